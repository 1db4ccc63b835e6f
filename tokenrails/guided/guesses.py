"""Drafts guessed ahead: what a speculative proposer would draft after tokens not yet accepted.

A proposer beside the forward (LMDeploy's ``draft_ahead``) knows the drafts being verified but not
which the verification keeps nor the bonus token it samples after them. ``guesses_after`` assumes
the likely outcome (every draft kept) and, per likely bonus, computes the drafts the proposer would
make from there: the token the grammar forces after the drafts; else each token of a mask that
allows at most ``BONUS_CANDIDATES`` (a ``,`` or ``}`` after a value), and the token the row's lookup
index names. ``guess_for`` hands a guess out only when the row then accepted exactly what it
assumed, so its forced run is the one ``forced_tokens`` gives there; its lookup tokens were looked up
as the index stood before the drafts (drafts only: the verifier decides).

The row's matcher is walked tentatively and rolled back; the mask read at the bonus position is the
grammar's own, never the row's ``fill`` (a guess must not end the row: a ``max_tokens`` budget
would count the guessed tokens).
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import numpy as np
import torch

from .bitmask import allowed, words_for
from .forced import ForcedRun, forced_tokens
from .lookup import ORDERS, LookupIndex, continue_run
from .sequence import Lookahead, SequenceState

__all__ = ["BONUS_CANDIDATES", "Guess", "guess_for", "guesses_after"]

BONUS_CANDIDATES = 4  # a bonus position allowing at most this many tokens is guessed for each
# (the state's (tokens, len(history)) once ``expected`` is accepted, expected, the drafts from there)
Guess = tuple[tuple[int, int], tuple[int, ...], ForcedRun]


def guesses_after(st: SequenceState, walk: Sequence[int], max_tokens: int, *, index: LookupIndex | None,
                  encode: Callable[[str], Sequence[int]] | None = None,
                  bitmask: torch.Tensor | None = None, candidates: int = BONUS_CANDIDATES) -> list[Guess]:
    """One guess per likely bonus after ``walk`` (see the module); ``index``: the row's lookup index
    (synced), None for forced runs only; ``bitmask``: a reusable ``(1, words)`` host row, as
    ``forced_tokens`` takes it. State unchanged; a walk the grammar refuses, an ended row or no
    candidate: no guesses."""
    look = Lookahead(st)
    try:
        if not all(look.advance(int(t)) for t in walk) or not st.answering or look.terminated():
            return []
        lead = [int(t) for t in walk]
        guesses: list[Guess] = []
        for bonus in _bonus_candidates(st, index, lead, encode, bitmask, candidates):
            if not look.advance(bonus):
                continue
            matcher = st.resolve() if st.answering else None
            if matcher is not None:
                then = None if index is None else functools.partial(
                    continue_run, index=index, lead=lead + [bonus], max_tokens=max_tokens, encode=encode,
                    bitmask=bitmask)
                run = forced_tokens(matcher, max_tokens, encode=encode, bitmask=bitmask, then=then)
                expected = (*lead, bonus)
                guesses.append(((st.tokens + len(expected), len(st.history) + len(expected)), expected, run))
            look.back()
        return guesses
    finally:
        look.restore()


def guess_for(st: SequenceState, guesses: Sequence[Guess]) -> ForcedRun | None:
    """The drafts of the guess whose assumption the row accepted exactly since it was made; None
    when the row went elsewhere (a draft rejected, a bonus not guessed)."""
    now = (st.tokens, len(st.history))
    for version, expected, run in guesses:
        n = len(expected)
        if now == tuple(version) and n and list(st.history[-n:]) == list(expected):
            return run
    return None


def _bonus_candidates(st: SequenceState, index: LookupIndex | None, lead: list[int],
                      encode: Callable[[str], Sequence[int]] | None, bitmask: torch.Tensor | None,
                      candidates: int) -> list[int]:
    """The bonus tokens guessed for, where the row's matcher stands (after the walk)."""
    matcher = st.resolve()
    if matcher is None:
        return []
    forced = forced_tokens(matcher, 1, encode=encode, bitmask=bitmask)
    if forced.tokens:
        return [forced.tokens[0]]
    words = words_for(matcher.vocab.vocab_size)
    usable = bitmask is not None and bitmask.is_cpu and bitmask.dim() == 2 and bitmask.shape[1] == words
    buf = bitmask if usable else torch.empty((1, words), dtype=torch.int32)  # read here, before any reuse
    constrained = matcher.fill_next_token_bitmask(buf, 0)  # False: every token allowed
    row = buf[0].numpy()
    stops = matcher.vocab.eos_ids
    picks: list[int] = []
    if index is not None:
        picks = [t for t in index.follow(index.tokens[-ORDERS[0]:] + lead, 1) if t not in stops
                 and (not constrained or (0 <= t < words * 32 and allowed(row, t)))]
    hot = np.flatnonzero(row) if constrained else ()
    if 0 < len(hot) <= candidates:
        ids = [int(w) * 32 + b for w in hot for b in range(32) if (int(row[w]) >> b) & 1]
        if len(ids) <= candidates:
            picks += [t for t in ids if t not in stops and t not in picks]
    return picks
