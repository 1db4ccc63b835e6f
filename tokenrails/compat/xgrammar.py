"""xgrammar's token-bitmask API, same names, signatures and semantics, tokenrails kernels underneath.

Code written against ``xgrammar`` (vLLM v1, SGLang, LMDeploy's own guided path) calls
``apply_token_bitmask_inplace(logits, bitmask, *, vocab_size=None, indices=None)`` with a
**full-batch** bitmask: ``indices`` picks rows of *both* tensors. ``tokenrails.apply_token_bitmask_inplace``
keeps the manager's **compact** form instead (bitmask row ``i`` masks logits row ``indices[i]``) and
sets columns ``>= vocab_size`` to -inf. Both are right for their callers; this module is the one to
import where xgrammar's meaning is expected::

    from tokenrails.compat import xgrammar as xgr   # instead of ``import xgrammar as xgr``
    xgr.apply_token_bitmask_inplace(logits, bitmask, indices=rows)

Differences from xgrammar that a caller could see, all on misuse: errors are ``ValueError`` (xgrammar
raises ``RuntimeError`` from C++ for some), a negative ``vocab_size`` is refused (xgrammar masks
nothing), and tuple ``indices`` select rows (xgrammar ignores a tuple and masks every row).
"""
from __future__ import annotations

import math
import operator
import warnings
from typing import List, Optional, Sequence, Tuple, Union

import torch

from ..kernels._common import KernelArgumentError
from ..kernels.dispatch import apply_token_bitmask_inplace as _apply_compact
from ..kernels.dispatch import apply_token_bitmask_inplace_triton as _apply_compact_triton
from ..kernels.reference import apply_token_bitmask_inplace_reference as _apply_compact_reference

__all__ = [
    "allocate_token_bitmask",
    "apply_token_bitmask_inplace",
    "apply_token_bitmask_inplace_cpu",
    "apply_token_bitmask_inplace_triton",
    "bitmask_dtype",
    "get_bitmask_shape",
    "reset_token_bitmask",
]

bitmask_dtype = torch.int32
"""The dtype of every bitmask: int32, 32 tokens a word, bit ``t % 32`` of word ``t // 32``."""

_BACKENDS = ("auto", "cpu", "cuda", "triton", "torch_compile", "torch_native")
XgrIndices = Union[List[int], Sequence[int], torch.Tensor, None]


def get_bitmask_shape(batch_size: int, vocab_size: int) -> Tuple[int, int]:
    """``(batch_size, ceil(vocab_size / 32))``."""
    return (batch_size, math.ceil(vocab_size / 32))


def allocate_token_bitmask(batch_size: int, vocab_size: int) -> torch.Tensor:
    """A CPU int32 bitmask of every-token-allowed rows (copy it to the logits' device to apply)."""
    return torch.full(get_bitmask_shape(batch_size, vocab_size), -1, dtype=bitmask_dtype)


def reset_token_bitmask(bitmask: torch.Tensor) -> None:
    """Set every bit: every token allowed again."""
    bitmask.fill_(-1)


