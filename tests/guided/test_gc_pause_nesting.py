"""Bug 4 of issue 23: the FSM compiler's own GC pause and the manager's pause nested wrongly.

On the old code an FSM build that turned the GC off first (``fsm.compiler.no_gc``) made the
manager's ``gc_paused`` see a disabled GC and never own it; the FSM build's exit then turned the GC
back on in the middle of the manager's compile. There is one pause now, counted process-wide.
"""
from __future__ import annotations

import gc
import threading

from tokenrails.guided.fsm import compiler
from tokenrails.guided.gc_pause import gc_paused
from tokenrails.guided.limits import GuideLimits


def test_an_fsm_build_ending_inside_a_manager_pause_keeps_the_gc_off(monkeypatch):
    assert gc.isenabled()
    inside, release = threading.Event(), threading.Event()
    real = compiler.dfa_from_strings

    def blocking_build(*args, **kwargs):
        inside.set()
        assert release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "dfa_from_strings", blocking_build)
    result = {}
    fsm_build = threading.Thread(target=lambda: result.setdefault("dfa", compiler.compile_choices(["a", "b"], GuideLimits())))
    fsm_build.start()
    assert inside.wait(10)  # the FSM build paused the GC first
    seen = []
    try:
        with gc_paused():  # a manager compile starts meanwhile
            release.set()
            fsm_build.join(10)  # ... and the FSM build ends inside it
            seen.append(gc.isenabled())
        seen.append(gc.isenabled())
    finally:
        release.set()
        fsm_build.join(10)
        gc.enable()
    assert result["dfa"].fullmatch(b"a")
    assert seen == [False, True]


def test_pauses_interleaved_out_of_order_across_threads():
    """A opens, B opens, A closes, B closes: off from A's start to B's end, on afterwards."""
    assert gc.isenabled()
    steps = [threading.Event() for _ in range(4)]
    seen = {}

    def a():
        with gc_paused():
            steps[0].set()
            steps[1].wait(10)
        seen["after_a"] = gc.isenabled()
        steps[2].set()

    t = threading.Thread(target=a)
    t.start()
    steps[0].wait(10)
    with gc_paused():
        steps[1].set()
        steps[2].wait(10)
        seen["b_after_a_left"] = gc.isenabled()
    t.join(10)
    assert seen == {"after_a": False, "b_after_a_left": False}
    assert gc.isenabled()


def test_re_entrant_on_one_thread_and_the_fsm_uses_the_same_pause():
    with gc_paused():
        with gc_paused():
            compiler.compile_choices(["x"], GuideLimits())
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    assert not hasattr(compiler, "no_gc")  # one pause only
