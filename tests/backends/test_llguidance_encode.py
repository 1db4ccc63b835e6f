"""Forced text is tokenized canonically (the model tokenizer's encoding), greedy only as fallback."""
from __future__ import annotations

import pytest

pytest.importorskip("llguidance")

from tokenrails import GuideSpec, Vocabulary, allocate_token_bitmask, compile_guide
from tokenrails.guided.backends.llguidance_backend import attach_tokenizer, build_lltokenizer
from tests.guided.helpers import allowed_ids

TEXTS = ['{"name"', ' "age"', "  leading", "naïve café", "emoji 🎉 ok", '"\\n"', ' "dateOfBirth": ',
         "internationalization", "x  y   z", "1234567"]


@pytest.fixture(scope="module")
def fresh_vocab(smollm2_tokenizer):
    """Own vocabulary: attaching a tokenizer must not change the shared fixture for other tests."""
    return Vocabulary.from_huggingface(smollm2_tokenizer)


def test_attached_tokenizer_encodes_exactly_like_the_model(fresh_vocab, smollm2_tokenizer):
    _, greedy = build_lltokenizer(Vocabulary(fresh_vocab.token_bytes, fresh_vocab.eos_ids,
                                             fresh_vocab.special_ids, fresh_vocab.vocab_size))
    attach_tokenizer(fresh_vocab, smollm2_tokenizer)
    _, enc = build_lltokenizer(fresh_vocab)
    assert greedy.source == "greedy" and enc.source == "tokenizers"
    differs = 0
    for text in TEXTS:
        want = smollm2_tokenizer.encode(text, add_special_tokens=False)
        assert enc(text) == want, text
        assert enc(text.encode()) == want, text  # bytes in, same ids
        g = greedy(text)
        assert b"".join(fresh_vocab.token_bytes[i] for i in g) == text.encode()
        differs += g != want
    assert differs, "the corpus should contain a text greedy tokenizes differently"


def test_python_tokenizer_fallback_and_special_text(fresh_vocab, smollm2_tokenizer):
    class Slow:  # not a fast tokenizer (no Rust backend to copy): its own encode is used
        def encode(self, text, add_special_tokens=True):
            return smollm2_tokenizer.encode(text, add_special_tokens=add_special_tokens)

    _, enc = build_lltokenizer(fresh_vocab)
    enc.set_tokenizer(Slow())
    assert enc.source == "tokenizer.encode"
    for text in TEXTS:
        assert enc(text) == smollm2_tokenizer.encode(text, add_special_tokens=False)
    # "<|im_end|>" as text: the model tokenizer returns the control token; never used
    ids = enc("<|im_end|>")
    assert not set(ids) & fresh_vocab.special_ids
    assert b"".join(fresh_vocab.token_bytes[i] for i in ids) == b"<|im_end|>"


def test_forced_text_masks_follow_the_canonical_tokenization(smollm2_tokenizer):
    """The forced property name ``  leading`` is offered as the model tokenizes it (" ", " leading")
    once the tokenizer is attached, also for a backend built before attaching."""
    v = Vocabulary.from_huggingface(smollm2_tokenizer)
    v.backend_cache.pop("hf_tokenizer")  # a vocabulary built without its tokenizer (e.g. from token bytes)
    schema = {"type": "object", "properties": {"  leading": {"type": "integer"}}, "required": ["  leading"]}
    spec = GuideSpec.json_schema(schema, any_whitespace=False)

    def forced_path(vocab):
        m = compile_guide(spec, vocab, "llguidance").matcher()
        bm = allocate_token_bitmask(1, vocab.vocab_size)
        path = []
        for _ in range(4):
            m.fill_next_token_bitmask(bm, 0)
            ids = allowed_ids(bm[0], vocab.vocab_size).tolist()
            assert len(ids) == 1
            path.append(ids[0])
            assert m.accept_token(ids[0])
        return path

    canonical = smollm2_tokenizer.encode('{"  leading":', add_special_tokens=False)
    before = forced_path(v)  # greedy: no tokenizer known yet
    assert before != canonical
    attach_tokenizer(v, smollm2_tokenizer)
    assert forced_path(v) == canonical
    assert forced_path(Vocabulary.from_huggingface(smollm2_tokenizer)) == canonical  # attached by default


def test_the_encoder_ignores_the_callers_padding_and_later_changes(fresh_vocab, smollm2_tokenizer):
    """The encoder works on its own copy of the Rust tokenizer: padding or truncation the caller
    turned on (transformers leaves them set after a padded call) never pads or cuts forced text."""
    import copy

    theirs = copy.deepcopy(smollm2_tokenizer)
    theirs.backend_tokenizer.enable_padding(length=64, pad_id=0)
    _, enc = build_lltokenizer(fresh_vocab)
    enc.set_tokenizer(theirs)
    theirs.backend_tokenizer.enable_truncation(max_length=1)
    for text in TEXTS:
        assert enc(text) == smollm2_tokenizer.encode(text, add_special_tokens=False), text
