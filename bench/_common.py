"""Shared benchmark helpers: tokenizers, timing, and the ratio table every bench prints."""
from __future__ import annotations

import functools
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


# ---- honest timing on a shared machine ---------------------------------------------------------
def load_average() -> float:
    """The 1-minute load average (printed beside every round: other load moves wall time)."""
    return os.getloadavg()[0]


def cpu_seconds() -> float:
    """CPU time of this process, all threads (an engine's worker threads included)."""
    return time.process_time()


def abba(names: list[str], instances: int) -> list[tuple[str, int]]:
    """Build order (name, instance): A B, then B A, ... so that no configuration always comes later
    in the process (an engine built later runs slower); round ``r`` uses instance ``r % instances``."""
    order: list[tuple[str, int]] = []
    for k in range(instances):
        order += [(n, k) for n in (names if k % 2 == 0 else list(reversed(names)))]
    return order


def round_order(names: list[str], rnd: int) -> list[str]:
    """Configurations in A B order on even rounds, B A on odd ones."""
    return list(names) if rnd % 2 == 0 else list(reversed(names))


def arrivals(n: int, rate: float, seed: int = 0) -> list[float]:
    """Arrival times (s) of ``n`` requests: a Poisson stream of ``rate`` requests/s (0: all at once)."""
    import random

    if rate <= 0:
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def stream_requests(pipe, prompts: list, gens: list, limit: int, rate: float = 0.0, seed: int = 0
                    ) -> tuple[list, float, float]:
    """A continuous request stream through an LMDeploy pipeline: request ``i`` arrives at its Poisson
    arrival time (``rate`` req/s; 0: all at once) and starts as soon as fewer than ``limit`` run
    (a finished row is refilled from the queue at once). Returns (outputs, wall s, process CPU s)."""
    import asyncio

    from lmdeploy.pipeline import MultimodalProcessor

    messages = MultimodalProcessor.format_prompts(list(prompts))  # as Pipeline.infer formats them
    times = arrivals(len(prompts), rate, seed)

    async def run_all():
        sem = asyncio.Semaphore(limit)
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def one(i: int):
            await asyncio.sleep(max(0.0, t0 + times[i] - loop.time()))
            async with sem:
                session = pipe.session_mgr.get()
                request = await pipe.async_engine.preprocess(session_id=session, messages=messages[i],
                                                             gen_config=gens[i])
                res = None
                async for out in pipe.async_engine.generate(request, stream_response=False):
                    r = out.to_response(i)
                    res = res.extend(r) if res else r
                return res

        return await asyncio.gather(*(one(i) for i in range(len(prompts))))

    wall, cpu = time.perf_counter(), cpu_seconds()
    outs = pipe._run(coro=run_all()).result()
    return list(outs), time.perf_counter() - wall, cpu_seconds() - cpu


def lookup_share(outputs: list[list[int]], specs, vocab, encode, prompts: list[list[int]]) -> float:
    """Fraction of emitted tokens the proposer's first draft names from the state before them: the
    forced rule, else the grammar-checked prompt lookup over the row's prompt and output so far
    (``guided/lookup.py``), replayed through fresh matchers. A step drafts more than its first token,
    from the state where it began, so this is the drafts' share a step-by-step replay sees, not a
    strict bound."""
    from tokenrails import compile_guide
    from tokenrails.guided.forced import forced_tokens
    from tokenrails.guided.lookup import LookupIndex, continue_run

    hit = total = 0
    for ids, spec, prompt in zip(outputs, specs, prompts):
        m = compile_guide(spec, vocab).matcher()
        index = LookupIndex(prompt, vocab.token_bytes)
        for t in ids:
            if t in vocab.eos_ids:
                break
            then = functools.partial(continue_run, index=index, max_tokens=1, encode=encode)
            run = forced_tokens(m, 1, encode=encode, then=then)
            hit += run.tokens[:1] == (t,)
            total += 1
            if not m.accept_token(t):
                break
            index.append(t)
    return hit / max(total, 1)


def ceiling(outputs: list[list[int]], specs, vocab, encode) -> tuple[float, float, int]:
    """Fractions of emitted tokens that are one-token masks / the forced rule's draft there."""
    from tokenrails import compile_guide
    from tokenrails.guided.forced import forced_tokens

    single = rule = total = 0
    for ids, spec in zip(outputs, specs):
        m = compile_guide(spec, vocab).matcher()
        for t in ids:
            if t in vocab.eos_ids:
                break
            run = forced_tokens(m, 1, encode=encode)
            if run.tokens == (t,):
                rule += 1
                single += run.single
            total += 1
            if not m.accept_token(t):
                break
    return single / max(total, 1), rule / max(total, 1), total
