"""Triton kernel: write-only masked -inf stores over a compact bitmask and a row map.

Grid ``(R, cdiv(V_logits, BLOCK))``: program ``(i, j)`` reads ``BLOCK // 32`` words of bitmask
row ``i`` and stores -inf into columns ``[j * BLOCK, (j + 1) * BLOCK)`` of logits row
``indices[i]`` wherever the bit is 0 or the column is ``>= vocab_size``. Logits are never read,
so an allowed logit's memory is never written either. Unguided rows get no program at all.

Graph-safe call: pass ``indices`` as an int32/int64 tensor already on the logits' device (or
``None``) and keep shapes fixed; the launch then does no host allocation, no copy and no device
query. A Python list of indices is converted (a small host->device copy) and is not graph-safe.
Indices on the GPU are not range-checked on the host (that would sync); rows outside
``[0, B)`` are skipped inside the kernel.

CPU tensors run through Triton's interpreter (tests; slow). ``TRITON_INTERPRET=1`` set before
this module is imported makes the regular kernel object interpreted as well.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import triton
import triton.language as tl

from ._common import ApplyArgs

BLOCK = 1024  # columns per program: 32 bitmask words, 4 KB of fp32 logits
NUM_WARPS = 4  # 128 threads x 8 columns each


def _apply_bitmask_kernel(
    logits_ptr,
    bitmask_ptr,
    indices_ptr,
    num_logits_rows,
    logits_width,
    vocab_size,
    logits_row_stride,
    logits_col_stride,
    bitmask_row_stride,
    HAS_INDICES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    block = tl.program_id(1)
    if HAS_INDICES:
        target = tl.load(indices_ptr + row).to(tl.int64)
    else:
        target = row.to(tl.int64)
    # a row outside [0, B) stores nothing (GPU indices are not range-checked on the host)
    col_limit = tl.where((target >= 0) & (target < num_logits_rows), logits_width, 0)
    word_index = block * (BLOCK // 32) + tl.arange(0, BLOCK // 32)  # [BLOCK // 32]
    bit = tl.arange(0, 32)  # [32]
    cols = word_index[:, None] * 32 + bit[None, :]  # [BLOCK // 32, 32]
    words = tl.load(
        bitmask_ptr + row.to(tl.int64) * bitmask_row_stride + word_index,
        mask=word_index * 32 < vocab_size,
        other=0,
    )
    allowed = ((words[:, None] >> bit[None, :]) & 1) != 0
    disallowed = (~allowed) | (cols >= vocab_size)
    store_mask = disallowed & (cols < col_limit)
    ptrs = logits_ptr + target * logits_row_stride + cols.to(tl.int64) * logits_col_stride
    neg_inf = tl.full((BLOCK // 32, 32), float("-inf"), logits_ptr.dtype.element_ty)
    tl.store(ptrs, neg_inf, mask=store_mask)


_jit_kernel = triton.jit(_apply_bitmask_kernel)


@functools.lru_cache(maxsize=None)
def _interpreted_kernel() -> Any:
    """The same kernel under Triton's interpreter, for CPU tensors."""
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(_apply_bitmask_kernel)


def launch_checked_triton(args: ApplyArgs) -> None:
    """Launch on arguments already validated by :func:`check_apply_args`."""
    logits, bitmask, rows = args.logits, args.bitmask, args.rows
    width = logits.shape[1]
    if args.num_rows == 0 or width == 0:
        return
    if rows is not None and not isinstance(rows, torch.Tensor):
        rows = torch.as_tensor(rows, dtype=torch.int32).to(logits.device, non_blocking=True)
    elif rows is not None and rows.device != logits.device:
        rows = rows.to(logits.device, non_blocking=True)
    if bitmask.stride(1) != 1 and bitmask.shape[1] > 1:
        bitmask = bitmask.contiguous()
    kernel = _jit_kernel if logits.device.type != "cpu" else _interpreted_kernel()
    grid = (args.num_rows, triton.cdiv(width, BLOCK))
    kernel[grid](
        logits,
        bitmask,
        rows,
        logits.shape[0],
        width,
        args.vocab_size,
        logits.stride(0),
        logits.stride(1),  # 1 almost always; a column-strided view is masked in place all the same
        bitmask.stride(0),
        HAS_INDICES=rows is not None,
        BLOCK=BLOCK,
        num_warps=NUM_WARPS,
    )
