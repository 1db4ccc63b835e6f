"""What the budget rule (``budget="close"``) costs: compile + table time, and per-step guided time.

For each constraint (a few regexes, and the JSON Schemas of MaskBench subsets in
``../shared/data/jsonschemabench`` that the fsm backend compiles), on one vocabulary:

* compile: the fsm compile of the plain spec, and of the budget spec (the same DFA plus the
  distance table), each on a fresh manager;
* step: one decoding path per constraint (random allowed tokens, seeded, closed within
  ``--max-tokens`` by the budget rule itself), replayed token for token through the manager's
  ``fill_rows`` + ``accept_tokens`` three ways: plain guided; budget with room to spare (every
  step on the fast path: the median step, best of ``--rounds``); budget = the path's own length
  (its last steps are ones where the rule binds: their median time on first visit, a trie walk,
  and again with the restricted rows cached on the guide).

Usage: python bench/budget_close.py [--tokenizer smollm2] [--schemas 40] [--max-tokens 64]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load_tokenizer, print_table  # noqa: E402

import numpy as np  # noqa: E402

from tokenrails import GuideSpec, Vocabulary  # noqa: E402
from tokenrails.guided.budget import budget_spec, budget_table  # noqa: E402
from tokenrails.guided.errors import GuideError  # noqa: E402
from tokenrails.guided.manager import GuidedDecodingManager  # noqa: E402
from tokenrails.guided.sequence import GuidedRow, StepStatus  # noqa: E402

_CANDIDATES = (Path(__file__).resolve().parents[2] / "shared", Path("/work/shared"))  # ../shared of a checkout
DATA = next((c for c in _CANDIDATES if c.exists()), _CANDIDATES[0]) / "data" / "jsonschemabench"
REGEXES = {
    "email": r"[a-z0-9._%+-]{1,64}@[a-z0-9.-]{1,63}\.[a-z]{2,10}",
    "date": r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
    "phone": r"\(\d{3}\) \d{3}-\d{4}",
    "sentence": r"[A-Z][a-z ,]{10,200}\.",
}


def _schemas(limit: int) -> list[tuple[str, GuideSpec]]:
    out = []
    if not DATA.exists():
        return out
    for name in ("Glaiveai2K", "Github_easy"):
        path = DATA / f"maskbench_{name}.json"
        if not path.exists():
            continue
        items = json.loads(path.read_text())["items"]
        for k, item in enumerate(items[: limit // 2]):
            try:
                out.append((f"{name}[{k}]", GuideSpec.json_schema(item["schema"], any_whitespace=False)))
            except GuideError:
                continue
    return out


def _bits(row) -> np.ndarray:
    words = row.numpy().view(np.uint32)
    return np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))


def _path(mgr: GuidedDecodingManager, vocab: Vocabulary, spec: GuideSpec, max_tokens: int, seed: int) -> list[int]:
    """Random allowed tokens (EOS avoided while anything else is allowed) under the budget rule."""
    rng = np.random.default_rng(seed)
    row = GuidedRow("path", seed, spec, max_tokens=max_tokens)
    out = []
    eos = set(vocab.eos_ids)
    try:
        for _ in range(max_tokens):
            ids = [int(t) for t in _bits(mgr.fill_rows([row]).bitmask[0]) if t < vocab.vocab_size]
            other = [t for t in ids if t not in eos]
            tok = int(rng.choice(other)) if other else ids[0]
            status = mgr.accept_tokens([tok], [row])[0]
            assert not status.failed, status
            out.append(tok)
            if status.state is StepStatus.TERMINATED:
                return out
        raise AssertionError("the budget rule did not close the path")
    finally:
        mgr.release("path", seed)


def _replay(mgr: GuidedDecodingManager, spec: GuideSpec, tokens: list[int], max_tokens: int | None,
            tag: str) -> tuple[list[float], list[bool]]:
    """Per-step fill+accept times, and per step whether the budget rule bound (slow path)."""
    row = GuidedRow("replay", tag, spec, max_tokens=max_tokens)
    mgr.fill_rows([row])  # state creation (and its compile wait) outside the timed steps
    st = mgr.sequence("replay", tag)
    times, tight = [], []
    try:
        for tok in tokens:
            if st.budget is not None:
                tight.append(bool(st.budget.table.maxnext[st.matcher.state] > st.budget_left() - 1))
            t0 = time.perf_counter()
            mgr.fill_rows([row])
            mgr.accept_tokens([tok], [row])
            times.append(time.perf_counter() - t0)
    finally:
        mgr.release("replay", tag)
    return times, tight


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="smollm2")
    ap.add_argument("--schemas", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    local = DATA.parent / "tokenizers" / args.tokenizer
    if local.exists():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(local))
    else:
        tokenizer = load_tokenizer(args.tokenizer)
    vocab = Vocabulary.from_huggingface(tokenizer)
    specs = [(k, GuideSpec.regex(v)) for k, v in REGEXES.items()] + _schemas(args.schemas)
    warm = GuidedDecodingManager(vocab, compile_workers=1)  # per-vocabulary tables built once, untimed
    warm.get_compiled(GuideSpec.regex("[a-z]+").with_routing("fsm", fallback=False))
    warm.close()
    rows, ratios_fast, compile_ratio, slow_ratio_cold, slow_ratio_warm = [], [], [], [], []
    table_s, skipped = [], 0
    for name, spec in specs:
        plain = spec.with_routing("fsm", fallback=False)
        bspec = budget_spec(spec)
        m1 = GuidedDecodingManager(vocab, compile_workers=1)
        m2 = GuidedDecodingManager(vocab, compile_workers=1)
        try:
            t0 = time.perf_counter()
            guide = m1.get_compiled(plain)
            c_plain = time.perf_counter() - t0
            t0 = time.perf_counter()
            bguide = m2.get_compiled(bspec)
            c_budget = time.perf_counter() - t0
        except GuideError:
            skipped += 1
            m1.close(), m2.close()
            continue
        table = budget_table(bguide)
        t0 = time.perf_counter()
        budget_table(guide)  # the same table on the plain guide: its build time alone
        t_table = time.perf_counter() - t0
        if table.start > args.max_tokens:
            skipped += 1
            m1.close(), m2.close()
            continue
        tokens = _path(m2, vocab, bspec, args.max_tokens, 0)
        med = statistics.median
        plain_s = min(med(_replay(m1, plain, tokens, None, f"p{r}")[0]) for r in range(args.rounds))
        fast_s = min(med(_replay(m2, bspec, tokens, 1 << 20, f"f{r}")[0]) for r in range(args.rounds))
        table.clear_rows()
        cold, flags = _replay(m2, bspec, tokens, len(tokens), "cold")
        warm, _ = _replay(m2, bspec, tokens, len(tokens), "warm")
        slow_cold = [t for t, f in zip(cold, flags) if f]
        slow_warm = [t for t, f in zip(warm, flags) if f]
        ratios_fast.append(fast_s / plain_s)
        compile_ratio.append(c_budget / c_plain)
        table_s.append(t_table)
        if slow_cold:
            slow_ratio_cold.append(med(slow_cold) / plain_s)
            slow_ratio_warm.append(med(slow_warm) / plain_s)
        rows.append([name, guide.dfa.num_states, table.start, len(tokens), f"{c_plain * 1e3:.1f}",
                     f"{c_budget * 1e3:.1f}", f"{t_table * 1e3:.1f}", f"{plain_s * 1e6:.1f}", f"{fast_s * 1e6:.1f}",
                     f"{fast_s / plain_s:.2f}", len(slow_cold),
                     f"{med(slow_cold) * 1e6:.0f}" if slow_cold else "-",
                     f"{med(slow_warm) * 1e6:.0f}" if slow_warm else "-"])
        m1.close(), m2.close()
    print_table(["constraint", "states", "D(start)", "path", "compile ms", "+budget ms", "table ms",
                 "plain us/step", "budget us/step", "ratio", "tight steps", "tight us cold", "tight us warm"], rows)
    if rows:
        gm = lambda xs: float(np.exp(np.mean(np.log(xs))))  # noqa: E731
        print(f"\n{len(rows)} constraints ({skipped} skipped: not compiled by fsm, or shortest > max tokens); "
              f"vocabulary {args.tokenizer} ({vocab.vocab_size} ids)")
        print(f"per-step guided time (fill + accept, median), budget with room / plain: geomean "
              f"{gm(ratios_fast):.3f}, max {max(ratios_fast):.2f}")
        if slow_ratio_cold:
            print(f"steps where the budget binds (the path's last steps at budget = its length), / plain step: "
                  f"first visit geomean {gm(slow_ratio_cold):.2f}x, cached row geomean {gm(slow_ratio_warm):.2f}x")
        print(f"compile + table / plain fsm compile: geomean {gm(compile_ratio):.2f}x; table build median "
              f"{statistics.median(table_s) * 1e3:.1f} ms, max {max(table_s) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
