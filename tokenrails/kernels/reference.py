"""Plain torch implementation: the test oracle. Slow and obviously correct, any device."""
from __future__ import annotations

from typing import Optional

import torch

from ._common import Indices, check_apply_args


def unpack_bitmask(bitmask: torch.Tensor, width: int, vocab_size: int) -> torch.Tensor:
    """Bool ``[R, width]``: True where the token is allowed (token ``t`` <- bit ``t % 32`` of word ``t // 32``).

    Columns ``>= vocab_size`` are False (not allowed) whatever their bits say.
    """
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [R, W, 32]; >> is arithmetic, & 1 keeps one bit
    allowed = bits.reshape(bitmask.shape[0], 32 * bitmask.shape[1]).bool()
    out = torch.zeros(bitmask.shape[0], width, dtype=torch.bool, device=bitmask.device)
    out[:, :vocab_size] = allowed[:, :vocab_size]
    return out


def apply_token_bitmask_inplace_reference(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: Indices = None,
    vocab_size: Optional[int] = None,
) -> None:
    """Set disallowed logits to -inf, one ``masked_fill_`` per masked row (same contract as dispatch).

    Bitmask row ``i`` applies to logits row ``indices[i]`` (row ``i`` when ``indices`` is None).
    A row named twice gets both masks (their AND).
    """
    args = check_apply_args(logits, bitmask, indices, vocab_size)
    allowed = unpack_bitmask(args.bitmask, args.logits.shape[1], args.vocab_size)
    rows = range(args.num_rows) if args.rows is None else [int(r) for r in args.rows]
    for i, row in enumerate(rows):
        args.logits[row].masked_fill_(~allowed[i], float("-inf"))
