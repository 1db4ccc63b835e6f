"""Per-step guided overhead through LMDeploy's own FusedLogitsProcessor: stock vs tokenrails.

One step = what ``BaseModelAgent.async_sampling_logits`` does: ``make_sampling_inputs`` (the
real AR strategy), ``FusedLogitsProcessor(...)``, ``await processor(logits)``, ``sampling``,
``accept_guided_tokens``. Rows are mixed: JSON schema, regex, choice, unguided (1/4 each).
A row that ends (EOS) is replaced by a new session with the same constraint.

Overhead = step time with guided rows − step time of the same batch with no constraint. Both
engines run in the same process and run; printed ratios are tokenrails / stock (goal ≤ 0.5 at
batch ≥ 16). Compilation is never timed (warm-up compiles; the check below fails the run if a
compile happens inside a timed step). ``--sessions N`` then runs N one-step sessions and reports
memory (RSS) and live state: tokenrails must stay flat.

    python bench/lmdeploy_step.py [--quick] [--tokenizer qwen2] [--batches 1,16,64,256]
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import load_tokenizer, median, print_table  # noqa: E402

import torch  # noqa: E402

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 12},
                                           "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                                           "ok": {"type": "boolean"}},
          "required": ["id", "name", "tags", "ok"], "additionalProperties": False}
FORMATS = [
    {"type": "json_schema", "json_schema": {"name": "rec", "schema": SCHEMA}},
    {"type": "regex_schema", "regex_schema": r"[A-Z]{2}-[0-9]{4}-[a-z]{3,8}\."},
    {"type": "choice", "choice": ["approve", "reject", "escalate", "defer"]},
    None,
]
# stock LMDeploy has no "choice": it receives the equivalent regex (same language, same tokens)
STOCK_CHOICE = {"type": "regex_schema", "regex_schema": "(approve|reject|escalate|defer)"}


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Row:
    _next_session = 10_000

    def __init__(self, fmt, prompt_len=16):
        from lmdeploy.messages import GenerationConfig
        from lmdeploy.pytorch.messages import SamplingParam
        from types import SimpleNamespace

        Row._next_session += 1
        self.session = SimpleNamespace(session_id=Row._next_session)
        self.seq_id = Row._next_session
        self.sampling_param = SamplingParam.from_gen_config(
            GenerationConfig(response_format=fmt, top_k=1, temperature=1.0, max_new_tokens=4096))
        self.fmt = fmt
        self.generated: list[int] = []
        self.prompt_len = prompt_len
        self.output_start_pos = prompt_len

    num_new_tokens = property(lambda self: len(self.generated))
    num_valid_ids = property(lambda self: self.prompt_len + len(self.generated))


def _batch(n, stock):
    rows = []
    for i in range(n):
        fmt = FORMATS[i % len(FORMATS)]
        if stock and fmt is not None and fmt["type"] == "choice":
            fmt = STOCK_CHOICE
        rows.append(Row(fmt))
    return rows


async def _step(strat, mgr, rows, logits):
    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor

    si = strat.make_sampling_inputs(rows)
    proc = FusedLogitsProcessor(si, logprobs_mode=None, guided_decoding_manager=mgr)
    scores, _ = await proc(logits)
    toks = proc.sampling(scores)
    await proc.accept_guided_tokens(toks)
    return toks.tolist()


def run_engine(mode, tokenizer, vocab_size, eos, batches, steps, warmup, vocab=None):
    import tokenrails.engine_patch.lmdeploy as patch
    from lmdeploy.pytorch.engine.model_agent import agent
    from lmdeploy.pytorch.strategies.ar.sampling import ARSamplingStrategy

    if mode == "tokenrails":
        patch.activate()
    else:
        patch.deactivate()
    mgr = agent.GuidedDecodingManager(tokenizer, vocab_size)
    if mode == "tokenrails":
        mgr.core()  # vocabulary built (at engine start-up in a real engine)
    strat = ARSamplingStrategy(0)
    gen = torch.Generator().manual_seed(0)
    results = {}
    loop = asyncio.new_event_loop()
    for bs in batches:
        for guided in (True, False):
            rows = _batch(bs, mode == "stock") if guided else [Row(None) for _ in range(bs)]
            logits_pool = [torch.randn(bs, vocab_size, generator=gen) for _ in range(4)]
            times = []
            compiles_before = mgr.stats().get("compiles", 0) if mode == "tokenrails" else None
            for s in range(warmup + steps):
                if s == warmup and mode == "tokenrails":
                    compiles_before = mgr.stats()["compiles"]
                x = logits_pool[s % 4].clone()
                t0 = time.perf_counter()
                toks = loop.run_until_complete(_step(strat, mgr, rows, x))
                dt = time.perf_counter() - t0
                if s >= warmup:
                    times.append(dt)
                for i, (r, t) in enumerate(zip(rows, toks)):
                    r.generated.append(int(t))
                    if int(t) in eos or len(r.generated) > 200:
                        if r.fmt is not None:
                            strat.on_session_end(r.session.session_id)
                        rows[i] = Row(r.fmt)
            if mode == "tokenrails":
                assert mgr.stats()["compiles"] == compiles_before, "a compile ran inside a timed step"
            results[(bs, guided)] = median(times)
    loop.close()
    patch.deactivate()
    return results, mgr


def run_sessions(mode, tokenizer, vocab_size, n, unique_every):
    """n one-step sessions (1 in ``unique_every`` with a never-seen regex), ended as they go."""
    import tokenrails.engine_patch.lmdeploy as patch
    from lmdeploy.pytorch.engine.model_agent import agent
    from lmdeploy.pytorch.strategies.ar.sampling import ARSamplingStrategy

    patch.activate() if mode == "tokenrails" else patch.deactivate()
    mgr = agent.GuidedDecodingManager(tokenizer, vocab_size)
    if mode == "tokenrails":
        mgr.core()
    strat = ARSamplingStrategy(0)
    loop = asyncio.new_event_loop()
    x = torch.randn(1, vocab_size)
    marks = {}
    t0 = time.perf_counter()
    for i in range(n):
        fmt = FORMATS[i % 3]
        if mode == "stock" and fmt["type"] == "choice":
            fmt = STOCK_CHOICE
        if i % unique_every == 0:
            fmt = {"type": "regex_schema", "regex_schema": f"id{i}-[0-9]{{3}}"}
        r = Row(fmt)
        loop.run_until_complete(_step(strat, mgr, [r], x.clone()))
        strat.on_session_end(r.session.session_id)
        if (i + 1) in (n // 10, n // 2, n):
            gc.collect()
            live = (mgr.stats()["active_matchers"] if mode == "tokenrails" else
                    sum(len(v) for v in mgr.processors.values()))
            cache = (mgr.stats()["cache_entries"] if mode == "tokenrails" else
                     f"{mgr.compiler.get_cache_size_bytes() / 2**20:.1f}MB")
            marks[i + 1] = (_rss_mb(), live, cache)
    loop.close()
    patch.deactivate()
    return marks, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="qwen2")
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--sessions-tokenizer", default="smollm2")
    ap.add_argument("--unique-every", type=int, default=10)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.batches, args.steps, args.warmup, args.sessions = "1,16,64", 8, 3, 1000
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from engine_patch.lmdeploy.harness import stub_cuda  # noqa: E402

    class _MP:  # stub_cuda wants a monkeypatch-like object
        def setattr(self, obj, name, value):
            setattr(obj, name, value)

    stub_cuda(_MP())
    import logging

    logging.getLogger("lmdeploy").setLevel(logging.WARNING)
    from lmdeploy.utils import get_logger

    get_logger("lmdeploy").setLevel(logging.WARNING)
    tok = load_tokenizer(args.tokenizer)
    vocab_size = len(tok)
    eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    batches = [int(b) for b in args.batches.split(",")]
    print(f"tokenizer={args.tokenizer} vocab={vocab_size} steps={args.steps} torch_threads={torch.get_num_threads()}")
    res = {}
    for mode in ("stock", "tokenrails"):
        res[mode], _ = run_engine(mode, tok, vocab_size, eos, batches, args.steps, args.warmup)
    rows = []
    for bs in batches:
        st_g, st_u = res["stock"][(bs, True)], res["stock"][(bs, False)]
        tr_g, tr_u = res["tokenrails"][(bs, True)], res["tokenrails"][(bs, False)]
        st_o, tr_o = max(st_g - st_u, 1e-6), max(tr_g - tr_u, 0.0)
        rows.append([bs, f"{st_g*1e3:.2f}", f"{tr_g*1e3:.2f}", f"{st_o*1e3:.2f}", f"{tr_o*1e3:.2f}",
                     f"{tr_o/st_o:.2f}x", f"{tr_g/st_g:.2f}x"])
    print("\nper step (ms, median): guided batch (3/4 rows guided); overhead = guided - unguided same batch")
    print_table(["batch", "stock step", "ours step", "stock overhead", "ours overhead", "overhead ratio",
                 "step ratio"], rows)
    if args.sessions:
        stok = load_tokenizer(args.sessions_tokenizer)
        print(f"\n{args.sessions} one-step sessions ({args.sessions_tokenizer}), 1 in {args.unique_every} "
              "with a never-seen regex, each ended after its step:")
        out = []
        for mode in ("stock", "tokenrails"):
            marks, dt = run_sessions(mode, stok, len(stok), args.sessions, args.unique_every)
            for k, (rss, live, cache) in marks.items():
                out.append([mode, k, f"{rss:.0f}", live, cache, f"{dt:.0f}s"])
        print_table(["engine", "sessions", "RSS MB", "live matchers", "compile cache", "total time"], out)


if __name__ == "__main__":
    main()
