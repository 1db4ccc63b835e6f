"""The CPU kernel -- the C one and the numpy fallback, each test runs on both -- is bit-exact against
the reference on every path it can take."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenrails.kernels import apply_token_bitmask_inplace_cpu, apply_token_bitmask_inplace_reference
from tokenrails import native
from tokenrails.kernels import cpu as cpu_module

from .cases import DTYPES, MASK_KINDS, assert_matches_reference, bits_equal, make_bitmask, make_logits

VOCABS = [(1, 1), (31, 31), (33, 33), (1000, 1000), (1000, 1024), (49152 + 7, 49152 + 7), (4096, 4160)]


@pytest.fixture(autouse=True, params=["native", "numpy"])
def cpu_path(request, monkeypatch):
    """Run every test on the C kernel and on the numpy path."""
    if request.param == "native":
        if native.load("apply") is None:
            pytest.skip("tokenrails._apply_native is not built (or TOKENRAILS_NATIVE=0)")
    else:
        monkeypatch.setenv(native.NATIVE_ENV, "0")
    return request.param


def check_against_reference(logits, bitmask, indices, vocab_size=None) -> None:
    assert_matches_reference(apply_token_bitmask_inplace_cpu, logits, bitmask, indices, vocab_size)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab,width", VOCABS)
@pytest.mark.parametrize("kind", MASK_KINDS)
def test_uniform_batches(dtype, vocab, width, kind):
    rng = np.random.default_rng(vocab + width)
    words = (vocab + 31) // 32
    logits = make_logits(rng, 4, width, dtype)
    check_against_reference(logits.clone(), make_bitmask(rng, [kind] * 4, words), None, vocab)
    indices = [3, 1]
    untouched = logits[[0, 2]].clone()
    check_against_reference(logits, make_bitmask(rng, [kind] * 2, words), indices, vocab)
    assert bits_equal(logits[[0, 2]], untouched)
    check_against_reference(logits, make_bitmask(rng, [kind], words), [2], vocab)  # one row
    assert bits_equal(logits[0], untouched[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab,width", [(4096, 4096), (49152 + 7, 49200)])
@pytest.mark.parametrize("index_type", ["list", "tuple", "int32", "int64", "none"])
def test_mixed_kinds_in_one_batch(dtype, vocab, width, index_type):
    """Rows of every density in one call: exercises the per-row grouping."""
    rng = np.random.default_rng(7)
    kinds = list(MASK_KINDS) * 2
    batch = len(kinds) + (0 if index_type == "none" else 5)
    logits = make_logits(rng, batch, width, dtype)
    bitmask = make_bitmask(rng, kinds, (vocab + 31) // 32)
    if index_type == "none":
        indices = None
    else:
        rows = rng.permutation(batch)[: len(kinds)].tolist()
        indices = {"list": rows, "tuple": tuple(rows)}.get(index_type)
        if indices is None:
            indices = torch.tensor(rows, dtype=getattr(torch, index_type))
    before = logits.clone()
    check_against_reference(logits, bitmask, indices, vocab)
    if indices is not None:
        named = set(int(i) for i in indices)
        for row in range(batch):
            if row not in named:
                assert bits_equal(logits[row], before[row])


def test_every_path_is_taken(monkeypatch, cpu_path):
    """Each density class reaches the numpy code path designed for it (and stays exact)."""
    if cpu_path == "native":
        pytest.skip("spies on the numpy path's functions")
    calls = []
    for name in ("_sparse_rows", "_blend"):
        original = getattr(cpu_module, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            calls.append((_name, kwargs.get("mostly_allowed")))
            return _original(*args, **kwargs)

        monkeypatch.setattr(cpu_module, name, spy)
    rng = np.random.default_rng(3)
    expected_paths = {
        "few_disallowed": ("_sparse_rows", True),
        "in_string": ("_sparse_rows", True),
        "few_allowed": ("_sparse_rows", False),
        "all_disallowed": ("_sparse_rows", False),
        "random": ("_blend", None),
    }
    for kind, path in expected_paths.items():
        calls.clear()
        logits = make_logits(rng, 3, 8192, torch.float32)
        check_against_reference(logits, make_bitmask(rng, [kind] * 3, 256), None)
        assert calls[0] == path, (kind, calls)
    calls.clear()
    check_against_reference(make_logits(rng, 2, 8192, torch.float32), make_bitmask(rng, ["all_allowed"] * 2, 256), None)
    assert calls == []
    calls.clear()  # few mixed words, but with many zero bits: whole-row blends are cheaper
    check_against_reference(make_logits(rng, 2, 8192, torch.float32), make_bitmask(rng, ["dense_zeros"] * 2, 256), None)
    assert calls == [("_blend", None)] * 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_logits_with_padded_row_stride(dtype):
    rng = np.random.default_rng(5)
    storage = make_logits(rng, 6, 1100, dtype)
    logits = storage[:, :1000]  # rows are contiguous, row stride 1100
    bitmask = make_bitmask(rng, ["random", "few_allowed", "few_disallowed"], 32)
    expected = storage.clone()
    apply_token_bitmask_inplace_reference(expected[:, :1000], bitmask, [5, 0, 2])
    apply_token_bitmask_inplace_cpu(logits, bitmask, [5, 0, 2])
    assert bits_equal(storage, expected)  # the padding columns are untouched too


def test_non_contiguous_columns_fall_back():
    rng = np.random.default_rng(6)
    storage = make_logits(rng, 2, 400, torch.float32)
    logits = storage[:, ::2]
    bitmask = make_bitmask(rng, ["random", "random"], 7)
    expected = storage.clone()
    apply_token_bitmask_inplace_reference(expected[:, ::2], bitmask)
    apply_token_bitmask_inplace_cpu(logits, bitmask)
    assert bits_equal(storage, expected)


def test_bitmask_wider_than_vocab_and_non_contiguous():
    rng = np.random.default_rng(8)
    wide = make_bitmask(rng, ["random"] * 6, 20)
    bitmask = wide[::2]  # non-contiguous rows
    logits = make_logits(rng, 3, 500, torch.float16)
    check_against_reference(logits, bitmask, None)  # vocab = min(500, 640) = 500


def test_repeated_indices_apply_every_mask():
    rng = np.random.default_rng(9)
    logits = make_logits(rng, 3, 3000, torch.float32)
    bitmask = make_bitmask(rng, ["random", "few_allowed", "few_disallowed", "random"], 94)
    check_against_reference(logits, bitmask, [2, 0, 2, 2])


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    batch=st.integers(1, 6),
    vocab=st.integers(1, 700),
    extra_cols=st.integers(0, 40),
    extra_words=st.integers(0, 2),
    dtype=st.sampled_from(DTYPES),
    explicit_vocab=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_cases(data, batch, vocab, extra_cols, extra_words, dtype, explicit_vocab, seed):
    rng = np.random.default_rng(seed)
    width = vocab + extra_cols
    words = (vocab + 31) // 32 + extra_words
    guided = data.draw(st.lists(st.integers(0, batch - 1), unique=True, max_size=batch), label="rows")
    use_indices = data.draw(st.booleans(), label="use_indices") or len(guided) != batch
    kinds = [data.draw(st.sampled_from(MASK_KINDS)) for _ in (guided if use_indices else range(batch))]
    bitmask = make_bitmask(rng, kinds, words)
    logits = make_logits(rng, batch, width, dtype)
    vocab_size = vocab if explicit_vocab else None
    if not explicit_vocab and min(width, 32 * words) != vocab:
        vocab_size = None  # the default: min(width, 32 * words)
    as_tensor = data.draw(st.booleans(), label="tensor indices")
    indices = None
    if use_indices:
        indices = torch.tensor(guided, dtype=torch.int64) if as_tensor else guided
    check_against_reference(logits, bitmask.reshape(len(kinds), words), indices, vocab_size)


def test_long_index_list_of_numpy_ints():
    rng = np.random.default_rng(10)
    logits = make_logits(rng, 150, 300, torch.float32)
    rows = [np.int64(i) for i in rng.permutation(150)[:100]]
    bitmask = make_bitmask(rng, [MASK_KINDS[i % len(MASK_KINDS)] for i in range(100)], 10)
    check_against_reference(logits, bitmask, rows)


def test_threads_do_not_share_scratch_buffers():
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(11)
    jobs = [
        (make_logits(rng, 8, 70000, torch.float32), make_bitmask(rng, ["random", "few_allowed"] * 4, 2188))
        for _ in range(4)
    ]
    expected = []
    for logits, bitmask in jobs:
        e = logits.clone()
        apply_token_bitmask_inplace_reference(e, bitmask)
        expected.append(e)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda job: apply_token_bitmask_inplace_cpu(*job), jobs))
    assert all(bits_equal(logits, e) for (logits, _), e in zip(jobs, expected))
