"""The compile worker process (``python -m tokenrails.guided.compile_worker``; see compile_procs.py).

Reads its setup (vocabulary, backend, limits) from the inherited descriptor its argument names,
then one spec per frame from stdin, and answers each with ``("ok", (backend, portable state,
seconds))`` or ``("error", GuideError)`` on stdout. The protocol owns the real stdout: anything a
library prints goes to stderr.

After each compile the heap's free pages go back to the OS (``memory_return.trim``), so an idle
worker is small again. Once booted it lowers its CPU priority (see compile_procs.py).
"""
from __future__ import annotations

import os
import sys


def main() -> None:
    inp = sys.stdin.buffer.fileno()
    out = os.dup(sys.stdout.buffer.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt a frame

    import torch

    torch.set_num_threads(1)
    from .compile_procs import export_guide, lower_priority, read_frame, read_setup, write_frame
    from .errors import GuideError, InvalidGuideError, detached_copy
    from .gc_pause import gc_paused
    from .memory_return import trim
    from .registry import compile_guide
    from .vocabulary import Vocabulary

    (tokens, eos, special, size, name), backend, limits = read_setup(int(sys.argv[1]))
    os.close(int(sys.argv[1]))

    vocab = Vocabulary(tokens, tuple(eos), frozenset(special), size, name)
    lower_priority()
    while True:
        try:
            spec = read_frame(inp)
        except EOFError:
            return
        guide = None
        try:
            with gc_paused():
                guide = compile_guide(spec, vocab, backend, limits=limits)
            reply = ("ok", export_guide(guide))
        except GuideError as exc:
            reply = ("error", detached_copy(exc))
        except Exception as exc:  # noqa: BLE001 - a backend bug fails this request, typed
            reply = ("error", InvalidGuideError(f"compiling the {spec.kind} constraint failed: {exc!r}"[:2000]))
        write_frame(out, reply)
        del guide, reply, spec  # drop the compiled grammar before waiting for the next spec
        trim()


if __name__ == "__main__":
    main()
