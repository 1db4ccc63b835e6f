"""The contract itself: allocation, bit layout, the reference oracle, argument validation."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tokenrails
from tokenrails.kernels import (
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    apply_token_bitmask_inplace_cpu,
    apply_token_bitmask_inplace_reference,
)

from .cases import DTYPES, bits_equal, make_logits


def naive_apply(logits: torch.Tensor, bitmask: torch.Tensor, indices, vocab_size) -> torch.Tensor:
    """Bit by bit, in Python: the oracle of the oracle."""
    out = logits.clone()
    rows = range(bitmask.shape[0]) if indices is None else list(indices)
    for i, row in enumerate(rows):
        for t in range(logits.shape[1]):
            word = int(bitmask[i, t // 32]) if t // 32 < bitmask.shape[1] else 0
            if t >= vocab_size or not (word >> (t % 32)) & 1:
                out[row, t] = float("-inf")
    return out


def test_public_reexports():
    assert tokenrails.apply_token_bitmask_inplace is apply_token_bitmask_inplace
    assert tokenrails.allocate_token_bitmask is allocate_token_bitmask


@pytest.mark.parametrize("vocab", [0, 1, 31, 32, 33, 1000, 49152 + 7])
def test_allocate_shape_dtype_all_allowed(vocab):
    bm = allocate_token_bitmask(3, vocab)
    assert bm.dtype == torch.int32 and bm.shape == (3, math.ceil(vocab / 32))
    assert bool((bm == -1).all())
    logits = torch.randn(3, vocab)
    before = logits.clone()
    apply_token_bitmask_inplace(logits, bm)
    assert bits_equal(logits, before)


def test_allocate_rejects_bad_arguments():
    with pytest.raises(ValueError):
        allocate_token_bitmask(-1, 10)
    with pytest.raises(ValueError):
        allocate_token_bitmask(1, 10.5)


def test_bit_layout_is_little_endian_within_word():
    bm = torch.zeros(1, 2, dtype=torch.int32)
    bm[0, 0] = 1 << 5  # token 5
    bm[0, 1] = np.int32(-(2**31))  # bit 31 of word 1: token 63
    logits = torch.zeros(1, 64)
    apply_token_bitmask_inplace(logits, bm)
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert allowed == [5, 63]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab,width,words", [(1, 1, 1), (31, 40, 1), (33, 33, 2), (70, 96, 3), (64, 64, 4)])
def test_reference_matches_naive(dtype, vocab, width, words):
    rng = np.random.default_rng(vocab * 7 + width)
    bm = torch.from_numpy(rng.integers(-(2**31), 2**31, (3, words)).astype(np.int32))
    logits = make_logits(rng, 5, width, dtype)
    for indices in (None, [4, 0, 2]):
        batch = logits[:3].clone() if indices is None else logits.clone()
        expected = naive_apply(batch, bm, indices, vocab)
        apply_token_bitmask_inplace_reference(batch, bm, indices, vocab)
        assert bits_equal(batch, expected)


def test_single_row_1d():
    rng = np.random.default_rng(1)
    logits = make_logits(rng, 1, 100, torch.float32)[0]
    bm = torch.from_numpy(rng.integers(-(2**31), 2**31, 4).astype(np.int32))
    expected = naive_apply(logits[None], bm[None], None, 100)[0]
    for fn in (apply_token_bitmask_inplace, apply_token_bitmask_inplace_reference):
        x = logits.clone()
        fn(x, bm)
        assert bits_equal(x, expected)


def test_repeated_index_gets_both_masks():
    logits = torch.zeros(2, 64)
    bm = torch.full((2, 2), -1, dtype=torch.int32)
    bm[0, 0] = ~np.int32(1 << 3)  # disallow 3
    bm[1, 1] = ~np.int32(1 << 4)  # disallow 36
    for fn in (apply_token_bitmask_inplace, apply_token_bitmask_inplace_reference):
        x = logits.clone()
        fn(x, bm, [1, 1])
        assert torch.isinf(x[1]).nonzero().flatten().tolist() == [3, 36]
        assert bits_equal(x[0], logits[0])


BAD_CALLS = {
    "bitmask dtype": lambda: (torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int64), None, None),
    "logits dtype": lambda: (torch.zeros(2, 64, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.int32), None, None),
    "logits int": lambda: (torch.zeros(2, 64, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int32), None, None),
    "3-D logits": lambda: (torch.zeros(1, 2, 64), torch.zeros(2, 2, dtype=torch.int32), None, None),
    "row count": lambda: (torch.zeros(3, 64), torch.zeros(2, 2, dtype=torch.int32), None, None),
    "indices length": lambda: (torch.zeros(3, 64), torch.zeros(2, 2, dtype=torch.int32), [0], None),
    "index too large": lambda: (torch.zeros(3, 64), torch.zeros(2, 2, dtype=torch.int32), [0, 3], None),
    "negative index": lambda: (torch.zeros(3, 64), torch.zeros(2, 2, dtype=torch.int32), [-1, 0], None),
    "tensor index too large": lambda: (
        torch.zeros(3, 64), torch.zeros(2, 2, dtype=torch.int32), torch.tensor([0, 5]), None),
    "float index tensor": lambda: (
        torch.zeros(3, 64), torch.zeros(2, 2, dtype=torch.int32), torch.tensor([0.0, 1.0]), None),
    "float indices": lambda: (torch.zeros(3, 64), torch.zeros(2, 2, dtype=torch.int32), [0.0, 1.0], None),
    "2-D indices": lambda: (torch.zeros(3, 64), torch.zeros(2, 2, dtype=torch.int32), torch.tensor([[0, 1]]), None),
    "indices type": lambda: (torch.zeros(3, 64), torch.zeros(1, 2, dtype=torch.int32), "0", None),
    "vocab too large for bitmask": lambda: (torch.zeros(2, 100), torch.zeros(2, 2, dtype=torch.int32), None, 65),
    "vocab too large for logits": lambda: (torch.zeros(2, 60), torch.zeros(2, 2, dtype=torch.int32), None, 61),
    "negative vocab": lambda: (torch.zeros(2, 60), torch.zeros(2, 2, dtype=torch.int32), None, -1),
    "not a tensor": lambda: (np.zeros((2, 64), np.float32), torch.zeros(2, 2, dtype=torch.int32), None, None),
    "1-D logits, 2 mask rows": lambda: (torch.zeros(64), torch.zeros(2, 2, dtype=torch.int32), None, None),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
@pytest.mark.parametrize(
    "fn", [apply_token_bitmask_inplace, apply_token_bitmask_inplace_cpu, apply_token_bitmask_inplace_reference]
)
def test_bad_arguments_raise_value_error(case, fn):
    logits, bitmask, indices, vocab = BAD_CALLS[case]()
    before = logits.clone() if isinstance(logits, torch.Tensor) else None
    with pytest.raises(ValueError):
        fn(logits, bitmask, indices, vocab)
    if before is not None:
        assert torch.equal(logits, before)


def test_empty_calls_are_no_ops():
    logits = torch.randn(3, 64)
    before = logits.clone()
    apply_token_bitmask_inplace(logits, torch.zeros(0, 2, dtype=torch.int32), [])
    apply_token_bitmask_inplace(logits, torch.zeros(0, 2, dtype=torch.int32), torch.zeros(0, dtype=torch.int64))
    assert bits_equal(logits, before)
    empty = torch.zeros(0, 64)
    apply_token_bitmask_inplace(empty, torch.zeros(0, 2, dtype=torch.int32))


def test_vocab_zero_masks_everything():
    logits = torch.randn(2, 40)
    apply_token_bitmask_inplace(logits, torch.full((1, 2), -1, dtype=torch.int32), [1], vocab_size=0)
    assert bool(torch.isinf(logits[1]).all()) and bool(torch.isfinite(logits[0]).all())
