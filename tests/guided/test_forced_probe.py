"""The forced-token rule skips the mask fill where nothing is forced, and its runs stay the same.

Oracle: the rule written the plain way, filling the mask at every position (bits read by
``helpers.allowed_ids``): one allowed token is forced, else the forced string's canonical
tokenization is taken as far as the grammar accepts it. On many states of tool-call and JSON
grammars (xgrammar, llguidance), regexes (the fsm too), marker-token grammars, a grammar naming a
token id, and characters begun by a byte token, ``forced_tokens`` returns exactly that run, with the
same count of one-token positions, and learns that nothing is forced without filling a mask
(except where the forced bytes are no whole character yet).
"""
from __future__ import annotations

import json
import random

import pytest

from tokenrails import GuideSpec, allocate_token_bitmask, compile_guide
from tokenrails.guided import forced
from tokenrails.guided.registry import available_backends

from .helpers import allowed_ids

TOOL = {"type": "object", "properties": {
    "name": {"const": "get_weather"},
    "arguments": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["city", "unit"], "additionalProperties": False}},
    "required": ["name", "arguments"], "additionalProperties": False}
RECORD = {"type": "object", "properties": {
    "id": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["北京", "上海", "café", "caña"]},
                                        "maxItems": 3},
    "ok": {"type": "boolean"}, "note": {"type": ["string", "null"]}},
    "required": ["id", "tags", "ok"], "additionalProperties": False}
TOOL_TAG = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": [
    {"begin": '<tool_call>\n{"name": "get_weather", "arguments": ', "content": {
        "type": "json_schema", "json_schema": TOOL["properties"]["arguments"]}, "end": "}\n</tool_call>"}],
    "at_least_one": True, "stop_after_first": True}}
SPECS = {
    "tool json": GuideSpec.json_schema(json.dumps(TOOL), any_whitespace=False),
    "json": GuideSpec.json_schema(json.dumps(RECORD), any_whitespace=False),
    "json, any whitespace": GuideSpec.json_schema(json.dumps(RECORD)),
    "tool tag": GuideSpec.structural_tag(TOOL_TAG),
    "regex": GuideSpec.regex(r'\{"id": [0-9]{1,3}, "city": "(北京|上海|東京|Zürich)", "ok": (true|false)\}'),
    "marker": GuideSpec.grammar('root ::= "<|im_start|>" ("user" | "assistant") "\\n" [a-z]+ "<|im_end|>"'),
}
BACKENDS = ["xgrammar", "llguidance", "fsm"]


def _guide(spec, vocab, backend):
    if backend not in available_backends():
        pytest.skip(f"backend {backend} not installed")
    try:
        return compile_guide(spec.with_routing(backend, fallback=False), vocab)
    except Exception as exc:  # noqa: BLE001 - this backend does not take this kind
        pytest.skip(f"{backend} does not compile it: {type(exc).__name__}")


def _fill_first(m, vocab, k: int, encode) -> tuple[tuple[int, ...], int]:
    """The rule filling a mask at every position: (tokens, how many came from one-token masks)."""
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    out, single = [], 0
    try:
        while len(out) < k and not m.is_terminated():
            m.fill_next_token_bitmask(bm, 0)
            ids = allowed_ids(bm[0], vocab.vocab_size).tolist()
            if len(ids) == 1:
                if ids[0] in vocab.eos_ids or not m.accept_token(ids[0]):
                    break
                out.append(ids[0])
                single += 1
                continue
            text = m.find_jump_forward_string()
            taken = 0
            for t in encode(text) if text else ():
                if len(out) >= k or t in vocab.eos_ids or not m.accept_token(t):
                    break
                out.append(t)
                taken += 1
            if not taken:
                break
    finally:
        if out:
            m.rollback(len(out))
    return tuple(out), single


class _CountFills:
    def __init__(self, m, monkeypatch):
        self.n = 0
        real = type(m).fill_next_token_bitmask

        def counting(this, *a, **kw):
            self.n += 1
            return real(this, *a, **kw)

        monkeypatch.setattr(type(m), "fill_next_token_bitmask", counting)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(SPECS))
def test_runs_equal_the_rule_that_fills_every_position(vocab, smollm2_tokenizer, backend, name, monkeypatch):
    guide = _guide(SPECS[name], vocab, backend)
    encode = lambda text: smollm2_tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    rnd = random.Random(name)
    nothing = filled = 0  # states where nothing is forced; those of them the rule filled a mask at
    for seed in range(6):
        m = guide.matcher()
        for _ in range(40):
            want = _fill_first(m, vocab, 4, encode)
            counter = _CountFills(m, monkeypatch)
            got = forced.forced_tokens(m, 4, encode=encode, bitmask=bm)
            monkeypatch.undo()
            assert (got.tokens, got.single) == want, (name, backend, smollm2_tokenizer.decode(want[0]))
            if not want[0]:
                nothing += 1
                filled += counter.n > 0
            if m.is_terminated() or not m.fill_next_token_bitmask(bm, 0):
                break
            ids = [t for t in allowed_ids(bm[0], vocab.vocab_size).tolist() if t not in vocab.eos_ids]
            if not ids:
                break
            # mostly tokens that end where a character ends, sometimes a lone byte starting one
            pick = rnd.choice(ids) if rnd.random() < 0.7 else min(ids, key=lambda t: len(vocab.token_bytes[t]))
            assert m.accept_token(pick)
    assert nothing >= 10
    # filled only where bytes are forced that are no whole character yet (a byte token began one)
    assert filled <= nothing // 4, (filled, nothing)


