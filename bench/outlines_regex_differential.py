"""Differential check: the shim's ``outlines.fsm.regex`` against outlines 0.0.46's own module.

Fetches outlines 0.0.46's source distribution at run time (nothing of outlines is committed),
loads its ``outlines/fsm/regex.py`` on its own (it needs numba, interegular, numpy, tqdm), and
runs both on the same random regexes: deterministic relabelling, byte-level automata (with and
without ``keep_utf8``), unions of several automata with their part records, and the token index
over the embedded SmolLM2 vocabulary. Prints how many cases agree exactly and lists the others
(expected: byte-level automata of regexes where a state has both a listed multi-byte character
and an ``anything_else`` edge, which outlines gets wrong and the shim does not), plus the index
timing of both.

    OMP_NUM_THREADS=1 .venv/bin/python bench/outlines_regex_differential.py [--cases 200] [--seed 0]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

ATOMS = ["a", "b", "é", "ü", "😀", "[ab]", "[a-c]", "[^a]", ".", "[^é]", "[é-ü]", " ", "\\.", "x", "[😀-😍]",
         "\\d", "\\w", "[^😀]"]


def load_theirs():
    """outlines 0.0.46's ``outlines/fsm/regex.py`` as a standalone module."""
    import outlines_suites

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "numba", "tqdm"],
                   check=True)
    path = outlines_suites.fetch("0.0.46") / "outlines" / "fsm" / "regex.py"
    spec = importlib.util.spec_from_file_location("outlines_0046_fsm_regex", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # numba's on-disk cache finds its functions by module name
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def random_regex(rng: random.Random, leaves: int) -> str:
    if leaves <= 1:
        return rng.choice(ATOMS)
    left = rng.randint(1, leaves - 1)
    a, b = random_regex(rng, left), random_regex(rng, leaves - left)
    shape = rng.randrange(6)
    if shape == 0:
        return a + b
    if shape == 1:
        return f"({a}|{b})"
    if shape == 2:
        return f"({a})?{b}"
    if shape == 3:
        return f"({a})+{b}"
    if shape == 4:
        return f"({a})*{b}"
    m = rng.randint(0, 2)
    return f"({a}){{{m},{m + rng.randint(0, 2)}}}{b}"


def as_outlines_byte_level(ours, char_fsm, keep: bool) -> tuple:
    """The shim's byte-level conversion with outlines' behaviour put back: a listed multi-byte
    character's byte path is dropped in states that also have an ``anything_else`` edge."""
    original = ours._trie_put
    ours._trie_put = lambda trie, keys, value, overwrite: original(trie, keys, value, True)
    try:
        return fsm_signature(ours.make_byte_level_fsm(char_fsm, keep))
    finally:
        ours._trie_put = original


def fsm_signature(fsm) -> tuple:
    return (fsm.initial, tuple(sorted(fsm.finals)), tuple(sorted((s, tuple(sorted(r.items())))
                                                                for s, r in fsm.map.items())),
            tuple(sorted((str(k), v) for k, v in fsm.alphabet._symbol_mapping.items())))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--index-cases", type=int, default=20, help="cases that also build the token index")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    # a fresh numba cache: its on-disk entries are keyed by module and must not outlive this run
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="numba-outlines-")

    import interegular
    import numba
    from transformers import AutoTokenizer

    from tokenrails.compat.outlines.fsm import regex as ours
    from tokenrails.compat.outlines.models.transformers import TransformerTokenizer

    theirs = load_theirs()
    rng = random.Random(args.seed)
    tokenizer = TransformerTokenizer(AutoTokenizer.from_pretrained(str(ROOT / "tests" / "fixtures" / "smollm2")))
    vocab_ours, _ = ours.reduced_vocabulary(tokenizer)
    vocab_theirs = numba.typed.List()
    for text, ids in vocab_ours:
        vocab_theirs.append((text, ids))

    checks = {"deterministic": [0, 0], "byte_level": [0, 0], "byte_level_utf8": [0, 0], "union": [0, 0],
              "index": [0, 0]}
    differing: dict[str, list[str]] = {k: [] for k in checks}
    time_ours = time_theirs = 0.0

    explained = {"byte_level": 0, "byte_level_utf8": 0}

    def record(name: str, same: bool, pattern: str) -> None:
        checks[name][0 if same else 1] += 1
        if not same:
            differing[name].append(pattern)

    warm = theirs.make_deterministic_fsm(interegular.parse_pattern("ab?").to_fsm().reduce())[0]
    theirs.create_fsm_index_end_to_end(warm.fsm_info, vocab_theirs)  # numba's JIT, outside the timing
    patterns = [random_regex(rng, rng.randint(1, 6)) for _ in range(args.cases)]
    for n, pattern in enumerate(patterns):
        try:
            char_fsm = interegular.parse_pattern(pattern).to_fsm().reduce()
        except Exception:  # noqa: BLE001 - interegular cannot read it: nothing to compare
            continue
        a, a_map = ours.make_deterministic_fsm(char_fsm)
        b, b_map = theirs.make_deterministic_fsm(char_fsm)
        record("deterministic", fsm_signature(a) == fsm_signature(b) and a_map == b_map, pattern)
        for keep, name in ((False, "byte_level"), (True, "byte_level_utf8")):
            expected = fsm_signature(theirs.make_byte_level_fsm(char_fsm, keep))
            same = fsm_signature(ours.make_byte_level_fsm(char_fsm, keep)) == expected
            record(name, same, pattern)
            if not same:  # is it the deliberate difference? redo it the way outlines does
                explained[name] += as_outlines_byte_level(ours, char_fsm, keep) == expected
        other = interegular.parse_pattern(patterns[(n + 1) % len(patterns)]).to_fsm().reduce()
        ua, ra = ours.fsm_union([char_fsm, other])
        ub, rb = theirs.fsm_union([char_fsm, other])
        record("union", fsm_signature(ua) == fsm_signature(ub) and ra == rb, pattern)
        if n < args.index_cases:
            # the same automaton on both sides (outlines' byte-level one): this compares the index alone
            byte_fsm = theirs.make_byte_level_fsm(char_fsm, keep_utf8=True)
            fa, _ = ours.make_deterministic_fsm(byte_fsm)
            fb, _ = theirs.make_deterministic_fsm(byte_fsm)
            t = time.perf_counter()
            ia = ours.create_fsm_index_end_to_end(fa.fsm_info, vocab_ours)
            time_ours += time.perf_counter() - t
            t = time.perf_counter()
            ib = theirs.create_fsm_index_end_to_end(fb.fsm_info, vocab_theirs)
            time_theirs += time.perf_counter() - t
            record("index", {s: set(v) for s, v in ia.items()} == {s: set(v) for s, v in ib.items()}, pattern)

    print(f"outlines 0.0.46 outlines.fsm.regex vs the shim: {len(patterns)} random regexes (seed {args.seed})")
    for name, (same, diff) in checks.items():
        note = f"  (all but {diff - explained[name]} are the deliberate one)" if name in explained and diff else ""
        print(f"  {name:16s} identical {same:4d}  differ {diff:4d}{note}")
        for pattern in differing[name][:5]:
            print(f"      e.g. {pattern!r}")
    if checks["index"][0] + checks["index"][1]:
        print(f"  token index over {len(vocab_ours)} texts: shim {time_ours:.2f} s, outlines (numba, compiled) "
              f"{time_theirs:.2f} s, ratio {time_theirs / max(time_ours, 1e-9):.2f}")


if __name__ == "__main__":
    main()
