"""The xgrammar backend against oracles: jsonschema / re.fullmatch under an adversarial sampler."""
import json
import re

import jsonschema
import pytest
import torch

from tokenrails import (
    GuideSpec,
    InvalidGuideError,
    UnsupportedGuideError,
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    compile_guide,
)

from .helpers import adversarial_decode, decode_text

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z ]{0,12}$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "member": {"type": "boolean"},
        },
        "required": ["name", "age", "member"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{0,5}$"}, "maxItems": 3},
        },
        "required": ["color", "tags"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 99}, "ok": {"type": "boolean"}},
            "required": ["id", "ok"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 3,
    },
    {"anyOf": [{"type": "null"}, {"type": "string", "enum": ["a", "b\"c", "dé"]}]},
]
REGEXES = [r"\d{3}-\d{4}", r"[a-z]{1,8}@[a-z]{1,8}\.(com|org)", r"(\+1 )?\(\d{3}\) \d{3}-\d{4}", r"(yes|no|maybe)!?"]
CHOICES = ["Paris", "London", "New York", "São Paulo", 'quote"d']


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_worst_token_json_output_validates(vocab, schema, seed):
    m = compile_guide(GuideSpec.json_schema(schema, any_whitespace=False), vocab, backend="xgrammar").matcher()
    ids, ended = adversarial_decode(m, vocab, seed=seed)
    assert ended, "output did not end at EOS"
    jsonschema.validate(json.loads(decode_text(vocab, ids)), schema)
    assert m.is_terminated()


