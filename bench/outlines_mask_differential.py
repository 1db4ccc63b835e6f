"""The shim's regex / JSON processors against outlines 1.3.3's own, mask for mask.

outlines 1.x constrains regexes and JSON Schemas with ``OutlinesCoreLogitsProcessor`` over an
``outlines_core.Index`` built on a vocabulary outlines makes from the Hugging Face tokenizer
(``OutlinesCoreBackend.create_outlines_core_vocabulary`` with its ``TransformerTokenizer``). This
imports that code from outlines 1.3.3's sdist (fetched with pip at run time, as
bench/outlines_suites.py does; outlines-core 0.2.14 is the venv's), builds both processors for
the same constraint and tokenizer, feeds both the same token walks (a random allowed token each
step, until EOS or ``--steps``) and compares the masked logits positions at every step, bit for bit.

Every difference is judged (``Judge``): the oracle is the ``regex`` module's partial matching
(full-match semantics) on the constraint's regex; a token the two read differently (outlines'
vocabulary holds tokens as decoded alone, so partial UTF-8 bytes become U+FFFD, and keeps special
tokens as their text) is named as such. A difference nothing explains is printed UNEXPLAINED.

Constraints: ``--regexes`` random regexes (``tokenrails.testing.random_regex`` joined with the
constructs where regex dialects differ: ``\\d \\w \\s`` and negations, POSIX classes, non-ASCII
literals, ``(?i)``) and ``--schemas`` random JSON Schemas (``tokenrails.testing.random_schema``,
lowered by outlines-core's ``build_regex_from_schema`` as outlines 1.x does; the shim's
``JSONLogitsProcessor`` gets the schema). Constraints outlines-core refuses are counted and skipped.

    OMP_NUM_THREADS=1 .venv/bin/python bench/outlines_mask_differential.py [--regexes 200] [--schemas 100]
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

DIALECT_ATOMS = [r"\d", r"\w", r"\s", r"\D", r"\W", r"\S", r"[\d_]", r"[^\w]", "[[:alpha:]]", "[[:digit:]x]",
                 "é", "😀", "[é-ü]", "ß", "Ω+"]


def random_constraint_regex(rng: random.Random) -> str:
    from tokenrails.testing import random_regex

    parts = [random_regex(rng) for _ in range(rng.randint(1, 2))]
    for _ in range(rng.randint(0, 2)):
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(DIALECT_ATOMS) + rng.choice(["", "?", "{1,2}"]))
    regex = "".join(parts)
    return ("(?i)" + regex) if rng.random() < 0.1 else regex


def outlines_1x(version: str = "1.3.3"):
    """outlines 1.3.3's processor class and vocabulary builder, from its fetched sdist."""
    from outlines_suites import package_root

    sys.path.insert(0, str(package_root(version)))
    from outlines.backends.outlines_core import OutlinesCoreBackend, OutlinesCoreLogitsProcessor
    from outlines.models.transformers import TransformerTokenizer

    return OutlinesCoreLogitsProcessor, OutlinesCoreBackend.create_outlines_core_vocabulary, TransformerTokenizer


def masked(processor, ids: torch.Tensor, width: int) -> torch.Tensor:
    return torch.isinf(processor(ids, torch.zeros((1, width))))[0]


class Judge:
    """Says, for a token allowed by one side only, why: the oracle (the ``regex`` module's partial
    matching on the constraint's regex in outlines-core's dialect, ``outlines_dialect``) on the
    text so far plus the token, or a difference in how the two read the token."""

    def __init__(self, hf, their_strings: dict[int, str]):
        from tokenrails.compat.outlines._vocabulary import vocabulary_for

        vocab = vocabulary_for(hf)
        self.bytes = vocab.token_bytes
        self.special = vocab.special_ids - set(vocab.eos_ids)
        self.eos = vocab.eos_ids[0]
        self.their_strings = their_strings

    def misread(self, token: int) -> bool:
        """outlines' vocabulary holds the token's text as decoded alone (U+FFFD for the bytes of a
        partial UTF-8 character), not its bytes."""
        text = self.their_strings.get(token)
        return text is not None and text.encode() != self.bytes[token]

    def why(self, token: int, ours_allows: bool, prefix: bytes, oracle) -> str | None:
        """The category when the shim's side is the right one, else None."""
        if token == self.eos:
            complete = oracle.fullmatch(prefix.decode()) is not None
            if ours_allows != complete:
                return None
            return "EOS after a full match, outlines refuses it" if complete else "EOS before a full match, outlines allows it"
        if token in self.special:
            return None if ours_allows else "outlines offers a special token as its text"
        if self.misread(token):
            return "outlines reads the token as decoded alone (U+FFFD for partial UTF-8)"
        try:
            text = (prefix + self.bytes[token]).decode()
        except UnicodeDecodeError:
            return None
        viable = oracle.fullmatch(text, partial=True) is not None
        if viable != ours_allows:
            return None
        return ("outlines refuses a token the oracle can continue to a match" if ours_allows
                else "outlines allows a token no match continues (oracle)")


