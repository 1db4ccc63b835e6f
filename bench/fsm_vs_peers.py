"""fsm backend vs outlines-core, xgrammar and llguidance on regular workloads, measured in one run.

For each vocabulary (smollm2 49k, llama3 128k, qwen2 152k from ../shared) and each workload
(email, ISO date-time, IPv4, phone, a choice of 5 and of 200 strings, outlines-lowered regexes of
three JSON schemas), every engine compiles the *same regex* (choices: the same strings) and
follows the same valid output token by token. Measured:

  (a) first   time to first mask: compile + first fill (fresh compile, caches off)
  (b) total   compile + every fill + every accept (+ EOS) for one full valid output
  (c) p50/p95 per-step fill: "cold" = the fills inside run (b) (our first visit of a state computes
              its row there), "warm" = a second matcher on the same compiled guide
  (d) mem     compiled-guide bytes as each engine reports them (ours after the run, rows included;
              outlines-core: pickled index; llguidance: not reported)

Per-vocabulary tables (our token trie, xgrammar TokenizerInfo, llguidance LLTokenizer,
outlines-core Vocabulary) are built once before timing, for every engine alike.
Ratios are ours/peer (< 1 = we are faster). Every row also gives (b) as process CPU time and the
load average: on a shared machine ``--stat min`` (fastest of ``--repeat`` runs instead of the
median) with the CPU-time ratio ("b/best cpu") is the less noisy figure.
Run: OMP_NUM_THREADS=1 python bench/fsm_vs_peers.py [--vocabs smollm2,llama3,qwen2] [--repeat 3] [--stat min]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

torch.set_num_threads(1)

from bench._common import load_tokenizer  # noqa: E402
from tokenrails import GuideSpec, Vocabulary, allocate_token_bitmask  # noqa: E402
from tokenrails.guided.backends.fsm_backend import FSMBackend  # noqa: E402
from tokenrails.guided.fsm.token_trie import token_trie  # noqa: E402
from tokenrails.guided.fsm.matcher import grammar_bytes  # noqa: E402
from tokenrails.guided.limits import GuideLimits  # noqa: E402

CHOICE5 = ["positive", "negative", "neutral", "mixed", "unknown"]
_WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
CHOICE200 = [f"{_WORDS[i % 10]} {_WORDS[(i // 10) % 10]} #{i:03d}" for i in range(200)]

SCHEMAS = {
    "json_person": ({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
        "email": {"type": "string", "format": "email"}}, "required": ["name", "age", "email"]},
        {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org"}),
    "json_order": ({"type": "object", "properties": {
        "id": {"type": "string", "format": "uuid"},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer"}, "price": {"type": "number"}},
            "required": ["sku", "qty", "price"]}, "minItems": 1, "maxItems": 5},
        "status": {"enum": ["new", "paid", "shipped"]}}, "required": ["id", "items", "status"]},
        {"id": "123e4567-e89b-12d3-a456-426614174000",
         "items": [{"sku": "A-1", "qty": 2, "price": 9.5}, {"sku": "B-22", "qty": 1, "price": 120}],
         "status": "paid"}),
    "json_event": ({"type": "object", "properties": {
        "title": {"type": "string"}, "date": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}},
        "public": {"type": "boolean"}, "location": {"anyOf": [{"type": "null"}, {"type": "string"}]}},
        "required": ["title", "date", "tags", "public", "location"]},
        {"title": "Launch review", "date": "2025-03-14", "tags": ["q1", "release"], "public": True,
         "location": None}),
}


def escape(text: str) -> str:
    """Escape only regex metacharacters (re.escape also escapes ' ' and '#', which xgrammar warns about)."""
    return "".join("\\" + c if c in ".^$*+?()[]{}|\\-" else c for c in text)


def workloads() -> list[tuple[str, str, str, list[str] | None]]:
    """(name, regex, valid text, choices or None)."""
    from outlines_core.json_schema import build_regex_from_schema

    out = [
        ("email", r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}", "john.doe@example.com", None),
        ("datetime", r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})",
         "2024-05-17T13:45:09.123+02:00", None),
        ("ipv4", r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
         "192.168.10.7", None),
        ("phone", r"\+?[0-9]{1,3}[ -]?\(?[0-9]{3}\)?[ -]?[0-9]{3}-[0-9]{4}", "+1 (555) 123-4567", None),
        ("choice5", "(" + "|".join(escape(c) for c in CHOICE5) + ")", "neutral", CHOICE5),
        ("choice200", "(" + "|".join(escape(c) for c in CHOICE200) + ")", CHOICE200[137], CHOICE200),
    ]
    for name, (schema, inst) in SCHEMAS.items():
        regex = build_regex_from_schema(json.dumps(schema))
        text = json.dumps(inst, separators=(", ", ": "))
        assert re.fullmatch(regex, text), name
        out.append((name, regex, text, None))
    return out


# ---- engines: each exposes compile(regex, choices) -> matcher-like with fill(bm)/accept(t) ----
class _MatcherEngine:
    """Engines whose matcher speaks tokenrails'/xgrammar's fill_next_token_bitmask/accept_token."""

    @staticmethod
    def fill(m, bm):
        m.fill_next_token_bitmask(bm, 0)

    @staticmethod
    def accept(m, t):
        return m.accept_token(t)


class Ours(_MatcherEngine):
    name = "fsm"

    def __init__(self, vocab: Vocabulary):
        self.vocab = vocab
        token_trie(vocab)
        grammar_bytes(vocab)
        self.backend = FSMBackend(vocab, GuideLimits())

    def compile(self, regex, choices):
        spec = GuideSpec.choice(choices) if choices else GuideSpec.regex(regex)
        guide = self.backend.compile(spec)
        return guide, guide.matcher

    @staticmethod
    def memory(guide):
        return guide.memory_bytes


class XGrammar(_MatcherEngine):
    name = "xgrammar"

    def __init__(self, tokenizer, vocab: Vocabulary):
        import xgrammar as xgr

        self.xgr = xgr
        info = xgr.TokenizerInfo(vocab.grammar_token_bytes(), xgr.VocabType.RAW, vocab_size=vocab.vocab_size,
                                 stop_token_ids=list(vocab.eos_ids))
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, regex, choices):
        g = self.compiler.compile_regex(regex)
        return g, lambda: self.xgr.GrammarMatcher(g)

    @staticmethod
    def memory(g):
        return int(g.memory_size_bytes)


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer, vocab: Vocabulary):
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.ll = llguidance
        self.llt = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab.vocab_size, eos_token=vocab.eos_ids[0])
        self._fill = llguidance.torch.fill_next_token_bitmask

    def compile(self, regex, choices):
        grammar = self.ll.LLMatcher.grammar_from_regex(regex)
        m0 = self.ll.LLMatcher(self.llt, grammar)
        if m0.is_error():
            raise RuntimeError(m0.get_error())
        first = [m0]

        def make():
            return first.pop() if first else self.ll.LLMatcher(self.llt, grammar)

        return grammar, make

    def fill(self, m, bm):
        self._fill(m, bm, 0)

    @staticmethod
    def accept(m, t):
        return m.consume_token(t) and not m.is_error()

    @staticmethod
    def memory(g):
        return None


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokenizer, vocab: Vocabulary):
        import outlines_core

        self.oc = outlines_core
        mapping: dict[bytes, list[int]] = {}
        for i, b in enumerate(vocab.token_bytes):
            if b and i not in vocab.special_ids:
                mapping.setdefault(b, []).append(i)
        self.vocabulary = outlines_core.Vocabulary(vocab.eos_ids[0], mapping)
        self.eos = vocab.eos_ids[0]

    def compile(self, regex, choices):
        index = self.oc.Index(regex, self.vocabulary)
        return index, lambda: self.oc.Guide(index)

    @staticmethod
    def fill(m, bm):
        m.write_mask_into(bm.data_ptr(), bm.numel(), 4)

    def accept(self, m, t):
        if t == self.eos:  # outlines-core has no transition on EOS: it is allowed iff finished
            return m.is_finished()
        try:
            m.advance(t, return_tokens=False)
            return True
        except ValueError:
            return False

    @staticmethod
    def memory(index):
        return len(pickle.dumps(index))


def run_once(engine, regex, choices, ids, eos, vocab_size):
    """One fresh compile + full guided output. Returns (first_s, total_s, fill_times, guide, make,
    ok, cpu_s) (cpu_s: process CPU time of the whole output)."""
    bm = allocate_token_bitmask(1, vocab_size)
    fills = []
    c0 = time.process_time()
    t0 = time.perf_counter()
    guide, make = engine.compile(regex, choices)
    m = make()
    t = time.perf_counter()
    engine.fill(m, bm)
    fills.append(time.perf_counter() - t)
    first = time.perf_counter() - t0
    ok = True
    for i, tok in enumerate(ids + [eos]):
        if i:
            t = time.perf_counter()
            engine.fill(m, bm)
            fills.append(time.perf_counter() - t)
        if not engine.accept(m, tok):
            ok = False
            break
    total = time.perf_counter() - t0
    return first, total, fills, guide, make, ok, time.process_time() - c0


def warm_fills(engine, make, ids, eos, vocab_size):
    bm = allocate_token_bitmask(1, vocab_size)
    m = make()
    fills = []
    for tok in ids + [eos]:
        t = time.perf_counter()
        engine.fill(m, bm)
        fills.append(time.perf_counter() - t)
        engine.accept(m, tok)
    return fills


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def med(values):
    s = sorted(values)
    return s[len(s) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocabs", default="smollm2,llama3,qwen2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--stat", choices=("median", "min"), default="median", help="of the --repeat runs")
    args = ap.parse_args()
    pick = med if args.stat == "median" else min
    loads = workloads()
    if args.only:
        keep = set(args.only.split(","))
        loads = [w for w in loads if w[0] in keep]
    rows = []
    for vname in args.vocabs.split(","):
        tok = load_tokenizer(vname)
        vocab = Vocabulary.from_huggingface(tok)
        eos = vocab.eos_ids[0]
        t = time.perf_counter()
        engines = [Ours(vocab)]
        ours_setup = time.perf_counter() - t
        engines += [XGrammar(tok, vocab), LLGuidance(tok, vocab), OutlinesCore(tok, vocab)]
        print(f"\n## {vname}: vocab_size={vocab.vocab_size}  (our per-vocabulary trie: {ours_setup*1e3:.0f} ms, once)")
        for wname, regex, text, choices in loads:
            ids = tok.encode(text, add_special_tokens=False)
            assert b"".join(vocab.token_bytes[i] for i in ids) == text.encode(), (vname, wname)
            res = {}
            for eng in engines:
                firsts, totals, cpus, cold = [], [], [], []
                ok = True
                guide = make = None
                for _ in range(args.repeat):
                    first, total, fills, guide, make, ok, cpu = run_once(eng, regex, choices, ids, eos, vocab.vocab_size)
                    if not ok:
                        break
                    firsts.append(first)
                    totals.append(total)
                    cpus.append(cpu)
                    cold += fills
                if not ok:
                    res[eng.name] = None
                    continue
                warm = warm_fills(eng, make, ids, eos, vocab.vocab_size)
                res[eng.name] = dict(first=pick(firsts), total=pick(totals), cpu=pick(cpus),
                                     cold50=pct(cold, .5), cold95=pct(cold, .95),
                                     warm50=pct(warm, .5), warm95=pct(warm, .95), mem=eng.memory(guide))
            rows.append((vname, wname, len(ids), res))
            _print_row(vname, wname, len(ids), res)
    _print_summary(rows)


def _fmt_ms(x):
    return "   REJ" if x is None else f"{x*1e3:7.2f}"


def _print_row(vname, wname, n, res):
    print(f"\n{vname:8s} {wname:11s} ({n} tokens)  load average {os.getloadavg()[0]:.2f}")
    print(f"  {'engine':14s} {'first ms':>9s} {'total ms':>9s} {'cpu ms':>8s} {'cold p50/p95 us':>17s} "
          f"{'warm p50/p95 us':>17s} {'mem KB':>9s}")
    for name, r in res.items():
        if r is None:
            print(f"  {name:14s} rejected the valid output (different match semantics)")
            continue
        mem = "n/a" if r["mem"] is None else f"{r['mem']/1024:.0f}"
        print(f"  {name:14s} {r['first']*1e3:9.2f} {r['total']*1e3:9.2f} {r['cpu']*1e3:8.2f} "
              f"{r['cold50']*1e6:8.1f}/{r['cold95']*1e6:8.1f} {r['warm50']*1e6:8.1f}/{r['warm95']*1e6:8.1f} {mem:>9s}")


def _ratio(a, b):
    return "   -" if a is None or b is None or b == 0 else f"{a / b:5.2f}"


def _print_summary(rows):
    print("\n## ratios ours/peer  (b = total guided time, a = first mask, c = warm p95 fill)")
    print(f"{'vocab':8s} {'workload':11s} {'b/best':>7s} {'cpu':>5s} {'b/xgr':>6s} {'b/llg':>6s} {'b/oc':>6s} {'a/xgr':>6s} {'c95/xgr':>8s} {'c95cold/xgr':>11s}")
    for vname, wname, _, res in rows:
        ours = res.get("fsm")
        if ours is None:
            print(f"{vname:8s} {wname:11s} ours rejected?!")
            continue
        peers = {k: v for k, v in res.items() if k != "fsm" and v is not None}
        best = min(v["total"] for v in peers.values()) if peers else None
        best_cpu = min(v["cpu"] for v in peers.values()) if peers else None
        g = lambda k, f: peers[k][f] if k in peers else None  # noqa: E731
        print(f"{vname:8s} {wname:11s} {_ratio(ours['total'], best):>7s} {_ratio(ours['cpu'], best_cpu):>5s} {_ratio(ours['total'], g('xgrammar', 'total')):>6s} "
              f"{_ratio(ours['total'], g('llguidance', 'total')):>6s} {_ratio(ours['total'], g('outlines-core', 'total')):>6s} "
              f"{_ratio(ours['first'], g('xgrammar', 'first')):>6s} {_ratio(ours['warm95'], g('xgrammar', 'warm95')):>8s} "
              f"{_ratio(ours['cold95'], g('xgrammar', 'cold95')):>11s}")
    for vname in dict.fromkeys(r[0] for r in rows):  # one figure per vocabulary: geometric mean of b/best
        ratios = [_best_ratios(res) for v, _w, _n, res in rows if v == vname]
        ratios = [r for r in ratios if r is not None]
        if ratios:
            gm = [math.exp(sum(math.log(r[i]) for r in ratios) / len(ratios)) for i in (0, 1)]
            print(f"{vname:8s} {'geomean':11s} {gm[0]:7.2f} {gm[1]:5.2f}   (b/best over {len(ratios)} workloads; "
                  f"max {max(r[0] for r in ratios):.2f}, cpu max {max(r[1] for r in ratios):.2f})")


def _best_ratios(res) -> tuple[float, float] | None:
    """(ours / best peer total, the same in CPU time), or None when a side is missing."""
    ours = res.get("fsm")
    peers = [v for k, v in res.items() if k != "fsm" and v is not None]
    if ours is None or not peers:
        return None
    return ours["total"] / min(v["total"] for v in peers), ours["cpu"] / min(v["cpu"] for v in peers)


if __name__ == "__main__":
    main()
