"""The grammar proposer beside the forward: next step's drafts guessed on a worker thread.

The proposal for step t+1 needs the tokens step t accepts: the drafts being verified and the bonus
token the verification samples after them. Right after proposing (``start``), a worker thread
guesses, for every proposed row, while the verifying forward runs: as if the row accepts all its
drafts, then a bonus, the drafts the proposer would make from there (forced run, then lookup
tokens), one guess per likely bonus: the token the grammar forces after the drafts; else each of
the few tokens the mask there allows (a ``,`` or a ``}`` after a value) and the token the lookup
names (``GuidedDecodingManager.forced_after``; the matcher walked tentatively and rolled back
under the manager's step lock). After acceptance the proposer takes the guesses (``take``: the
worker stops at the row it is on) and uses a row's guess only when the row accepted exactly the
drafts and that bonus since (``GuidedDecodingManager.guessed_run``); any other row (a draft
rejected, a bonus not guessed) is proposed inline. A guess's forced run is the run
``forced_tokens`` gives from that state; its lookup tokens are looked up as the index stood before
the drafts (drafts only: the verifier decides, so outputs do not change).
``TOKENRAILS_DRAFTS_AHEAD=0`` proposes inline only.

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
ENV_PREFILL = "TOKENRAILS_SPEC_PREFILL"

__all__ = ["ENV_AHEAD", "ENV_PREFILL", "Ahead", "ProposerStats", "STATS", "enabled", "prefill_enabled"]

Guess = tuple  # (version, expected tokens, ForcedRun): GuidedDecodingManager.forced_after's guesses


def enabled() -> bool:
    return env_switch(ENV_AHEAD, True)


def prefill_enabled() -> bool:
    """Fill the next verification's masks beside the forward (``TOKENRAILS_SPEC_PREFILL``): on by
    default where a GPU computes the forward and the host would idle; off on the CPU path, where
    the worker competes with the forward for the cores and the GIL (the plain step's overlap
    measured that, ``step/overlap.py``)."""
    return env_switch(ENV_PREFILL, torch.cuda.is_available())


@dataclass
class ProposerStats:
    """``critical_s``: proposal time the step waited for (inline proposal + wait for the worker);
    ``ahead_s``: the worker's time beside the forward; ``guessed`` / ``inline``: rows whose drafts
    came from a guess / were proposed inline; ``missed``: guesses not used (the row went elsewhere);
    ``prefilled`` / ``refilled``: verification steps whose masks were filled beside the forward and
    used / found stale and filled again."""

    steps: int = 0
    critical_s: float = 0.0
    ahead_s: float = 0.0
    wait_s: float = 0.0
    guessed: int = 0
    inline: int = 0
    missed: int = 0
    prefilled: int = 0
    refilled: int = 0

    def reset(self) -> None:
        self.steps, self.critical_s, self.ahead_s, self.wait_s = 0, 0.0, 0.0, 0.0
        self.guessed = self.inline = self.missed = self.prefilled = self.refilled = 0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


STATS = ProposerStats()
_STATS_LOCK = threading.Lock()


def record_prefill(used: bool) -> None:
    with _STATS_LOCK:
        if used:
            STATS.prefilled += 1
        else:
            STATS.refilled += 1


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
        self._stop = threading.Event()
        self.lookup = False  # the lookup setting the guesses in flight were made under

    def start(self, core: Any, rows: Sequence[tuple[Hashable, Any, Sequence[int]]], k: int,
              encode: Callable[[str], list[int]] | None, lookup: bool = False) -> None:
        """Guess the next drafts of ``rows`` ((key, row, the drafts being verified)) on the worker."""
        if not rows:
            return
        self._stop = threading.Event()
        self.lookup = lookup
        self._future = self.submit(_guess_all, core, list(rows), k, encode, lookup, self._stop)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn`` on the worker before the next guesses (one thread: in submission order)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="tokenrails-drafts-ahead")
        return self._pool.submit(fn, *args)

    def take(self) -> tuple[dict[Hashable, list[Guess]], float]:
        """The guesses of the last ``start`` (the worker stops after its current row) and how long
        the caller waited for them."""
        fut, self._future = self._future, None
        if fut is None:
            return {}, 0.0
        t0 = time.perf_counter()
        self._stop.set()
        try:
            guesses = fut.result()
        except Exception:  # noqa: BLE001 - a failed guess only means the rows are proposed inline
            logger.debug("tokenrails: grammar-draft guesses failed", exc_info=True)
            guesses = {}
        return guesses, time.perf_counter() - t0

    def close(self) -> None:
        self._stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _guess_all(core: Any, rows: list[tuple[Hashable, Any, Sequence[int]]], k: int,
               encode: Callable[[str], list[int]] | None, lookup: bool, stop: threading.Event
               ) -> dict[Hashable, list[Guess]]:
    t0 = time.perf_counter()
    words = (core.vocab.vocab_size + 31) // 32
    buf = torch.empty((1, words), dtype=torch.int32)
    out: dict[Hashable, list[Guess]] = {}
    for key, row, walk in rows:
        if stop.is_set():
            break  # the step needs its proposal now: the rest are proposed inline
        try:
            guesses = core.forced_after(row, walk, k, encode=encode, bitmask=buf, lookup=lookup)
        except Exception:  # noqa: BLE001 - the row is proposed inline next step, which reports a failure
            logger.debug("tokenrails: grammar-draft guess failed for a row", exc_info=True)
            continue
        if guesses:
            out[key] = guesses
    with _STATS_LOCK:
        STATS.ahead_s += time.perf_counter() - t0
    return out
