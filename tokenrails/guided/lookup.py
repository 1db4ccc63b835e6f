"""Prompt-lookup drafts: what followed the row's last tokens the last time they occurred.

Extraction and tool-argument outputs copy their values from the prompt, and a JSON output repeats
its own separators (``":`` after every key). ``LookupIndex`` keeps one sequence's tokens (its
prompt, then every accepted token) and, per n-gram order, the position right after the most
recent occurrence of each n-gram that has a follower, so a lookup is a dict read, not a scan:
the index grows by a few dict writes per accepted token and is rebuilt from the newer half when
it passes ``MAX_TOKENS`` (bounded memory; it lives and dies with the sequence's state).

``continue_run`` puts lookup tokens after a forced run (``forced_tokens(then=...)``, where the
matcher already stands at the run's end): each looked-up token while the grammar accepts it (the
first refused one ends the draft), a forced stretch met on the way taken by the forced rule, and
the matcher rolled back by exactly what was walked. Lookup tokens are only guesses: the verifier
fills and applies the grammar's mask at their positions and LMDeploy's rejection sampler decides,
so outputs do not change.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Collection, Sequence

import numpy as np
import torch

from .bitmask import allowed
from .forced import SeenMask, forced_tokens

if TYPE_CHECKING:
    from .backend import Matcher
    from .reasoning import ReasoningPhase

__all__ = ["LookupIndex", "MAX_TOKENS", "ORDERS", "continue_run"]

ORDERS = (3, 2, 1)  # n-gram lengths tried, longest first (a longer match predicts better)
MAX_TOKENS = 8192  # tokens an index keeps at most (prompt tail + output)
MAX_PROMPT = 4096  # prompt tokens indexed (its tail: the part nearest the output)
LONGER = 3  # longer tokens remembered per first byte


class LookupIndex:
    """One sequence's tokens and, for each n in ``ORDERS``, n-gram -> index of the token that
    followed its most recent occurrence (n-grams of one order are tuples; order 1 is the int).

    ``longer(tok)``: the last few distinct tokens (most recent first) that start with ``tok``'s
    bytes and are longer (the ``":`` the sequence wrote where a forced string ends at ``"``);
    one-byte ``tok`` only, which is where forced strings end (a quote, a bracket)."""

    __slots__ = ("tokens", "_maps", "synced", "_bytes", "_longer")

    def __init__(self, prompt: Sequence[int] = (), token_bytes: Sequence[bytes] | None = None) -> None:
        self.tokens: list[int] = []
        self._maps: dict[int, dict] = {n: {} for n in ORDERS}
        self._bytes = token_bytes
        self._longer: dict[int, list[int]] = {}  # first byte -> recent longer tokens starting with it
        self.synced = 0  # how many of the sequence's accepted tokens are in ``tokens``
        self._rebuild([int(t) for t in prompt[-MAX_PROMPT:]])

    def _rebuild(self, tokens: list[int]) -> None:
        """Index ``tokens`` at once: ``dict(zip(...))`` keeps the last occurrence of each key."""
        self.tokens = tokens
        t, size = tokens, len(tokens)
        tb = self._bytes
        if tb is not None:
            count = len(tb)
            self._longer = {}
            for x in t:
                if 0 <= x < count and len(tb[x]) > 1:
                    self._note_longer(tb[x][0], x)
        for n in ORDERS:
            if size <= n:
                self._maps[n] = {}
            elif n == 1:
                self._maps[n] = dict(zip(t[:-1], range(1, size)))
            else:
                self._maps[n] = dict(zip(zip(*(t[i:size - n + i] for i in range(n))), range(n, size)))

    def append(self, tok: int) -> None:
        """One more token of the sequence: the n-grams ending just before it now have a follower."""
        t = self.tokens
        size = len(t)
        t.append(int(tok))
        maps = self._maps
        tb = self._bytes
        if tb is not None and 0 <= tok < len(tb) and len(tb[tok]) > 1:
            self._note_longer(tb[tok][0], int(tok))
        for n in ORDERS:
            if size >= n:
                maps[n][t[size - 1] if n == 1 else tuple(t[size - n:size])] = size
        if size + 1 > MAX_TOKENS:
            self._rebuild(t[-(MAX_TOKENS // 2):])

    def extend(self, toks: Sequence[int]) -> None:
        for tok in toks:
            self.append(tok)

    def sync(self, history: Sequence[int]) -> None:
        """Catch up with the sequence's accepted tokens (``history``, only ever appended to; a
        roll-back, which jump-forward may do, re-indexes from what is left)."""
        if len(history) < self.synced:
            kept = len(self.tokens) - (self.synced - len(history))
            self._rebuild(self.tokens[:max(kept, 0)])
            self.synced = len(history)
        if len(history) > self.synced:
            self.extend(history[self.synced:])
            self.synced = len(history)

    def _note_longer(self, first: int, tok: int) -> None:
        recent = self._longer.get(first)
        if recent is None:
            self._longer[first] = [tok]
        elif recent[0] != tok:
            if tok in recent:
                recent.remove(tok)
            recent.insert(0, tok)
            del recent[LONGER:]

    def longer(self, tok: int) -> Sequence[int]:
        tb = self._bytes
        if tb is None or not 0 <= tok < len(tb) or len(tb[tok]) != 1:
            return ()
        return self._longer.get(tb[tok][0], ())

    def follow(self, tail: Sequence[int], max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` tokens that followed the most recent occurrence of ``tail``'s last
        n tokens (n from ``ORDERS``, longest first); empty when none occurred."""
        if max_tokens <= 0 or not tail:
            return []
        maps = self._maps
        if tail[-1] not in maps[1]:
            return []  # the last token never had a follower: no longer n-gram ending in it did either
        key = tuple(tail[-ORDERS[0]:])
        for n in ORDERS:
            if len(key) >= n:
                at = maps[n].get(key[-1] if n == 1 else key[-n:] if n < len(key) else key)
                if at is not None:
                    return self.tokens[at:at + max_tokens]
        return []


