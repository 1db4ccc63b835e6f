"""The token bitmask: its layout, and the one reusable buffer every guided step fills and applies.

Layout (xgrammar's, so masks interoperate): int32 ``[rows, words(V)]`` with ``words(V) =
ceil(V / 32)``; token ``t`` is allowed iff bit ``t % 32`` of word ``t // 32`` is set. Helpers here
are the only spelling of that rule in the core (the step, speculative rows, the reasoning rows and
the LMDeploy speculative patch all use them).

``MaskBuffer`` is the step's memory: a host mask that grows by doubling (pinned when the logits
live on a GPU), a compact index (mask row ``j`` masks logits row ``index[j]``), one device copy
per device, and ``apply`` = copy-to-device + one kernel call. Steady state allocates nothing.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..kernels import apply_token_bitmask_inplace
from ..kernels._common import eos_only_row

__all__ = ["MaskBuffer", "allowed", "bit_value", "empty_rows", "eos_only_row", "set_only", "words_for"]


def words_for(vocab_size: int) -> int:
    """int32 words per mask row for a vocabulary (logits width) of ``vocab_size``."""
    return (int(vocab_size) + 31) // 32


def bit_value(i: int) -> int:
    """The int32 value with only bit ``i`` (0..31) set (bit 31 is the sign bit)."""
    return -(1 << 31) if i == 31 else 1 << i


def allowed(row: torch.Tensor, token_id: int) -> bool:
    """Whether ``token_id`` is allowed by one mask row."""
    return bool((int(row[token_id // 32]) >> (token_id % 32)) & 1)


def set_only(row: torch.Tensor, token_id: int) -> None:
    """Write a row that allows exactly ``token_id``."""
    row.zero_()
    row[token_id // 32] = bit_value(token_id % 32)


def empty_rows(bitmask: torch.Tensor) -> list[int]:
    """Indices of host rows that allow no token at all (one vectorized pass over the words)."""
    words = bitmask.numpy()
    if words.shape[1] % 2 == 0 and words.flags.c_contiguous:
        return np.flatnonzero(words.view(np.uint64).max(axis=1) == 0).tolist()
    return np.flatnonzero(~words.any(axis=1)).tolist()


class MaskBuffer:
    """The persistent host/pinned/device mask and compact index of one vocabulary width."""

    def __init__(self, vocab_size: int, device: str | torch.device | None = None):
        self.vocab_size = int(vocab_size)
        self.words = words_for(vocab_size)
        self._host = torch.empty((0, self.words), dtype=torch.int32)
        self._index = torch.empty(0, dtype=torch.int32)
        self._dev: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        if device is not None:
            self.ensure(1, torch.device(device))

    def ensure(self, rows: int, device: torch.device | None = None) -> None:
        """Grow (doubling) so ``rows`` fit on the host and, for a non-CPU ``device``, there."""
        if self._host.shape[0] < rows:
            cap = max(rows, 2 * self._host.shape[0], 8)
            pin = device is not None and device.type == "cuda"
            self._host = torch.empty((cap, self.words), dtype=torch.int32, pin_memory=pin)
            self._index = torch.empty(cap, dtype=torch.int32, pin_memory=pin)
        if device is not None and device.type != "cpu":
            cur = self._dev.get(device)
            if cur is None or cur[0].shape[0] < self._host.shape[0]:
                cap = self._host.shape[0]
                self._dev[device] = (torch.empty((cap, self.words), dtype=torch.int32, device=device),
                                     torch.empty(cap, dtype=torch.int32, device=device))

    def rows(self, k: int, device: torch.device | None = None) -> torch.Tensor:
        """The first ``k`` host rows (contents undefined: every row is written by a fill)."""
        self.ensure(k, device)
        return self._host[:k]

    @property
    def host(self) -> torch.Tensor:
        return self._host

    def to_device(self, bitmask: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``bitmask`` (host rows) on ``device``: itself when already there (the CPU), else an
        async copy into the buffer's device rows."""
        if bitmask.device == device or device.type == "cpu":
            return bitmask
        k = bitmask.shape[0]
        self.ensure(k, device)
        dev = self._dev[device][0][:k]
        dev.copy_(bitmask, non_blocking=True)
        return dev

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor, index: Sequence[int] | None,
              vocab_size: int | None = None) -> None:
        """Mask ``logits`` in place with one kernel call: row ``index[j]`` gets mask row ``j``
        (``index`` None: row ``j`` gets row ``j``). Columns ≥ ``vocab_size`` (default: the
        buffer's vocabulary) are never allowed."""
        k = bitmask.shape[0]
        if not k:
            return
        device = logits.device
        self.ensure(k, device)
        dev_index = None
        if index is not None:
            host_index = self._index[:k]
            host_index.numpy()[:] = index
            if device.type == "cpu":
                dev_index = host_index
            else:
                dev_index = self._dev[device][1][:k]
                dev_index.copy_(host_index, non_blocking=True)
        apply_token_bitmask_inplace(logits, self.to_device(bitmask, device), indices=dev_index,
                                    vocab_size=self.vocab_size if vocab_size is None else vocab_size)
