"""Matcher contract: termination, illegal tokens, specials/padding, jump-forward, validate_tokens,
batch_fill, interchangeability with the xgrammar backend's masks."""
from __future__ import annotations

import pytest
import torch

from tokenrails import GuideSpec, UnsupportedGuideError, Vocabulary, allocate_token_bitmask, compile_guide
from tokenrails.guided.fsm.matcher import FSMMatcher

from tests.fsm.conftest import allowed_ids, fill


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_eos_terminates_and_then_only_eos(fsm_compile, smollm2_tokenizer, vocab):
    g = fsm_compile(r"ab|abc")
    m = g.matcher()
    eos = vocab.eos_ids[0]
    assert not m.accept_token(eos)  # not accepting yet
    for t in _ids(smollm2_tokenizer, "ab"):
        assert m.accept_token(t)
    assert m.is_accepting() and not m.is_terminated()
    assert eos in allowed_ids(m, vocab)
    assert m.accept_token(eos) and m.is_terminated()
    assert allowed_ids(m, vocab) == set(vocab.eos_ids)
    assert not m.accept_token(eos) and not m.accept_token(_ids(smollm2_tokenizer, "c")[0])
    assert m.find_jump_forward_string() == ""
    m.rollback(1)
    assert not m.is_terminated() and m.accept_token(_ids(smollm2_tokenizer, "c")[0])


def test_illegal_tokens_are_rejected_without_changing_state(fsm_compile, vocab):
    g = fsm_compile(r"[0-9]+")
    m = g.matcher()
    before = fill(m, vocab)
    specials = sorted(vocab.special_ids - set(vocab.eos_ids))
    for t in [-1, vocab.vocab_size, vocab.vocab_size + 5, specials[0], vocab.token_bytes.index(b"a")]:
        assert not m.accept_token(t)
        assert torch.equal(fill(m, vocab), before)
    allowed = allowed_ids(m, vocab)
    assert not allowed & vocab.special_ids  # specials never allowed (EOS not accepting yet)


