"""The matcher's native fill (one C call writing into the bitmask) against the row-tensor path it
bypasses: every target layout gives the row ``index.row(state)`` holds, wherever it lands; targets
the C path cannot address (GPU-like views, strided, numpy-int or negative indices) take the tensor
path and give the same bits; a too-narrow bitmask is refused with the same error either way."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tokenrails import GuideSpec, allocate_token_bitmask, compile_guide, native
from tokenrails.guided.fsm.matcher import FSMMatcher

from tests.fsm.conftest import allowed_ids

pytestmark = pytest.mark.skipif(native.load("fsm") is None, reason="tokenrails._fsm_native is not built")

PATTERN = r"(ab|[0-9]{2,3})-[^\"]{0,3}x"


def _walk(guide, tokenizer, text):
    """Matchers at every prefix of a valid output (and one terminated by EOS)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    out = []
    for n in range(len(ids) + 1):
        m = guide.matcher()
        for t in ids[:n]:
            assert m.accept_token(t)
        out.append(m)
    done = guide.matcher()
    for t in ids + [guide.vocab.eos_ids[0]]:
        assert done.accept_token(t)
    return out + [done]


def _expected(m: FSMMatcher) -> torch.Tensor:
    return m._index.eos_row if m.is_terminated() else m._index.row(m.state)


@pytest.fixture(scope="module")
def matchers(vocab, smollm2_tokenizer):
    guide = compile_guide(GuideSpec.regex(PATTERN), vocab, "fsm")
    assert guide.index.native
    return _walk(guide, smollm2_tokenizer, "123-é\"x"[:4] + "yzx") + _walk(guide, smollm2_tokenizer, "ab-x")


def test_fast_path_writes_only_its_row(matchers, vocab):
    words = (vocab.vocab_size + 31) // 32
    for m in matchers:
        for width in (words, words + 5):
            bm = torch.full((4, width), 0x33, dtype=torch.int32)
            masked = m.fill_next_token_bitmask(bm, 2)
            assert torch.equal(bm[2, :words], _expected(m)) and not bm[2, words:].any()
            assert (bm[[0, 1, 3]] == 0x33).all()
            assert masked is True


@pytest.mark.parametrize("layout", ["strided", "numpy_index", "negative_index", "transposed_copy"])
def test_other_targets_take_the_tensor_path_with_the_same_bits(matchers, vocab, layout):
    words = (vocab.vocab_size + 31) // 32
    for m in matchers:
        want = _expected(m)
        if layout == "strided":  # every other row of a bigger buffer: not contiguous
            base = torch.full((6, words), 7, dtype=torch.int32)
            bm, index = base[::2], 1
            m.fill_next_token_bitmask(bm, index)
            assert torch.equal(base[2], want) and (base[[0, 1, 3, 4, 5]] == 7).all()
        elif layout == "numpy_index":
            bm = allocate_token_bitmask(3, vocab.vocab_size)
            m.fill_next_token_bitmask(bm, np.int64(1))
            assert torch.equal(bm[1], want)
        elif layout == "negative_index":
            bm = allocate_token_bitmask(3, vocab.vocab_size)
            m.fill_next_token_bitmask(bm, -1)
            assert torch.equal(bm[2], want)
        else:  # column-major storage of a [rows, words] bitmask
            bm = torch.zeros((words, 2), dtype=torch.int32).t()
            assert not bm.is_contiguous()
            m.fill_next_token_bitmask(bm, 0)
            assert torch.equal(bm[0], want) and not bm[1].any()


def test_too_narrow_bitmask_is_refused_either_way(matchers, vocab):
    words = (vocab.vocab_size + 31) // 32
    m = matchers[1]
    narrow = torch.zeros((2, words - 1), dtype=torch.int32)
    with pytest.raises(ValueError, match="this vocabulary needs"):
        m.fill_next_token_bitmask(narrow, 0)
    with pytest.raises(ValueError, match="this vocabulary needs"):
        m.fill_next_token_bitmask(torch.zeros((words - 1, 2), dtype=torch.int32).t(), 0)
    assert not narrow.any()


def test_index_out_of_range_is_an_index_error_not_a_write(matchers, vocab):
    bm = allocate_token_bitmask(2, vocab.vocab_size)
    with pytest.raises(IndexError):
        matchers[0].fill_next_token_bitmask(bm, 2)


def test_batch_fill_on_cpu_equals_single_fills(matchers, vocab):
    rows = list(range(len(matchers)))[::-1]
    bm = allocate_token_bitmask(len(matchers), vocab.vocab_size)
    FSMMatcher.batch_fill(matchers, bm, rows)
    for m, r in zip(matchers, rows):
        assert torch.equal(bm[r], _expected(m))


def test_native_and_numpy_matchers_agree_step_by_step(vocab, smollm2_tokenizer, monkeypatch):
    """Same spec compiled with and without the C module: same allowed sets and accept decisions
    along a valid output, including tokens each side must refuse."""
    fast = compile_guide(GuideSpec.regex(PATTERN), vocab, "fsm")
    monkeypatch.setenv(native.NATIVE_ENV, "0")
    slow = compile_guide(GuideSpec.regex(PATTERN), vocab, "fsm")
    assert fast.index.native and not slow.index.native
    mf, ms = fast.matcher(), slow.matcher()
    probe = [vocab.eos_ids[0], vocab.vocab_size + 3, -4, sorted(vocab.special_ids)[0]]
    for t in smollm2_tokenizer.encode("ab-\u00e9x", add_special_tokens=False) + [vocab.eos_ids[0]]:
        assert allowed_ids(mf, vocab) == allowed_ids(ms, vocab)
        for p in probe:
            assert mf.validate_tokens([p]) == ms.validate_tokens([p])
        assert mf.accept_token(t) and ms.accept_token(t)
    assert mf.is_terminated() and ms.is_terminated()
    assert allowed_ids(mf, vocab) == allowed_ids(ms, vocab) == set(vocab.eos_ids)
