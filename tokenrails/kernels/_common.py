"""Argument checking shared by every apply implementation, and the bitmask allocator.

Bit layout (identical to xgrammar): token ``t`` of a row is allowed iff
``(bitmask[row, t // 32] >> (t % 32)) & 1`` -- bit ``t % 32`` counted from the least
significant bit of int32 word ``t // 32``.
"""
from __future__ import annotations

import operator
from typing import NamedTuple, Optional, Sequence, Union

import numpy as np
import torch

Indices = Union[Sequence[int], torch.Tensor, None]

LOGITS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Bit pattern of -inf for each logits dtype, as the signed integer of the same width.
NEG_INF_BITS = {torch.float32: -0x00800000, torch.float16: -0x0400, torch.bfloat16: -0x0080}
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


class KernelArgumentError(ValueError, TypeError):
    """An argument of the wrong type; a ``ValueError`` like every other argument error here."""


class ApplyArgs(NamedTuple):
    """Normalised arguments of one apply call.

    ``logits`` is 2-D ``[B, V_logits]`` (a view of the caller's tensor), ``bitmask`` 2-D int32
    ``[R, W]``; bitmask row ``i`` applies to logits row ``rows[i]`` (``rows is None``: row ``i``).
    ``rows`` is a tuple of ints or an int64 numpy array (from a sequence), or a 1-D int32/int64
    tensor (as given); tensors on
    CPU are range-checked, tensors on an accelerator are not (that would need a device sync).
    ``num_rows`` is ``R``, the number of masked rows.
    """

    logits: torch.Tensor
    bitmask: torch.Tensor
    rows: Union[tuple, np.ndarray, torch.Tensor, None]
    vocab_size: int

    num_rows: int


def allocate_token_bitmask(
    rows: int, vocab_size: int, device: Union[str, torch.device] = "cpu"
) -> torch.Tensor:
    """Return an int32 tensor ``[rows, ceil(vocab_size / 32)]`` filled with -1 (every token allowed)."""
    rows, vocab_size = _as_int(rows, "rows"), _as_int(vocab_size, "vocab_size")
    if rows < 0 or vocab_size < 0:
        raise ValueError(f"rows and vocab_size must be >= 0, got {rows} and {vocab_size}")
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32, device=device)


