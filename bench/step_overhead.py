"""Per-step guided overhead: tokenrails' batched step vs the naive loop engines run today.

Naive (what LMDeploy 0.18 does): allocate a fresh bitmask every step, fill every guided row
serially with xgrammar, apply with xgrammar's kernel. Ours: the manager's persistent buffer,
threaded fill, our kernel. Half the rows are guided with a JSON schema; each guided row walks a
valid output token by token so masks come from real grammar states.

    python bench/step_overhead.py [--quick] [--backends xgrammar,fsm]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
from bench._common import load_tokenizer, median, print_table  # noqa: E402

import torch  # noqa: E402
import xgrammar as xgr  # noqa: E402

from tokenrails import GuidedDecodingManager, GuideSpec, Vocabulary, compile_guide  # noqa: E402
from tokenrails.guided.manager import GuidedRow  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["street", "city", "zip"],
        },
        "active": {"type": "boolean"},
    },
    "required": ["id", "name", "email", "tags", "address", "active"],
}
DOC = {
    "id": 12345,
    "name": "Ada Lovelace",
    "email": "ada@example.com",
    "tags": ["math", "engine", "poetry"],
    "address": {"street": "12 St James's Square", "city": "London", "zip": "SW1Y 4JH"},
    "active": True,
}


def trajectory(tokenizer, vocab: Vocabulary, guide) -> list[int]:
    """DOC tokenized in the whitespace style this guide's language uses (xgrammar's compact JSON
    is ``", "``/``": "``; outlines' lowering with any_whitespace=False has no whitespace)."""
    for separators in ((", ", ": "), (",", ":")):
        ids = tokenizer.encode(json.dumps(DOC, separators=separators), add_special_tokens=False)
        ids.append(vocab.eos_ids[0])
        m = guide.matcher()
        if all(m.accept_token(t) for t in ids):
            return ids
    raise SystemExit("no whitespace style of DOC is accepted by the guide")


def naive_loop(xgr_info, compiled, traj, batch: int, steps: int) -> tuple[float, float]:
    guided = list(range(0, batch, 2))
    matchers = {i: xgr.GrammarMatcher(compiled) for i in guided}
    pos = {i: (i * 7) % (len(traj) - 1) for i in guided}
    for i in guided:
        for t in traj[: pos[i]]:
            matchers[i].accept_token(t)
    fill_apply = accept = 0.0
    for _ in range(steps):
        logits = torch.randn(batch, xgr_info.vocab_size)
        t0 = time.perf_counter()
        bitmask = xgr.allocate_token_bitmask(batch, xgr_info.vocab_size)
        for i in guided:
            matchers[i].fill_next_token_bitmask(bitmask, i)
        xgr.apply_token_bitmask_inplace(logits, bitmask, indices=guided)
        t1 = time.perf_counter()
        for i in guided:
            t = traj[pos[i]]
            matchers[i].accept_token(t)
            pos[i] += 1
            if pos[i] == len(traj):
                matchers[i].reset()
                pos[i] = 0
        t2 = time.perf_counter()
        fill_apply += t1 - t0
        accept += t2 - t1
    return fill_apply / steps, accept / steps


def ours(vocab, spec, backend, traj, batch: int, steps: int) -> tuple[float, float]:
    mgr = GuidedDecodingManager(vocab, backend=backend, fill_threads=2, parallel_fill_threshold=8)
    rows = [GuidedRow("bench", i, spec) if i % 2 == 0 else None for i in range(batch)]
    pos = {}
    for i, r in enumerate(rows):
        if r is None:
            continue
        m = mgr.matcher_for(r.session_id, r.seq_id, spec)
        pos[i] = (i * 7) % (len(traj) - 1)
        for t in traj[: pos[i]]:
            m.accept_token(t)
    fill_apply = accept = 0.0
    for _ in range(steps):
        logits = torch.randn(batch, vocab.vocab_size)
        tokens = [traj[pos[i]] if i in pos else 0 for i in range(batch)]
        t0 = time.perf_counter()
        mgr.fill_and_apply(logits, rows)
        t1 = time.perf_counter()
        mgr.accept_tokens(tokens, rows)
        t2 = time.perf_counter()
        for i in pos:
            pos[i] += 1
            if pos[i] == len(traj):
                mgr.matcher_for("bench", i, spec).reset()
                pos[i] = 0
        fill_apply += t1 - t0
        accept += t2 - t1
    mgr.close()
    return fill_apply / steps, accept / steps


