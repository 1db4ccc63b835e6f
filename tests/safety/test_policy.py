"""Operator policy, and the guarantee that no grammar can make a guided row emit a control token."""
from __future__ import annotations

import pytest

from tokenrails import GuideSpec, allocate_token_bitmask, compile_guide
from tokenrails.guided.errors import GuideError, GuidePolicyError
from tokenrails.guided.policy import GuidePolicy, check_policy, find_token_reference
from tokenrails.guided.registry import available_backends
from tests.guided.helpers import adversarial_decode, allowed_ids, decode_text

IM_START = "<|im_start|>"


def test_allowed_kinds():
    only_json = GuidePolicy.json_schema_only()
    check_policy(GuideSpec.json_schema({"type": "integer"}), only_json)
    check_policy(GuideSpec.json_object(), only_json)
    for spec in (GuideSpec.regex("a+"), GuideSpec.grammar('root ::= "a"'), GuideSpec.choice(["a"]),
                 GuideSpec.structural_tag({"structures": [], "triggers": []})):
        with pytest.raises(GuidePolicyError) as info:
            check_policy(spec, only_json)
        assert info.value.rule == "allowed_kinds" and spec.kind in str(info.value)
    no_grammars = GuidePolicy.no_client_grammars()
    check_policy(GuideSpec.choice(["a", "b"]), no_grammars)
    with pytest.raises(GuidePolicyError):
        check_policy(GuideSpec.regex("a"), no_grammars)
    assert issubclass(GuidePolicyError, GuideError)


@pytest.mark.parametrize("grammar, ref", [
    ('root ::= "a" <[1]>', "<[1]>"),
    ("start: <|im_start|> \"user\"", "<|im_start|>"),
    ('root ::= "x" <[ 7, 9 ]> "y"', "<[ 7, 9 ]>"),
])
def test_special_token_references_refused_by_default(grammar, ref):
    spec = GuideSpec.grammar(grammar)
    assert find_token_reference(grammar) == ref
    with pytest.raises(GuidePolicyError) as info:
        check_policy(spec)
    assert info.value.rule == "allow_special_token_refs"
    check_policy(spec, GuidePolicy(allow_special_token_refs=True))


@pytest.mark.parametrize("grammar", [
    'root ::= "<|im_start|>" "user"',          # quoted literal text: allowed (ordinary tokens)
    "root ::= \"a\" | '<[1]>'",
    'root ::= [<] "x"',
])
def test_literal_text_is_not_a_token_reference(grammar):
    assert find_token_reference(grammar) is None
    check_policy(GuideSpec.grammar(grammar))


def _specs_with_special_text():
    yield "ebnf", GuideSpec.grammar('root ::= "<|im_start|>" ("user" | "assistant")')
    yield "regex", GuideSpec.regex(r"<\|im_start\|>(user|assistant)")
    yield "choice", GuideSpec.choice([IM_START + "system", IM_START])
    yield "json_schema", GuideSpec.json_schema({"const": IM_START})
    yield "structural_tag", GuideSpec.structural_tag({
        "structures": [{"begin": IM_START, "schema": {"type": "integer"}, "end": "<|im_end|>"}],
        "triggers": ["<|im_"]})


BACKENDS = ["auto"] + [b for b in ("xgrammar", "llguidance", "fsm") if b in available_backends()]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("label, spec", list(_specs_with_special_text()), ids=[x[0] for x in _specs_with_special_text()])
def test_special_text_in_a_grammar_never_yields_control_tokens(vocab, smollm2_tokenizer, backend, label, spec):
    """"<|im_start|>" inside a grammar is reachable as literal text through ordinary tokens, and as
    the token itself only where an EBNF literal is exactly its text; no control id is ever allowed
    or accepted anywhere else."""
    im_start = smollm2_tokenizer.convert_tokens_to_ids(IM_START)
    assert im_start == 1 and im_start in vocab.special_ids
    try:
        guide = compile_guide(spec, vocab, backend)
    except GuideError:
        return  # refusing is also safe (e.g. fsm has no structural tags)
    controls = sorted(vocab.special_ids - set(vocab.eos_ids))
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    # An EBNF literal equal to a marker's text is a marker position (issue 13: the token is
    # allowed exactly there, as stock allows it); everywhere else, and for every other kind
    # (regex, choice, schema const, a tag begin reached through a partial trigger), never.
    marker_at_start = label == "ebnf" and guide.backend == "xgrammar"
    for seed in range(3):
        m = guide.matcher()
        m.fill_next_token_bitmask(bm, 0)
        first = set(allowed_ids(bm[0], vocab.vocab_size).tolist()) & set(controls)
        assert first == ({im_start} if marker_at_start else set())
        if marker_at_start:
            assert m.accept_token(im_start)
            m.fill_next_token_bitmask(bm, 0)
            assert not set(allowed_ids(bm[0], vocab.vocab_size).tolist()) & set(controls)
            m.rollback(1)
        else:
            assert not m.accept_token(im_start)
        ids, ended = adversarial_decode(m, vocab, seed=seed, max_steps=80)
        assert not set(ids[1:] if marker_at_start else ids) & set(controls)
        if label != "structural_tag":
            assert ended
            assert IM_START in decode_text(vocab, ids) or (marker_at_start and ids[0] == im_start)
