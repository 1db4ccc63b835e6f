"""CPU apply: the C kernel ``tokenrails._apply_native`` when built, else numpy integer ops.

:func:`apply_checked_cpu` hands validated arguments to the C kernel (raw data pointers, strides and
sizes; design in ``csrc/apply_native.c``) unless it is not built or ``TOKENRAILS_NATIVE=0``; then
:func:`apply_checked_numpy` runs instead. Both are bit-exact against the reference
(tests/kernels/test_native_apply.py).

The numpy path views the logits as int32 (float32) or int16 (float16 / bfloat16) and stores the
dtype's -inf bit pattern, so allowed logits keep their exact bits. ``masked_fill_`` /
``torch.where`` branch per element, so each masked row takes the cheapest of three branch-free
paths, picked by a cost model over its popcount and word counts: *blend* (mixed rows: ``x = ((x ^
NINF) & keep) ^ NINF``), *scatter* (few disallowed tokens: -inf at the 0 bits), *fill* (few allowed
tokens: save them, fill the row with -inf, restore them). Large temporaries come from per-thread
scratch buffers: fresh multi-MB arrays page-fault once glibc returns them to the OS.
docs/kernels.md ("CPU path") has the design and the measurements.
"""
from __future__ import annotations

import math
import threading
from typing import Optional

import numpy as np
import torch

from .. import native
from ._common import INT_VIEW, NEG_INF_BITS, ApplyArgs, Indices, check_apply_args

# Cost model of the three paths, ns: per mixed word scanned, per -inf store of a scattered
# disallowed bit, per allowed logit saved and restored, per column filled, per column blended.
_NS_PER_WORD, _NS_PER_STORE, _NS_PER_KEEP, _NS_PER_FILL, _NS_PER_BLEND = 15.0, 10.0, 8.0, 0.15, 0.45
_BLEND, _SCATTER, _FILL = 0, 1, 2
_DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # the C kernel's dtype codes
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
    """Apply arguments already validated by :func:`check_apply_args` (CPU tensors): the C kernel
    when it is built (and not switched off), else the numpy path.

    Called every decoding step, so each tensor attribute is read once (~0.2 us a read).
    """
    module = native.load("apply")
    if module is None:
        apply_checked_numpy(args)
        return
    logits, bitmask, rows, vocab, num_rows = args
    batch, width = logits.shape
    row_stride, col_stride = logits.stride()
    if num_rows == 0 or width == 0:
        return
    if col_stride != 1 and width > 1:  # rare: columns not contiguous
        _reference_fallback(args)
        return
    if bitmask.stride(1) != 1 and bitmask.shape[1] > 1:
        bitmask = bitmask.contiguous()
    if rows is None or type(rows) is tuple:
        address, itemsize = rows, 0
    elif isinstance(rows, torch.Tensor):
        if not rows.is_contiguous():
            rows = rows.contiguous()
        address, itemsize = rows.data_ptr(), rows.element_size()
    else:  # int64 numpy array (a long index list)
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        address, itemsize = rows.ctypes.data, 8
    module.apply(
        logits.data_ptr(), batch, row_stride, width, _DTYPE_CODE[logits.dtype],
        bitmask.data_ptr(), bitmask.stride(0), bitmask.shape[1], num_rows, address, itemsize, vocab,
    )  # ``rows`` (the local) keeps any contiguous copy alive during the call


def apply_checked_numpy(args: ApplyArgs) -> None:
    """The numpy implementation (the fallback when the C kernel is not built)."""
    logits, vocab = args.logits, args.vocab_size
    if args.num_rows == 0 or logits.shape[1] == 0:
        return
    if logits.stride(1) != 1 and logits.shape[1] > 1:  # rare: columns not contiguous
        _reference_fallback(args)
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


def _reference_fallback(args: ApplyArgs) -> None:
    from .reference import apply_token_bitmask_inplace_reference

    apply_token_bitmask_inplace_reference(args.logits, args.bitmask, args.rows, args.vocab_size)


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
    if not np.count_nonzero(not_full):
        return
    choice, not_empty = _choose_paths(words, not_full)
    if len(rows) == 1:  # skip the grouping below: a handful of numpy calls less
        path = int(choice[0])
        if path == _BLEND:
            _blend(ints[rows[0], : 32 * whole], words[0], ninf)
        else:
            minority = not_full if path == _SCATTER else not_empty
            _sparse_rows(ints, words, rows, ninf, minority, mostly_allowed=path == _SCATTER)
        return
    for path, minority in ((_SCATTER, not_full), (_FILL, not_empty)):
        group = choice == path
        if not group.any():
            continue
        if not group.all():
            words_g, rows_g, minority = words[group], rows[group], minority[group]
        else:
            words_g, rows_g = words, rows
        _sparse_rows(ints, words_g, rows_g, ninf, minority, mostly_allowed=path == _SCATTER)
    for i in np.flatnonzero(choice == _BLEND):
        _blend(ints[rows[i], : 32 * whole], words[i], ninf)


