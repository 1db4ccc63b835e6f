"""Native batch fills from many worker threads (an engine's ``asyncio.to_thread`` pool) share one
pool per backend and thread count: no pool, and no OS thread, per calling thread."""
from __future__ import annotations

import gc
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import xgrammar as xgr

from tokenrails import GuidedDecodingManager, GuideSpec
from tokenrails.guided.manager import GuidedRow

from .helpers import allowed_ids

WORKERS = 16
SPECS = [GuideSpec.regex(r"[0-9]{2,4}"), GuideSpec.regex(r"[a-f]{3}"), GuideSpec.json_schema({"type": "integer"})]


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _batch_matchers() -> int:
    gc.collect()
    return sum(isinstance(o, xgr.BatchGrammarMatcher) for o in gc.get_objects())


def _fill_from_workers(mgr: GuidedDecodingManager) -> tuple[int, int, list[torch.Tensor]]:
    """Fill the same rows from WORKERS live worker threads: (OS threads and xgrammar batch matchers
    beyond those before, measured while the workers are alive and idle like an engine's; masks)."""
    rows = [GuidedRow("s", i, spec) for i, spec in enumerate(SPECS)]
    mgr.fill_rows(rows)  # compiles done and this thread's pool made: the baseline (a compile thread may
    # still be winding down in it, hence the one-thread tolerance below)
    threads, matchers = _os_threads(), _batch_matchers()
    barrier = threading.Barrier(WORKERS)

    def fill(_):
        barrier.wait()
        return mgr.fill_rows(rows).bitmask.clone()

    with ThreadPoolExecutor(WORKERS) as pool:
        masks = list(pool.map(fill, range(WORKERS)))
        extra_threads = _os_threads() - threads - WORKERS
        extra_matchers = _batch_matchers() - matchers
    return extra_threads, extra_matchers, masks


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_llguidance_fills_from_many_threads_share_one_executor(vocab):
    mgr = GuidedDecodingManager(vocab, backend="llguidance", fill_threads=1, parallel_fill_threshold=2)
    try:
        extra, _, masks = _fill_from_workers(mgr)
    finally:
        mgr.close()
    assert extra <= 1, f"{extra} native threads for {WORKERS} filling threads"
    assert all(torch.equal(m, masks[0]) for m in masks)  # shared, the masks are the same
    allowed = {vocab.token_bytes[i] for i in allowed_ids(masks[0][0], vocab.vocab_size).tolist()}
    assert b"7" in allowed and b"a" not in allowed


def test_xgrammar_fills_from_many_threads_share_one_batch_matcher(vocab):
    mgr = GuidedDecodingManager(vocab, backend="xgrammar", fill_threads=1, parallel_fill_threshold=2)
    try:
        _, extra, masks = _fill_from_workers(mgr)
    finally:
        mgr.close()
    assert extra == 0, f"{extra} more batch matchers for {WORKERS} filling threads"
    assert all(torch.equal(m, masks[0]) for m in masks)
    allowed = {vocab.token_bytes[i] for i in allowed_ids(masks[0][1], vocab.vocab_size).tolist()}
    assert b"a" in allowed and b"7" not in allowed
