"""The grammar proposer beside the forward: next step's forced runs guessed on a worker thread.

A row whose forced run filled all ``k`` drafts stands, once they are verified, where the grammar
still forces text: the bonus token the verification samples after them is the forced one, and the
next run starts after it. That run depends only on tokens the grammar fixes, so it is computed
while the forward that verifies the drafts runs (``start``, right after the proposal), on a worker
thread, with the matcher walked tentatively and rolled back under the manager's step lock. After
acceptance the proposer takes the guesses (``take``) and uses a row's guess only when the row
accepted exactly the drafts and that bonus since the guess (``GuidedDecodingManager.guessed_run``);
any other row (a draft rejected, another bonus, a run shorter than ``k``: the bonus was the model's
choice) is proposed inline. The guess is the very run ``forced_tokens`` gives from that
state, so outputs do not change. ``TOKENRAILS_DRAFTS_AHEAD=0`` proposes inline only.

``STATS`` keeps the proposer's own time per step, split into what the step waits for (the inline
part and any wait for the worker) and what the worker did beside the forward.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence

import torch
from ...._env import env_switch

logger = logging.getLogger(__name__)

ENV_AHEAD = "TOKENRAILS_DRAFTS_AHEAD"

__all__ = ["ENV_AHEAD", "Ahead", "ProposerStats", "STATS", "enabled"]

Guess = tuple  # (version, expected tokens, ForcedRun), from GuidedDecodingManager.forced_after


def enabled() -> bool:
    return env_switch(ENV_AHEAD, True)


@dataclass
class ProposerStats:
    """``critical_s``: proposal time the step waited for (inline proposal + wait for the worker);
    ``ahead_s``: the worker's time beside the forward; ``guessed`` / ``inline``: rows whose drafts
    came from a guess / were proposed inline; ``missed``: guesses not used (the row went elsewhere)."""

    steps: int = 0
    critical_s: float = 0.0
    ahead_s: float = 0.0
    wait_s: float = 0.0
    guessed: int = 0
    inline: int = 0
    missed: int = 0

    def reset(self) -> None:
        self.steps, self.critical_s, self.ahead_s, self.wait_s = 0, 0.0, 0.0, 0.0
        self.guessed = self.inline = self.missed = 0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


STATS = ProposerStats()
_STATS_LOCK = threading.Lock()


def record(critical_s: float, wait_s: float, guessed: int, inline: int, missed: int) -> None:
    with _STATS_LOCK:
        STATS.steps += 1
        STATS.critical_s += critical_s
        STATS.wait_s += wait_s
        STATS.guessed += guessed
        STATS.inline += inline
        STATS.missed += missed


class Ahead:
    """One proposer's worker: at most one batch of guesses in flight."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._future: Future | None = None

    def start(self, core: Any, rows: Sequence[tuple[Hashable, Any, Sequence[int]]], k: int,
              encode: Callable[[str], list[int]] | None) -> None:
        """Guess the next runs of ``rows`` ((key, row, the drafts being verified)) on the worker."""
        if not rows:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="tokenrails-drafts-ahead")
        self._future = self._pool.submit(_guess_all, core, list(rows), k, encode)

    def take(self) -> tuple[dict[Hashable, Guess], float]:
        """The guesses of the last ``start`` (joined) and how long the caller waited for them."""
        fut, self._future = self._future, None
        if fut is None:
            return {}, 0.0
        t0 = time.perf_counter()
        try:
            guesses = fut.result()
        except Exception:  # noqa: BLE001 - a failed guess only means the rows are proposed inline
            logger.debug("tokenrails: grammar-draft guesses failed", exc_info=True)
            guesses = {}
        return guesses, time.perf_counter() - t0

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _guess_all(core: Any, rows: list[tuple[Hashable, Any, Sequence[int]]], k: int,
               encode: Callable[[str], list[int]] | None) -> dict[Hashable, Guess]:
    t0 = time.perf_counter()
    words = (core.vocab.vocab_size + 31) // 32
    buf = torch.empty((1, words), dtype=torch.int32)
    out: dict[Hashable, Guess] = {}
    for key, row, walk in rows:
        try:
            guess = core.forced_after(row, walk, k, encode=encode, bitmask=buf)
        except Exception:  # noqa: BLE001 - the row is proposed inline next step, which reports a failure
            logger.debug("tokenrails: grammar-draft guess failed for a row", exc_info=True)
            continue
        if guess is not None:
            out[key] = guess
    with _STATS_LOCK:
        STATS.ahead_s += time.perf_counter() - t0
    return out