def eos_only_row(row: torch.Tensor, eos_ids: Sequence[int]) -> None:
    """Write a bitmask row that allows only the EOS ids."""
    row.zero_()
    for e in eos_ids:
        word = row[e // 32].item()
        bit = e % 32
        value = (word | (1 << bit)) & 0xFFFFFFFF
        row[e // 32] = value - (1 << 32) if value >= 1 << 31 else value


def check_apply_args(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: Indices = None,
    vocab_size: Optional[int] = None,
) -> ApplyArgs:
    """Validate an apply call and normalise it to 2-D tensors; raise ``ValueError`` on misuse.

    Runs on every decoding step before a kernel that may take ~1 us, so each tensor attribute is
    read once (every read is a ~0.1-0.2 us trip into torch).
    """
    if not isinstance(logits, torch.Tensor) or not isinstance(bitmask, torch.Tensor):
        raise KernelArgumentError("logits and bitmask must be torch.Tensor")
    if logits.dtype not in LOGITS_DTYPES:
        raise ValueError(f"logits must be float32, float16 or bfloat16, got {logits.dtype}")
    if bitmask.dtype is not _INT32:  # dtypes are singletons
        raise ValueError(f"bitmask must be int32, got {bitmask.dtype}")
    logits_shape, bitmask_shape = logits.shape, bitmask.shape
    logits_dim, bitmask_dim = len(logits_shape), len(bitmask_shape)
    if logits_dim not in (1, 2) or bitmask_dim not in (1, 2):
        raise ValueError(
            f"logits and bitmask must be 1-D or 2-D, got shapes {tuple(logits_shape)} "
            f"and {tuple(bitmask_shape)}"
        )
    if logits_dim == 1 and bitmask_dim == 2 and bitmask_shape[0] != 1:
        raise ValueError(f"1-D logits take a 1-D bitmask, got {tuple(bitmask_shape)}")
    if not (logits.is_cpu and bitmask.is_cpu) and bitmask.device != logits.device:
        raise ValueError(f"bitmask is on {bitmask.device} but logits are on {logits.device}")
    if logits_dim == 1:
        logits = logits.unsqueeze(0)
        batch, width = 1, logits_shape[0]
    else:
        batch, width = logits_shape
    if bitmask_dim == 1:
        bitmask = bitmask.unsqueeze(0)
        mask_rows, words = 1, bitmask_shape[0]
    else:
        mask_rows, words = bitmask_shape
    limit = min(width, 32 * words)
    if vocab_size is None:
        vocab_size = limit
    else:
        vocab_size = _as_int(vocab_size, "vocab_size")
        if not 0 <= vocab_size <= limit:
            raise ValueError(
                f"vocab_size={vocab_size} must be in [0, min(logits.shape[-1]={width}, "
                f"32 * bitmask.shape[-1]={32 * words})]"
            )
    rows = None if indices is None else _check_indices(indices, batch, logits)
    expected = batch if rows is None else len(rows)
    if mask_rows != expected:
        what = "logits rows" if rows is None else "len(indices)"
        raise ValueError(f"bitmask has {mask_rows} rows but {what} is {expected}")
    return ApplyArgs(logits, bitmask, rows, vocab_size, mask_rows)


_INT32 = torch.int32
_SMALL_LIST = 1024  # index lists up to this length are checked in Python, not via numpy


def _check_indices(
    indices: Union[Sequence[int], torch.Tensor], batch: int, logits: torch.Tensor
) -> Union[tuple, np.ndarray, torch.Tensor]:
    if isinstance(indices, torch.Tensor):
        if indices.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"indices tensor must be int32 or int64, got {indices.dtype}")
        if indices.dim() != 1:
            raise ValueError(f"indices must be 1-D, got shape {tuple(indices.shape)}")
        if indices.is_cpu:
            count = indices.numel()
            if 0 < count <= 256:  # one tolist() beats two torch reductions on short tensors
                values = indices.tolist()
                _check_range(min(values), max(values), batch)
            elif count:
                _check_range(int(indices.min()), int(indices.max()), batch)
        elif indices.device != logits.device:
            raise ValueError(f"indices are on {indices.device} but logits are on {logits.device}")
        return indices
    if not isinstance(indices, (list, tuple, range, np.ndarray)):
        raise KernelArgumentError(
            f"indices must be a list/tuple of ints or an int tensor, got {type(indices).__name__}"
        )
    if not isinstance(indices, np.ndarray) and len(indices) <= _SMALL_LIST:
        if not indices:
            return ()
        if set(map(type, indices)) == {int}:  # fast path: plain ints (bools and numpy ints are not)
            _check_range(min(indices), max(indices), batch)
            return tuple(indices)
    rows = np.asarray(indices)
    if rows.size == 0:
        return np.zeros(0, dtype=np.int64)
    if rows.dtype.kind not in "iu" or rows.ndim != 1:
        raise KernelArgumentError(f"indices must be a flat sequence of ints, got {indices!r:.80}")
    rows = rows.astype(np.int64, copy=False)
    _check_range(int(rows.min()), int(rows.max()), batch)
    return rows


def _check_range(low: int, high: int, batch: int) -> None:
    if low < 0 or high >= batch:
        bad = low if low < 0 else high
        raise ValueError(f"index {bad} out of range for logits with {batch} rows")


def _as_int(value: object, name: str) -> int:
    if isinstance(value, bool):
        raise KernelArgumentError(f"{name} must be an int, got bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise KernelArgumentError(f"{name} must be an int, got {type(value).__name__}") from None
