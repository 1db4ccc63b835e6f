"""gc_paused: the cyclic GC is off while any compile runs, back on after the last, and a process
that disabled it itself keeps it disabled."""
from __future__ import annotations

import gc
import threading

from tokenrails.guided.gc_pause import gc_paused


def test_nested_across_threads_restores_on_the_last_exit():
    assert gc.isenabled()
    first_in, release = threading.Event(), threading.Event()
    seen = {}

    def other():
        with gc_paused():
            first_in.set()
            release.wait(5)
            seen["inside_other"] = gc.isenabled()

    t = threading.Thread(target=other)
    t.start()
    first_in.wait(5)
    with gc_paused():
        seen["inside_main"] = gc.isenabled()
    seen["main_left_other_inside"] = gc.isenabled()
    release.set()
    t.join(5)
    assert seen == {"inside_main": False, "main_left_other_inside": False, "inside_other": False}
    assert gc.isenabled()


def test_a_process_that_disabled_gc_keeps_it_disabled():
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_an_exception_inside_still_restores():
    try:
        with gc_paused():
            raise ValueError("boom")
    except ValueError:
        pass
    assert gc.isenabled()


def test_the_manager_compiles_with_the_gc_paused(vocab, monkeypatch):
    """The stall it prevents: a full collection over a parsed 28k-property payload (112 ms)."""
    import tokenrails as tr
    from tokenrails.guided import manager as manager_mod
    from tokenrails.guided.errors import InvalidGuideError

    seen = []

    def recording_compile(spec, vocab, backend, limits=None):
        seen.append(gc.isenabled())
        raise InvalidGuideError("refused by the test")

    monkeypatch.setattr(manager_mod, "compile_guide", recording_compile)
    mgr = manager_mod.GuidedDecodingManager(vocab, backend="xgrammar")
    try:
        try:
            mgr.get_compiled(tr.GuideSpec.regex("[a-z]+"))
        except InvalidGuideError:
            pass
    finally:
        mgr.close()
    assert seen == [False]
    assert gc.isenabled()


def test_a_pause_is_bounded_even_if_a_compile_never_ends(monkeypatch):
    """An abandoned native compile may run for minutes: the GC comes back after MAX_PAUSE_S."""
    import time

    from tokenrails.guided import gc_pause

    monkeypatch.setattr(gc_pause, "MAX_PAUSE_S", 0.05)
    with gc_paused():
        assert not gc.isenabled()
        deadline = time.monotonic() + 5
        while not gc.isenabled() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gc.isenabled()
        with gc_paused():  # a compile starting late in an expired pause does not turn it off again
            assert gc.isenabled()
    assert gc.isenabled()


def test_a_child_forked_mid_compile_pauses_the_gc_again():
    """Forked while another thread's compile held the pause (and while the forking thread held
    one of its own): in the child that thread is gone, so its pause must not count; the forking
    thread's own does, until it closes. Run in a fresh interpreter: this test process imported
    libraries that must not be forked."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    script = textwrap.dedent("""
        import gc, os, threading
        from tokenrails.guided.gc_pause import gc_paused

        inside, release = threading.Event(), threading.Event()

        def compiling():
            with gc_paused():
                inside.set()
                release.wait(30)

        t = threading.Thread(target=compiling)
        t.start()
        inside.wait(30)
        with gc_paused():  # the forking thread's own pause
            pid = os.fork()
            if pid == 0:
                ok = gc.isenabled()  # the other thread's pause is not the child's
            else:
                release.set()
        if pid == 0:
            ok = ok and gc.isenabled()  # closing its own pause leaves the GC on
            with gc_paused():
                ok = ok and not gc.isenabled()  # a compile in the child pauses the GC
            ok = ok and gc.isenabled() and gc_paused().depth() == 0
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        t.join(30)
        print("child", os.waitstatus_to_exitcode(status))
    """)
    repo = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=repo, env={**__import__("os").environ, "PYTHONPATH": repo})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "child 0" in done.stdout, done.stdout + done.stderr[-2000:]
