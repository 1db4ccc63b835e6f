"""``tokenrails.compat.xgrammar`` against xgrammar: same bits out, same calls refused.

Every case is checked bit for bit (NaN payloads, -0.0 and -inf included) against a dense oracle of
xgrammar's documented contract, and against the installed xgrammar itself where xgrammar keeps that
contract. Shapes, dtypes, row strides, ``indices`` (full-batch meaning, lists and tensors),
``vocab_size`` and bitmasks narrower or wider than the logits are drawn by hypothesis.

Where xgrammar 0.2.8 does not keep its contract: with fewer than 9 masked columns (the effective
``vocab_size``) its CPU kernel masks wrong logits (``vocab_size=1`` on 3 columns masks column 1;
100 columns, ``vocab_size=8``, 5 rows: 1 wrong logit in 30 trials) and, with several rows narrower
than 8 columns, writes out of bounds (glibc aborts: "invalid fastbin entry"). Calls masking fewer
than 16 columns are compared with the oracle only, never run through xgrammar here.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

xgr = pytest.importorskip("xgrammar")

from tokenrails.compat import xgrammar as dropin  # noqa: E402

from tests.kernels.cases import DTYPES, bits_equal, make_logits  # noqa: E402


@st.composite
def calls(draw):
    """One xgrammar-style call: (logits, bitmask, kwargs)."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    dtype = draw(st.sampled_from(DTYPES))
    one_d = draw(st.booleans())
    logits_rows = 1 if one_d else draw(st.integers(1, 6))
    width = draw(st.integers(1, 300))
    words = draw(st.integers(max(1, (width - 40) // 32), (width + 31) // 32 + 2))
    use_indices = not one_d and draw(st.booleans())
    mask_rows = draw(st.integers(1, 6)) if use_indices else logits_rows
    row_pad = draw(st.sampled_from([0, 0, 3]))  # a row stride wider than the row
    base = make_logits(rng, logits_rows, width + row_pad, dtype)
    logits = base[:, :width]
    bitmask = torch.from_numpy(rng.integers(-(2**31), 2**31, size=(mask_rows, words), dtype=np.int64).astype(np.int32))
    if one_d:
        logits, bitmask = logits[0], bitmask[0]
    kwargs = {}
    limit = min(width, 32 * words)
    if draw(st.booleans()):
        kwargs["vocab_size"] = draw(st.integers(0, limit))
    if use_indices:
        batch = min(logits_rows, mask_rows)
        rows = draw(st.lists(st.integers(0, batch - 1), max_size=batch, unique=True))
        kwargs["indices"] = torch.tensor(rows, dtype=torch.int32) if draw(st.booleans()) and rows else rows
    return logits, bitmask, kwargs


def oracle(logits, bitmask, kwargs):
    """xgrammar's documented operation, densely: for each masked row k, logits[k, t] = -inf for
    every t < vocab_size whose bit in bitmask[k] is 0; nothing else changes."""
    out = logits.clone()
    out2 = out if out.dim() == 2 else out.unsqueeze(0)
    mask2 = bitmask if bitmask.dim() == 2 else bitmask.unsqueeze(0)
    vocab = kwargs.get("vocab_size", min(out2.shape[1], 32 * mask2.shape[1]))
    rows = kwargs.get("indices")
    rows = range(out2.shape[0]) if rows is None else [int(r) for r in rows]
    for k in rows:
        for t in range(vocab):
            if not (int(mask2[k, t // 32]) >> (t % 32)) & 1:
                out2[k, t] = float("-inf")
    return out


XGRAMMAR_SAFE_COLUMNS = 16  # measured: xgrammar's CPU kernel is wrong below 9 masked columns


def xgrammar_keeps_contract(logits, bitmask, kwargs) -> bool:
    vocab = kwargs.get("vocab_size", min(logits.shape[-1], 32 * bitmask.shape[-1]))
    return vocab >= XGRAMMAR_SAFE_COLUMNS


def run_both(logits, bitmask, kwargs):
    ours, theirs = logits.clone(), logits.clone()
    with warnings.catch_warnings(record=True) as ours_warned:
        warnings.simplefilter("always")
        dropin.apply_token_bitmask_inplace(ours, bitmask, **kwargs)
    with warnings.catch_warnings(record=True) as theirs_warned:
        warnings.simplefilter("always")
        xgr.apply_token_bitmask_inplace(theirs, bitmask, **kwargs)
    return ours, theirs, len(ours_warned), len(theirs_warned)


@settings(max_examples=300, deadline=None)
@given(calls())
def test_same_bits_as_xgrammar(call):
    logits, bitmask, kwargs = call
    expected = oracle(logits, bitmask, kwargs)
    if not xgrammar_keeps_contract(logits, bitmask, kwargs):
        ours = logits.clone()
        dropin.apply_token_bitmask_inplace(ours, bitmask, **kwargs)
        assert bits_equal(ours, expected)
        return
    ours, theirs, ours_warned, theirs_warned = run_both(logits, bitmask, kwargs)
    assert bits_equal(ours, expected)
    assert bits_equal(theirs, expected)
    assert ours_warned == theirs_warned  # the undersized-bitmask warning, exactly when xgrammar warns


@settings(max_examples=60, deadline=None)
@given(calls())
def test_cpu_kernel_entry_point_matches(call):
    logits, bitmask, kwargs = call
    from xgrammar.kernels.apply_token_bitmask_inplace_cpu import apply_token_bitmask_inplace_cpu

    if isinstance(kwargs.get("indices"), torch.Tensor):
        kwargs = dict(kwargs, indices=kwargs["indices"].tolist())
    ours, theirs = logits.clone(), logits.clone()
    dropin.apply_token_bitmask_inplace_cpu(ours, bitmask, **kwargs)
    assert bits_equal(ours, oracle(logits, bitmask, kwargs))
    if xgrammar_keeps_contract(logits, bitmask, kwargs):
        apply_token_bitmask_inplace_cpu(theirs, bitmask, **kwargs)
        assert bits_equal(ours, theirs)


def test_indices_select_rows_of_a_full_batch_bitmask():
    """The meaning vLLM relies on: bitmask[k] masks logits[k] for each listed k, other rows untouched."""
    logits = torch.zeros(4, 64)
    bitmask = torch.zeros(4, 2, dtype=torch.int32)
    bitmask[2, 0] = 1 << 5  # row 2 allows token 5 only
    dropin.apply_token_bitmask_inplace(logits, bitmask, indices=[2])
    assert torch.isfinite(logits[[0, 1, 3]]).all()
    assert torch.isfinite(logits[2]).sum() == 1 and logits[2, 5] == 0


def test_columns_past_vocab_size_are_left_alone():
    logits = torch.zeros(2, 100)
    bitmask = torch.zeros(2, 4, dtype=torch.int32)
    dropin.apply_token_bitmask_inplace(logits, bitmask, vocab_size=70)
    assert torch.isinf(logits[:, :70]).all() and (logits[:, 70:] == 0).all()


@pytest.mark.parametrize(
    "logits_shape,bitmask_shape,kwargs",
    [
        ((3, 64), (2, 2), {}),  # batch sizes differ without indices
        ((2, 64), (2, 2), {"indices": [2]}),  # out of range
        ((2, 64), (2, 2), {"indices": [-1]}),
        ((2, 64), (2, 2), {"vocab_size": 65}),  # wider than the bitmask covers
    ],
)
def test_refuses_what_xgrammar_refuses(logits_shape, bitmask_shape, kwargs):
    for module, error in ((xgr, Exception), (dropin, ValueError)):
        logits = torch.zeros(logits_shape)
        with pytest.raises(error):
            module.apply_token_bitmask_inplace(logits, torch.zeros(bitmask_shape, dtype=torch.int32), **kwargs)


def test_allocation_helpers_match_xgrammar():
    for batch, vocab in [(1, 1), (3, 32), (2, 33), (4, 128_257)]:
        assert dropin.get_bitmask_shape(batch, vocab) == xgr.get_bitmask_shape(batch, vocab)
        ours, theirs = dropin.allocate_token_bitmask(batch, vocab), xgr.allocate_token_bitmask(batch, vocab)
        assert ours.dtype == theirs.dtype == dropin.bitmask_dtype and torch.equal(ours, theirs)
        ours.zero_()
        dropin.reset_token_bitmask(ours)
        assert torch.equal(ours, theirs)


def test_triton_entry_point_under_the_interpreter():
    pytest.importorskip("triton")
    rng = np.random.default_rng(7)
    logits = make_logits(rng, 3, 90, torch.float32)
    bitmask = torch.from_numpy(rng.integers(-(2**31), 2**31, size=(3, 3), dtype=np.int64).astype(np.int32))
    ours, theirs = logits.clone(), logits.clone()
    dropin.apply_token_bitmask_inplace_triton(ours, bitmask, vocab_size=90, indices=[0, 2])
    xgr.apply_token_bitmask_inplace(theirs, bitmask, vocab_size=90, indices=[0, 2])
    assert bits_equal(ours, theirs)
    narrow = logits.clone()
    dropin.apply_token_bitmask_inplace_triton(narrow, bitmask, vocab_size=70, indices=[1])
    assert bits_equal(narrow, oracle(logits, bitmask, {"vocab_size": 70, "indices": [1]}))
