"""Hostile compiles cannot starve the manager: a benign spec is served while slow compiles are in
flight, a compile past its deadline gives its slot back, and interpreter exit never waits for one.

The slow compiles come from a test backend that blocks on an event for ``hostile`` regexes (a
stand-in for an uninterruptible C++/Rust compile: xgrammar on a 36 KB grammar of 6,000 classes
measured 30 s+) and hands every other spec to the real fsm backend. The wall-clock bounds below are
the behaviour under test, with wide margins.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import tokenrails as tr
from tokenrails.guided.backend import GuideBackend
from tokenrails.guided.errors import GuideLimitError, GuideTimeoutError
from tokenrails.guided.manager import GuidedDecodingManager
from tokenrails.guided.registry import get_backend, register_backend, unregister_backend

RELEASE = threading.Event()


class BlockingBackend(GuideBackend):
    name = "blocking-test"
    kinds = frozenset({"regex"})

    def compile(self, spec):
        if spec.pattern.startswith("hostile"):
            RELEASE.wait(60)
        return get_backend("fsm", self.vocab, self.limits).compile(spec)


@pytest.fixture
def blocking_backend():
    RELEASE.clear()
    register_backend(BlockingBackend.name, BlockingBackend)
    yield BlockingBackend.name
    RELEASE.set()  # let abandoned compile threads finish
    unregister_backend(BlockingBackend.name)


def test_benign_spec_is_served_while_eight_hostile_compiles_run(vocab, blocking_backend):
    manager = GuidedDecodingManager(vocab, backend=blocking_backend, limits=tr.GuideLimits(compile_timeout_s=20))
    for n in range(8):
        manager.prefetch(tr.GuideSpec.regex(f"hostile{n}"))
    start = time.perf_counter()
    guide = manager.get_compiled(tr.GuideSpec.regex("[0-9]{3}"))
    assert time.perf_counter() - start < 1.0
    assert guide.matcher() is not None
    assert manager.stats()["compiles_in_flight"] == 8
    manager.close()


def test_timed_out_compile_frees_its_slot(vocab, blocking_backend):
    limits = tr.GuideLimits(compile_timeout_s=1.0)
    manager = GuidedDecodingManager(vocab, backend=blocking_backend, limits=limits, compile_workers=1)
    hostile = tr.GuideSpec.regex("hostile-a")
    with pytest.raises(GuideTimeoutError):
        manager.get_compiled(hostile)
    # the only slot is free again: a benign spec compiles although the hostile one still runs
    assert manager.get_compiled(tr.GuideSpec.regex("[ab]{2}")) is not None
    assert manager._pool.abandoned == 1
    with pytest.raises(GuideTimeoutError):  # a repeat joins the compile still running, with its own deadline
        manager.get_compiled(tr.GuideSpec.regex("hostile-a"))
    assert manager._pool.abandoned == 1 and manager._pool.running == 0  # no second thread for it
    RELEASE.set()
    deadline = time.monotonic() + 10
    while manager._pool.abandoned and time.monotonic() < deadline:
        time.sleep(0.01)
    assert manager._pool.abandoned == 0  # its thread ended with the compile
    manager.close()


def test_abandoned_compiles_are_bounded(vocab, blocking_backend):
    limits = tr.GuideLimits(compile_timeout_s=0.1, max_abandoned_compiles=2)
    manager = GuidedDecodingManager(vocab, backend=blocking_backend, limits=limits)
    for n in range(2):
        with pytest.raises(GuideTimeoutError):
            manager.get_compiled(tr.GuideSpec.regex(f"hostile-{n}"))
    with pytest.raises(GuideLimitError, match="max_abandoned_compiles"):
        manager.get_compiled(tr.GuideSpec.regex("[cd]{2}"))
    manager.close()


def test_interpreter_exit_does_not_wait_for_a_stuck_compile(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from transformers import AutoTokenizer
        import tokenrails as tr
        from tokenrails.guided.backend import GuideBackend
        from tokenrails.guided.manager import GuidedDecodingManager
        from tokenrails.guided.registry import register_backend

        class Stuck(GuideBackend):
            name = "stuck"
            kinds = frozenset({{"regex"}})
            def compile(self, spec):
                time.sleep(120)  # an uninterruptible native compile, as far as Python can tell

        register_backend("stuck", Stuck)
        tok = AutoTokenizer.from_pretrained({str(Path(__file__).resolve().parents[1] / "fixtures" / "smollm2")!r})
        manager = GuidedDecodingManager(tr.Vocabulary.from_huggingface(tok), backend="stuck",
                                        limits=tr.GuideLimits(compile_timeout_s=0.2))
        try:
            manager.get_compiled(tr.GuideSpec.regex("x"))
        except tr.GuideTimeoutError:
            print("timed out", flush=True)
    """)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=100)
    elapsed = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-2000:]
    assert "timed out" in done.stdout
    assert elapsed < 60  # the stuck compile sleeps 120 s; exit must not wait for it


