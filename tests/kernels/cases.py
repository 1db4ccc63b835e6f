"""Shared helpers for the kernel tests: mask generators and a bit-exact comparison."""
from __future__ import annotations

import numpy as np
import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INT_OF = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
MASK_KINDS = (
    "random", "all_allowed", "all_disallowed", "few_disallowed", "few_allowed", "dense_zeros", "in_string"
)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact equality of the stored bits (NaN payloads, -0.0 and -inf included)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.view(INT_OF[a.dtype]), b.view(INT_OF[b.dtype])
    )


def make_logits(rng: np.random.Generator, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Random logits sprinkled with the awkward values: NaN, +-inf, -0.0."""
    values = rng.standard_normal((rows, width)).astype(np.float32) * 4
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], dtype=np.float32)
    spots = rng.random((rows, width)) < 0.02
    values[spots] = rng.choice(special, size=int(spots.sum()))
    return torch.from_numpy(values).to(dtype)


def mask_row(rng: np.random.Generator, words: int, kind: str) -> np.ndarray:
    """One int32 bitmask row of ``words`` words, of a given density ``kind``."""
    rand = rng.integers(-(2**31), 2**31, size=words, dtype=np.int64).astype(np.int32)
    if kind == "random":
        return rand
    if kind == "all_allowed":
        return np.full(words, -1, np.int32)
    if kind == "all_disallowed":
        return np.zeros(words, np.int32)
    few = rng.random(words) < 0.05  # a few mixed words
    if kind == "few_disallowed":  # mostly all-ones words, a few words with a zero bit or two
        holes = np.int32(-1) ^ (np.int32(1) << rng.integers(0, 31, size=words).astype(np.int32))
        return np.where(few, holes, np.int32(-1)).astype(np.int32)
    if kind == "in_string":  # half the words have one zero bit: a JSON string's mask
        hole = np.int32(-1) ^ (np.int32(1) << rng.integers(0, 31, size=words).astype(np.int32))
        return np.where(rng.random(words) < 0.5, hole, np.int32(-1)).astype(np.int32)
    if kind == "few_allowed":  # mostly zero words, a few random ones
        return np.where(few, rand, 0).astype(np.int32)
    if kind == "dense_zeros":  # ~20% mixed words, each almost all zeros (many minority bits)
        return np.where(rng.random(words) < 0.2, rand & 0x11, -1).astype(np.int32)
    raise ValueError(kind)


def make_bitmask(rng: np.random.Generator, kinds: list, words: int) -> torch.Tensor:
    """int32 ``[len(kinds), words]``, row ``i`` of density ``kinds[i]``."""
    rows = [mask_row(rng, words, k) for k in kinds]
    return torch.from_numpy(np.stack(rows) if rows else np.zeros((0, words), np.int32))


def assert_matches_reference(apply, logits, bitmask, indices, vocab_size=None) -> None:
    """``apply`` (any implementation) changes ``logits`` exactly like the reference, bit for bit."""
    from tokenrails.kernels import apply_token_bitmask_inplace_reference

    expected = logits.clone()
    apply_token_bitmask_inplace_reference(expected, bitmask, indices, vocab_size)
    apply(logits, bitmask, indices, vocab_size)
    assert bits_equal(logits, expected)