def test_padded_ids_never_allowed():
    base = [bytes([b]) for b in range(256)] + [b"<eos>"]
    v = Vocabulary(base, eos_ids=(256,), vocab_size=300)  # logits wider than the tokenizer
    g = compile_guide(GuideSpec.regex(r".*"), v, "fsm")
    m = g.matcher()
    bm = allocate_token_bitmask(1, 300)
    assert m.fill_next_token_bitmask(bm, 0) is True  # something is masked
    row = bm[0]
    bits = [(int(row[t // 32]) >> (t % 32)) & 1 for t in range(320)]
    assert all(bits[t] == 0 for t in range(257, 320))
    assert bits[256] == 1 and bits[ord("a")] == 1 and bits[0x80] == 0  # lone continuation byte


def test_nothing_masked_is_reported():
    # every id is an ASCII byte or EOS, and `[\x00-\x7f]*` accepts all of them: nothing is masked
    v = Vocabulary([bytes([b]) for b in range(128)] + [b"</s>"], eos_ids=(128,), vocab_size=129)
    g = compile_guide(GuideSpec.regex(r"[\x00-\x7f]*"), v, "fsm")
    bm = allocate_token_bitmask(1, 129)
    assert g.matcher().fill_next_token_bitmask(bm, 0) is False


def test_jump_forward_strings(fsm_compile, smollm2_tokenizer, vocab):
    g = fsm_compile(r'\{"name": "[a-z]+", "id": \d+\}')
    m = g.matcher()
    assert m.find_jump_forward_string() == '{"name": "'
    for t in _ids(smollm2_tokenizer, '{"name": "bob'):
        assert m.accept_token(t)
    assert m.find_jump_forward_string() == ""  # [a-z] or the closing quote
    assert m.accept_token(_ids(smollm2_tokenizer, '"')[0])
    assert m.find_jump_forward_string() == ', "id": '
    # multi-byte forced characters, stopping at an accepting state
    g2 = fsm_compile(r"日本(語)?")
    assert g2.matcher().find_jump_forward_string() == "日本"
    # mid-character position: nothing decodable is forced from there
    m3 = fsm_compile(r"é!").matcher()
    byte_tok = {b: i for i, b in enumerate(vocab.token_bytes) if len(b) == 1 and i not in vocab.special_ids}
    assert m3.accept_token(byte_tok[b"\xc3"])
    assert m3.find_jump_forward_string() == ""
    m3.accept_token(byte_tok[b"\xa9"])
    assert m3.find_jump_forward_string() == "!"


def test_validate_tokens_leaves_state(fsm_compile, smollm2_tokenizer, vocab):
    g = fsm_compile(r"hello world")
    m = g.matcher()
    ids = _ids(smollm2_tokenizer, "hello world")
    before = fill(m, vocab)
    assert m.validate_tokens(ids + [vocab.eos_ids[0]]) == len(ids) + 1
    assert m.validate_tokens(ids[:1] + _ids(smollm2_tokenizer, "xyz")) == 1
    assert torch.equal(fill(m, vocab), before)
    for t in ids:
        m.accept_token(t)
    assert m.validate_tokens([vocab.eos_ids[0], ids[0]]) == 1


def test_rollback_beyond_history_raises(fsm_compile, smollm2_tokenizer):
    m = fsm_compile(r"ab").matcher()
    m.accept_token(_ids(smollm2_tokenizer, "a")[0])
    with pytest.raises(ValueError):
        m.rollback(2)
    m.reset()
    assert m.state == 1


def test_batch_fill_equals_single_fills(fsm_compile, smollm2_tokenizer, vocab):
    g = fsm_compile(r"[a-z]+ [0-9]+")
    ms = [g.matcher() for _ in range(6)]
    for i, m in enumerate(ms):
        for t in _ids(smollm2_tokenizer, "abc 12"[: i + 1]):
            m.accept_token(t)
    bm = allocate_token_bitmask(8, vocab.vocab_size)
    rows = [7, 0, 3, 5, 1, 2]
    FSMMatcher.batch_fill(ms, bm, rows)
    for m, r in zip(ms, rows):
        assert torch.equal(bm[r], fill(m, vocab))


@pytest.mark.parametrize("spec", [
    GuideSpec.regex(r"(true|false|null|-?[0-9]+)"),
    GuideSpec.choice(["red", "green", "blue", "a\"quote", "ünï"]),
    GuideSpec.regex(r"[A-Z]{2}-[0-9]{3}"),  # not \d: xgrammar's \d is ASCII, Python's is Unicode
])
def test_masks_interchangeable_with_xgrammar(vocab, spec):
    """Same masks as the xgrammar backend along a valid output (same Matcher methods)."""
    fsm = compile_guide(spec, vocab, "fsm")
    xgr = compile_guide(spec, vocab, "xgrammar")
    text = {"regex": {r"(true|false|null|-?[0-9]+)": "-42", r"[A-Z]{2}-[0-9]{3}": "AB-123"}.get(spec.payload, ""),
            "choice": "ünï"}[spec.kind]
    mf, mx = fsm.matcher(), xgr.matcher()
    data = text.encode()
    # greedy longest-token tokenization of the text via the vocabulary itself
    ids, i = [], 0
    by_bytes = {b: t for t, b in enumerate(vocab.token_bytes) if b and t not in vocab.special_ids}
    while i < len(data):
        j = max(k for k in range(i + 1, len(data) + 1) if data[i:k] in by_bytes)
        ids.append(by_bytes[data[i:j]])
        i = j
    for t in ids + [vocab.eos_ids[0]]:
        assert torch.equal(fill(mf, vocab), fill(mx, vocab)), t
        assert mf.accept_token(t) and mx.accept_token(t)
    assert mf.is_terminated() and mx.is_terminated()


def test_unsupported_kinds(vocab):
    for spec in (GuideSpec.json_object(), GuideSpec.grammar('root ::= "a"')):
        with pytest.raises(UnsupportedGuideError) as err:
            compile_guide(spec, vocab, "fsm")
        assert err.value.backend == "fsm"


def test_choice_dfa_is_minimal_and_exact(fsm_compile, vocab):
    g = fsm_compile(GuideSpec.choice(["cat", "cats", "dog", "dogs", "", "é"]))
    d = g.dfa
    for s in ["cat", "cats", "dog", "dogs", "", "é"]:
        assert d.fullmatch(s.encode())
    for s in ["ca", "catss", "do", "e", "éé"]:
        assert not d.fullmatch(s.encode())
    # minimal: dead, start, c, ca, d, do, é-lead, {cat,dog} (may add s), {cats,dogs,é}
    assert d.num_states == 9
