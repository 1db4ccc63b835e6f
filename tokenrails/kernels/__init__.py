"""In-place token-bitmask kernels: one module per implementation behind one dispatch function.

Bit layout (identical to xgrammar): token ``t`` of a row is allowed iff
``(bitmask[row, t // 32] >> (t % 32)) & 1``. Importing this package imports neither triton nor
xgrammar; the Triton kernel is loaded on first use.
"""
from ._common import allocate_token_bitmask, check_apply_args
from .cpu import apply_token_bitmask_inplace_cpu
from .dispatch import apply_token_bitmask_inplace, apply_token_bitmask_inplace_triton
from .reference import apply_token_bitmask_inplace_reference

__all__ = [
    "allocate_token_bitmask",
    "apply_token_bitmask_inplace",
    "apply_token_bitmask_inplace_cpu",
    "apply_token_bitmask_inplace_reference",
    "apply_token_bitmask_inplace_triton",
    "check_apply_args",
]
