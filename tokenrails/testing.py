"""Differential checking of backends against oracles: helpers the test suite and the nightly fuzz
script (``bench/differential_fuzz.py``) share, like xgrammar's ``testing.py``.

A *check* is one (spec, text) question: does the backend's matcher accept ``text`` (its tokens, then
EOS)? The oracle answers the same question independently: Python ``re.fullmatch`` for regexes built
only from constructs where Python's reading is the one every backend documents (ASCII literals and
classes, groups, alternation, bounded and unbounded repetition), ``jsonschema`` for JSON Schemas,
membership for choices. A *wrong accept* is the backend saying yes where the oracle says no: the one
failure a constrained decoder must never have. Walks (the sampler always taking the lowest-id
allowed token, or a random allowed one) produce texts the backend itself chose; each must satisfy
the oracle too.
"""
from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .guided.errors import GuideError
from .guided.registry import compile_guide
from .guided.spec import GuideSpec
from .guided.vocabulary import Vocabulary


@dataclass
class Tally:
    checks: int = 0
    wrong_accepts: list = field(default_factory=list)
    refused_specs: int = 0
    compiled_specs: int = 0
    slow_walks: list = field(default_factory=list)  # walks cut short: one mask took > max_mask_s

    def merge(self, other: "Tally") -> None:
        self.checks += other.checks
        self.slow_walks.extend(other.slow_walks)
        self.wrong_accepts.extend(other.wrong_accepts)
        self.refused_specs += other.refused_specs
        self.compiled_specs += other.compiled_specs


def accepts(guide, encode: Callable[[str], list[int]], vocab: Vocabulary, text: str) -> bool:
    matcher = guide.matcher()
    for token in encode(text):
        if not matcher.accept_token(token):
            return False
    return bool(matcher.accept_token(vocab.eos_ids[0]))


class SlowMask(Exception):
    """One mask took longer than the walk's budget (a finding, reported, not a wrong accept)."""


def walk(guide, vocab: Vocabulary, decode: Callable[[list[int]], str], rng: random.Random,
         adversarial: bool, max_tokens: int = 48, max_mask_s: float | None = None) -> str | None:
    """Let the backend's masks drive a sampler; the decoded text when it chose EOS, else None."""
    matcher = guide.matcher()
    bitmask = torch.full((1, (vocab.vocab_size + 31) // 32), -1, dtype=torch.int32)
    eos = set(vocab.eos_ids)
    out: list[int] = []
    for _ in range(max_tokens):
        bitmask.fill_(-1)
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask, 0)
        took = time.perf_counter() - t0
        if max_mask_s is not None and took > max_mask_s:
            raise SlowMask(f"mask {len(out)} took {took:.2f} s")
        allowed = _allowed_ids(bitmask[0], vocab.vocab_size)
        if not allowed:
            return None
        non_eos = [t for t in allowed if t not in eos]
        if adversarial:  # the worst sampler: never ends while it can go on, takes the lowest id
            token = non_eos[0] if non_eos else allowed[0]
        else:
            token = rng.choice(allowed if rng.random() < 0.3 or not non_eos else non_eos)
        if token in eos:
            return decode(out) if matcher.accept_token(token) else None
        if not matcher.accept_token(token):
            return None
        out.append(token)
    return None


def _allowed_ids(row: torch.Tensor, vocab_size: int) -> list[int]:
    shifts = torch.arange(32, dtype=torch.int32)
    bits = ((row.unsqueeze(-1) >> shifts) & 1).reshape(-1)[:vocab_size]
    return torch.nonzero(bits).flatten().tolist()


def check_spec(spec: GuideSpec, oracle: Callable[[str], bool], texts: list[str], vocab: Vocabulary,
               encode, decode, backend: str, rng: random.Random, walks: int = 2,
               max_mask_s: float | None = None) -> Tally:
    """All checks of one spec on one backend."""
    tally = Tally()
    try:
        guide = compile_guide(spec, vocab, backend)
    except GuideError:
        tally.refused_specs += 1
        return tally
    tally.compiled_specs += 1
    for text in texts:
        tally.checks += 1
        if accepts(guide, encode, vocab, text) and not oracle(text):
            tally.wrong_accepts.append((backend, spec.kind, spec.payload[:200], text))
    for n in range(walks):
        try:
            text = walk(guide, vocab, decode, rng, adversarial=n == 0, max_mask_s=max_mask_s)
        except SlowMask as exc:
            tally.slow_walks.append((backend, spec.kind, spec.payload[:200], str(exc)))
            continue
        if text is not None:
            tally.checks += 1
            if not oracle(text):
                tally.wrong_accepts.append((backend, spec.kind, spec.payload[:200], text, "walk"))
    return tally


# ---- generators (plain ``random``, so the nightly script needs no hypothesis) -------------------
_ALPHABET = "ab0{}-x"


def random_regex(rng: random.Random, depth: int = 0) -> str:
    """A regex in the common dialect: literals, classes, groups, alternation, repetition."""
    kind = rng.randrange(7 if depth < 3 else 2)
    if kind == 0:
        return re.escape(rng.choice(_ALPHABET))
    if kind == 1:
        return rng.choice(["[ab]", "[0-9]", "[^a]", "[a-x]", "[-x]", "[{}]", "."])
    if kind == 2:
        return "".join(random_regex(rng, depth + 1) for _ in range(rng.randint(2, 3)))
    if kind == 3:
        return "(" + "|".join(random_regex(rng, depth + 1) for _ in range(rng.randint(2, 3))) + ")"
    if kind == 4:
        return "(" + random_regex(rng, depth + 1) + ")" + rng.choice(["*", "+", "?"])
    if kind == 5:
        low = rng.randint(0, 3)
        high = rng.choice([low, low + rng.randint(0, 3), None])
        bound = f"{{{low}}}" if high == low else (f"{{{low},}}" if high is None else f"{{{low},{high}}}")
        return "(" + random_regex(rng, depth + 1) + ")" + bound
    return "(?:" + random_regex(rng, depth + 1) + ")"


def random_text(rng: random.Random) -> str:
    """A candidate text over the regexes' alphabet (short: most random regexes match short strings)."""
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 6)))


