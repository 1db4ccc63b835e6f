"""End-to-end CPU benchmark on the embedded SmolLM2-135M: what constraining costs, what jump-forward saves.

    OMP_NUM_THREADS=1 python bench/e2e_cpu.py [--quick] [--threads 1]

1. Overhead of guided decoding (goal <= 3%). Peer: the same decode loop, unconstrained, in the
   same run. To compare identical work, the guided run's tokens are *replayed* in both: every
   step does the same forward pass, argmax and feed; the guided replay additionally fills the
   bitmasks, applies them (one kernel call) and advances the matchers.
   Also: model.generate() with and without GuidedLogitsProcessor (time per generated step).
2. Jump-forward on a schema with long fixed keys and enums (goal >= 30% fewer forward passes):
   forward passes and wall time, on vs off, both outputs validated.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from tokenrails import GuideSpec  # noqa: E402
from tokenrails.engine_patch.hf.decode import _Batch  # noqa: E402  (the loop's batched KV feed)
from tokenrails.engine_patch.transformers import (  # noqa: E402
    GuidedLogitsProcessor,
    encode_prompts,
    generate_guided,
    logits_width,
    manager_for,
    vocabulary_for,
)
from tokenrails.guided.sequence import GuidedRow  # noqa: E402
from tokenrails.demo_model import load_model  # noqa: E402

EXTRACT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "city": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "status": {"enum": ["active", "suspended", "closed"]},
    },
    "required": ["name", "city", "age", "status"],
    "additionalProperties": False,
}
EXTRACT_PROMPTS = [
    "Extract as JSON: Maria Lopez, 34, lives in Madrid, account active.",
    "Extract as JSON: Tom Becker, 51, from Berlin, account suspended.",
    "Extract as JSON: Aiko Tanaka, 28, Osaka, her account was closed.",
    "Extract as JSON: Jean Dupont, 45, based in Lyon, active customer.",
]
LONG_KEYS = {
    "type": "object",
    "properties": {
        "customer_identification_number": {"type": "integer", "minimum": 0, "maximum": 99999},
        "preferred_contact_channel": {"enum": ["electronic_mail_message", "telephone_call_in_office_hours"]},
        "subscription_renewal_status": {"enum": ["renewed_automatically", "cancelled_by_customer"]},
        "marketing_communication_consent": {"type": "boolean"},
    },
    "required": ["customer_identification_number", "preferred_contact_channel",
                 "subscription_renewal_status", "marketing_communication_consent"],
    "additionalProperties": False,
}
LONG_PROMPTS = [
    "Customer 4521 wants phone calls, cancelled the subscription, no marketing. Record as JSON.",
    "Customer 877 prefers email, renews automatically and accepts marketing. Record as JSON.",
    "Customer 30012 prefers email, cancelled, accepts marketing. Record as JSON.",
    "Customer 15 wants phone calls, renews automatically, refuses marketing. Record as JSON.",
]


@torch.inference_mode()
def replay(model, tok, prompts, tokens, rows, mgr) -> tuple[list[float], list[float]]:
    """Decode ``tokens`` (one list per row) step by step; guided when ``rows`` is given.

    Returns per-step wall times and, per step, the time spent in the guided calls alone.
    """
    pad = tok.pad_token_id
    batch = _Batch(model, pad)
    logits = batch.feed(encode_prompts(tok, prompts, chat=True))
    steps = max(len(t) for t in tokens)
    step_s, guided_s = [], []
    for s in range(steps):
        t0 = time.perf_counter()
        g = 0.0
        step_rows = [r if rows is not None and s < len(tokens[i]) else None
                     for i, r in enumerate(rows or [None] * len(prompts))]
        if rows is not None:
            g0 = time.perf_counter()
            mgr.fill_and_apply(logits, step_rows)
            g += time.perf_counter() - g0
        logits.argmax(dim=-1)  # same sampling work in both runs; then replay the recorded ids
        ids = [tokens[i][s] if s < len(tokens[i]) else pad for i in range(len(prompts))]
        if rows is not None:
            g0 = time.perf_counter()
            mgr.accept_tokens(ids, step_rows)
            g += time.perf_counter() - g0
        feed = [[ids[i]] if s < len(tokens[i]) else [] for i in range(len(prompts))]
        if any(feed) and s + 1 < steps:
            logits = batch.feed(feed)
        step_s.append(time.perf_counter() - t0)
        guided_s.append(g)
    if rows is not None:
        mgr.end_session(rows[0].session_id)
    return step_s, guided_s


def bench_overhead(lm, prompts, spec, repeats: int, max_new: int) -> dict:
    """Per-step minimum over interleaved repeats (robust to other processes on a shared box)."""
    model, tok = lm.model, lm.tokenizer
    vocab = vocabulary_for(tok, logits_width(model))
    mgr = manager_for(vocab)
    ref = generate_guided(model, tok, prompts, [spec] * len(prompts), max_new_tokens=max_new, chat=True,
                          jump_forward=False, manager=mgr)
    valid = sum(bool(r.valid) for r in ref.results)
    tokens = [r.token_ids + [vocab.eos_ids[0]] if r.finish_reason == "stop" else r.token_ids for r in ref.results]
    best: dict[str, list[float]] = {}
    guided_part: list[float] = []
    for k in range(repeats):
        for mode in (("plain", "guided") if k % 2 == 0 else ("guided", "plain")):
            rows = None if mode == "plain" else [GuidedRow(f"bench-{k}", i, spec) for i in range(len(prompts))]
            step_s, g = replay(model, tok, prompts, tokens, rows, mgr)
            best[mode] = step_s if mode not in best else [min(a, b) for a, b in zip(best[mode], step_s)]
            if rows is not None:
                guided_part = g if not guided_part else [min(a, b) for a, b in zip(guided_part, g)]
    return {"tokens": sum(len(t) for t in tokens), "valid": valid, "rows": len(prompts),
            "plain": sum(best["plain"]), "guided": sum(best["guided"]), "guided_part": sum(guided_part)}


@torch.inference_mode()
def bench_generate(lm, prompts, spec, repeats: int, max_new: int) -> dict:
    """model.generate() with vs without the processor, same prompts and the same number of steps.

    The guided call runs first and sets the step count; the plain call is forced to run exactly
    as many steps (min_new_tokens = max_new_tokens), so prefill and KV lengths match.
    """
    model, tok = lm.model, lm.tokenizer
    enc = encode_prompts(tok, prompts, chat=True)
    width = max(map(len, enc))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(e)) + e for e in enc])
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc])
    best = {"plain": float("inf"), "guided": float("inf"), "inside": float("inf")}
    steps = max_new
    for k in range(repeats):
        proc = GuidedLogitsProcessor([spec] * len(prompts), tok, vocab_size=logits_width(model))
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, logits_processor=[proc],
                             max_new_tokens=max_new, do_sample=False)
        best["guided"] = min(best["guided"], time.perf_counter() - t0)
        best["inside"] = min(best["inside"], proc.time_s)
        proc.finalize(out)
        steps = out.shape[1] - width
        t0 = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps,
                       do_sample=False)
        best["plain"] = min(best["plain"], time.perf_counter() - t0)
    return {**best, "steps": steps}


def bench_jump_forward(lm, prompts, spec, repeats: int, max_new: int) -> dict:
    model, tok = lm.model, lm.tokenizer
    out = {}
    for jf in (True, False):
        best = None
        for _ in range(repeats):
            rep = generate_guided(model, tok, prompts, [spec] * len(prompts), max_new_tokens=max_new,
                                  chat=True, jump_forward=jf)
            if best is None or rep.wall_s < best.wall_s:
                best = rep
        out[jf] = {
            "wall_s": best.wall_s,
            "batch_passes": best.forward_passes,
            "row_passes": sum(r.forward_passes for r in best.results),
            "forced": sum(r.forced_tokens for r in best.results),
            "tokens": best.new_tokens,
            "valid": sum(bool(r.valid) for r in best.results),
            "rows": len(best.results),
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rows and repeats (~1 min)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    lm = load_model(threads=args.threads)
    repeats = 2 if args.quick else 7
    rows = 2 if args.quick else 4
    max_new = 40 if args.quick else 64
    print(f"SmolLM2-135M float32 CPU, torch threads={torch.get_num_threads()}, rows={rows}, repeats={repeats}")

    ov = bench_overhead(lm, EXTRACT_PROMPTS[:rows], GuideSpec.json_schema(EXTRACT, any_whitespace=False), repeats, max_new)
    plain_tps, guided_tps = ov["tokens"] / ov["plain"], ov["tokens"] / ov["guided"]
    print("\n[1] guided vs unconstrained, our decode loop (identical replayed tokens; JSON schema)")
    print(f"    unconstrained {plain_tps:8.1f} tok/s | guided {guided_tps:8.1f} tok/s | "
          f"guided/unconstrained time = {ov['guided'] / ov['plain']:.3f} "
          f"(overhead {100 * (ov['guided'] / ov['plain'] - 1):+.1f}%, goal <= +3%) | valid {ov['valid']}/{ov['rows']}")
    print(f"    time inside the guided calls (fill + kernel + accept) / unconstrained time = "
          f"{ov['guided_part'] / ov['plain']:.4f} ({1000 * ov['guided_part'] / ov['tokens']:.3f} ms per token)")

    gen = bench_generate(lm, EXTRACT_PROMPTS[:rows], GuideSpec.json_schema(EXTRACT, any_whitespace=False), repeats, max_new)
    print(f"    model.generate(), {gen['steps']} steps, prefill included: "
          f"plain {gen['plain']:.2f} s | with GuidedLogitsProcessor {gen['guided']:.2f} s | "
          f"ratio {gen['guided'] / gen['plain']:.3f}")
    print(f"    time inside GuidedLogitsProcessor / plain generate time = {gen['inside'] / gen['plain']:.4f} "
          f"({1000 * gen['inside'] / gen['steps']:.2f} ms per step)")

    jf = bench_jump_forward(lm, LONG_PROMPTS[:rows], GuideSpec.json_schema(LONG_KEYS, any_whitespace=False),
                            1 if args.quick else 2, 192)
    on, off = jf[True], jf[False]
    print("\n[2] jump-forward, schema with long fixed keys and enums")
    for name, r in (("on ", on), ("off", off)):
        print(f"    {name}: {r['row_passes']:4d} row forward passes, {r['batch_passes']:4d} batched, "
              f"{r['forced']:4d} forced tokens, {r['tokens']:4d} tokens, {r['wall_s']:.2f} s, valid {r['valid']}/{r['rows']}")
    saved = 1 - on["row_passes"] / off["row_passes"]
    print(f"    forward passes on/off = {on['row_passes'] / off['row_passes']:.3f} ({100 * saved:.0f}% fewer, goal >= 30%); "
          f"wall time on/off = {on['wall_s'] / off['wall_s']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