def _choose_paths(words: np.ndarray, not_full: np.ndarray):
    """Each row's cheapest path (``_BLEND``/``_SCATTER``/``_FILL``) by a cost model over its bit
    and word counts; also ``words != 0`` when that had to be computed (else None)."""
    n = 32 * words.shape[1]
    blend = _NS_PER_BLEND * n
    ones = _popcount_rows(words)  # allowed tokens per row
    if len(words) == 1:  # Python numbers: much cheaper than array ops for one row
        one = int(ones[0])
        scatter = _NS_PER_WORD * int(np.count_nonzero(not_full)) + _NS_PER_STORE * (n - one)
        fill = _NS_PER_FILL * n + _NS_PER_KEEP * one  # + scanning the non-zero words
        not_empty = None
        if fill < min(scatter, blend):
            not_empty = _compare(words, 0, "not_empty")
            fill += _NS_PER_WORD * int(np.count_nonzero(not_empty))
        return np.array([min((blend, _BLEND), (scatter, _SCATTER), (fill, _FILL))[1]]), not_empty
    scatter = _NS_PER_WORD * np.count_nonzero(not_full, axis=1) + _NS_PER_STORE * (n - ones)
    fill = _NS_PER_FILL * n + _NS_PER_KEEP * ones
    not_empty = None
    if (fill < np.minimum(scatter, blend)).any():
        not_empty = _compare(words, 0, "not_empty")
        fill = fill + _NS_PER_WORD * np.count_nonzero(not_empty, axis=1)
    choice = np.where(scatter < fill, _SCATTER, _FILL)
    return np.where(np.minimum(scatter, fill) < blend, choice, _BLEND), not_empty


def _popcount_rows(words: np.ndarray) -> np.ndarray:
    """Number of set bits in each row of an int32 array (int64 ``[R]``)."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2; counts |x| for signed types, so view unsigned
        if words.flags.c_contiguous and words.shape[1] % 2 == 0:
            return np.bitwise_count(words.view(np.uint64)).sum(axis=1, dtype=np.int64)
        return np.bitwise_count(words.view(np.uint32)).sum(axis=1, dtype=np.int64)
    table = np.array([bin(b).count("1") for b in range(256)], dtype=np.int64)
    return table[np.ascontiguousarray(words).view(np.uint8)].sum(axis=1)


def _sparse_rows(
    ints: np.ndarray,
    words: np.ndarray,
    rows: np.ndarray,
    ninf: np.integer,
    mixed: np.ndarray,
    *,
    mostly_allowed: bool,
) -> None:
    """Touch only the minority bits' columns. ``mixed[i, j]``: word ``j`` of row ``i`` may hold a
    minority bit (``!= -1`` when ``mostly_allowed``, else ``!= 0``).

    * mostly allowed (scatter): store -inf at every 0 bit of those words;
    * mostly disallowed (fill): save the logits at every 1 bit, fill the rows with -inf, restore.
    """
    nw = words.shape[1]
    if len(rows) == 1:  # one row: unpacking it whole takes fewer numpy calls than two levels
        target = ints[rows[0], : 32 * nw]
        row_words = np.invert(words[0]) if mostly_allowed else words[0]
        cols = np.flatnonzero(np.unpackbits(row_words.view(np.uint8), bitorder="little").view(np.bool_))
        if mostly_allowed:
            target[cols] = ninf
        else:
            saved = target[cols]
            target[:] = ninf
            target[cols] = saved
        return
    offsets = _minority_offsets(ints, words, rows, mixed, invert=mostly_allowed)
    flat_ints = _flat_view(ints)
    if mostly_allowed:
        flat_ints[offsets] = ninf
        return
    saved = flat_ints[offsets]
    for row in rows:
        ints[row, : 32 * nw] = ninf
    flat_ints[offsets] = saved


def _minority_offsets(
    ints: np.ndarray, words: np.ndarray, rows: np.ndarray, mixed: np.ndarray, *, invert: bool
) -> np.ndarray:
    """Offsets into ``ints`` (flattened) of every set bit of ``words`` (of ``~words`` if ``invert``)
    in the words where ``mixed`` is True: column ``32 * j + bit`` of row ``rows[i]`` for word
    ``words[i, j]``.
    """
    nw = words.shape[1]
    flat = np.flatnonzero(mixed)  # i * nw + j of each mixed word
    picked = words.reshape(-1)[flat] if words.flags.c_contiguous else words[np.divmod(flat, nw)]
    if invert:
        np.invert(picked, out=picked)
    # Two levels, as minority bits are sparse: the bytes holding one, then those bytes' bits.
    packed = picked.view(np.uint8)
    hot = np.flatnonzero(packed != 0)
    j = np.flatnonzero(np.unpackbits(packed[hot], bitorder="little").view(np.bool_))
    pos = np.left_shift(hot[j >> 3], 3)
    pos |= j & 7  # bit position in the concatenated picked words: 32 * k + bit
    # column base of picked word k, minus 32 * k so that adding pos gives the column
    if len(rows) == 1:
        base = flat - _arange(flat.size)
        base *= 32
        base += rows[0] * (ints.strides[0] // ints.itemsize)
    else:
        r = flat // nw
        base = rows[r] * (ints.strides[0] // ints.itemsize) + 32 * (flat - r * nw - _arange(flat.size))
    offsets = base[pos >> 5]
    offsets += pos
    return offsets


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


def _arange(n: int) -> np.ndarray:
    """``np.arange(n)`` (intp), from a cached array."""
    cached = _SCRATCH.buffers.get("arange")
    if cached is None or cached.size < n:
        cached = _SCRATCH.buffers["arange"] = np.arange(max(n, 1 << 16), dtype=_INTP)
    return cached[:n]
