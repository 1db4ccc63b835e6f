"""Shared benchmark helpers: tokenizers, timing, and the ratio table every bench prints."""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parent.parent
SHARED_TOKENIZERS = REPO.parent / "shared" / "data" / "tokenizers"
FIXTURE = REPO / "tests" / "fixtures" / "smollm2"


def load_tokenizer(name: str):
    """A tokenizer from ../shared (benchmarks only); SmolLM2 falls back to the test fixture."""
    from transformers import AutoTokenizer

    path = SHARED_TOKENIZERS / name
    if not path.exists():
        if name != "smollm2":
            raise SystemExit(f"tokenizer {name!r} needs ../shared/data/tokenizers (not in a user checkout)")
        path = FIXTURE
    return AutoTokenizer.from_pretrained(str(path))


def timeit(fn: Callable[[], object], *, repeat: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def p(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def print_table(headers: list[str], rows: list[list[object]]) -> None:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, r in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if v < 100 else f"{v:.0f}"
    return str(v)
