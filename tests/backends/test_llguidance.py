"""llguidance backend: exactness against oracles, special tokens, rollback, typed errors."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

pytest.importorskip("llguidance")

from tokenrails import GuideSpec, Vocabulary, allocate_token_bitmask, compile_guide
from tokenrails.guided.errors import (
    GuideLimitError,
    InvalidGuideError,
    UnsupportedGuideError,
)
from tests.guided.helpers import adversarial_decode, allowed_ids, decode_text

BACKEND = "llguidance"


def _compile(spec: GuideSpec, vocab: Vocabulary, **kw):
    return compile_guide(spec, vocab, BACKEND, **kw)


def _accepts(guide, ids: list[int], eos: int) -> bool:
    m = guide.matcher()
    return all(m.accept_token(t) for t in ids) and m.accept_token(eos)


REGEXES = [r"\d{3}-[a-z]{2,4}", r"(yes|no|maybe)", r"[A-Z][a-z]{0,6}( [A-Z][a-z]{0,6}){0,3}", r"-?(0|[1-9]\d{0,5})(\.\d{1,4})?",
           r"\w{1,8}@\w{1,8}\.(com|org)", r"é[ñü]{1,3}"]


@pytest.mark.parametrize("pattern", REGEXES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_regex_worst_case_sampler_matches_re(vocab, pattern, seed):
    """The lowest-logit allowed token every step still yields a full match of the pattern."""
    guide = _compile(GuideSpec.regex(pattern), vocab)
    ids, ended = adversarial_decode(guide.matcher(), vocab, seed=seed, max_steps=200)
    assert ended, "generation never allowed EOS"
    assert re.fullmatch(pattern, decode_text(vocab, ids), re.ASCII), decode_text(vocab, ids)


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 150}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "items": {"enum": ["a", "b", 3, None]}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}},
                                      "score": {"type": "number", "exclusiveMinimum": 0}},
     "required": ["tags"], "additionalProperties": False},
    {"anyOf": [{"type": "integer", "multipleOf": 7}, {"type": "boolean"}]},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=[f"schema{i}" for i in range(len(SCHEMAS))])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_json_schema_worst_case_sampler_validates(vocab, schema, seed):
    # Compact whitespace: with free whitespace a worst-case sampler may pick spaces forever.
    guide = _compile(GuideSpec.json_schema(schema, any_whitespace=False), vocab)
    ids, ended = adversarial_decode(guide.matcher(), vocab, seed=seed, max_steps=300)
    assert ended
    jsonschema.validate(json.loads(decode_text(vocab, ids)), schema)


def test_mask_bits_are_accepted_and_rejections_are_typed(vocab, smollm2_tokenizer):
    """Every token the mask allows is accepted (state unchanged after rollback); tokens outside
    the grammar are refused without corrupting the matcher."""
    schema = SCHEMAS[0]
    guide = _compile(GuideSpec.json_schema(schema), vocab)
    m = guide.matcher()
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    text = json.dumps({"name": "Ada", "age": 36})
    for tok in smollm2_tokenizer.encode(text):
        m.fill_next_token_bitmask(bm, 0)
        ids = allowed_ids(bm[0], vocab.vocab_size).tolist()
        assert ids, "empty mask"
        for t in ids[:: max(1, len(ids) // 40)]:
            assert m.accept_token(t), t
            m.rollback(1)
        for t in sorted(vocab.special_ids - set(vocab.eos_ids)):
            assert not m.accept_token(t)
        assert m.accept_token(tok)
    assert m.is_accepting()
    assert m.accept_token(vocab.eos_ids[0]) and m.is_terminated()


def test_invalid_instances_are_rejected(vocab, smollm2_tokenizer):
    guide = _compile(GuideSpec.json_schema(SCHEMAS[0]), vocab)
    eos = vocab.eos_ids[0]
    good = {"name": "Bob", "age": 3}
    assert _accepts(guide, smollm2_tokenizer.encode(json.dumps(good)), eos)
    for bad in ({"name": "Bob"}, {"name": "Bob", "age": -1}, {"name": "x" * 13, "age": 1},
                {"name": "Bob", "age": 1, "x": 0}, {"name": "Bob", "age": 1.5}):
        assert not _accepts(guide, smollm2_tokenizer.encode(json.dumps(bad)), eos), bad


def test_compact_whitespace_matches_xgrammar_separators(vocab, smollm2_tokenizer):
    """any_whitespace=False: exactly json.dumps' ", " / ": " separators, as the xgrammar backend."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "required": ["a", "b"], "additionalProperties": False}
    guide = _compile(GuideSpec.json_schema(schema, any_whitespace=False), vocab)
    eos = vocab.eos_ids[0]
    assert _accepts(guide, smollm2_tokenizer.encode('{"a": 1, "b": 2}'), eos)
    assert not _accepts(guide, smollm2_tokenizer.encode('{"a":1,"b":2}'), eos)
    assert not _accepts(guide, smollm2_tokenizer.encode('{"a": 1,  "b": 2}'), eos)