@pytest.mark.parametrize("backend", BACKENDS)
def test_forced_bytes_that_are_no_whole_character(vocab, smollm2_tokenizer, backend):
    """Two characters sharing a lead byte, and a character begun by a byte token: the forced bytes
    are no text, yet one byte token may be the only one allowed; the run is the filling rule's."""
    encode = lambda text: smollm2_tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    forced_somewhere = False
    for pattern, prefix in [("(é|è)x", b""), ("日本!", b"\xe6"), ("€x", b"\xe2"), ("[āă]x", b"")]:
        guide = _guide(GuideSpec.regex(pattern), vocab, backend)
        m = guide.matcher()
        for b in prefix:
            assert m.accept_token(vocab.token_bytes.index(bytes([b])))
        run = forced.forced_tokens(m, 4, encode=encode)
        assert m.find_jump_forward_string() == ""  # no whole character is forced: no text (no error)
        assert (run.tokens, run.single) == _fill_first(m, vocab, 4, encode), pattern
        forced_somewhere |= bool(run.single)
    assert forced_somewhere  # a character begun by a byte token: its next byte's token is the one allowed


def test_a_grammar_naming_a_token_id_keeps_its_one_token_masks(vocab, smollm2_tokenizer):
    """xgrammar's token-level format allows one token with no forced text: it is still forced."""
    hello = smollm2_tokenizer.encode("hello", add_special_tokens=False)[0]
    tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
        {"type": "token", "token": hello}, {"type": "const_string", "value": " world"}]}}
    m = _guide(GuideSpec.structural_tag(tag), vocab, "xgrammar").matcher()
    assert m.find_jump_forward_string() == ""
    encode = lambda text: smollm2_tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    run = forced.forced_tokens(m, 4, encode=encode)
    assert run.tokens[:1] == (hello,) and run.single >= 1
    assert smollm2_tokenizer.decode(list(run.tokens)) == "hello world"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["tool json", "json", "tool tag", "regex"])
def test_every_mask_a_run_reports_is_the_mask_there(vocab, smollm2_tokenizer, backend, name):
    """A verifier uses the masks a run reports instead of filling them (a token id: that token
    alone is allowed; a row: exactly those bits). Each equals the mask a fill gives at that
    position, wherever the run learned it (a fill, or llguidance's forced tokens, which fill none)."""
    guide = _guide(SPECS[name], vocab, backend)
    encode = lambda text: smollm2_tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    rnd = random.Random(name + backend)
    reported = 0
    for seed in range(4):
        m = guide.matcher()
        for _ in range(40):
            run = forced.forced_tokens(m, 6, encode=encode, bitmask=allocate_token_bitmask(1, vocab.vocab_size))
            walked = 0
            for j, seen in enumerate(run.masks):
                if seen is not None:
                    m.fill_next_token_bitmask(bm, 0)
                    ids = allowed_ids(bm[0], vocab.vocab_size).tolist()
                    if isinstance(seen, int):
                        assert ids == [seen], (name, backend, j)
                    else:
                        assert (seen == bm[0].numpy()).all(), (name, backend, j)
                    reported += 1
                if j < len(run.tokens):
                    assert m.accept_token(run.tokens[j])
                    walked += 1
            if walked:
                m.rollback(walked)
            if m.is_terminated() or not m.fill_next_token_bitmask(bm, 0):
                break
            ids = [t for t in allowed_ids(bm[0], vocab.vocab_size).tolist() if t not in vocab.eos_ids]
            if not ids:
                break
            assert m.accept_token(rnd.choice(ids))
    assert reported >= 5


def test_llguidance_forced_tokens_need_no_fill(vocab, smollm2_tokenizer, monkeypatch):
    """llguidance forces a forced text as its canonical tokens, and names them in one call: a run
    through them fills no mask, where asking position by position filled one per token."""
    guide = _guide(SPECS["tool json"], vocab, "llguidance")
    encode = lambda text: smollm2_tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    m = guide.matcher()
    want = _fill_first(m, vocab, 6, encode)
    counter = _CountFills(m, monkeypatch)
    run = forced.forced_tokens(m, 6, encode=encode)
    assert (run.tokens, run.single) == want and len(run.tokens) == 6
    assert counter.n == 0
    assert smollm2_tokenizer.decode(list(run.tokens)).startswith('{"name": "get')
    monkeypatch.setattr(type(m), "forced_token_ids", lambda self, n: None)  # the backend cannot say
    counter.n = 0
    assert forced.forced_tokens(m, 6, encode=encode).tokens == run.tokens
    assert counter.n == 6
