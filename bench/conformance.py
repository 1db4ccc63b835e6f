"""JSON-Schema conformance on MaskBench (and the JSON-Schema-Test-Suite), tokenrails vs raw peers.

Passing rule (MaskBench): the guide compiles, every valid instance is accepted token by token
with EOS allowed at the end, and every invalid instance is rejected (some token or the final EOS
is not allowed). A schema a backend cannot enforce must fail with a clear error; accepting an
invalid instance is a *wrong accept* — the one number that must be zero for tokenrails.

Instances are tokenized from ``json.dumps(data)`` (Python's default ``", "``/``": "``
separators, ASCII escapes) with the chosen tokenizer, without special tokens. tokenrails
backends and raw llguidance compile with flexible whitespace (any JSON whitespace, both accept the
json.dumps form); raw outlines-core uses its default whitespace ``[ ]?`` which also covers it.

    python bench/conformance.py --limit 40                 # every subset, 40 sampled schemas each
    python bench/conformance.py --subset Handwritten --backends auto,xgrammar,llguidance
    python bench/conformance.py --jsts ../JSON-Schema-Test-Suite/tests/draft2020-12
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import REPO, load_tokenizer, p, print_table  # noqa: E402

import torch  # noqa: E402

MASKBENCH = REPO.parent / "shared" / "data" / "jsonschemabench"
PEERS = ("raw-llguidance", "raw-outlines")


@dataclass
class Item:
    subset: str
    name: str
    schema: Any
    tests: list[tuple[Any, bool]]


@dataclass
class Stats:
    schemas: int = 0
    passed: int = 0
    compile_errors: Counter = field(default_factory=Counter)
    wrong_accepts: int = 0          # invalid instances accepted (instances)
    unsafe_schemas: int = 0         # schemas with >= 1 wrong accept
    wrong_rejects: int = 0          # valid instances rejected (instances)
    compile_s: list[float] = field(default_factory=list)
    mask_s: list[float] = field(default_factory=list)


# ---- data --------------------------------------------------------------------------------
def load_maskbench(subsets: list[str] | None) -> list[Item]:
    items: list[Item] = []
    for path in sorted(MASKBENCH.glob("maskbench_*.json")):
        doc = json.loads(path.read_text())
        if subsets and doc["subset"] not in subsets:
            continue
        for i, it in enumerate(doc["items"]):
            tests = [(t["data"], bool(t["valid"])) for t in it.get("tests") or []]
            if tests:
                items.append(Item(doc["subset"], it.get("file") or f"{doc['subset']}/{i}", it["schema"], tests))
    return items


def load_jsts(root: Path) -> list[Item]:
    """JSON-Schema-Test-Suite layout: files of ``[{description, schema, tests: [{data, valid}]}]``."""
    items: list[Item] = []
    for path in sorted(root.rglob("*.json")):
        try:
            groups = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if not isinstance(groups, list):
            continue
        subset = "jsts/" + str(path.relative_to(root).with_suffix(""))
        for g in groups:
            if isinstance(g, dict) and "schema" in g and g.get("tests"):
                tests = [(t["data"], bool(t["valid"])) for t in g["tests"]]
                items.append(Item(subset, f"{subset}: {g.get('description', '')}", g["schema"], tests))
    return items


# ---- evaluation --------------------------------------------------------------------------
def _bit(row: torch.Tensor, t: int) -> bool:
    return bool((int(row[t // 32]) >> (t % 32)) & 1)


class TokenrailsRunner:
    """compile_guide + Matcher, exactly the production path."""

    def __init__(self, vocab, backend: str):
        self.vocab, self.backend = vocab, backend

    def compile(self, schema: Any):
        from tokenrails import GuideSpec, compile_guide

        return compile_guide(GuideSpec.json_schema(schema), self.vocab, self.backend)

    def run(self, guide, ids: list[int], bitmask: torch.Tensor, mask_s: list[float]) -> bool:
        m = guide.matcher()
        eos = self.vocab.eos_ids[0]
        for t in ids + [eos]:
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(bitmask, 0)
            mask_s.append(time.perf_counter() - t0)
            if not _bit(bitmask[0], t):
                return False
            if not m.accept_token(t):
                return False
        return True


class RawLLGuidance:
    """llguidance as its docs show it: HF tokenizer, default JSON options."""

    def __init__(self, tok, vocab_size: int):
        import llguidance as llg
        import llguidance.hf

        self.llg = llg
        self.t = llguidance.hf.from_tokenizer(tok, n_vocab=vocab_size)
        self.eos = self.t.eos_token

    def compile(self, schema: Any):
        from tokenrails.guided.errors import InvalidGuideError

        g = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema) if not isinstance(schema, str) else schema)
        err = self.llg.LLMatcher.validate_grammar(g, self.t)
        if err and not err.startswith("WARNING"):
            raise InvalidGuideError(err.splitlines()[0][:200])
        m = self.llg.LLMatcher(self.t, g, log_level=0)
        if m.is_error():
            raise InvalidGuideError(m.get_error().splitlines()[0][:200])
        return m

    def run(self, proto, ids: list[int], bitmask: torch.Tensor, mask_s: list[float]) -> bool:
        import llguidance.torch as llt

        m = proto.deep_copy()
        for t in ids + [self.eos]:
            t0 = time.perf_counter()
            llt.fill_next_token_bitmask(m, bitmask, 0)
            mask_s.append(time.perf_counter() - t0)
            if not _bit(bitmask[0], t) or not m.consume_token(t):
                return False
        return True


class RawOutlines:
    """outlines-core: schema → regex → token Index (its default whitespace ``[ ]?``)."""

    def __init__(self, vocab):
        import outlines_core as oc

        self.oc = oc
        eos = vocab.eos_ids[0]
        table: dict[bytes, list[int]] = defaultdict(list)
        for i, b in enumerate(vocab.token_bytes):
            if i not in vocab.special_ids and b:
                table[b].append(i)
        self.vocab = oc.Vocabulary(eos, dict(table))
        self.eos = eos

    def compile(self, schema: Any):
        from tokenrails.guided.errors import InvalidGuideError

        try:
            regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
            return self.oc.Index(regex, self.vocab)
        except Exception as exc:  # noqa: BLE001 - peers report errors as plain exceptions
            raise InvalidGuideError(str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__) from exc

    def run(self, index, ids: list[int], bitmask: torch.Tensor, mask_s: list[float]) -> bool:
        g = self.oc.Guide(index)
        row = bitmask[0]
        for t in ids + [self.eos]:
            t0 = time.perf_counter()
            g.write_mask_into(row.data_ptr(), row.numel(), 4)
            mask_s.append(time.perf_counter() - t0)
            if not _bit(row, t):
                return False
            if t == self.eos:
                return True
            try:
                g.advance(t, return_tokens=False)
            except Exception:  # noqa: BLE001
                return False
        return True


def evaluate(items: list[Item], runners: dict[str, Any], tok, vocab_size: int,
             verbose: bool, details: list[dict]) -> dict[tuple[str, str], Stats]:
    from tokenrails.guided.errors import GuideError

    stats: dict[tuple[str, str], Stats] = defaultdict(Stats)
    bitmask = torch.zeros((1, (vocab_size + 31) // 32), dtype=torch.int32)
    encoded = {}
    for n, item in enumerate(items):
        tests = []
        for data, valid in item.tests:
            text = json.dumps(data)
            tests.append((tok.encode(text, add_special_tokens=False), valid))
        encoded[n] = tests
    for name, runner in runners.items():
        for n, item in enumerate(items):
            st = stats[(item.subset, name)]
            st.schemas += 1
            rec = {"backend": name, "subset": item.subset, "schema": item.name}
            t0 = time.perf_counter()
            try:
                guide = runner.compile(item.schema)
            except GuideError as exc:
                st.compile_errors[type(exc).__name__] += 1
                rec["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                details.append(rec)
                continue
            except Exception as exc:  # noqa: BLE001 - a crash is a bug: count it loudly
                st.compile_errors[f"CRASH:{type(exc).__name__}"] += 1
                rec["error"] = f"CRASH {type(exc).__name__}: {str(exc)[:200]}"
                details.append(rec)
                continue
            st.compile_s.append(time.perf_counter() - t0)
            wa = wr = 0
            for ids, valid in encoded[n]:
                ok = runner.run(guide, ids, bitmask, st.mask_s)
                if ok and not valid:
                    wa += 1
                elif valid and not ok:
                    wr += 1
            st.wrong_accepts += wa
            st.wrong_rejects += wr
            st.unsafe_schemas += wa > 0
            st.passed += (wa == 0 and wr == 0)
            rec.update(wrong_accepts=wa, wrong_rejects=wr)
            details.append(rec)
            if verbose and wa:
                print(f"  WRONG ACCEPT {name} {item.name}", file=sys.stderr)
    return stats


def report(stats: dict[tuple[str, str], Stats], backends: list[str]) -> None:
    subsets = sorted({s for s, _ in stats})
    rows = []
    totals: dict[str, Stats] = defaultdict(Stats)
    for subset in subsets + ["TOTAL"]:
        best_peer = max((stats[(subset, b)].passed for b in backends if b in PEERS and (subset, b) in stats),
                        default=0) if subset != "TOTAL" else max((totals[b].passed for b in backends if b in PEERS), default=0)
        for b in backends:
            st = totals[b] if subset == "TOTAL" else stats.get((subset, b))
            if st is None:
                continue
            if subset != "TOTAL":
                t = totals[b]
                t.schemas += st.schemas
                t.passed += st.passed
                t.compile_errors.update(st.compile_errors)
                t.wrong_accepts += st.wrong_accepts
                t.unsafe_schemas += st.unsafe_schemas
                t.wrong_rejects += st.wrong_rejects
                t.compile_s += st.compile_s
                t.mask_s += st.mask_s
            errs = ",".join(f"{k}={v}" for k, v in sorted(st.compile_errors.items())) or "-"
            ratio = (st.passed / best_peer) if best_peer else float("nan")
            rows.append([subset, b, st.schemas, st.passed, ratio, errs, st.wrong_accepts, st.unsafe_schemas,
                         st.wrong_rejects,
                         1e3 * p(st.compile_s, 0.5) if st.compile_s else float("nan"),
                         1e3 * p(st.compile_s, 0.99) if st.compile_s else float("nan"),
                         1e6 * p(st.mask_s, 0.5) if st.mask_s else float("nan"),
                         1e6 * p(st.mask_s, 0.99) if st.mask_s else float("nan")])
    print_table(["subset", "backend", "schemas", "pass", "pass/best_peer", "compile_errors", "wrong_acc",
                 "unsafe_sch", "wrong_rej", "compile_p50_ms", "compile_p99_ms", "mask_p50_us", "mask_p99_us"], rows)


def main(argv: Iterable[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subset", action="append", help="MaskBench subset (repeatable); default all")
    ap.add_argument("--limit", type=int, default=40, help="sample N schemas per subset (0 = all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backends", default="auto,xgrammar,fsm,llguidance,raw-llguidance,raw-outlines")
    ap.add_argument("--tokenizer", default="qwen2")
    ap.add_argument("--jsts", type=Path, help="a JSON-Schema-Test-Suite tests/<draft> directory")
    ap.add_argument("--no-maskbench", action="store_true")
    ap.add_argument("--no-encode", action="store_true",
                    help="do not give the llguidance backend the real tokenizer's encode()")
    ap.add_argument("--details", type=Path, help="write per-schema results (JSON lines)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(list(argv) if argv is not None else None)

    from tokenrails import Vocabulary
    from tokenrails.guided.registry import available_backends

    tok = load_tokenizer(args.tokenizer)
    vocab = Vocabulary.from_huggingface(tok)
    if not args.no_encode:
        vocab.encode = lambda s: tok.encode(s, add_special_tokens=False)  # type: ignore[attr-defined]
    items: list[Item] = [] if args.no_maskbench else load_maskbench(args.subset)
    if args.jsts:
        items += load_jsts(args.jsts)
    if args.limit:
        rng = random.Random(args.seed)
        by_subset: dict[str, list[Item]] = defaultdict(list)
        for it in items:
            by_subset[it.subset].append(it)
        items = [x for s in sorted(by_subset) for x in
                 (rng.sample(by_subset[s], args.limit) if len(by_subset[s]) > args.limit else by_subset[s])]
    have = set(available_backends())
    runners: dict[str, Any] = {}
    for b in args.backends.split(","):
        b = b.strip()
        if b == "raw-llguidance":
            runners[b] = RawLLGuidance(tok, vocab.vocab_size)
        elif b == "raw-outlines":
            runners[b] = RawOutlines(vocab)
        elif b == "auto" or b in have:
            runners[b] = TokenrailsRunner(vocab, b)
        else:
            print(f"skipping backend {b!r}: not installed", file=sys.stderr)
    print(f"# {len(items)} schemas, tokenizer {args.tokenizer} (vocab {vocab.vocab_size}), instances = json.dumps(data)")
    details: list[dict] = []
    stats = evaluate(items, runners, tok, vocab.vocab_size, args.verbose, details)
    report(stats, list(runners))
    if args.details:
        args.details.write_text("\n".join(json.dumps(d) for d in details) + "\n")


if __name__ == "__main__":
    main()
