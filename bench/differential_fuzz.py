"""Nightly-style differential fuzzing: wrong accepts per backend over many checks, and typed errors
over many malformed requests. Not a benchmark of speed: it prints counts (checks, wrong accepts,
escapes) and how long they took.

    OMP_NUM_THREADS=1 python bench/differential_fuzz.py [--checks 100000] [--requests 100000] [--seed 1]

Checks: random regexes (oracle Python ``re``) and JSON Schemas (oracle ``jsonschema``) on every
backend (see ``tokenrails/testing.py``). Requests: random request bodies in every shape
``tokenrails.spec_from_request`` reads, compiled on ``auto``; any exception that is not a ``GuideError``
is an escape.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import FIXTURE  # noqa: E402

import tokenrails as tr  # noqa: E402
from tokenrails.testing import Tally, check_spec, random_regex, random_schema, regex_case, schema_case  # noqa: E402

BACKENDS = ["auto", "fsm", "xgrammar", "llguidance"]
MAX_MASK_S = 1.0  # a walk whose mask takes longer is cut and reported (a stall finding, not a wrong accept)
SLOW_SPEC_S = 2.0  # one spec's checks on one backend (compile + 8 texts + 2 walks of <= 48 masks)
_KEYS = ["type", "json_schema", "schema", "name", "strict", "regex_schema", "choice", "grammar", "structures",
         "triggers", "begin", "end", "format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
         "response_format", "structured_outputs", "enum", "pattern", "properties", "items", "required"]
_TYPES = ["json_schema", "json_object", "regex_schema", "regex", "choice", "grammar", "ebnf", "structural_tag",
          "text", "bogus"]


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 3 else 5)
    if kind == 0:
        return rng.choice([None, True, False, 0, -1, 2**70, 1.5, float("nan")])
    if kind == 1:
        return rng.choice(_TYPES + ["", "a", "root ::= \"x\"", "<a>", "\ud800", "x" * 50])
    if kind == 2:
        return random_regex(rng)
    if kind == 3:
        return random_schema(rng)
    if kind == 4:
        return rng.choice([[], {}, [1, 2], ["a", "b"]])
    if kind in (5, 6):
        return {rng.choice(_KEYS): random_value(rng, depth + 1) for _ in range(rng.randint(1, 4))}
    if kind == 7:
        return {"type": rng.choice(_TYPES), **{rng.choice(_KEYS): random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}}
    return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def fuzz_requests(vocab, count: int, rng: random.Random) -> tuple[int, list]:
    escapes = []
    for _ in range(count):
        body = random_value(rng)
        try:
            spec = tr.spec_from_request(body)
            if spec is not None:
                tr.compile_guide(spec, vocab, "auto")
        except tr.GuideError:
            pass
        except Exception as exc:  # noqa: BLE001 - what we count
            escapes.append((type(exc).__name__, str(exc)[:120], repr(body)[:200]))
    return count, escapes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checks", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=3600, help="stop the differential part after this long")
    ap.add_argument("--trace", default=None, help="write each (backend, spec) to this file before checking it")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(FIXTURE))
    vocab = tr.Vocabulary.from_huggingface(tok)
    encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    decode = lambda ids: tok.decode(ids, clean_up_tokenization_spaces=False)  # noqa: E731
    rng = random.Random(args.seed)
    totals = {b: Tally() for b in BACKENDS}
    start = time.perf_counter()
    next_report = 5_000
    slow: list[tuple] = []
    while sum(t.checks for t in totals.values()) < args.checks and time.perf_counter() - start < args.seconds:
        make = regex_case if rng.random() < 0.5 else schema_case
        spec, oracle, texts = make(rng)
        for backend in BACKENDS:
            if args.trace:
                with open(args.trace, "w") as fh:  # the last one is what a hang is stuck on
                    fh.write(f"{backend}\t{spec.kind}\t{spec.payload}\n")
            t0 = time.perf_counter()
            totals[backend].merge(check_spec(spec, oracle, texts, vocab, encode, decode, backend, rng,
                                             max_mask_s=MAX_MASK_S))
            if time.perf_counter() - t0 > SLOW_SPEC_S:  # a finding of its own: slow masks or compiles
                slow.append((backend, spec.kind, spec.payload[:300], round(time.perf_counter() - t0, 1)))
                print(f"  slow: {slow[-1]}", flush=True)
        done = sum(t.checks for t in totals.values())
        if done >= next_report:
            wrong = sum(len(t.wrong_accepts) for t in totals.values())
            print(f"  ... {done} checks, {wrong} wrong accepts, {time.perf_counter() - start:.0f} s", flush=True)
            next_report += 5_000
    print(f"differential: {sum(t.checks for t in totals.values())} checks in {time.perf_counter() - start:.0f} s, "
          f"seed {args.seed}")
    for backend, t in totals.items():
        print(f"  {backend:10s} checks {t.checks:7d}  compiled specs {t.compiled_specs:5d}  refused {t.refused_specs:5d}  "
              f"wrong accepts {len(t.wrong_accepts)}")
        for case in t.wrong_accepts[:5]:
            print(f"      {case}")
    print(f"  specs slower than {SLOW_SPEC_S} s on one backend: {len(slow)}")
    for backend, t in totals.items():
        if t.slow_walks:
            print(f"  {backend}: {len(t.slow_walks)} walks cut at a mask > {MAX_MASK_S} s, e.g. {t.slow_walks[0]}")
    start = time.perf_counter()
    count, escapes = fuzz_requests(vocab, args.requests, rng)
    print(f"requests: {count} fuzzed in {time.perf_counter() - start:.0f} s, non-GuideError escapes: {len(escapes)}")
    for case in escapes[:10]:
        print(f"      {case}")


if __name__ == "__main__":
    main()
