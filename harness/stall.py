"""Decode-tick stalls while hostile requests compile: what ``bench/stall.py`` reports and
``tests/safety/test_stall.py`` bounds (issue 16: "a 50 ms decode tick never stalls > 100 ms while
hostile requests compile").

A tick thread drives a small guided batch through one ``GuidedDecodingManager`` every
``PERIOD`` seconds (fill + apply + accept, like an engine step) while hostile specs compile on the
manager's own compile threads. A stall is a gap between tick starts beyond the period: time the
tick could not run because another thread held the GIL (a compile's single long C call, a large
``json`` parse) or the manager's step lock.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Iterator

import torch

from tokenrails.guided.sequence import GuidedRow, StepStatus
from tokenrails.guided.spec import GuideSpec

PERIOD = 0.05


def hostile_specs() -> Iterator[tuple[str, GuideSpec]]:
    """The compile-side shapes of issue 16 (each measured to stall or starve before)."""
    yield "6,000 [^\\n] classes (36 KB grammar)", GuideSpec.grammar("root ::= " + " ".join(["[^\\n]"] * 6000))
    yield "structural tag, 400 KB begin", GuideSpec.structural_tag({
        "type": "structural_tag", "format": {"type": "tag", "begin": "x" * 400_000,
                                             "content": {"type": "any_text"}, "end": "y"}})
    props = {f"p{i}": {"type": "integer"} for i in range(28_000)}
    yield "28k-property schema", GuideSpec.json_schema({"type": "object", "properties": props})
    yield "10k x 100 B enum", GuideSpec.json_schema({"enum": [f"{i:0100d}" for i in range(10_000)]})
    nested: dict = {"type": "integer"}
    for _ in range(20):
        nested = {"type": "array", "items": nested}
    yield "arrays nested 20 deep", GuideSpec.json_schema(nested)
    yield "regex (a|aa){1,1000}b", GuideSpec.regex("(a|aa){1,1000}b")
    yield "x{1000} (llguidance-shaped)", GuideSpec.grammar('root ::= "x"{1000}')


@dataclass
class StallReport:
    ticks: int
    max_stall_ms: float
    p99_gap_ms: float


def _tick_loop(mgr, rows: list[GuidedRow], stop: threading.Event, gaps: list[float]) -> None:
    gen = torch.Generator().manual_seed(0)
    vocab = mgr.vocab
    last = time.perf_counter()
    while not stop.is_set():
        t0 = time.perf_counter()
        gaps.append(t0 - last)
        last = t0
        logits = torch.randn((len(rows), vocab.vocab_size), generator=gen)
        mgr.fill_and_apply(logits, rows)
        statuses = mgr.accept_tokens(logits.argmax(dim=1).tolist(), rows)
        for r, st in zip(rows, statuses):  # keep the rows alive: restart sequences that ended
            if st is not None and st.state is not StepStatus.OK:
                mgr.release(r.session_id, r.seq_id)
        time.sleep(max(0.0, PERIOD - (time.perf_counter() - t0)))


def measure_stalls(mgr, specs: list[GuideSpec], seconds: float, rows: int = 4) -> StallReport:
    """Tick for ``seconds`` while ``specs`` are prefetched (compiled) on ``mgr``."""
    tick_spec = GuideSpec.json_schema({"type": "object", "properties": {"a": {"type": "string"}}})
    mgr.get_compiled(tick_spec)
    batch = [GuidedRow(f"tick{i}", 0, tick_spec) for i in range(rows)]
    gaps: list[float] = []
    stop = threading.Event()
    worker = threading.Thread(target=_tick_loop, args=(mgr, batch, stop, gaps), daemon=True)
    worker.start()
    for spec in specs:
        mgr.prefetch(spec)
    time.sleep(seconds)
    stop.set()
    worker.join(30)
    for r in batch:
        mgr.release(r.session_id, r.seq_id)
    tail = gaps[1:] or [PERIOD]
    return StallReport(len(gaps), round(max(g - PERIOD for g in tail) * 1e3, 1),
                       round(sorted(tail)[int(0.99 * (len(tail) - 1))] * 1e3, 1))
