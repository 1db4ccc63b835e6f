"""Per-step mask fill of a batch of llguidance matchers: per-row loop vs native batch fill.

    python bench/llguidance_fill.py [--tokenizer qwen2] [--batch 16 64] [--repeat 30]

Matchers sit at random mid-generation states of a few JSON schemas / regexes. "before" replays
the previous per-row fill (mask, then a torch AND over the whole row and ``row.any()``) in a
loop, which is what the batched step ran before this backend had a batch fill; "per-row" is the
generic ``Matcher.batch_fill`` loop over today's ``fill_next_token_bitmask``; "batch" is
``LLGuidanceMatcher.batch_fill`` (one ``LLExecutor`` call + one vectorised special-token AND),
"raw" is llguidance's own ``fill_next_token_bitmask_par`` on the same matchers without our
special-token handling (the peer floor). Ratios are from the same run.
"""
from __future__ import annotations

import argparse
import random
import sys

from _common import load_tokenizer, median, print_table

import llguidance.torch as llt
import torch

sys.path.insert(0, str(__import__("_common").REPO))
from tokenrails import GuideSpec, Vocabulary, allocate_token_bitmask, compile_guide  # noqa: E402
from tokenrails.guided.backend import Matcher  # noqa: E402
from tokenrails.guided.backends.llguidance_backend import LLGuidanceMatcher, _executor  # noqa: E402

SPECS = [
    GuideSpec.json_schema({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "age", "tags"]}),
    GuideSpec.json_schema({"type": "array", "items": {"type": "object", "properties": {
        "id": {"type": "integer"}, "ok": {"type": "boolean"}, "note": {"type": "string"}}}}),
    GuideSpec.json_object(),
    GuideSpec.regex(r"[A-Za-z ]{1,40}\. [0-9]{1,6}"),
]


def matchers(vocab: Vocabulary, n: int, seed: int) -> list[LLGuidanceMatcher]:
    rng = random.Random(seed)
    guides = [compile_guide(s, vocab, "llguidance") for s in SPECS]
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    out = []
    for i in range(n):
        m = guides[i % len(guides)].matcher()
        for _ in range(rng.randrange(1, 25)):
            m.fill_next_token_bitmask(bm, 0)
            bits = (bm[0].to(torch.int64).unsqueeze(-1) >> torch.arange(32)) & 1
            ids = [t for t in torch.nonzero(bits.reshape(-1)[: vocab.vocab_size]).reshape(-1).tolist()
                   if t not in vocab.eos_ids]
            if not ids:
                break
            m.accept_token(rng.choice(ids))
        out.append(m)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="qwen2")
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    vocab = Vocabulary.from_huggingface(load_tokenizer(args.tokenizer))
    rows_out = []
    for b in args.batch:
        ms = matchers(vocab, b, seed=b)
        bm = allocate_token_bitmask(b, vocab.vocab_size)
        rows = list(range(b))
        raw = [(m._m, r) for m, r in zip(ms, rows)]
        ex = _executor()
        words = ms[0]._guide.allowed_words

        def before() -> None:
            for m, r in zip(ms, rows):
                row = bm[r]
                m._m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)
                if not m._m.is_error():
                    row.bitwise_and_(words)
                    bool(row.any())

        fns = {
            "before": before,
            "per-row": lambda: Matcher.batch_fill(ms, bm, rows),
            "batch": lambda: LLGuidanceMatcher.batch_fill(ms, bm, rows),
            "raw": lambda: llt.fill_next_token_bitmask_par(ex, raw, bm),
        }
        times: dict[str, list[float]] = {k: [] for k in fns}
        import time
        for f in fns.values():  # warm-up (lazy lexer states)
            for _ in range(3):
                f()
        for _ in range(args.repeat):  # interleaved: shared-machine noise hits every variant alike
            for k, f in fns.items():
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
        med = {k: median(v) * 1e3 for k, v in times.items()}
        rows_out.append([b, f"{med['before']:.3f}", f"{med['per-row']:.3f}", f"{med['batch']:.3f}",
                         f"{med['raw']:.3f}", f"{med['before'] / med['batch']:.2f}x",
                         f"{med['per-row'] / med['batch']:.2f}x", f"{med['batch'] / med['raw']:.2f}"])
    print(f"tokenizer {args.tokenizer} ({vocab.vocab_size} ids), LLExecutor threads: default, "
          f"median of {args.repeat} (ms per step)")
    print_table(["B", "before ms", "per-row ms", "batch ms", "raw llg par ms", "before/batch",
                 "per-row/batch", "batch/raw"], rows_out)


if __name__ == "__main__":
    main()
