"""Overlap the guided mask with the model forward.

A row's next mask depends only on tokens already accepted, so it can be filled while the model
computes the logits: on a GPU the CPU is idle then; on a CPU the forward and the fill can use
different cores. The step (lmdeploy_step.py) starts the fill of its guided rows on a worker thread as it
opens, before the forward; the logits processor then joins it and applies the
mask (one kernel call) instead of filling. Fail-closed rules are the fill's own (errors, empty
rows → EOS-only); when the rows the processor sees differ from the ones filled (they should not),
the prefilled mask is dropped and the processor fills them itself.

Not used for non-last prefill chunks (their token is discarded), dummy inputs, speculative
decoding (its verification masks are built per draft), or a CPU agent's steps with fewer than
``CPU_MIN_ROWS`` guided rows (the fill thread slows the CPU forward more than it saves). ``TOKENRAILS_OVERLAP=0`` turns it off.
The future lives on the step (``LMDeployStep.prefill``). Times per step (``fill_s`` on the worker, ``wait_s`` exposed to the step) are kept in
``OverlapStats`` for the engine benchmark.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ....guided.sequence import GuidedRow
from ...._env import env_switch

ENV_OVERLAP = "TOKENRAILS_OVERLAP"


def enabled() -> bool:
    return env_switch(ENV_OVERLAP, True)


@dataclass
class OverlapStats:
    steps: int = 0
    fill_s: float = 0.0  # fill time on the worker (what overlapping hides)
    wait_s: float = 0.0  # time the step waited for the fill after the forward (exposed)
    dropped: int = 0  # prefilled masks not used (rows changed)
    inline: int = 0  # guided steps applied on the event loop's thread (logits.INLINE_MAX_ROWS)

    def reset(self) -> None:
        self.steps, self.fill_s, self.wait_s, self.dropped, self.inline = 0, 0.0, 0.0, 0, 0


# A forward on the CPU holds the core and hands the GIL back and forth between torch ops: a fill
# thread started beside it competes for both, and for a few rows that costs the forward more than
# the fill it hides (measured in docs/lmdeploy.md, "The overlapped fill slowed the CPU forward"). Below this many
# guided rows a CPU agent does not overlap; the logits processor fills them inline when their
# constraints are compiled.
CPU_MIN_ROWS = 9

STATS = OverlapStats()
_EXECUTOR: ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(1, thread_name_prefix="tokenrails-overlap")
        return _EXECUTOR


def row_keys(rows: list[Any]) -> tuple:
    return tuple((r.session_id, r.seq_id, r.spec.key) if isinstance(r, GuidedRow) else None for r in rows)


def start(agent: Any, step: Any, inputs: Any) -> None:
    """Start the fill of this step's guided rows on the worker, if overlap applies. Rows whose
    constraint is still compiling are not overlapped: preparing them may wait for the compile,
    and this runs on the event loop (the logits processor fills them on a worker thread)."""
    if step.skip_guided or not step.guided or not enabled() or getattr(inputs, "is_dummy", False):
        return
    spec_agent = getattr(agent, "spec_agent", None)
    if spec_agent is not None and spec_agent.is_enabled():
        return
    if step.guided < CPU_MIN_ROWS and str(getattr(agent, "device", "")) == "cpu":
        return  # the logits processor fills these inline (step._is_short)
    mgr = step.owner.core(wait=False)
    if mgr is None or not mgr.compiled([r for r in step.rows if isinstance(r, GuidedRow)]):
        return
    run_rows = step.run_rows()

    def fill():
        t0 = time.perf_counter()
        filled = mgr.fill_rows(run_rows)
        return filled, time.perf_counter() - t0

    step.prefill = (row_keys(run_rows), _executor().submit(fill))


def take(step: Any, run_rows: list[Any]):
    """The prefilled mask for exactly these rows (joined), or None."""
    pending, step.prefill = step.prefill, None
    if pending is None:
        return None
    keys, future = pending
    t0 = time.perf_counter()
    filled, fill_s = future.result()
    waited = time.perf_counter() - t0
    now = row_keys(run_rows)  # rows left out since (stopped before the step) may keep their mask
    if len(keys) != len(now) or any(n is not None and n != k for k, n in zip(keys, now)):
        STATS.dropped += 1
        return None
    STATS.steps += 1
    STATS.fill_s += fill_s
    STATS.wait_s += waited
    return filled
