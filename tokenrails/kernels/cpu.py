"""Fast CPU path: branch-free numpy integer ops on the logits' own memory.

The logits are viewed as int32 (float32) or int16 (float16 / bfloat16) and every change is
the blend ``x = ((x ^ NINF) & keep) ^ NINF``, where ``keep`` is 0 / -1 from the unpacked bits
and ``NINF`` is the dtype's -inf bit pattern (``0xFF800000``, ``0xFC00``, ``0xFF80``): allowed
logits keep their exact bits, disallowed ones become exactly -inf. Unlike ``masked_fill_`` /
``torch.where`` (a branch per element, ~4 ns each on a random mask) this runs at memory speed.

Work is chosen by mask density, measured on the words of the masked rows:

* mostly allowed (few words are not all-ones): blend only the 32-column blocks of those words;
* mostly disallowed (few words are non-zero): save those blocks, fill the rows with -inf,
  blend the saved blocks back;
* otherwise: blend whole rows.

Large temporaries come from per-thread scratch buffers: fresh multi-MB arrays on every call
page-fault after glibc returns them to the OS, which costs more than the work itself.
"""
from __future__ import annotations

import math
import threading
from typing import Optional

import numpy as np
import torch

from ._common import INT_VIEW, NEG_INF_BITS, ApplyArgs, Indices, check_apply_args

_FEW_WORDS = 1 / 4  # rows with at most this fraction of mixed words take the sparse path
_MANY_BITS = 1 / 12  # ...unless more than this fraction of their bits are the minority
_MAX_SCRATCH_BYTES = 16 << 20  # larger temporaries are allocated per call, not kept
_BOOL = np.dtype(np.bool_)
_INTP = np.dtype(np.intp)
_NEG_INF = {
    dtype: np.dtype(str(INT_VIEW[dtype]).replace("torch.", "")).type(bits)
    for dtype, bits in NEG_INF_BITS.items()
}  # numpy scalar of the -inf bit pattern, per logits dtype


def apply_token_bitmask_inplace_cpu(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: Indices = None,
    vocab_size: Optional[int] = None,
) -> None:
    """Same contract as :func:`tokenrails.kernels.apply_token_bitmask_inplace`; CPU tensors only."""
    args = check_apply_args(logits, bitmask, indices, vocab_size)
    if args.logits.device.type != "cpu":
        raise ValueError(f"the CPU kernel needs CPU tensors, got {args.logits.device}")
    apply_checked_cpu(args)


def apply_checked_cpu(args: ApplyArgs) -> None:
    """Apply arguments already validated by :func:`check_apply_args` (CPU tensors)."""
    logits, vocab = args.logits, args.vocab_size
    if args.num_rows == 0 or logits.shape[1] == 0:
        return
    if logits.stride(1) != 1 and logits.shape[1] > 1:  # rare: columns not contiguous
        from .reference import apply_token_bitmask_inplace_reference

        apply_token_bitmask_inplace_reference(logits, args.bitmask, args.rows, vocab)
        return
    words = args.bitmask.numpy()
    if not words.flags.c_contiguous:
        words = np.ascontiguousarray(words)
    whole = vocab // 32  # words whose 32 columns all lie inside the vocabulary
    not_full = _compare(words[:, :whole] if whole < words.shape[1] else words, -1, "not_full")
    if 32 * whole == logits.shape[1] and not np.count_nonzero(not_full):
        return  # every token of every masked row is allowed (e.g. a fresh bitmask)
    ints = logits.detach().view(INT_VIEW[logits.dtype]).numpy()
    ninf = _NEG_INF[logits.dtype]
    rows = args.rows
    if rows is None:
        rows = np.arange(args.num_rows)
    elif isinstance(rows, torch.Tensor):
        rows = rows.numpy().astype(np.int64, copy=False)
    elif isinstance(rows, tuple):
        rows = np.array(rows, dtype=np.int64)
    if rows.size > 1 and np.count_nonzero(np.bincount(rows)) != rows.size:
        for i in range(rows.size):  # a repeated row gets every mask in turn (their AND)
            _apply_rows(ints, words[i : i + 1], rows[i : i + 1], vocab, ninf, not_full[i : i + 1])
        return
    _apply_rows(ints, words, rows, vocab, ninf, not_full)


def _apply_rows(
    ints: np.ndarray,
    words: np.ndarray,
    rows: np.ndarray,
    vocab: int,
    ninf: np.integer,
    not_full: np.ndarray,
) -> None:
    """Mask ``ints[rows[i]]`` with ``words[i]``; ``rows`` must be duplicate-free.

    ``not_full[i, j]`` is ``words[i, j] != -1`` for the ``vocab // 32`` whole words.
    """
    whole = vocab // 32
    if vocab < ints.shape[1]:
        ints[rows, vocab:] = ninf
    if vocab % 32:
        _blend_partial_word(ints, words[:, whole], rows, 32 * whole, vocab, ninf)
    if whole == 0:
        return
    if whole < words.shape[1]:
        words = words[:, :whole]
    few = _FEW_WORDS * words.size
    n_not_full = np.count_nonzero(not_full)
    if n_not_full == 0:
        return
    if n_not_full <= few:
        _sparse_rows(ints, words, rows, ninf, not_full, mostly_allowed=True)
        return
    not_empty = _compare(words, 0, "not_empty")
    if np.count_nonzero(not_empty) <= few:
        _sparse_rows(ints, words, rows, ninf, not_empty, mostly_allowed=False)
        return
    few = _FEW_WORDS * whole
    few_disallowed = not_full.sum(axis=1) <= few
    few_allowed = ~few_disallowed & (not_empty.sum(axis=1) <= few)
    if few_disallowed.any():
        sub = words[few_disallowed]
        _sparse_rows(ints, sub, rows[few_disallowed], ninf, sub != -1, mostly_allowed=True)
    if few_allowed.any():
        sub = words[few_allowed]
        _sparse_rows(ints, sub, rows[few_allowed], ninf, sub != 0, mostly_allowed=False)
    for i in np.flatnonzero(~(few_disallowed | few_allowed)):
        _blend(ints[rows[i], : 32 * whole], words[i], ninf)


