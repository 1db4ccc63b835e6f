"""Marker tokens on xgrammar (xgrammar_markers.py): allowed exactly where the grammar spells their
text, never in free text, and what the marker matcher allows, read as text, is in the language.

SmolLM2's added tokens (``<file_sep>`` = 5, ``<gh_stars>`` = 7, ``<|im_start|>`` = 1) stand in for
tool-call markers; tests/engine_patch/lmdeploy/test_tool_markers.py runs LMDeploy's real formats.
"""
from __future__ import annotations

import json
import random

import pytest
import torch
import xgrammar as xgr

from tokenrails.guided.backends.xgrammar_backend import MarkerXGrammarMatcher, XGrammarBackend
from tokenrails.guided.errors import GuideError
from tokenrails.guided.limits import GuideLimits
from tokenrails.guided.spec import GuideSpec

FILE_SEP, GH_STARS, IM_START = 5, 7, 1


@pytest.fixture(scope="module")
def backend(vocab):
    return XGrammarBackend(vocab, GuideLimits())


def allowed(matcher, vocab) -> torch.Tensor:
    mask = torch.zeros((1, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
    matcher.fill_next_token_bitmask(mask, 0)
    words = mask[0].to(torch.int64) & 0xFFFFFFFF
    return (((words.unsqueeze(-1) >> torch.arange(32)) & 1).flatten()[: vocab.vocab_size]).bool()


def specials_allowed(matcher, vocab) -> set[int]:
    a = allowed(matcher, vocab)
    return {i for i in vocab.special_ids if bool(a[i])}


def feed(matcher, tok, text: str) -> None:
    for t in tok.encode(text, add_special_tokens=False):
        assert matcher.accept_token(t), (text, t)


def feed_plain(matcher, tok, text: str) -> None:
    """``text`` one character at a time: ordinary tokens only, never a marker."""
    for ch in text:
        feed(matcher, tok, ch)


def tag(fmt: dict) -> GuideSpec:
    return GuideSpec.structural_tag({"type": "structural_tag", "format": fmt})


def test_grammar_literal_equal_to_a_marker_admits_the_token(backend, vocab, smollm2_tokenizer):
    g = backend.compile(GuideSpec.grammar('root ::= "<file_sep>" [a-z]+ "<file_sep>"'))
    m = g.matcher()
    assert isinstance(m, MarkerXGrammarMatcher)
    a = allowed(m, vocab)
    assert bool(a[FILE_SEP]) and bool(a[smollm2_tokenizer.convert_tokens_to_ids("<")])
    assert specials_allowed(m, vocab) == {FILE_SEP}
    assert m.accept_token(FILE_SEP)
    assert specials_allowed(m, vocab) == set()  # inside [a-z]+
    feed(m, smollm2_tokenizer, "ab")
    assert specials_allowed(m, vocab) == {FILE_SEP}
    assert m.accept_token(FILE_SEP)
    assert m.is_accepting()


def test_plain_spelling_of_the_marker_still_works(backend, vocab, smollm2_tokenizer):
    m = backend.compile(GuideSpec.grammar('root ::= "<file_sep>" "x"')).matcher()
    feed(m, smollm2_tokenizer, "<file_")
    assert not bool(allowed(m, vocab)[FILE_SEP])  # mid-literal: the marker no longer fits
    feed(m, smollm2_tokenizer, "sep>x")
    assert m.is_accepting()


def test_negated_classes_never_admit_a_marker(backend, vocab):
    m = backend.compile(GuideSpec.grammar('root ::= "<file_sep>" [^x]* "!"')).matcher()
    assert m.accept_token(FILE_SEP)
    assert specials_allowed(m, vocab) == set()


def test_literal_that_only_contains_a_marker_is_not_one(backend, vocab):
    m = backend.compile(GuideSpec.grammar('root ::= "a<file_sep>b"')).matcher()
    assert not isinstance(m, MarkerXGrammarMatcher)
    assert specials_allowed(m, vocab) == set()


def test_client_token_syntax_is_never_compiled_on_the_marker_view(backend, vocab):
    try:
        g = backend.compile(GuideSpec.grammar(f'root ::= "<file_sep>" Token({IM_START})'))
    except GuideError:
        return  # refused outright: fine
    m = g.matcher()
    assert not isinstance(m, MarkerXGrammarMatcher)
    assert IM_START not in specials_allowed(m, vocab)
    if m.accept_token(FILE_SEP):
        assert IM_START not in specials_allowed(m, vocab)


def test_enum_value_equal_to_a_marker_is_free_text(backend, vocab, smollm2_tokenizer):
    spec = tag({"type": "tag", "begin": "<file_sep>", "end": "<file_sep>", "content": {
        "type": "json_schema", "json_schema": {"enum": ["<gh_stars>", "plain"]}}})
    m = backend.compile(spec).matcher()
    assert specials_allowed(m, vocab) == {FILE_SEP}
    assert m.accept_token(FILE_SEP)
    feed(m, smollm2_tokenizer, '"')
    assert specials_allowed(m, vocab) == set()  # the enum's <gh_stars> is text, not a marker
    feed_plain(m, smollm2_tokenizer, '<gh_stars>"')
    assert specials_allowed(m, vocab) == {FILE_SEP}


def test_json_string_inside_a_tag_refuses_every_marker(backend, vocab, smollm2_tokenizer):
    spec = tag({"type": "tag", "begin": "<file_sep>", "end": "<file_sep>", "content": {
        "type": "json_schema", "json_schema": {"type": "string"}}})
    m = backend.compile(spec).matcher()
    assert m.accept_token(FILE_SEP)
    feed(m, smollm2_tokenizer, '"abc')
    assert specials_allowed(m, vocab) == set()


TRIGGERED = {"type": "triggered_tags", "triggers": ["<file_sep>"], "at_least_one": False,
             "tags": [{"type": "tag", "begin": "<file_sep>=", "end": ";<issue_start>", "content": {
                 "type": "json_schema", "json_schema": {
                     "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]}


def test_trigger_marker_in_free_text_starts_the_tag(backend, vocab, smollm2_tokenizer):
    g = backend.compile(tag(TRIGGERED))
    m = g.matcher()
    assert g.triggers == {FILE_SEP: ["<file_sep>"]}
    assert specials_allowed(m, vocab) == {FILE_SEP} | set(vocab.eos_ids)
    feed(m, smollm2_tokenizer, "some text <")
    assert IM_START not in specials_allowed(m, vocab)
    assert m.accept_token(FILE_SEP)
    # the dispatcher saw the trigger: only the tag's continuation is allowed now
    a = allowed(m, vocab)
    assert {smollm2_tokenizer.decode([t])[:1] for t in a.nonzero().flatten().tolist()} == {"="}
    feed(m, smollm2_tokenizer, '={"a": 1')
    assert not m.accept_token(smollm2_tokenizer.convert_tokens_to_ids("<"))  # no way out of the tag
    feed(m, smollm2_tokenizer, "};")
    assert 8 in specials_allowed(m, vocab)  # <issue_start>: the end literal
    assert m.accept_token(8)
    assert m.is_accepting()


def test_trigger_marker_not_taken_inside_another_dispatch(backend, vocab, smollm2_tokenizer):
    fmt = {"type": "sequence", "elements": [
        {"type": "tag", "begin": "<file_sep>", "end": "<issue_start>",
         "content": {"type": "any_text"}},
        dict(TRIGGERED)]}
    m = backend.compile(tag(fmt)).matcher()
    assert m.accept_token(FILE_SEP)
    feed(m, smollm2_tokenizer, "free ")
    # inside any_text the trigger is just text: the marker is refused; the end marker is allowed
    assert specials_allowed(m, vocab) == {8}


def test_rollback_restores_masks_across_marker_paths(backend, vocab, smollm2_tokenizer):
    m = backend.compile(tag(TRIGGERED)).matcher()
    seq = smollm2_tokenizer.encode("hi ", add_special_tokens=False) + [FILE_SEP] + \
        smollm2_tokenizer.encode('={"a": 12};', add_special_tokens=False) + [8]
    masks = []
    for t in seq:
        masks.append(allowed(m, vocab))
        assert m.accept_token(t)
    for k in range(len(seq) - 1, -1, -1):
        m.rollback(1)
        assert torch.equal(allowed(m, vocab), masks[k]), k


def test_batch_fill_matches_single_fills(backend, vocab, smollm2_tokenizer):
    g = backend.compile(tag(TRIGGERED))
    ms = [g.matcher() for _ in range(3)]
    feed(ms[1], smollm2_tokenizer, "x")
    assert ms[2].accept_token(FILE_SEP)
    width = (vocab.vocab_size + 31) // 32
    batch = torch.zeros((4, width), dtype=torch.int32)
    MarkerXGrammarMatcher.batch_fill(ms, batch, [0, 2, 3])
    for m, r in zip(ms, [0, 2, 3]):
        one = torch.zeros((1, width), dtype=torch.int32)
        m.fill_next_token_bitmask(one, 0)
        assert torch.equal(batch[r], one[0])


WALK_SPECS = [
    ("grammar", 'root ::= ("<file_sep>" [a-z]{1,4})+ "<issue_start>"?'),
    ("tag", TRIGGERED),
    ("tag", {"type": "sequence", "elements": [
        {"type": "const_string", "value": "<gh_stars>:"},
        {"type": "tags_with_separator", "separator": "<file_sep>", "at_least_one": True, "tags": [
            {"type": "tag", "begin": "<issue_start>", "end": "<issue_closed>", "content": {
                "type": "json_schema", "json_schema": {"type": "string", "maxLength": 3}}}]}]}),
]


@pytest.mark.parametrize("kind,body", WALK_SPECS, ids=["grammar", "triggered", "separator"])
def test_random_walks_stay_in_the_language(backend, vocab, kind, body):
    """Oracle: the same grammar compiled by xgrammar on the stock (text) view must accept the
    walk's text, markers read as their text, at every step; markers are never in free text."""
    spec = GuideSpec.grammar(body) if kind == "grammar" else tag(body)
    guide = backend.compile(spec)
    oracle_info = xgr.TokenizerInfo(vocab.grammar_token_bytes(), xgr.VocabType.RAW,
                                    vocab_size=vocab.vocab_size, stop_token_ids=list(vocab.eos_ids))
    compiler = xgr.GrammarCompiler(oracle_info)
    oracle_grammar = (compiler.compile_grammar(body) if kind == "grammar"
                      else compiler.compile_structural_tag(json.dumps({"type": "structural_tag", "format": body})))
    rng = random.Random(7)
    used_markers = 0
    for _ in range(25):
        m, oracle = guide.matcher(), xgr.GrammarMatcher(oracle_grammar)
        for _ in range(30):
            a = allowed(m, vocab).nonzero().flatten().tolist()
            specials = [t for t in a if t in vocab.special_ids and t not in vocab.eos_ids]
            pool = specials if specials and rng.random() < 0.5 else a
            t = rng.choice(pool)
            if t in vocab.eos_ids:
                assert oracle.is_completed() or oracle.accept_token(t)
                break
            assert m.accept_token(t), t
            used_markers += t in vocab.special_ids
            assert oracle.accept_string(vocab.token_bytes[t]), (t, vocab.token_bytes[t])
    assert used_markers > 0
