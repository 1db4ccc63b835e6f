"""Verification shapes for grammar drafts: ragged rows where the attention allows it, padded rows elsewhere.

Row ``i`` of a drafts step has ``L_i`` forced tokens (0 to k). Two ways to feed the target forward:

* **ragged** (``adaptive``): row ``i`` runs over ``1 + L_i`` positions. Cheapest, but it needs an
  attention that takes a query length per row. The project's CPU attention does; LMDeploy 0.18's CUDA
  paths do not: FA3's speculative decode unflattens the query as ``[batch, total // batch]`` and the
  Triton paged-decode kernel asserts ``total % batch == 0`` and treats every row as that length.
  LMDeploy's CUDA graphs are keyed by ``total // batch`` too.
* **padded** (``buckets`` / ``fixed``): every row runs over ``1 + K`` positions, ``K`` the same for
  all rows of the step: for ``fixed`` always ``k``; for ``buckets`` the smallest of a few widths
  (0, 1, 2, 4, ..., k) that holds the step's longest run, so at most ``log2(k) + 2`` query lengths
  ever reach the kernels and one CUDA graph per (batch size, width) covers every step. Positions past
  a row's run carry a filler token (the row's next token); their outputs are cut before anything
  reads them (``adaptive_drafts.cut_after``) and the KV they write lies past the row's accepted
  length, where the next step writes over it before any query can attend to it.

Which one runs is decided per step from the device of the step's tensors: ragged on the CPU path,
bucketed on CUDA, unless ``TOKENRAILS_GRAMMAR_DRAFTS_FIXED`` says otherwise (``0``: ragged;
``1``: padded to k every step; ``buckets``: bucketed). The tokens kept are the same in every mode:
verification reads only positions ``0..L_i`` of row ``i``.
"""
from __future__ import annotations

import os

import torch

ENV_SHAPE = "TOKENRAILS_GRAMMAR_DRAFTS_FIXED"
AUTO, RAGGED, BUCKETS, FIXED = "auto", "adaptive", "buckets", "fixed"
_VALUES = {"": AUTO, "auto": AUTO, "0": RAGGED, "adaptive": RAGGED, "1": FIXED, "fixed": FIXED,
           "buckets": BUCKETS}

__all__ = ["ENV_SHAPE", "AUTO", "RAGGED", "BUCKETS", "FIXED", "requested_mode", "mode_for", "widths",
           "bucket_width", "pad_rows"]


def requested_mode() -> str:
    """The mode asked for in the environment (read when an engine's step inputs are built)."""
    raw = (os.environ.get(ENV_SHAPE) or "").strip().lower()
    if raw not in _VALUES:
        raise ValueError(f"{ENV_SHAPE}={raw!r}: expected one of 0, 1, auto, adaptive, buckets, fixed")
    return _VALUES[raw]


def mode_for(requested: str, device: torch.device) -> str:
    """``auto`` resolved for a device: ragged only where the project's own attention runs (CPU)."""
    if requested != AUTO:
        return requested
    return RAGGED if device.type == "cpu" else BUCKETS


def widths(k: int) -> list[int]:
    """The draft widths a bucketed step may take: 0, 1, 2, 4, ... below k, and k."""
    out, w = [0], 1
    while w < k:
        out.append(w)
        w *= 2
    if k > 0:
        out.append(k)
    return out


def bucket_width(longest: int, k: int, mode: str) -> int:
    """The step's common draft width ``K`` for its longest forced run."""
    if mode == FIXED:
        return k
    for w in widths(k):
        if w >= longest:
            return w
    return max(k, longest)


def pad_rows(ids: torch.Tensor, seq_length: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed ragged rows (``[1, sum q_i]``, ``q_i <= 1 + width``) as ``[1, batch * (1 + width)]``:
    each row's real positions, then its first token (its next token) as filler."""
    flat = ids.reshape(-1)
    q = seq_length.to(flat.device)
    batch = q.numel()
    if batch and int(q.max()) > width + 1:
        raise ValueError(f"a row has {int(q.max())} positions, more than 1 + width = {width + 1}")
    starts = q.cumsum(0) - q
    pos = torch.arange(width + 1, device=flat.device)[None, :]
    src = starts[:, None] + torch.minimum(pos, (q - 1).clamp_min(0)[:, None])
    real = flat.index_select(0, src.reshape(-1)).reshape(batch, width + 1)
    first = flat.index_select(0, starts)[:, None].expand(batch, width + 1)
    out = torch.where(pos < q[:, None], real, first)
    return out.reshape(1, -1), torch.full_like(seq_length, width + 1)