@pytest.mark.parametrize("spec, text", [
    (GuideSpec.json_schema(SCHEMAS[2]), json.dumps({"tags": ["ab", "c"], "score": 2.5})),  # stopped at EOS
    (GuideSpec.regex("a[bc]{0,9}"), "abcb"),  # EOS while more text could still follow
])
def test_rollback_restores_exact_masks(vocab, smollm2_tokenizer, spec, text):
    guide = _compile(spec, vocab)
    m = guide.matcher()
    ids = smollm2_tokenizer.encode(text)
    bm = allocate_token_bitmask(len(ids) + 1, vocab.vocab_size)
    for i, t in enumerate(ids):
        m.fill_next_token_bitmask(bm, i)
        assert m.accept_token(t)
    m.fill_next_token_bitmask(bm, len(ids))
    assert m.accept_token(vocab.eos_ids[0])
    again = allocate_token_bitmask(1, vocab.vocab_size)
    for k in range(len(ids), -1, -1):
        m.rollback(1)
        assert not m.is_terminated()
        m.fill_next_token_bitmask(again, 0)
        assert torch.equal(again[0], bm[k]), f"mask differs after rolling back to step {k}"
    with pytest.raises(ValueError):
        m.rollback(1)
    m.reset()
    m.fill_next_token_bitmask(again, 0)
    assert torch.equal(again[0], bm[0])


def test_terminated_allows_only_eos_and_refuses_tokens(vocab):
    guide = _compile(GuideSpec.choice(["yes", "no"]), vocab)
    m = guide.matcher()
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    ids, ended = adversarial_decode(m, vocab, seed=5)
    assert ended and decode_text(vocab, ids) in ("yes", "no")
    assert m.is_terminated() and not m.accept_token(ids[0]) and not m.accept_token(vocab.eos_ids[0])
    m.fill_next_token_bitmask(bm, 0)
    assert allowed_ids(bm[0], vocab.vocab_size).tolist() == sorted(vocab.eos_ids)


def test_special_tokens_never_allowed_even_when_text_is_in_grammar(vocab, smollm2_tokenizer):
    """'<|im_start|>' as grammar/regex/choice text is reachable only through ordinary tokens."""
    im_start = smollm2_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert im_start in vocab.special_ids
    specials = sorted(vocab.special_ids - set(vocab.eos_ids))
    for spec in (GuideSpec.regex(r"<\|im_start\|>(user|assistant)"),
                 GuideSpec.choice(["<|im_start|>", "<|im_end|>"]),
                 GuideSpec.grammar('root ::= "<|im_start|>" "system"')):
        guide = _compile(spec, vocab)
        m = guide.matcher()
        bm = allocate_token_bitmask(1, vocab.vocab_size)
        m.fill_next_token_bitmask(bm, 0)
        allowed = set(allowed_ids(bm[0], vocab.vocab_size).tolist())
        assert not allowed & set(specials)
        assert not m.accept_token(im_start)
        for seed in range(3):
            ids, ended = adversarial_decode(guide.matcher(), vocab, seed=seed, max_steps=60)
            assert ended and not set(ids) & set(specials)
            assert decode_text(vocab, ids).startswith("<|im_")