def compare(ours, theirs, width: int, rng: random.Random, steps: int, judge: Judge, oracle,
            tally: dict) -> str | None:
    """One walk through both processors; differing masks are judged token by token and the walk
    goes on with a token both allow. Returns the first unexplained difference, if any."""
    ids = torch.tensor([[1, 2, 3]])
    prefix = b""
    for step in range(steps):
        a, b = masked(ours, ids, width), masked(theirs, ids, width)
        tally["masks"] += 1
        if torch.equal(a, b):
            tally["identical"] += 1
        else:
            only_ours = (~a & b).nonzero().flatten().tolist()
            only_theirs = (a & ~b).nonzero().flatten().tolist()
            for token, ours_allows in [(t, True) for t in only_ours] + [(t, False) for t in only_theirs]:
                reason = judge.why(token, ours_allows, prefix, oracle)
                if reason is None:
                    return (f"step {step} after {prefix.decode(errors='replace')!r}: token {token} "
                            f"{judge.bytes[token]!r} allowed only by {'ours' if ours_allows else 'outlines'}")
                tally["reasons"][reason] = tally["reasons"].get(reason, 0) + 1
                examples = tally["examples"].setdefault(reason, [])
                if len(examples) < 2 and all(e[0] != tally["constraint"] for e in examples):
                    examples.append((tally["constraint"], prefix.decode(errors="replace"), judge.bytes[token]))
        both = (~a & ~b).nonzero().flatten().tolist()
        both = [t for t in both if t == judge.eos or _whole_chars(judge.bytes[t])]
        if not both:
            return None
        token = rng.choice(both)
        if token == judge.eos:
            return None
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
        prefix += judge.bytes[token]
    return None


def _whole_chars(data: bytes) -> bool:
    try:
        data.decode()
        return True
    except UnicodeDecodeError:
        return False


def oracle_for(pattern: str):
    """The oracle: the ``regex`` module on the pattern in outlines-core's class dialect
    (``outlines_dialect``), with a leading ``(?i)`` left to the ``regex`` module's own (simple)
    case folding rather than the shim's spelled-out folding."""
    import regex as regex_module

    from tokenrails.compat.outlines.regex_dialect import outlines_dialect

    flags = 0
    while pattern.startswith("(?i)"):
        pattern, flags = pattern[4:], regex_module.IGNORECASE
    return regex_module.compile(outlines_dialect(pattern), flags | regex_module.V0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--regexes", type=int, default=200)
    ap.add_argument("--schemas", type=int, default=100)
    ap.add_argument("--walks", type=int, default=3, help="walks per constraint")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer", default=str(ROOT / "tests" / "fixtures" / "smollm2"))
    args = ap.parse_args()

    import outlines_core
    from outlines_core.json_schema import build_regex_from_schema
    from transformers import AutoTokenizer

    from tokenrails.compat.outlines.processors import JSONLogitsProcessor, RegexLogitsProcessor
    from tokenrails.testing import random_schema

    their_processor, their_vocabulary, their_tokenizer = outlines_1x()
    hf = AutoTokenizer.from_pretrained(args.tokenizer)
    tok = their_tokenizer(hf)
    their_strings = {i: tok.convert_token_to_string(t) for t, i in tok.get_vocab().items()}
    vocabulary = their_vocabulary(tok.get_vocab(), tok.eos_token_id, tok.eos_token, tok.convert_token_to_string)
    judge = Judge(hf, their_strings)
    width = len(hf)
    rng = random.Random(args.seed)
    cases = [("regex", random_constraint_regex(rng)) for _ in range(args.regexes)]
    cases += [("json", random_schema(rng)) for _ in range(args.schemas)]

    tallies = {kind: {"constraints": 0, "walks": 0, "masks": 0, "identical": 0, "core refused": 0,
                      "shim refused": 0, "reasons": {}, "examples": {}, "constraint": ""}
                for kind in ("regex", "json")}
    unexplained = []
    t0 = time.perf_counter()
    for kind, payload in cases:
        tally = tallies[kind]
        regex = payload if kind == "regex" else build_regex_from_schema(json.dumps(payload))
        try:
            index = outlines_core.Index(regex, vocabulary)
        except Exception:  # noqa: BLE001 - outlines-core refuses it: nothing to compare
            tally["core refused"] += 1
            continue
        try:
            ours = RegexLogitsProcessor(payload, hf) if kind == "regex" else JSONLogitsProcessor(payload, hf)
        except Exception as exc:  # noqa: BLE001 - a refusal outlines does not make is a finding
            tally["shim refused"] += 1
            unexplained.append(f"{kind} {payload!r}: the shim refuses ({type(exc).__name__}: {exc})"[:300])
            continue
        oracle = oracle_for(regex)
        tally["constraints"] += 1
        tally["constraint"] = regex if kind == "regex" else json.dumps(payload)
        for _ in range(args.walks):
            tally["walks"] += 1
            finding = compare(ours.copy(), their_processor(index, "torch"), width, rng, args.steps, judge,
                              oracle, tally)
            if finding is not None:
                unexplained.append(f"{kind} {payload!r}: {finding}"[:400])
                break
    elapsed = time.perf_counter() - t0
    for kind, t in tallies.items():
        print(f"{kind:6} constraints {t['constraints']:4d} (outlines-core refused {t['core refused']}, shim refused "
              f"{t['shim refused']})  walks {t['walks']:4d}  masks {t['masks']:5d}  identical {t['identical']:5d}")
        for reason, count in sorted(t["reasons"].items(), key=lambda kv: -kv[1]):
            print(f"         {count:7d} tokens: {reason}")
            for constraint, text, token in t["examples"].get(reason, []):
                print(f"                   e.g. {constraint[:70]!r} after {text[-30:]!r}: {token!r}")
    for line in unexplained[:20]:
        print("  UNEXPLAINED " + line)
    print(f"unexplained differences: {len(unexplained)} ({elapsed:.0f} s; tokenizer {Path(args.tokenizer).name}, "
          f"V={width}; peer = outlines 1.3.3 OutlinesCoreLogitsProcessor, outlines-core "
          f"{importlib.metadata.version('outlines_core')})")


if __name__ == "__main__":
    main()
