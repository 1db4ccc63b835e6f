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

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.stall import PERIOD, StallReport

REPO = Path(__file__).resolve().parents[2]
# The measurement runs in a child process that ends with its report: the hostile specs compile
# in-process (a library manager runs no compile workers), and xgrammar's compiles of the 400 KB tag
# and the 36 KB grammar cannot be stopped: left in the test process they ran on for 100 s and
# more on two threads, taking both cores from the tests after this one.
_CHILD = f"""
import json, os, sys
sys.path.insert(0, {str(REPO)!r})
from transformers import AutoTokenizer
from tokenrails import GuidedDecodingManager, Vocabulary
from harness.stall import hostile_specs, measure_stalls
vocab = Vocabulary.from_huggingface(AutoTokenizer.from_pretrained({str(REPO / "tests" / "fixtures" / "smollm2")!r}))
mgr = GuidedDecodingManager(vocab, backend="auto")
quiet = measure_stalls(mgr, [], 1.0)
hostile = measure_stalls(mgr, [s for _, s in hostile_specs()], 4.0)
print(json.dumps([vars(quiet), vars(hostile)]), flush=True)
os._exit(0)  # the abandoned compiles end with the process
"""


def test_decode_tick_keeps_its_rhythm_while_hostile_specs_compile():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    quiet, hostile = (StallReport(**r) for r in json.loads(done.stdout.strip().splitlines()[-1]))
    assert quiet.ticks >= int(0.6 / PERIOD)
    # p99 over ~80 ticks: at most one gap of 250 ms or more (the code before issue 16 stalled
    # 330-540 ms again and again). The single worst gap is one scheduler hiccup on a loaded 2-core
    # CI machine (250.4 ms seen there, 31-84 ms quiet); a compile holding the GIL stalls seconds.
    assert hostile.p99_gap_ms < 250, hostile
    assert hostile.max_stall_ms < 1000, hostile
    assert hostile.ticks >= int(2.0 / PERIOD), hostile  # never starved for long
