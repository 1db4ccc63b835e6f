"""A 50 ms decode tick keeps its rhythm while issue 16's hostile requests compile.

Before: a 28,000-property schema went through a second of routing analysis (its single long
``json`` calls holding the GIL) and then minutes of xgrammar compile; the tick stalled 330-540 ms,
again and again (p99 gap 440 ms). Now over-limit schemas are refused before routing
(``max_object_properties``) and compiles release the GIL: p99 gap 90-140 ms, one stall of
110-520 ms per run on 2 cores. That stall was a full cyclic-GC pass (112 ms measured by
``gc.callbacks``) set off by the parsed payloads living through young collections; compiles now
run with the GC paused, at most 5 s (``gc_pause.py``): max stall 31-84 ms, p99 gap 54-63 ms
(bench/stall.py).
The bounds here are wide for a loaded CI machine; the p99 one fails on the code before
``max_object_properties``; that compiles pause the GC is checked deterministically in
tests/guided/test_gc_pause.py.
"""
from __future__ import annotations

from tokenrails import GuidedDecodingManager
from harness.stall import PERIOD, hostile_specs, measure_stalls


def test_decode_tick_keeps_its_rhythm_while_hostile_specs_compile(vocab):
    mgr = GuidedDecodingManager(vocab, backend="auto")
    try:
        quiet = measure_stalls(mgr, [], 1.0)
        hostile = measure_stalls(mgr, [s for _, s in hostile_specs()], 4.0)
    finally:
        mgr.close()
    assert quiet.ticks >= int(0.6 / PERIOD)
    # p99 over ~80 ticks: at most one gap of 250 ms or more (the code before issue 16 stalled
    # 330-540 ms again and again). The single worst gap is one scheduler hiccup on a loaded 2-core
    # CI machine (250.4 ms seen there, 31-84 ms quiet); a compile holding the GIL stalls seconds.
    assert hostile.p99_gap_ms < 250, hostile
    assert hostile.max_stall_ms < 1000, hostile
    assert hostile.ticks >= int(2.0 / PERIOD), hostile  # never starved for long