def budget_flags(vocab, spec, traj, batch: int, steps: int) -> tuple[float, float]:
    """The LMDeploy agent's per-step read of its budget rows' ``budget_closed`` flags
    (``budget_report.row_flags``, every row a budget row): (wall, process CPU) seconds per step."""
    from tokenrails.engine_patch.lmdeploy.server.budget_report import row_flags
    from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager

    owner = LMDeployGuidedManager(None, vocab.vocab_size, vocab=vocab, backend="fsm")  # budget rows need the fsm
    mgr, steps, wall, cpu = owner.core(), min(steps, len(traj) - 1), 0.0, 0.0
    rows = [GuidedRow("bench", (i, 0), spec, max_tokens=len(traj) + 8) for i in range(batch)]
    for step in range(steps):  # every row walks the trajectory from its start
        mgr.fill_and_apply(torch.randn(batch, vocab.vocab_size), rows)
        mgr.accept_tokens([traj[step]] * batch, rows)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(100):
            assert len(row_flags(owner, rows)) == batch
        wall, cpu = wall + time.perf_counter() - t0, cpu + time.process_time() - c0
    mgr.close()
    return wall / steps / 100, cpu / steps / 100


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--backends", default="xgrammar,fsm")
    ap.add_argument("--tokenizers", default="smollm2,qwen2")
    ap.add_argument("--budget-flags", action="store_true", help="only the agent's budget-flag read per step")
    args = ap.parse_args()
    steps = 20 if args.quick else 60
    if args.budget_flags:
        tok = load_tokenizer("smollm2")
        vocab = Vocabulary.from_huggingface(tok)
        spec = GuideSpec.json_schema(SCHEMA, any_whitespace=False)
        traj = trajectory(tok, vocab, compile_guide(spec, vocab, backend="fsm"))
        for b in (1, 16, 64):
            wall, cpu = budget_flags(vocab, spec, traj, b, steps)
            print(f"budget flags batch {b}: {wall * 1e6:.1f} us wall, {cpu * 1e6:.1f} us CPU per step "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
        return
    batches = [1, 16, 64] if args.quick else [1, 16, 64, 256]
    rows = []
    for name in args.tokenizers.split(","):
        tok = load_tokenizer(name)
        vocab = Vocabulary.from_huggingface(tok)
        spec = GuideSpec.json_schema(SCHEMA, any_whitespace=False)
        xgr_guide = compile_guide(spec, vocab, backend="xgrammar")
        xgr_traj = trajectory(tok, vocab, xgr_guide)
        info = xgr_guide.grammar.tokenizer_info
        for backend in args.backends.split(","):
            try:
                traj = trajectory(tok, vocab, compile_guide(spec, vocab, backend=backend))
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(f"skip {backend}: {exc}", file=sys.stderr)
                continue
            for b in batches:
                runs_naive = [naive_loop(info, xgr_guide.grammar, xgr_traj, b, steps) for _ in range(3)]
                runs_ours = [ours(vocab, spec, backend, traj, b, steps) for _ in range(3)]
                nf = median([r[0] for r in runs_naive]); na = median([r[1] for r in runs_naive])
                of = median([r[0] for r in runs_ours]); oa = median([r[1] for r in runs_ours])
                rows.append([name, vocab.vocab_size, backend, b, nf * 1e3, of * 1e3, of / nf, na * 1e3, oa * 1e3,
                             (of + oa) / (nf + na)])
    print("per-step guided overhead, ms (half the rows guided, JSON schema); naive = fresh bitmask + serial xgrammar fill + xgrammar apply")
    print_table(["tokenizer", "vocab", "ours:backend", "batch", "naive fill+apply", "ours fill+apply", "ratio",
                 "naive accept", "ours accept", "total ratio"], rows)


if __name__ == "__main__":
    main()
