"""The outlines shim at guide level, on the real SmolLM2 tokenizer: code written against
outlines' ``RegexGuide`` / processors runs unchanged and stays inside outlines' languages."""
from __future__ import annotations

import json
import random
import re
from enum import Enum
from typing import Literal

import jsonschema
import numpy as np
import pytest
import torch
from outlines_core.json_schema import build_regex_from_schema as core_build_regex
import regex
from pydantic import BaseModel, Field

from tokenrails import InvalidGuideError, UnsupportedGuideError
from tokenrails.compat import outlines
from tokenrails.compat.outlines._json_language import UnenforcedSchemaWarning, json_spec, outlines_regex
from tokenrails.compat.outlines.fsm.guide import CFGGuide, Generate, RegexGuide, Write
from tokenrails.compat.outlines.fsm.json_schema import build_regex_from_schema
from tokenrails.compat.outlines.fsm.states import FINAL
from tokenrails.compat.outlines.processors import (
    CFGLogitsProcessor,
    GuideLogitsProcessor,
    JSONLogitsProcessor,
    RegexLogitsProcessor,
)
from tokenrails.compat.outlines.types import spec_for_output_type

REGEXES = [
    r"[0-9]{3}-[a-z]{2,4}",
    r"(yes|no|maybe)",
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?",
    r"[A-Z][a-z]+ [A-Z][a-z]+",
    r"\(\d{3}\) \d{3}-\d{4}",
    r"(ab|cd)+e?",
    r"[^\n\"]{1,12}!",
]


class Character(BaseModel):
    name: str
    age: int
    armor: Literal["leather", "chain", "plate"]
    strength: float | None = None


def _text(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)


