"""The one public entry point: validate once, then pick an implementation by device.

* CUDA (or other GPU) tensors -> Triton kernel; the torch reference if triton is not installed.
* CPU tensors -> the CPU kernel (C when built, numpy otherwise; see cpu.py).
* ``TOKENRAILS_KERNEL=reference|cpu|triton`` forces one (read on every call). ``triton`` on CPU
  tensors runs Triton's interpreter (tests only); ``cpu`` on GPU tensors is an error.
"""
from __future__ import annotations

from typing import Optional

import torch

from .._env import env_lookup
from ._common import ApplyArgs, Indices, check_apply_args
from .cpu import apply_checked_cpu
from .reference import apply_token_bitmask_inplace_reference

KERNEL_ENV = "TOKENRAILS_KERNEL"
_forced_kernel = env_lookup(KERNEL_ENV)  # os.environ.get(KERNEL_ENV), cheap when unset
_CHOICES = ("reference", "cpu", "triton")


def apply_token_bitmask_inplace(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: Indices = None,
    vocab_size: Optional[int] = None,
) -> None:
    """Set disallowed logits to -inf in place.

    Args:
        logits: ``[B, V_logits]`` (or 1-D ``[V_logits]``: one row) float32/float16/bfloat16.
        bitmask: int32 ``[R, ceil(vocab/32)]`` (1-D for one row); token ``t`` of row ``i`` is
            allowed iff ``(bitmask[i, t // 32] >> (t % 32)) & 1`` (xgrammar's layout).
        indices: bitmask row ``i`` applies to logits row ``indices[i]`` (so ``R == len(indices)``);
            ``None`` means row ``i`` -> row ``i`` and ``R == B``. A list/tuple of ints or a 1-D
            int32/int64 tensor; on a GPU pass a tensor on the logits' device (graph-safe).
        vocab_size: real vocabulary size, default ``min(V_logits, 32 * bitmask.shape[-1])``;
            columns ``>= vocab_size`` of every masked row become -inf.

    Allowed logits and rows not named in ``indices`` keep their exact bits. A row named twice
    gets both masks. Raises ``ValueError`` for bad dtypes, shapes, devices or indices.
    """
    args = check_apply_args(logits, bitmask, indices, vocab_size)
    forced = _forced_kernel()
    if forced:
        _run_forced(forced, args)
    elif args.logits.is_cpu:
        apply_checked_cpu(args)
    elif _triton_available():
        _triton().launch_checked_triton(args)
    else:
        _reference(args)


def apply_token_bitmask_inplace_triton(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: Indices = None,
    vocab_size: Optional[int] = None,
) -> None:
    """The Triton implementation (imports triton on first call); CPU tensors use its interpreter."""
    _triton().launch_checked_triton(check_apply_args(logits, bitmask, indices, vocab_size))


def _run_forced(name: str, args: ApplyArgs) -> None:
    name = name.strip().lower()
    if name == "reference":
        _reference(args)
    elif name == "cpu":
        if args.logits.device.type != "cpu":
            raise ValueError(f"{KERNEL_ENV}=cpu but the logits are on {args.logits.device}")
        apply_checked_cpu(args)
    elif name == "triton":
        _triton().launch_checked_triton(args)
    else:
        raise ValueError(f"{KERNEL_ENV}={name!r}: expected one of {', '.join(_CHOICES)}")


def _reference(args: ApplyArgs) -> None:
    apply_token_bitmask_inplace_reference(args.logits, args.bitmask, args.rows, args.vocab_size)


_TRITON_STATE: dict = {}


def _triton_available() -> bool:
    if "ok" not in _TRITON_STATE:
        try:
            _triton()
            _TRITON_STATE["ok"] = True
        except ImportError:
            _TRITON_STATE["ok"] = False
    return _TRITON_STATE["ok"]


def _triton():
    from . import triton_kernel

    return triton_kernel