def random_schema(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 2 else 5)
    if kind == 0:
        return {"type": "integer", **rng.choice([{}, {"minimum": rng.randint(-5, 5)}, {"maximum": rng.randint(-5, 50)},
                                               {"multipleOf": rng.randint(1, 7)}])}
    if kind == 1:
        return {"type": "string", **rng.choice([{}, {"maxLength": rng.randint(0, 4)}, {"minLength": rng.randint(0, 3)},
                                              {"pattern": "^" + random_regex(rng, 2) + "$"}, {"enum": ["a", "bb", "x-"]}])}
    if kind == 2:
        return rng.choice([{"type": "boolean"}, {"type": "null"}, {"const": rng.choice([1, "a", True, None])}])
    if kind == 3:
        return {"enum": rng.sample([0, 1, "a", "b", None, True, 2.5], rng.randint(1, 4))}
    if kind == 4:
        return {"type": "number", **rng.choice([{}, {"minimum": 0}, {"exclusiveMaximum": 3}])}
    if kind == 5:
        return {"type": "array", "items": random_schema(rng, depth + 1),
                **rng.choice([{}, {"maxItems": rng.randint(0, 3)}, {"minItems": rng.randint(0, 2)}])}
    if kind == 6:
        names = rng.sample(["a", "b", "c"], rng.randint(1, 3))
        return {"type": "object", "properties": {n: random_schema(rng, depth + 1) for n in names},
                "required": rng.sample(names, rng.randint(0, len(names)))}
    return {"anyOf": [random_schema(rng, depth + 1) for _ in range(rng.randint(2, 3))]}


def random_instance(rng: random.Random, schema: Any, depth: int = 0) -> Any:
    """A JSON value that often nearly fits ``schema`` (the oracle decides)."""
    pick = rng.random()
    if pick < 0.2 or depth > 3:
        return rng.choice([0, 1, -3, 7, 2.5, "a", "bb", "", True, None, [], {}])
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "array":
        return [random_instance(rng, schema.get("items", {}), depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "object":
        return {n: random_instance(rng, s, depth + 1) for n, s in schema.get("properties", {}).items() if rng.random() < 0.8}
    if isinstance(schema, dict) and "anyOf" in schema:
        return random_instance(rng, rng.choice(schema["anyOf"]), depth + 1)
    if isinstance(schema, dict) and "enum" in schema:
        return rng.choice(schema["enum"] + ["zz"])
    if kind == "string":
        return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 5)))
    if kind in ("integer", "number"):
        return rng.choice([0, 1, -1, 3, 5, 6, 14, 49, 51, 2.5, -0.5])
    return rng.choice([True, False, None, 0, "a"])


def regex_case(rng: random.Random) -> tuple[GuideSpec, Callable[[str], bool], list[str]]:
    pattern = random_regex(rng)
    compiled = re.compile(pattern, re.ASCII | re.DOTALL)
    texts = [random_text(rng) for _ in range(8)]
    return GuideSpec.regex(pattern), lambda t: compiled.fullmatch(t) is not None, texts


def schema_case(rng: random.Random) -> tuple[GuideSpec, Callable[[str], bool], list[str]]:
    import jsonschema

    schema = random_schema(rng)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())

    def oracle(text: str) -> bool:
        try:
            value = json.loads(text)
        except ValueError:
            return False
        return validator.is_valid(value)

    texts = [json.dumps(random_instance(rng, schema), separators=rng.choice([(",", ":"), (", ", ": ")]))
             for _ in range(8)]
    return GuideSpec.json_schema(schema), oracle, texts