def apply_token_bitmask_inplace(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    *,
    vocab_size: Optional[int] = None,
    indices: XgrIndices = None,
    backend: str = "auto",
) -> None:
    """Set the logits of disallowed tokens to -inf, in place, with xgrammar's meaning.

    ``logits`` ``[B, V]`` (or 1-D), ``bitmask`` int32 ``[Bm, ceil(V/32)]`` on the same device.
    Without ``indices`` ``Bm == B`` and row ``i`` masks row ``i``; with ``indices`` row ``k`` of
    both tensors is masked for each ``k`` listed (the batch sizes may differ). Only columns
    ``< vocab_size`` are touched; ``vocab_size`` defaults to ``min(V, 32 * bitmask.shape[-1])``
    and a bitmask narrower than the logits then warns, as xgrammar does, because the uncovered
    logits stay sampleable.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"Unknown backend: {backend}. The value should be one of {list(_BACKENDS)}")
    if not isinstance(logits, torch.Tensor) or not isinstance(bitmask, torch.Tensor):
        raise KernelArgumentError("logits and bitmask must be torch.Tensor")
    if bitmask.device != logits.device:
        raise ValueError(
            "logits and bitmask should be on the same device. "
            f"But got logits.device: {logits.device}, bitmask.device: {bitmask.device}"
        )
    if vocab_size is None and 32 * bitmask.shape[-1] < logits.shape[-1]:
        masked_width = 32 * bitmask.shape[-1]
        warnings.warn(
            f"The bitmask covers only {masked_width} tokens but logits have {logits.shape[-1]}, so "
            f"logits[..., {masked_width}:] are left unmasked. Allocate the bitmask with the full "
            "vocab size, or pass vocab_size explicitly.",
            stacklevel=2,
        )
    _apply(logits, bitmask, vocab_size, indices, _kernel_for(backend, logits))


def apply_token_bitmask_inplace_cpu(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    vocab_size: Optional[int] = None,
    indices: XgrIndices = None,
) -> None:
    """``xgrammar.kernels.apply_token_bitmask_inplace_cpu``: CPU tensors only."""
    if logits.device.type != "cpu" or bitmask.device.type != "cpu":
        raise ValueError("logits and bitmask must be on CPU")
    _apply(logits, bitmask, vocab_size, indices, _apply_compact)


def apply_token_bitmask_inplace_triton(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    vocab_size: Optional[int] = None,
    indices: XgrIndices = None,
) -> None:
    """``xgrammar.kernels.apply_token_bitmask_inplace_triton`` (CPU tensors run the interpreter)."""
    _apply(logits, bitmask, vocab_size, indices, _apply_compact_triton)


def _kernel_for(backend: str, logits: torch.Tensor):
    if backend == "cpu":
        if logits.device.type != "cpu":
            raise ValueError("backend='cpu' needs logits on CPU")
        return _apply_compact
    if backend == "triton":
        return _apply_compact_triton
    if backend in ("torch_compile", "torch_native"):
        return _reference_kernel
    return _apply_compact  # auto and cuda: the dispatch picks by device


def _reference_kernel(logits, bitmask, indices=None, vocab_size=None) -> None:
    from ..kernels._common import check_apply_args

    args = check_apply_args(logits, bitmask, indices, vocab_size)
    _apply_compact_reference(args.logits, args.bitmask, args.rows, args.vocab_size)


def _apply(logits: torch.Tensor, bitmask: torch.Tensor, vocab_size: Optional[int], indices: XgrIndices,
           kernel) -> None:
    """Translate xgrammar's call into the compact one: narrow the columns, then pick bitmask rows."""
    if bitmask.dtype != bitmask_dtype:
        raise ValueError(f"bitmask must be of type int32, got {bitmask.dtype}")
    if logits.dim() not in (1, 2) or bitmask.dim() not in (1, 2):
        raise ValueError(f"logits and bitmask must be 1-D or 2-D, got {logits.dim()}-D and {bitmask.dim()}-D")
    logits2 = logits if logits.dim() == 2 else logits.unsqueeze(0)
    bitmask2 = bitmask if bitmask.dim() == 2 else bitmask.unsqueeze(0)
    limit = min(logits2.shape[1], 32 * bitmask2.shape[1])
    if vocab_size is None:
        vocab_size = limit
    elif isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 0 <= vocab_size <= limit:
        raise ValueError(
            f"vocab_size={vocab_size!r} must be an int in [0, min(logits.shape[-1]={logits2.shape[1]}, "
            f"32 * bitmask.shape[-1]={32 * bitmask2.shape[1]})]"
        )
    # xgrammar touches only logits[..., :vocab_size]; the compact kernel masks every column it sees.
    logits2 = logits2[:, :vocab_size]
    bitmask2 = bitmask2[:, : (vocab_size + 31) // 32]
    if indices is None:
        if logits2.shape[0] != bitmask2.shape[0]:
            raise ValueError(
                "When indices is not provided, the logits's batch size should be equal to the "
                f"bitmask's batch size, but got {logits2.shape[0]} vs {bitmask2.shape[0]}"
            )
        kernel(logits2, bitmask2, None, vocab_size)
        return
    rows = _row_list(indices, min(logits2.shape[0], bitmask2.shape[0]))
    if rows:
        picked = bitmask2[torch.tensor(rows, dtype=torch.long, device=bitmask2.device)]
        kernel(logits2, picked, rows, vocab_size)


def _row_list(indices: XgrIndices, batch: int) -> List[int]:
    """The rows as Python ints, each checked to lie in both tensors (an out-of-range row would
    write out of bounds in a kernel, so it is refused here)."""
    if isinstance(indices, torch.Tensor):
        if indices.dim() != 1 or indices.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"indices must be a 1-D int32/int64 tensor, got {indices.dtype} {tuple(indices.shape)}")
        rows = indices.tolist()
    else:
        try:
            rows = [operator.index(i) for i in indices]  # type: ignore[union-attr]
        except TypeError:
            raise KernelArgumentError(f"indices must be a sequence of ints, got {type(indices).__name__}") from None
    for row in rows:
        if not 0 <= row < batch:
            raise ValueError(f"index {row} out of range for a batch of {batch} rows")
    return rows
