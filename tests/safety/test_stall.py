"""A 50 ms decode tick keeps its rhythm while issue 16's hostile requests compile.

Before: a 28,000-property schema went through a second of routing analysis (its single long
``json`` calls holding the GIL) and then minutes of xgrammar compile; the tick stalled 330-540 ms,
again and again (p99 gap 440 ms). Now over-limit schemas are refused before routing
(``max_object_properties``) and compiles release the GIL: p99 gap 90-140 ms, one stall of
110-520 ms per run (the 28k-property request's one-off parse and collection) on 2 cores
(bench/stall.py). The bounds here are wide for a loaded CI machine; the p99 one fails on the old
code. The issue's goal (no stall > 100 ms) is not met yet: docs/safety.md.
"""
from __future__ import annotations

from tokenrails import GuidedDecodingManager
from tokenrails.testing_stall import PERIOD, hostile_specs, measure_stalls


def test_decode_tick_keeps_its_rhythm_while_hostile_specs_compile(vocab):
    mgr = GuidedDecodingManager(vocab, backend="auto")
    try:
        quiet = measure_stalls(mgr, [], 1.0)
        hostile = measure_stalls(mgr, [s for _, s in hostile_specs()], 4.0)
    finally:
        mgr.close()
    assert quiet.ticks >= int(0.6 / PERIOD)
    assert hostile.p99_gap_ms < 250, hostile
    assert hostile.max_stall_ms < 1500, hostile  # never frozen
    assert hostile.ticks >= int(2.0 / PERIOD), hostile  # never starved for long
