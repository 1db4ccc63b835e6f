"""Speculative-decoding mask overhead: manager vs raw xgrammar loops, same run, same drafts.

Per verification step every guided row needs ``1 + k`` masks (after drafts ``< j``), then the
accepted tokens. Peers:
* ``raw``  : what vLLM-style integrations do with xgrammar directly — per row, fill / accept each
  draft, roll back, fresh bitmask each step, xgrammar's apply kernel; accept afterwards.
* ``fork`` : a matcher copy per row per step (``GrammarMatcher.fork``), advanced through the drafts.
Ours: ``mgr.fill_and_apply_spec`` + ``mgr.accept_tokens_spec`` (persistent buffer, threaded fill,
exact rollback). Every draft is valid (rows walk a real JSON document), all are accepted.

    python bench/spec_decode.py [--quick] [--tokenizers smollm2,llama3] [--k 4]
"""
from __future__ import annotations

import argparse
import json
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
        "id": {"type": "integer"}, "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city", "zip"]},
        "active": {"type": "boolean"},
    },
    "required": ["id", "name", "tags", "address", "active"],
}
DOC = {"id": 12345, "name": "Ada Lovelace", "tags": ["math", "engine", "poetry"],
       "address": {"city": "London", "zip": "SW1Y 4JH"}, "active": True}


def traj(tok) -> list[int]:
    return tok.encode(json.dumps(DOC), add_special_tokens=False)  # stops before EOS: rows never end


class Walk:
    """Per-row position along the trajectory; a step consumes k drafts + 1 bonus token."""

    def __init__(self, n: int, path: list[int], k: int):
        self.path, self.k = path, k
        self.pos = [(i * 5) % (len(path) - k - 2) for i in range(n)]

    def drafts(self, i: int) -> list[int]:
        return self.path[self.pos[i]: self.pos[i] + self.k]

    def accepted(self, i: int) -> list[int]:
        return self.path[self.pos[i]: self.pos[i] + self.k + 1]

    def advance(self, i: int) -> bool:
        """Move on; True when the row must restart (end of the document)."""
        self.pos[i] += self.k + 1
        if self.pos[i] + self.k + 1 > len(self.path):
            self.pos[i] = 0
            return True
        return False


def run_raw(info, grammar, path, batch, k, steps, fork: bool) -> float:
    ms = [xgr.GrammarMatcher(grammar) for _ in range(batch)]
    w = Walk(batch, path, k)
    for i, m in enumerate(ms):
        for t in path[: w.pos[i]]:
            m.accept_token(t)
    total = 0.0
    for _ in range(steps):
        logits = torch.randn(batch * (k + 1), info.vocab_size)
        t0 = time.perf_counter()
        bitmask = xgr.allocate_token_bitmask(batch * (k + 1), info.vocab_size)
        for i, m in enumerate(ms):
            d = w.drafts(i)
            cur = m.fork() if fork else m
            for j in range(k + 1):
                cur.fill_next_token_bitmask(bitmask, i * (k + 1) + j)
                if j < k:
                    cur.accept_token(d[j])
            if not fork:
                m.rollback(k)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        for i, m in enumerate(ms):
            for t in w.accepted(i):
                m.accept_token(t)
        total += time.perf_counter() - t0
        for i, m in enumerate(ms):
            if w.advance(i):
                m.reset()
    return total / steps


def run_ours(vocab, spec, path, batch, k, steps) -> float:
    mgr = GuidedDecodingManager(vocab, backend="xgrammar", fill_threads=2, parallel_fill_threshold=8)
    rows = [GuidedRow("b", i, spec) for i in range(batch)]
    w = Walk(batch, path, k)
    for i, r in enumerate(rows):
        m = mgr.matcher_for("b", i, spec)
        for t in path[: w.pos[i]]:
            m.accept_token(t)
    total = 0.0
    for _ in range(steps):
        logits = torch.randn(batch * (k + 1), vocab.vocab_size)
        drafts = [w.drafts(i) for i in range(batch)]
        acc = [w.accepted(i) for i in range(batch)]
        t0 = time.perf_counter()
        mgr.fill_and_apply_spec(logits, rows, drafts)
        st = mgr.accept_tokens_spec(acc, rows)
        total += time.perf_counter() - t0
        assert all(not s.failed for s in st), st
        for i in range(batch):
            if w.advance(i):
                mgr.release("b", i)  # fresh state at the start of the document
    mgr.close()
    return total / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tokenizers", default="smollm2,llama3")
    ap.add_argument("--k", type=int, default=4)
    args = ap.parse_args()
    steps = 15 if args.quick else 40
    batches = [1, 8, 32] if args.quick else [1, 8, 32, 64]
    table = []
    for name in args.tokenizers.split(","):
        tok = load_tokenizer(name)
        vocab = Vocabulary.from_huggingface(tok)
        spec = GuideSpec.json_schema(SCHEMA, any_whitespace=False)
        guide = compile_guide(spec, vocab, backend="xgrammar")
        path = traj(tok)
        info = guide.grammar.tokenizer_info
        for b in batches:
            raw = median([run_raw(info, guide.grammar, path, b, args.k, steps, fork=False) for _ in range(3)])
            frk = median([run_raw(info, guide.grammar, path, b, args.k, steps, fork=True) for _ in range(3)])
            ours = median([run_ours(vocab, spec, path, b, args.k, steps) for _ in range(3)])
            table.append([name, vocab.vocab_size, b, args.k, raw * 1e3, frk * 1e3, ours * 1e3, ours / raw, ours / frk])
    print(f"speculative verification step (fill {args.k}+1 masks per row, apply, accept {args.k}+1 tokens), ms; ratio < 1 = ours faster")
    print_table(["tokenizer", "vocab", "batch", "k", "raw xgrammar", "fork xgrammar", "ours", "ours/raw", "ours/fork"], table)


if __name__ == "__main__":
    main()