def test_grammar_token_references_are_refused(vocab):
    for text in ('start: "a" <[1]> "b"', 'start: "a" <|im_start|>'):
        with pytest.raises((UnsupportedGuideError, InvalidGuideError)):
            _compile(GuideSpec.grammar(text), vocab)


def test_padded_vocabulary_never_allows_padding_ids():
    base = [bytes([i]) for i in range(256)] + [b"<eos>"]
    vocab = Vocabulary(token_bytes=base, eos_ids=(256,), special_ids=frozenset({256}), vocab_size=320)
    guide = _compile(GuideSpec.regex("[a-c]+"), vocab)
    m = guide.matcher()
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    m.fill_next_token_bitmask(bm, 0)
    assert allowed_ids(bm[0], 320).tolist() == [97, 98, 99]
    assert not m.accept_token(300) and not m.accept_token(-1) and not m.accept_token(10_000)
    assert m.accept_token(97)
    m.fill_next_token_bitmask(bm, 0)
    assert allowed_ids(bm[0], 320).tolist() == [97, 98, 99, 256]


@pytest.mark.parametrize("spec, error", [
    (lambda: GuideSpec.regex("a(b"), InvalidGuideError),
    (lambda: GuideSpec.json_schema({"type": "array", "uniqueItems": True}), UnsupportedGuideError),
    (lambda: GuideSpec.json_schema({"not": {"const": 3}}), UnsupportedGuideError),
    (lambda: GuideSpec.json_schema({"type": "string", "format": "no-such-format"}), UnsupportedGuideError),
    (lambda: GuideSpec.json_schema({"oneOf": [{"type": "integer"}, {"type": "number"}]}), UnsupportedGuideError),
    (lambda: GuideSpec.json_schema({"$ref": "https://example.com/s.json"}), UnsupportedGuideError),
    (lambda: GuideSpec.json_schema({"$ref": "#/$defs/missing"}), InvalidGuideError),
    (lambda: GuideSpec.grammar("root ::= ( "), InvalidGuideError),
    (lambda: GuideSpec.regex("a{1,100000}"), GuideLimitError),
    (lambda: GuideSpec.structural_tag({"structures": [], "triggers": []}), UnsupportedGuideError),
])
def test_errors_are_typed(vocab, spec, error):
    with pytest.raises(error) as info:
        _compile(spec(), vocab)
    assert str(info.value)


def test_json_object_and_lark_grammar(vocab, smollm2_tokenizer):
    eos = vocab.eos_ids[0]
    obj = _compile(GuideSpec.json_object(), vocab)
    assert _accepts(obj, smollm2_tokenizer.encode('{"k": [1, {"z": null}]}'), eos)
    assert not _accepts(obj, smollm2_tokenizer.encode('[1]'), eos)
    lark = _compile(GuideSpec.grammar('start: "n=" NUM\nNUM: /[0-9]+/'), vocab)
    assert _accepts(lark, smollm2_tokenizer.encode("n=42"), eos)
    assert not _accepts(lark, smollm2_tokenizer.encode("n=4a"), eos)
    gbnf = _compile(GuideSpec.grammar('root ::= "x" [0-9]+'), vocab)
    assert _accepts(gbnf, smollm2_tokenizer.encode("x12"), eos)


def test_lowered_keywords_are_enforced(vocab, smollm2_tokenizer):
    """dependencies / not-forms llguidance lacks are rewritten exactly, then enforced."""
    eos = vocab.eos_ids[0]
    enc = lambda v: smollm2_tokenizer.encode(json.dumps(v))  # noqa: E731
    not_str = _compile(GuideSpec.json_schema({"not": {"type": "string"}}), vocab)
    assert _accepts(not_str, enc(3), eos) and not _accepts(not_str, enc("x"), eos)
    dep = _compile(GuideSpec.json_schema({"type": "object", "dependencies": {"a": ["b"]},
                                          "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}), vocab)
    assert _accepts(dep, enc({"a": 1, "b": 2}), eos) and _accepts(dep, enc({"b": 2}), eos)
    assert not _accepts(dep, enc({"a": 1}), eos)