def test_a_compile_returning_during_exit_does_not_abort_the_process():
    """An abandoned xgrammar compile that returns while the interpreter finalizes cannot take the GIL
    back; CPython's thread exit then unwinds through tvm-ffi's noexcept guard and the process aborts
    (exit status 134) after the program's own work succeeded. Exit waits for it instead. Here a slow
    finalizer in ``__main__`` holds finalization open long enough for the compile to return in it."""
    script = textwrap.dedent(f"""
        import json, os, time
        os.environ["TOKENRAILS_EXIT_WAIT_S"] = "60"
        from transformers import AutoTokenizer
        import tokenrails as tr
        from tokenrails.guided.manager import GuidedDecodingManager

        class SlowFinalizer:
            def __del__(self):
                time.sleep(4)  # runs after finalization has begun; the GIL is released meanwhile

        keep = SlowFinalizer()
        tok = AutoTokenizer.from_pretrained({str(Path(__file__).resolve().parents[1] / "fixtures" / "smollm2")!r})
        manager = GuidedDecodingManager(tr.Vocabulary.from_huggingface(tok), backend="xgrammar",
                                        limits=tr.GuideLimits(compile_timeout_s=0.01))
        schema = {{"type": "object", "properties": {{
            f"p{{i}}": {{"type": "string", "pattern": "[a-z]{{1,%d}}" % (100 - i % 7)}} for i in range(100)}}}}
        try:  # the first compile also builds the tokenizer info, partly in Python: let it finish
            manager.get_compiled(tr.GuideSpec.regex("warm"))
        except tr.GuideTimeoutError:
            while manager._pool.abandoned:
                time.sleep(0.05)
        try:  # about 1 s inside one native call
            manager.get_compiled(tr.GuideSpec.json_schema(json.dumps(schema)))
        except tr.GuideTimeoutError:
            print("timed out", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=200,
                          cwd=str(Path(__file__).resolve().parents[2]))
    assert "timed out" in done.stdout, done.stderr[-2000:]
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_named_client_is_capped_and_the_local_caller_is_not(vocab, blocking_backend):
    """``per_client`` bounds each named client (an api_server's); ``LOCAL`` (a library caller, no
    client named) is one caller whose benign spec never queues behind its own slow ones."""
    from tokenrails.guided.clients import CLIENT

    manager = GuidedDecodingManager(vocab, backend=blocking_backend, compile_workers=4, per_client=1,
                                    limits=tr.GuideLimits(compile_timeout_s=20))
    token = CLIENT.set("key:flood")
    try:
        for n in range(3):
            manager.prefetch(tr.GuideSpec.regex(f"hostile-named{n}"))
    finally:
        CLIENT.reset(token)
    assert manager._pool.running == 1 and manager._pool.queued("key:flood") == 2
    for n in range(2):
        manager.prefetch(tr.GuideSpec.regex(f"hostile-local{n}"))
    start = time.perf_counter()
    guide = manager.get_compiled(tr.GuideSpec.regex("[0-9]{4}"))  # LOCAL's third compile runs at once
    assert time.perf_counter() - start < 1.0 and guide.matcher() is not None
    manager.close()