def _sparse_rows(
    ints: np.ndarray,
    words: np.ndarray,
    rows: np.ndarray,
    ninf: np.integer,
    mixed: np.ndarray,
    *,
    mostly_allowed: bool,
) -> None:
    """Rows where few words are mixed (``mixed[i, j]``: word ``j`` of row ``i`` is neither all ones
    nor, when ``mostly_allowed`` is False, zero). Touch only the minority bits' columns:

    * mostly allowed: store -inf at every 0 bit of the mixed words;
    * mostly disallowed: save the logits at every 1 bit, fill the rows with -inf, put them back.

    Falls back to whole-row blends when the minority bits turn out to be many.
    """
    nw = words.shape[1]
    flat = np.flatnonzero(mixed)
    r = flat // nw
    w = flat - r * nw
    picked = words[r, w]
    if mostly_allowed:
        picked = ~picked
    bits = np.unpackbits(picked.view(np.uint8), bitorder="little").view(np.bool_)
    n = np.count_nonzero(bits)
    if n > _MANY_BITS * rows.size * 32 * nw:
        for i in range(rows.size):
            _blend(ints[rows[i], : 32 * nw], words[i], ninf)
        return
    # offsets[j] = rows[r] * stride + 32 * w + bit for the j-th minority bit (bit j of `bits`)
    pos = np.compress(bits, _arange(bits.size), out=_scratch("pos", _INTP, (n,)))
    k = np.right_shift(pos, 5, out=_scratch("k", _INTP, (n,)))
    base = rows[r] * (ints.strides[0] // ints.itemsize) + w * 32
    offsets = np.take(base, k, out=_scratch("offsets", _INTP, (n,)))
    offsets += np.bitwise_and(pos, 31, out=pos)
    flat_ints = _flat_view(ints)
    if mostly_allowed:
        flat_ints[offsets] = ninf
        return
    saved = flat_ints[offsets]
    for row in rows:
        ints[row, : 32 * nw] = ninf
    flat_ints[offsets] = saved


def _arange(n: int) -> np.ndarray:
    """``np.arange(n)`` (intp), cached."""
    cached = _SCRATCH.buffers.get("arange")
    if cached is None or cached.size < n:
        cached = _SCRATCH.buffers["arange"] = np.arange(max(n, 1 << 16), dtype=_INTP)
    return cached[:n]


def _flat_view(ints: np.ndarray) -> np.ndarray:
    """1-D view of the memory behind a 2-D array with contiguous rows (any row stride)."""
    if ints.flags.c_contiguous:
        return ints.reshape(-1)
    size = (ints.shape[0] - 1) * (ints.strides[0] // ints.itemsize) + ints.shape[1]
    return np.lib.stride_tricks.as_strided(ints, shape=(size,), strides=(ints.itemsize,))


def _blend(target: np.ndarray, words: np.ndarray, ninf: np.integer) -> None:
    """In place: element ``j`` of ``target`` (flattened) becomes -inf iff bit ``j`` of ``words`` is 0.

    ``target`` is a contiguous int array with ``32 * words.size`` elements (or fewer: a prefix).
    """
    n = target.size
    bits = np.unpackbits(words.view(np.uint8).reshape(-1), count=n, bitorder="little").view(np.int8)
    np.negative(bits, out=bits)  # 1 -> -1 (keep), 0 -> 0
    keep = _scratch("keep", target.dtype, target.shape)
    np.copyto(keep, bits.reshape(target.shape))  # sign-extending widen
    np.bitwise_xor(target, ninf, out=target)
    np.bitwise_and(target, keep, out=target)
    np.bitwise_xor(target, ninf, out=target)


def _blend_partial_word(
    ints: np.ndarray, last: np.ndarray, rows: np.ndarray, start: int, vocab: int, ninf: np.integer
) -> None:
    """Columns ``[start, vocab)`` (fewer than 32) of every masked row, from word ``last[i]``."""
    segment = ints[rows, start:vocab]  # [R, vocab - start] copy
    bits = np.unpackbits(
        np.ascontiguousarray(last).view(np.uint8).reshape(-1, 4), axis=1, bitorder="little"
    )
    keep = -bits[:, : vocab - start].astype(ints.dtype)
    segment ^= ninf
    segment &= keep
    segment ^= ninf
    ints[rows, start:vocab] = segment


class _ScratchBuffers(threading.local):
    def __init__(self) -> None:
        self.buffers: dict = {}


_SCRATCH = _ScratchBuffers()


def _compare(words: np.ndarray, value: int, name: str) -> np.ndarray:
    """``words != value`` (bool, same shape), in a scratch buffer when large."""
    if words.size < 1 << 16:
        return words != value
    return np.not_equal(words, value, out=_scratch(name, _BOOL, words.shape))


def _scratch(name: str, dtype: np.dtype, shape: tuple) -> np.ndarray:
    """A reusable per-thread array of ``shape`` (contents undefined); fresh if very large."""
    size = math.prod(shape)
    if size * dtype.itemsize > _MAX_SCRATCH_BYTES:
        return np.empty(shape, dtype)
    key = (name, dtype)
    buf = _SCRATCH.buffers.get(key)
    if buf is None or buf.size < size:
        buf = _SCRATCH.buffers[key] = np.empty(size, dtype)
    return buf[:size].reshape(shape)
