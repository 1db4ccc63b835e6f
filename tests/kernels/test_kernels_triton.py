"""The Triton kernel, run by Triton's interpreter on CPU tensors, is bit-exact against the reference.

In-process tests use the interpreter explicitly (CPU tensors always do), so nothing here sets
TRITON_INTERPRET for the rest of the suite; one subprocess test runs the regular
``TRITON_INTERPRET=1`` route through the public API. Sizes stay small: the interpreter is slow.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

triton = pytest.importorskip("triton")

from tokenrails.kernels import apply_token_bitmask_inplace_reference, apply_token_bitmask_inplace_triton  # noqa: E402

from .cases import DTYPES, MASK_KINDS, assert_matches_reference, bits_equal, make_bitmask, make_logits  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def check_against_reference(logits, bitmask, indices, vocab_size=None) -> None:
    assert_matches_reference(apply_token_bitmask_inplace_triton, logits, bitmask, indices, vocab_size)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab,width", [(1, 1), (31, 31), (33, 40), (1000, 1000), (1000, 1100), (2048 + 7, 2100)])
def test_matches_reference(dtype, vocab, width):
    rng = np.random.default_rng(vocab)
    words = (vocab + 31) // 32
    logits = make_logits(rng, 4, width, dtype)
    kinds = [MASK_KINDS[(vocab + i) % len(MASK_KINDS)] for i in range(4)]
    check_against_reference(logits.clone(), make_bitmask(rng, kinds, words), None, vocab)
    for indices in ([3, 0], torch.tensor([2], dtype=torch.int32), (1, 3, 0)):
        bitmask = make_bitmask(rng, ["random"] * len(indices), words)
        check_against_reference(logits, bitmask, indices, vocab)


@settings(max_examples=20, deadline=None)
@given(
    batch=st.integers(1, 4),
    vocab=st.integers(1, 1200),
    extra_cols=st.integers(0, 70),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_random_cases(batch, vocab, extra_cols, dtype, seed, data):
    rng = np.random.default_rng(seed)
    rows = data.draw(st.lists(st.integers(0, batch - 1), unique=True, max_size=batch))
    kinds = [data.draw(st.sampled_from(MASK_KINDS)) for _ in rows]
    logits = make_logits(rng, batch, vocab + extra_cols, dtype)
    bitmask = make_bitmask(rng, kinds, (vocab + 31) // 32)
    check_against_reference(logits, bitmask, torch.tensor(rows, dtype=torch.int32), vocab)


def test_untouched_rows_and_default_vocab():
    rng = np.random.default_rng(11)
    logits = make_logits(rng, 5, 300, torch.bfloat16)
    before = logits.clone()
    bitmask = make_bitmask(rng, ["random", "all_disallowed"], 8)  # 256 bits < 300 columns
    check_against_reference(logits, bitmask, torch.tensor([4, 1], dtype=torch.int64))
    for row in (0, 2, 3):
        assert bits_equal(logits[row], before[row])
    assert bool(torch.isinf(logits[4, 256:]).all())


def test_single_row_1d():
    rng = np.random.default_rng(12)
    logits = make_logits(rng, 1, 77, torch.float16)[0]
    check_against_reference(logits, make_bitmask(rng, ["random"], 3)[0], None)


def test_out_of_range_gpu_style_index_is_skipped_in_kernel():
    """Device indices are not range-checked on the host; the kernel skips bad rows itself."""
    from tokenrails.kernels import check_apply_args
    from tokenrails.kernels.triton_kernel import launch_checked_triton

    logits = torch.zeros(2, 64)
    args = check_apply_args(logits, torch.zeros(2, 2, dtype=torch.int32), [0, 1])
    launch_checked_triton(args._replace(rows=torch.tensor([5, -1], dtype=torch.int32)))
    assert bool((logits == 0).all())


def test_triton_interpret_env_through_public_api():
    script = textwrap.dedent(
        """
        import torch
        from triton.runtime.interpreter import InterpretedFunction
        import tokenrails
        from tokenrails.kernels import apply_token_bitmask_inplace_reference, triton_kernel
        assert isinstance(triton_kernel._jit_kernel, InterpretedFunction)
        torch.manual_seed(0)
        logits = torch.randn(3, 100)
        bitmask = torch.randint(-2**31, 2**31 - 1, (2, 4), dtype=torch.int32)
        expected = logits.clone()
        apply_token_bitmask_inplace_reference(expected, bitmask, [2, 0], 90)
        tokenrails.apply_token_bitmask_inplace(logits, bitmask, torch.tensor([2, 0]), 90)
        assert torch.equal(logits.view(torch.int32), expected.view(torch.int32))
        print("OK")
        """
    )
    env = dict(os.environ, TRITON_INTERPRET="1", TOKENRAILS_KERNEL="triton", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), result.stderr[-3000:]


def test_strided_inputs():
    rng = np.random.default_rng(13)
    storage = make_logits(rng, 3, 300, torch.float32)
    bitmask = make_bitmask(rng, ["random"] * 6, 8)
    for logits in (storage[:, :250], storage[:, ::2]):  # padded rows; non-contiguous columns
        expected = storage.clone()
        view = expected[:, :250] if logits.stride(1) == 1 else expected[:, ::2]
        apply_token_bitmask_inplace_reference(view, bitmask[::2])
        apply_token_bitmask_inplace_triton(logits, bitmask[::2])
        assert bits_equal(storage, expected)


def test_large_vocab_not_multiple_of_32():
    rng = np.random.default_rng(14)
    vocab = 49152 + 7
    logits = make_logits(rng, 3, vocab + 40, torch.bfloat16)
    bitmask = make_bitmask(rng, ["random", "in_string"], (vocab + 31) // 32)
    check_against_reference(logits, bitmask, [2, 0], vocab)