@pytest.mark.parametrize("pattern", REGEXES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_worst_token_regex_output_fullmatches(vocab, pattern, seed):
    m = compile_guide(GuideSpec.regex(pattern), vocab, backend="xgrammar").matcher()
    ids, ended = adversarial_decode(m, vocab, seed=seed)
    assert ended
    assert re.fullmatch(pattern, decode_text(vocab, ids))


@pytest.mark.parametrize("seed", range(5))
def test_worst_token_choice_is_one_of_the_options(vocab, seed):
    m = compile_guide(GuideSpec.choice(CHOICES), vocab, backend="xgrammar").matcher()
    ids, ended = adversarial_decode(m, vocab, seed=seed, worst=seed % 2 == 0)
    assert ended and decode_text(vocab, ids) in CHOICES


def test_renormalization_single_allowed_token_sampled_with_probability_one(vocab, smollm2_tokenizer):
    m = compile_guide(GuideSpec.regex("x"), vocab, backend="xgrammar").matcher()
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    m.fill_next_token_bitmask(bm)
    logits = torch.randn(1, vocab.vocab_size) * 5
    apply_token_bitmask_inplace(logits, bm)
    probs = torch.softmax(logits, dim=-1)
    x = smollm2_tokenizer.convert_tokens_to_ids("x")
    assert probs[0, x].item() == 1.0
    draws = torch.multinomial(probs.expand(64, -1), 50, replacement=True, generator=torch.Generator().manual_seed(0))
    assert bool((draws == x).all())


@pytest.mark.parametrize("spec", [GuideSpec.json_schema(SCHEMAS[0]), GuideSpec.regex(REGEXES[1]), GuideSpec.choice(CHOICES)])
def test_rollback_restores_bit_identical_masks(vocab, spec):
    m = compile_guide(spec, vocab, backend="xgrammar").matcher()
    ids, _ = adversarial_decode(m, vocab, seed=7, worst=False)
    m.reset()
    bm = allocate_token_bitmask(2, vocab.vocab_size)
    half = len(ids) // 2
    for t in ids[:half]:
        assert m.accept_token(t)
    m.fill_next_token_bitmask(bm, 0)
    for t in ids[half:]:
        assert m.accept_token(t)
    m.rollback(len(ids) - half)
    m.fill_next_token_bitmask(bm, 1)
    assert torch.equal(bm[0], bm[1])


def test_terminated_matcher_allows_only_eos(vocab):
    m = compile_guide(GuideSpec.choice(["a"]), vocab, backend="xgrammar").matcher()
    assert m.accept_token(vocab.token_bytes.index(b"a"))
    assert m.accept_token(vocab.eos_ids[0]) and m.is_terminated()
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    m.fill_next_token_bitmask(bm)
    logits = torch.zeros(1, vocab.vocab_size)
    apply_token_bitmask_inplace(logits, bm)
    assert torch.isfinite(logits[0]).nonzero().reshape(-1).tolist() == list(vocab.eos_ids)
    assert not m.accept_token(5)


def test_jump_forward_string_for_fixed_keys(vocab):
    schema = {"type": "object", "properties": {"customer_name": {"type": "string"}}, "required": ["customer_name"]}
    m = compile_guide(GuideSpec.json_schema(schema, any_whitespace=False), vocab, backend="xgrammar").matcher()
    assert m.find_jump_forward_string().startswith('{"customer_name":')


@pytest.mark.parametrize(
    "spec, error",
    [
        (GuideSpec.regex("(abc"), InvalidGuideError),
        (GuideSpec.grammar("root ::= undefined_rule"), InvalidGuideError),
        (GuideSpec.json_schema({"type": "string", "pattern": "[a-z]+", "maxLength": 4}), UnsupportedGuideError),
        (GuideSpec.json_schema({"type": "array", "uniqueItems": True}), UnsupportedGuideError),
    ],
)
def test_bad_or_unenforceable_specs_raise_typed_errors(vocab, spec, error):
    with pytest.raises(error) as info:
        compile_guide(spec, vocab, backend="xgrammar")
    assert str(info.value)
    if error is UnsupportedGuideError:
        assert "xgrammar" in str(info.value)


def test_pattern_with_max_length_is_not_silently_dropped_under_auto(vocab):
    """auto must enforce both bounds, or refuse — never accept an over-long string."""
    schema = {"type": "string", "pattern": "^[a-z]+$", "maxLength": 4}
    try:
        m = compile_guide(GuideSpec.json_schema(schema), vocab).matcher()
    except UnsupportedGuideError:
        return
    # byte-level vocabulary: single-character tokens exist for ASCII letters and quotes
    ids = [vocab.token_bytes.index(ch.encode()) for ch in '"abcdefgh"']
    accepted = all(m.accept_token(t) for t in ids)
    assert not accepted


def test_error_messages_carry_no_cpp_noise(vocab):
    with pytest.raises(InvalidGuideError) as info:
        compile_guide(GuideSpec.regex("(abc"), vocab, backend="xgrammar")
    msg = str(info.value)
    assert "position" in msg and "/project/" not in msg and not re.search(r"\[\d\d:\d\d:\d\d\]", msg)


def test_length_bounded_strings_never_reach_xgrammar_which_admits_raw_control_characters(vocab):
    schema = {"type": "string", "maxLength": 5}
    with pytest.raises(UnsupportedGuideError, match="control characters"):
        compile_guide(GuideSpec.json_schema(schema), vocab, backend="xgrammar")
    m = compile_guide(GuideSpec.json_schema(schema), vocab).matcher()  # auto routes elsewhere
    assert m.accept_token(vocab.token_bytes.index(b'"'))
    assert not m.accept_token(vocab.token_bytes.index(b"\x1e"))


# A listed property beside a patternProperties pattern is decided on a small DFA, under a time
# bound; a pattern whose DFA has a few hundred states (the build reads the clock between them).
MEMBER_SCHEMA = {"type": "object", "properties": {"name": {"type": "boolean"}},
                 "patternProperties": {"^(ab|cd){1,100}$": {"type": "integer"}},
                 "required": ["name"], "additionalProperties": False}


def _stalled_once(monkeypatch):
    """The automaton clock as the first analysis sees it when its thread is put off the CPU for a
    second right after it started (a loaded machine); later builds see a steady clock."""
    import types

    from tokenrails.guided.fsm import deadline

    real, reads = deadline.time.perf_counter, []

    def perf_counter():
        reads.append(1)
        return real() + (1.0 if len(reads) > 1 else 0.0)

    monkeypatch.setattr(deadline, "time", types.SimpleNamespace(perf_counter=perf_counter))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_stalled_schema_analysis_does_not_refuse_what_xgrammar_serves(vocab, monkeypatch, seed):
    """The analysis' bound is its own CPU time: a stall of the machine does not turn "this name
    matches no pattern" into "may match" (which refuses the schema on xgrammar)."""
    _stalled_once(monkeypatch)
    guide = compile_guide(GuideSpec.json_schema(MEMBER_SCHEMA), vocab, backend="xgrammar")
    ids, ended = adversarial_decode(guide.matcher(), vocab, seed=seed)
    assert ended
    jsonschema.validate(json.loads(decode_text(vocab, ids)), MEMBER_SCHEMA)


def test_an_expensive_member_pattern_is_still_undecided(vocab, monkeypatch):
    """A pattern whose analysis is expensive itself stays "may match": xgrammar refuses the
    schema (``auto`` serves it elsewhere), stalled machine or not."""
    alts = "|".join(f"[a-{chr(ord('a') + i)}]" for i in range(25))
    schema = {"type": "object", "properties": {"name": {"type": "string"}},
              "patternProperties": {f"(?:{alts}|[0-9]{{1,8}}){{1,25}}": {"type": "integer"}}}
    _stalled_once(monkeypatch)
    with pytest.raises(UnsupportedGuideError, match="patternProperties"):
        compile_guide(GuideSpec.json_schema(schema), vocab, backend="xgrammar")
