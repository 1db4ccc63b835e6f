"""Leak check for the native entry points: resident memory stays flat over many rounds of a call."""
from __future__ import annotations

import os
from typing import Callable

import pytest

STATM = "/proc/self/statm"
needs_proc = pytest.mark.skipif(not os.path.exists(STATM), reason="needs /proc")


def rss_kb() -> int:
    with open(STATM) as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def assert_flat_rss(work: Callable[[], None], rounds: int = 1500, warmup: int = 200, max_growth_kb: int = 2048) -> None:
    """Run ``work`` ``warmup`` times (allocator pools fill up), then ``rounds`` times: RSS may grow
    by at most ``max_growth_kb``."""
    for _ in range(warmup):
        work()
    before = rss_kb()
    for _ in range(rounds):
        work()
    growth = rss_kb() - before
    assert growth < max_growth_kb, f"RSS grew by {growth} kB over {rounds} rounds"
