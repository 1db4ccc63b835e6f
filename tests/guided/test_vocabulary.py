import pytest

from tokenrails import GuideSpec, InvalidGuideError, Vocabulary, allocate_token_bitmask, compile_guide

from .helpers import allowed_ids


def test_special_tokens_are_marked(vocab, smollm2_tokenizer):
    im_start = smollm2_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert im_start in vocab.special_ids
    assert vocab.eos_ids == (smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    assert vocab.num_tokens == len(smollm2_tokenizer)
    assert vocab.token_bytes[smollm2_tokenizer.convert_tokens_to_ids("Ġthe")] == b" the"


@pytest.mark.parametrize("backend", ["xgrammar"])
def test_special_tokens_never_allowed_inside_a_json_string(vocab, smollm2_tokenizer, backend):
    """xgrammar alone allows <|im_start|> inside strings for this tokenizer; we must not."""
    guide = compile_guide(GuideSpec.json_schema({"type": "string"}), vocab, backend=backend)
    m = guide.matcher()
    assert m.accept_token(smollm2_tokenizer.convert_tokens_to_ids('"'))
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    m.fill_next_token_bitmask(bm)
    allowed = set(allowed_ids(bm[0], vocab.vocab_size).tolist())
    assert len(allowed) > 40_000  # almost every ordinary token may appear in a string
    assert not allowed & (vocab.special_ids - set(vocab.eos_ids))
    assert not allowed & set(vocab.eos_ids)  # the string is open: no EOS yet


def test_padded_ids_are_never_allowed(smollm2_tokenizer):
    wide = Vocabulary.from_huggingface(smollm2_tokenizer, vocab_size=49_152 + 100)
    assert wide.vocab_size == 49_252 and wide.num_tokens == 49_152
    m = compile_guide(GuideSpec.regex("[a-z ]+"), wide, backend="xgrammar").matcher()
    bm = allocate_token_bitmask(1, wide.vocab_size)
    m.fill_next_token_bitmask(bm)
    allowed = allowed_ids(bm[0], wide.vocab_size)
    assert int(allowed.max()) < wide.num_tokens


def test_vocabulary_validation():
    with pytest.raises(InvalidGuideError):
        Vocabulary([b"a", b"b"], eos_ids=())
    with pytest.raises(InvalidGuideError):
        Vocabulary([b"a", b"b"], eos_ids=(5,))
    with pytest.raises(InvalidGuideError):
        Vocabulary([b"a", b"b"], eos_ids=(1,), vocab_size=1)
    v = Vocabulary([b"a", b"b", b""], eos_ids=(2,))
    assert v.fingerprint != Vocabulary([b"a", b"c", b""], eos_ids=(2,)).fingerprint