def walk(guide, tokenizer, rng: random.Random, *, max_steps: int = 60, pick: str = "random") -> str:
    """Drive a guide by hand, exactly like outlines users did; stop with EOS once allowed."""
    state, out = guide.initial_state, []
    for step in range(max_steps):
        instruction = guide.get_next_instruction(state)
        if isinstance(instruction, Write):
            break
        assert isinstance(instruction, Generate)
        allowed = instruction.tokens.tolist()
        assert allowed, "a live state must allow something"
        if guide.eos_token_id in allowed and (step >= max_steps // 2 or rng.random() < 0.2):
            token = guide.eos_token_id
        else:
            choices = [t for t in allowed if t != guide.eos_token_id] or allowed
            token = {"random": rng.choice, "first": min, "last": max}[pick](choices)
        state = guide.get_next_state(state, token)
        if token == guide.eos_token_id:
            assert state == FINAL and guide.is_final_state(state)
            break
        out.append(token)
    return _text(tokenizer, out)


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_guide_walked_by_hand_stays_in_the_language(pattern, smollm2_tokenizer) -> None:
    guide = RegexGuide.from_regex(pattern, smollm2_tokenizer)
    rng = random.Random(pattern)
    finished = 0
    for pick in ("first", "last", "random", "random", "random"):
        state_text = walk(guide.copy(), smollm2_tokenizer, rng, pick=pick, max_steps=80)
        prefix_ok = re.fullmatch(pattern, state_text) is not None
        finished += prefix_ok
    assert finished >= 1  # random walks that stopped on EOS produced full matches


@pytest.mark.parametrize("pattern", REGEXES)
def test_eos_is_offered_exactly_on_full_matches(pattern, smollm2_tokenizer) -> None:
    """Every state on random walks: EOS allowed ⇔ is_final_state ⇔ re.fullmatch(text so far)."""
    guide = RegexGuide(pattern, smollm2_tokenizer)
    rng = random.Random(1)
    for _ in range(4):
        state, ids = guide.initial_state, []
        for _ in range(30):
            allowed = guide.get_next_instruction(state).tokens.tolist()
            text = _text(smollm2_tokenizer, ids)
            full = re.fullmatch(pattern, text) is not None
            assert (guide.eos_token_id in allowed) == full == guide.is_final_state(state), text
            choices = [t for t in allowed if t != guide.eos_token_id]
            if not choices:
                break
            token = rng.choice(choices)
            state = guide.get_next_state(state, token)
            ids.append(token)


@pytest.mark.parametrize("text,pattern", [
    ("123-abcd", REGEXES[0]), ("maybe", REGEXES[1]), ("-10.25", REGEXES[2]),
    ("Ada Lovelace", REGEXES[3]), ("(555) 123-4567", REGEXES[4]), ("abcdabe", REGEXES[5]),
])
def test_tokenized_members_are_accepted_and_mutants_rejected(text, pattern, smollm2_tokenizer) -> None:
    guide = RegexGuide.from_regex(pattern, smollm2_tokenizer)
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    state = guide.initial_state
    for t in ids:
        state = guide.get_next_state(state, t)
        assert state != FINAL
    assert guide.is_final_state(state)
    assert guide.get_next_state(state, guide.eos_token_id) == FINAL
    mutant = text + "#"
    state = guide.initial_state
    for t in smollm2_tokenizer.encode(mutant, add_special_tokens=False):
        state = guide.get_next_state(state, t)
    assert state == FINAL  # outlines' convention: a forbidden token sends the guide to -1
    assert re.fullmatch(pattern, mutant) is None


def test_outlines_state_conventions(smollm2_tokenizer) -> None:
    guide = RegexGuide.from_regex(r"a[0-9]", smollm2_tokenizer)
    assert guide.initial_state == 0
    assert guide.is_final_state(FINAL) and not guide.is_final_state(0)
    instruction = guide.get_next_instruction(FINAL)
    assert isinstance(instruction, Write) and instruction.tokens.tolist() == [guide.eos_token_id]
    assert guide.get_next_state(FINAL, 5) == FINAL
    assert guide.get_next_state(0, guide.eos_token_id) == FINAL  # EOS always ends
    special = smollm2_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert special not in guide.get_next_instruction(0).tokens.tolist()
    assert guide.get_next_state(0, special) == FINAL
    a = smollm2_tokenizer.convert_tokens_to_ids("a")
    s1 = guide.get_next_state(0, a)
    assert guide.get_next_state(0, a) == s1  # pure function of (state, token)
    assert not guide.is_final_state(s1)
    digits = set(guide.get_next_instruction(s1).tokens.tolist())
    assert {smollm2_tokenizer.decode([t]) for t in digits} == set("0123456789")


def test_old_states_stay_walkable_after_eviction(smollm2_tokenizer) -> None:
    """States are pure names: an early state still gives the same answer after many others."""
    guide = RegexGuide.from_regex(r"[a-z]{1,20}", smollm2_tokenizer)
    guide.states.max_live = 2
    rng = random.Random(0)
    history = [(0, guide.get_next_instruction(0).tokens.tolist())]
    state = 0
    for _ in range(12):
        choices = [t for t in history[-1][1] if t != guide.eos_token_id]
        if not choices:
            break
        state = guide.get_next_state(state, rng.choice(choices))
        if state == FINAL:
            break
        history.append((state, guide.get_next_instruction(state).tokens.tolist()))
    for old_state, allowed in history:
        assert guide.get_next_instruction(old_state).tokens.tolist() == allowed


def test_copy_is_independent(smollm2_tokenizer) -> None:
    guide = RegexGuide.from_regex(r"x+", smollm2_tokenizer)
    other = guide.copy()
    assert other.compiled is guide.compiled  # nothing recompiled
    x = smollm2_tokenizer.convert_tokens_to_ids("x")
    guide.get_next_state(0, x)
    assert len(other.states) == 1 and len(guide.states) == 2


def test_cfg_guide_takes_ebnf_and_outlines_lark(smollm2_tokenizer) -> None:
    guide = CFGGuide('root ::= "(" root ")" | "x"', smollm2_tokenizer)
    text = walk(guide, smollm2_tokenizer, random.Random(3), max_steps=40, pick="random")
    assert re.fullmatch(r"(\(*)x(\)*)", text) and text.count("(") == text.count(")") or text == ""
    # outlines' own dialect (Lark, ``?rule`` inlining, ``%import common``) compiles on llguidance
    lark_guide = CFGGuide('?start: pair\n?pair: NUMBER "," NUMBER\n%import common.NUMBER', smollm2_tokenizer)
    assert lark_guide.compiled.backend == "llguidance"
    s = lark_guide.initial_state
    for t in smollm2_tokenizer.encode("12,3", add_special_tokens=False):
        s = lark_guide.get_next_state(s, t)
    assert lark_guide.is_final_state(s) or lark_guide.can_terminate_state(s)
    with pytest.raises(InvalidGuideError):
        CFGGuide("start: ???", smollm2_tokenizer)  # malformed: a clear error
    lark = outlines.grammars.check_ebnf(outlines.grammars.arithmetic_ebnf)
    g = CFGGuide(lark, smollm2_tokenizer)
    s = g.initial_state
    for t in smollm2_tokenizer.encode("(1+2)*3", add_special_tokens=False):
        s = g.get_next_state(s, t)
    # outlines 0.0.x: a CFG guide may end here but is final only once EOS is generated
    assert g.can_terminate_state(s) and not g.is_final_state(s) and s != FINAL
    assert g.is_final_state(g.get_next_state(s, smollm2_tokenizer.eos_token_id))


def test_cfg_guide_keeps_0_0_generation_and_terminal_boundaries(smollm2_tokenizer) -> None:
    """0.0.x's stateful extras: ``generation`` (text fed so far), ``reset_state`` (the last
    Generate was between terminals), ``Write([eos])`` once only EOS may follow."""
    g = CFGGuide('start: WORD ("," WORD)*\nWORD: "ab" | "cd"', smollm2_tokenizer)
    tokens = {t: smollm2_tokenizer.convert_tokens_to_ids(t) for t in ["a", "b", ","]}
    state = g.initial_state
    assert isinstance(g.get_next_instruction(state), Generate) and g.reset_state  # nothing read yet
    state = g.get_next_state(state, tokens["a"])
    g.get_next_instruction(state)
    assert g.generation == "a" and not g.reset_state  # inside the terminal "ab"
    state = g.get_next_state(state, tokens["b"])
    instruction = g.get_next_instruction(state)
    assert g.generation == "ab" and g.reset_state and g.eos_token_id in instruction.tokens.tolist()
    assert not g.is_final_state(state) and g.can_terminate_state(state) and not g.must_terminate_state(state)
    state = g.get_next_state(state, g.eos_token_id)
    assert g.is_final_state(state) and g.generation == "ab"
    assert isinstance(g.get_next_instruction(state), Write)
    assert g.copy().generation == ""


class _PieceTokenizer:
    """An outlines-interface tokenizer whose vocabulary is a handful of text pieces (EOS = 0)."""

    special_tokens = {"<eos>"}
    eos_token_id = 0

    def __init__(self, pieces: list[str]):
        self.vocabulary = {"<eos>": 0, **{p: i + 1 for i, p in enumerate(pieces)}}
        self.pieces = dict(enumerate(["<eos>", *pieces]))

    def convert_token_to_string(self, token: str) -> str:
        return token

    def decode(self, ids: list[int]) -> list[str]:
        return [self.pieces[i] for i in ids]


# Finite languages whose literals overlap (a terminal that is a prefix or a concatenation of
# others), so a guide that keeps one spelling of forced text would refuse some tokenizations.
FINITE_LARK = [
    '?start: "a" "b" "c" "ab"',
    'start: "ab" "c" | "a" "bc" | "abc" "a"',
    'start: A B? C\nA: "a" | "ab"\nB: "b"\nC: "c" | "bc"',
    'start: ("a" | "b") "cab" "b"?',
]


@pytest.mark.parametrize("grammar", FINITE_LARK)
def test_cfg_guide_allows_every_tokenization_like_outlines_lark_guide(grammar: str) -> None:
    """outlines 0.x's Lark guide allowed every spelling of the language: oracle = Lark's own
    parser over all strings up to 7 characters; at every reachable state the allowed tokens must
    be exactly the pieces that keep the text a prefix of a sentence, and EOS exactly on sentences."""
    import itertools

    import lark

    parser = lark.Lark(grammar, parser="lalr")

    def parses(text: str) -> bool:
        try:
            parser.parse(text)
            return True
        except lark.exceptions.LarkError:
            return False

    sentences = {"".join(p) for n in range(1, 8) for p in itertools.product("abc", repeat=n)}
    sentences = {s for s in sentences if parses(s)}
    assert sentences  # the oracle found the language
    pieces = ["a", "b", "c", "ab", "bc", "ca", "abc", "cab", "bca"]
    tokenizer = _PieceTokenizer(pieces)
    guide = CFGGuide(grammar, tokenizer)
    frontier = [(guide.initial_state, "")]
    seen = 0
    while frontier:
        state, text = frontier.pop()
        allowed = {int(t) for t in guide.get_next_instruction(state).tokens}
        expected = {i for i, p in enumerate(pieces, 1) if any(s.startswith(text + p) for s in sentences)}
        if text in sentences:
            expected.add(0)
        assert allowed == expected, (grammar, text)
        seen += 1
        for i in expected - {0}:
            frontier.append((guide.get_next_state(state, i), text + pieces[i - 1]))
    assert seen > len(sentences)  # walked every tokenization, not one spelling


SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]},
    {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
    {"type": "string", "enum": ["x", "y", "z"]},
    {"type": "object", "properties": {"d": {"type": "string", "format": "date"},
                                      "u": {"type": "string", "format": "uuid"}}},
    {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
    {"$defs": {"P": {"type": "object", "properties": {"n": {"type": "string", "maxLength": 3}}}},
     "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}},
    Character.model_json_schema(),
]


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("ws", [None, r"[\n ]?"])
def test_build_regex_from_schema_matches_outlines_core(schema, ws) -> None:
    text = json.dumps(schema)
    assert build_regex_from_schema(text, ws) == core_build_regex(text, ws)
    assert build_regex_from_schema(schema, ws) == core_build_regex(text, ws)


def test_build_regex_from_pydantic_model() -> None:
    assert build_regex_from_schema(Character) == core_build_regex(json.dumps(Character.model_json_schema()))


def adversarial_decode(processor, tokenizer, vocab_width: int, seed: int, steps: int = 120) -> str:
    """Random logits through the processor; always take the LOWEST-logit token that survived
    (the worst allowed choice), so any leak in the mask would be picked."""
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.tensor([[1, 2, 3]])
    ids = prompt
    eos = processor.guide.eos_token_id
    out: list[int] = []
    for step in range(steps):
        logits = torch.randn(1, vocab_width, generator=gen)
        masked = processor(ids, logits.clone())
        finite = torch.isfinite(masked[0])
        assert finite.any()
        allowed = finite.nonzero().reshape(-1)
        if eos in allowed.tolist() and (step > steps // 3 or allowed.numel() == 1):
            return tokenizer.decode(out)
        cand = allowed[allowed != eos]
        token = int(cand[masked[0, cand].argmin()])
        assert masked[0, token] == logits[0, token]  # surviving logits are untouched
        out.append(token)
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return tokenizer.decode(out)  # out of steps: a prefix


class Bounded(BaseModel):
    """Every string/number bounded: any walk must end, so the adversary must reach EOS."""

    name: str = Field(max_length=6)
    level: Literal[1, 2, 3]
    armor: Literal["leather", "chain"]
    alive: bool
    tags: list[Literal["a", "b"]] = Field(max_length=2)


def test_json_processor_adversarial_output_validates(smollm2_tokenizer) -> None:
    schema = Bounded.model_json_schema()
    processor = JSONLogitsProcessor(Bounded, smollm2_tokenizer)
    for seed in range(3):
        text = adversarial_decode(processor.copy(), smollm2_tokenizer, 49152 + 64, seed, steps=400)
        jsonschema.validate(json.loads(text), schema)
        Bounded.model_validate_json(text)


def test_json_processor_unbounded_schema_stays_a_valid_prefix(smollm2_tokenizer) -> None:
    regex_text = core_build_regex(json.dumps(Character.model_json_schema()))
    processor = JSONLogitsProcessor(Character, smollm2_tokenizer, whitespace_pattern=r"[ ]?")
    for seed in range(2):
        text = adversarial_decode(processor.copy(), smollm2_tokenizer, 49152, seed, steps=60)
        assert regex.fullmatch(regex_text, text, partial=True), text


@pytest.mark.parametrize("pattern", [r"[0-9]{2,5}", r"(red|green|blue)"])
def test_regex_processor_adversarial(pattern, smollm2_tokenizer) -> None:
    processor = RegexLogitsProcessor(pattern, smollm2_tokenizer)
    text = adversarial_decode(processor, smollm2_tokenizer, 49152, seed=7, steps=30)
    assert re.fullmatch(pattern, text), text


def test_processor_mask_is_bit_exact_against_the_guide(smollm2_tokenizer) -> None:
    """Batch of rows at different states: -inf exactly where the guide forbids, logits intact
    elsewhere; extra logits columns (padding) are always masked."""
    processor = RegexLogitsProcessor(r"[a-c]{1,3}[0-9]", smollm2_tokenizer)
    guide = processor.guide
    prompt = torch.tensor([[7, 8], [7, 8], [7, 8]])
    width = 49152 + 100
    logits = torch.randn(3, width)
    processor(prompt, logits.clone())
    a, b = (smollm2_tokenizer.convert_tokens_to_ids(c) for c in "ab")
    ids = torch.cat([prompt, torch.tensor([[a], [b], [a]])], dim=1)
    logits = torch.randn(3, width, dtype=torch.float64)  # dtype outside the kernel's set
    out = processor(ids, logits.clone())
    for row, token in enumerate([a, b, a]):
        state = guide.get_next_state(0, token)
        allowed = set(guide.get_next_instruction(state).tokens.tolist())
        finite = set(torch.isfinite(out[row]).nonzero().reshape(-1).tolist())
        assert finite == allowed
        keep = torch.tensor(sorted(allowed))
        assert torch.equal(out[row, keep], logits[row, keep])
    assert torch.isinf(out[:, 49152:]).all()


def test_processor_accepts_numpy_and_1d(smollm2_tokenizer) -> None:
    processor = RegexLogitsProcessor(r"[0-9]", smollm2_tokenizer)
    logits = np.random.default_rng(0).standard_normal(49152).astype(np.float32)
    out = processor(np.array([5, 6]), logits)
    assert isinstance(out, np.ndarray) and out.shape == (49152,)
    kept = {smollm2_tokenizer.decode([int(i)]) for i in np.flatnonzero(np.isfinite(out))}
    assert kept == set("0123456789")


def test_processor_notices_a_new_generation(smollm2_tokenizer) -> None:
    processor = RegexLogitsProcessor(r"z[0-9]", smollm2_tokenizer)
    z = smollm2_tokenizer.convert_tokens_to_ids("z")
    first = torch.isfinite(processor(torch.tensor([[1, 2]]), torch.zeros(1, 49152))[0])
    assert first.nonzero().reshape(-1).tolist() == [z]
    after_z = torch.isfinite(processor(torch.tensor([[1, 2, z]]), torch.zeros(1, 49152))[0])
    assert {smollm2_tokenizer.decode([int(i)]) for i in after_z.nonzero()} == set("0123456789")
    # a different prompt of the next length, then a longer jump: both are new generations
    for prompt in ([[5, 6, 7, 8]], [[9] * 12]):
        out = processor(torch.tensor(prompt), torch.zeros(1, 49152))
        assert torch.isfinite(out[0]).nonzero().reshape(-1).tolist() == [z]


def test_guide_logits_processor_with_a_user_defined_guide(smollm2_tokenizer) -> None:
    class OnlyTokens(outlines.fsm.guide.Guide):
        def get_next_instruction(self, state):
            return Generate(torch.tensor([10, 20]))

        def get_next_state(self, state, token_id):
            return 0

        def is_final_state(self, state):
            return False

        def copy(self):
            return self

    processor = GuideLogitsProcessor(smollm2_tokenizer, OnlyTokens())
    out = processor(torch.tensor([[1]]), torch.zeros(1, 100))
    assert torch.isfinite(out[0]).nonzero().reshape(-1).tolist() == [10, 20]


def test_cfg_processor(smollm2_tokenizer) -> None:
    processor = CFGLogitsProcessor('root ::= "[" [0-9]+ ("," [0-9]+)* "]"', smollm2_tokenizer)
    text = adversarial_decode(processor, smollm2_tokenizer, 49152, seed=1, steps=25)
    assert re.fullmatch(r"\[[0-9]+(,[0-9]+)*\]", text) or re.fullmatch(r"\[[0-9]+(,[0-9]+)*,?", text), text


class Color(Enum):
    red = "red"
    green = "green"


@pytest.mark.parametrize("output_type,good,bad", [
    (int, ["0", "-12", "+7"], ["01", "1.5", ""]),
    (float, ["1.5", "-0", "2e10", "3.0E-2"], ["1.", ".5", "e3"]),
    (bool, ["True", "False"], ["true", "1"]),
    (Literal["a.b", "c"], ["a.b", "c"], ["aXb", "a"]),
    (Color, ["red", "green"], ["Color.red", "blue"]),
    (outlines.types.Regex(r"[xy]{2}"), ["xy", "yy"], ["x", "xyz"]),
    (outlines.types.Choice([1, "two"]), ["1", "two"], ["2"]),
])
def test_output_types_have_outlines_languages(output_type, good, bad) -> None:
    spec = spec_for_output_type(output_type)
    from tokenrails.compat.outlines.types.convert import regex_of

    rx = regex_of(output_type)
    assert spec.kind in ("regex", "choice")
    for s in good:
        assert re.fullmatch(rx, s), (s, rx)
    for s in bad:
        assert not re.fullmatch(rx, s), (s, rx)


def test_structured_output_types_are_json(smollm2_tokenizer) -> None:
    spec = spec_for_output_type(Character)
    assert outlines_regex(spec) == core_build_regex(json.dumps(Character.model_json_schema()))
    js = outlines.types.JsonSchema({"type": "integer"}, whitespace_pattern=" ")
    assert outlines_regex(spec_for_output_type(js)) == core_build_regex('{"type": "integer"}', " ")
    assert spec_for_output_type(dict).kind == "grammar"  # outlines 1.x: its Lark JSON grammar
    assert spec_for_output_type(outlines.types.CFG('root ::= "a"')).kind == "grammar"
    with pytest.raises(UnsupportedGuideError):
        spec_for_output_type(set[int])  # outlines 1.x refuses it too (list[int] is a regex)
    lark = spec_for_output_type(outlines.types.CFG("start: \"a\""))  # outlines' Lark dialect
    assert lark.kind == "grammar" and lark.option("dialect") == "lark"


def test_json_language_is_outlines_regex_on_the_active_backend(smollm2_tokenizer) -> None:
    """The compiled guide accepts exactly outlines' strings: members of the regex tokenized
    end in a final state; near-misses (other whitespace, reordered keys) are refused."""
    from tokenrails.compat.outlines.fsm.guide import TokenrailsGuide

    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "boolean"}},
              "required": ["b", "a"]}
    spec = json_spec(schema)
    guide = TokenrailsGuide.from_spec(spec, smollm2_tokenizer)
    rx = core_build_regex(json.dumps(schema))

    def accepts(text: str) -> bool:
        state = 0
        for t in smollm2_tokenizer.encode(text, add_special_tokens=False):
            state = guide.get_next_state(state, t)
            if state == FINAL:
                return False
        return guide.is_final_state(state)

    for text in ['{"b":1,"a":true}', '{ "b": -20, "a": false}', '{"b":0, "a":true }']:
        assert bool(re.fullmatch(rx, text)) == accepts(text) == True, text  # noqa: E712
    for text in ['{"a":true,"b":1}', '{"b":1,\n"a":true}', '{"b":1,  "a":true}', '{"b":01,"a":true}']:
        assert bool(re.fullmatch(rx, text)) == accepts(text) == False, text  # noqa: E712