def continue_run(matcher: "Matcher | ReasoningPhase", out: list[int], masks: list[SeenMask], *, index: LookupIndex,
                 max_tokens: int, encode: Callable[[str], Sequence[int]] | None = None,
                 stop_ids: Collection[int] = (), bitmask: torch.Tensor | None = None,
                 lead: Sequence[int] = ()) -> None:
    """Continue the drafted run ``out`` (walked on ``matcher``; ``masks``: one entry per position up
    to its end) with lookup tokens, up to ``max_tokens`` in all: appended to ``out`` (walked too, the
    caller rolls everything back) with None in ``masks`` (the verifier fills those positions).

    A run ending in a forced string's last token that a longer allowed token extends (a key's
    closing ``"``, which the model writes as ``":``) takes the lookup's token there instead when
    the lookup names such a token. A forced stretch after looked-up tokens is taken by the forced
    rule, with the masks it saw. No matcher work at all when the lookup names nothing.

    ``lead``: tokens the matcher stands after that the index has not seen yet (a guess made ahead
    assumes the drafts being verified and a bonus); the lookup reads them as the sequence's end."""
    n = len(out)
    if n >= max_tokens:
        return
    tail = index.tokens[-ORDERS[0]:] + list(lead[-ORDERS[0]:]) if lead else index.tokens[-ORDERS[0]:]
    swap = n and not isinstance(masks[n - 1], int)  # the run ends inside a forced string
    guess = index.follow(tail + out if out else tail, max_tokens - n)
    if not guess and not swap:
        return  # the lookup names nothing: no matcher call
    if matcher.is_terminated():
        return
    eos = matcher.vocab.eos_ids
    if swap and _extend_last(matcher, index, tail, out, masks, eos, stop_ids, matcher.vocab.token_bytes):
        if len(out) >= max_tokens or matcher.is_terminated():
            return
        guess = index.follow(tail + out, max_tokens - len(out))
    seen = masks[len(out)] if guess else None
    if isinstance(seen, np.ndarray) and not (0 <= guess[0] < seen.shape[0] * 32 and allowed(seen, guess[0])):
        return  # the mask the forced rule filled here refuses it: no matcher call
    while guess:
        took = 0
        for tok in guess:
            if tok in eos or tok in stop_ids or not matcher.accept_token(tok):
                break
            out.append(tok)
            masks.append(None)
            took += 1
        if took < len(guess) or len(out) >= max_tokens or matcher.is_terminated():
            return  # refused: the draft ends here
        more = forced_tokens(matcher, max_tokens - len(out), encode=encode, stop_ids=stop_ids, bitmask=bitmask)
        if more.tokens:
            masks[-1] = more.masks[0] if more.masks else None
            for j, tok in enumerate(more.tokens):
                if not matcher.accept_token(tok):
                    return
                out.append(tok)
                masks.append(more.masks[j + 1] if j + 1 < len(more.masks) else None)
        # else: the looked-up stretch ended at the history's end: look up again from here
        guess = index.follow(tail + out, max_tokens - len(out))


def _extend_last(matcher: "Matcher | ReasoningPhase", index: LookupIndex, tail: list[int], out: list[int],
                 masks: list[SeenMask], eos: Collection[int], stop_ids: Collection[int],
                 token_bytes: Sequence[bytes]) -> bool:
    """Swap the run's last token (the matcher stands after it) for the lookup's token at that
    position when that token is longer, starts with the same bytes and the grammar accepts it
    (True: swapped); the matcher stands after whichever token ends ``out``."""
    last = out[-1]
    lead = token_bytes[last]
    if len(lead) != 1:  # forced strings end at one-byte tokens where the model writes a longer one
        return False
    guess = index.follow(tail + out[:-1], 1)
    picks = [t for t in guess if 0 <= t < len(token_bytes) and len(token_bytes[t]) > 1
             and token_bytes[t].startswith(lead)]
    picks += [t for t in index.longer(last) if t not in picks]
    picks = [t for t in picks if t != last and t not in eos and t not in stop_ids]
    if not picks:
        return False
    matcher.rollback(1)
    for tok in picks:
        if matcher.accept_token(tok):
            out[-1] = tok
            masks[len(out)] = None  # the mask after the new token is not the one the run saw
            return True
    if not matcher.accept_token(last):  # back where the run ended (always accepted again)
        raise RuntimeError("the matcher refused a forced token it had just accepted")
    return False