def test_keywords_outlines_ignored_warn(smollm2_tokenizer) -> None:
    pytest.importorskip("tokenrails.guided.fsm.schema")
    with pytest.warns(UnenforcedSchemaWarning, match="minimum"):
        json_spec({"type": "integer", "minimum": 3})


@pytest.fixture(scope="module")
def core_vocabulary(smollm2_tokenizer):
    """outlines-core's own Vocabulary for the same tokens (the engine outlines 1.x runs on)."""
    import outlines_core

    from tokenrails.compat.outlines._vocabulary import vocabulary_for

    vocab = vocabulary_for(smollm2_tokenizer)
    token_map: dict[bytes, list[int]] = {}
    for i, b in enumerate(vocab.grammar_token_bytes()):
        if b and i not in vocab.special_ids:
            token_map.setdefault(b, []).append(i)
    return outlines_core.Vocabulary(vocab.eos_ids[0], token_map)


@pytest.mark.parametrize("kind,payload", [
    ("regex", r"[0-9]{2}-[a-z]{1,4}(x|yz)?"),
    ("choice", ["apple pie", "apple", "banana split", "c++"]),
    ("json", {"type": "object", "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"},
                                                "tag": {"enum": ["a", "b"]}}, "required": ["id", "ok"]}),
])
def test_allowed_tokens_equal_outlines_core_at_every_state(kind, payload, smollm2_tokenizer, core_vocabulary) -> None:
    """Differential test against outlines-core's Index/Guide at every state of random walks.

    Everything outlines-core allows, the shim allows (EOS included). The shim may allow more:
    outlines-core 0.2.14 drops some tokens that leave a final state through a non-final one
    (with ``a(yz)?`` it refuses ``y`` after ``a`` even with no ``yz`` token, so ``ayz`` cannot
    be generated). Every such extra token must keep the text a viable prefix of the regex."""
    import outlines_core

    from tokenrails.compat.outlines.fsm.guide import TokenrailsGuide
    from tokenrails.compat.outlines.fsm.states import allowed_token_ids
    from tokenrails.guided.spec import GuideSpec

    if kind == "regex":
        spec, regex_text = GuideSpec.regex(payload), payload
    elif kind == "choice":
        spec, regex_text = GuideSpec.choice(payload), "(" + "|".join(re.escape(c) for c in payload) + ")"
    else:
        spec = json_spec(payload)
        regex_text = core_build_regex(json.dumps(payload))
    guide = TokenrailsGuide.from_spec(spec, smollm2_tokenizer)
    index = outlines_core.Index(regex_text, core_vocabulary)
    width = guide.vocabulary_.vocab_size
    mask = torch.zeros(1, (width + 31) // 32, dtype=torch.int32)
    rng = random.Random(kind)
    token_bytes = guide.vocabulary_.token_bytes
    identical = 0
    for _ in range(6):
        core = outlines_core.Guide(index)
        state, text = guide.initial_state, b""
        for _ in range(40):
            core.write_mask_into(mask.data_ptr(), mask.numel(), mask.element_size())
            theirs = set(allowed_token_ids(mask[0], width).tolist())
            ours = set(guide.get_next_instruction(state).tokens.tolist())
            assert theirs <= ours
            identical += ours == theirs
            for extra in ours - theirs:
                candidate = (text + token_bytes[extra]).decode("utf-8", "ignore")
                assert regex.fullmatch(regex_text, candidate, partial=True), candidate
            choices = sorted(theirs - {guide.eos_token_id})  # stay where both can follow
            if not choices or rng.random() < 0.1 and guide.eos_token_id in ours:
                break
            token = rng.choice(choices)
            core.advance(token)
            state = guide.get_next_state(state, token)
            text += token_bytes[token]
    assert identical >= 6  # most states agree exactly (at least every start state)


def test_processor_steps_equal_a_fresh_replay(smollm2_tokenizer) -> None:
    """Step-by-step calls (the fast path: same rows, one token longer), beam-style reorders and
    drops, and an in-place rewritten buffer all give the masks of the guide state reached by
    replaying each row's generated ids."""
    pattern = r"(ab|[0-9]{2,4})-[a-z]{1,6}"
    processor = RegexLogitsProcessor(pattern, smollm2_tokenizer)
    texts = ["12-abc", "ab-xyzzy", "4567-q"]
    paths = [smollm2_tokenizer.encode(t, add_special_tokens=False) for t in texts]
    prompt = [[3, 4, 5]] * 3

    guide = processor.guide

    def check(ids: torch.Tensor) -> None:
        got = torch.isfinite(processor(ids, torch.zeros(ids.shape[0], 49152)))
        for row in range(ids.shape[0]):
            state = guide.initial_state
            for token in ids[row, 3:].tolist():
                state = guide.get_next_state(state, token)
            want = set(guide.get_next_instruction(state).tokens.tolist())
            assert set(got[row].nonzero().reshape(-1).tolist()) == want, (row, ids[row].tolist())

    check(torch.tensor(prompt))
    steps = max(len(p) for p in paths)
    rows = [list(r) for r in prompt]
    for k in range(steps):
        for r, path in zip(rows, paths):
            r.append(path[k] if k < len(path) else path[-1])
        if k == 2:  # beam search: rows reordered and one dropped
            rows = [list(rows[2]), list(rows[0]), list(rows[0])]
            paths = [paths[2], paths[0], paths[0]]
        check(torch.tensor(rows))
    buffer = torch.tensor(rows)
    buffer[1, 4] = buffer[0, 4]  # an earlier token rewritten in place, then one more step
    longer = torch.cat([buffer, buffer[:, -1:]], dim=1)
    check(longer)


def test_guides_take_outlines_interface_tokenizers():
    """outlines' own tokenizer interface (a ``vocabulary`` dict, ``eos_token_id``,
    ``special_tokens``, ``convert_token_to_string``) — as outlines' tests and custom
    integrations write it — builds a vocabulary; byte-fallback pieces are their byte."""
    from tokenrails.compat.outlines.fsm.guide import Generate, RegexGuide, StopAtEOSGuide

    class Tok:
        vocabulary = {"1": 1, "a": 2, "eos": 3, "<0xF0>": 4}
        special_tokens = {"eos"}
        eos_token_id = 3

        def convert_token_to_string(self, token):
            return token

    guide = RegexGuide.from_regex("[1-9]", Tok())
    instruction = guide.get_next_instruction(guide.initial_state)
    assert isinstance(instruction, Generate) and sorted(map(int, instruction.tokens)) == [1]
    assert StopAtEOSGuide(Tok()).get_next_state(0, 3) == StopAtEOSGuide.final_state

    class OnlyA(Tok):
        vocabulary = {"a": 1}

    with pytest.raises(ValueError, match="The vocabulary"):
        RegexGuide.from_regex("[1-9]", OnlyA())
