"""The forced-token rule: which tokens the grammar fixes from a matcher's current state (peek only).

A grammar forces the next token in two ways:

* **one token**: the mask allows exactly one token (a closing brace after the last field, the
  only marker token that can follow);
* **a forced string**: every valid continuation starts with the same text (``"name": `` after
  ``{``) although the mask allows several tokens (``"``, ``"n``, ``"name`` ...). The string is
  taken in its canonical tokenization (``encode``, the model's tokenizer) and kept only as far as
  the grammar accepts it token by token.

A backend that names a whole run of one-token masks in one call (``Matcher.forced_token_ids``:
llguidance forces forced text as its canonical tokens, ``compute_ff_tokens``, about 2 us against
16 us per fill) gives those tokens without any fill; the rule asks it at every position a run
reaches, and the rest of the rule takes over where it names none.

A mask fill costs far more than the forced-string query, so the rule asks the backend first
(``jump_forward_probe``) and fills only where the answer needs the mask. No byte forced next
(most positions): the grammar allows two or more next bytes, and in a vocabulary holding a
one-byte token for each of them that is two or more tokens, no one-token mask. A forced string
whose tokenization starts with a token longer than a byte, over a backend whose mask allows every
token the string's bytes admit: that token and the string's first byte are both allowed, so the
string is taken without a fill. Bytes a vocabulary may lack (``_OPTIONAL_BYTES``) could leave one
token allowed where the grammar offers two bytes; the rule then misses that token (a shorter run,
never a wrong one). A vocabulary lacking any other byte fills every position.

The rule repeats from the state it reaches until ``max_tokens`` tokens, a choice, a stop token
or the end of the grammar. The matcher is advanced tentatively and rolled back by exactly what
was accepted, so it ends where it started. This is the one place that decides the forced
continuation: a speculative proposer (the LMDeploy grammar drafts) drafts these tokens (the target
model verifies them: greedy or sampled output is unchanged); ``jump_forward.compute_jump_forward``
takes the run's text and does its own, different job on it: retokenizing it together with the
sequence's last tokens (rollback) and leaving the last token to the model.
Stop tokens (EOS) are never returned: ending a request is left to a real decoding step.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Collection, Sequence, Union

import numpy as np
import torch

from .backend import Matcher

if TYPE_CHECKING:
    from .reasoning import ReasoningPhase
    from .vocabulary import Vocabulary

__all__ = ["ForcedRun", "forced_tokens", "single_allowed_token"]

Encode = Callable[[str], Sequence[int]]


# a mask the rule saw at one position: the one token it allowed, or a copy of the (host) row
SeenMask = Union[int, np.ndarray, None]


@dataclass(frozen=True)
class ForcedRun:
    """``tokens``: the forced tokens, in order. ``single``: how many came from a one-token mask;
    the rest came from forced strings' tokenizations (acceptance depends on the model there).

    ``masks[j]``: the mask at position ``j`` (after ``tokens[:j]``, ``j <= len(tokens)``) as the
    rule filled it, so a verifier of these tokens need not fill it again: the token id where it
    allowed that one token, a copy of the row where it allowed several (where a forced string
    starts, where a run ends at a filled choice), None where it did not fill (inside a forced
    string; where nothing was forced and no mask was needed to know it; past the last entry when
    the run stopped at ``max_tokens`` or the grammar's end)."""

    tokens: tuple[int, ...] = ()
    single: int = 0
    masks: tuple[SeenMask, ...] = field(default=(), compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.tokens)


NOTHING = ForcedRun()

# Bytes whose one-byte token a vocabulary may lack (SmolLM2's does): ASCII controls other than tab,
# newline and carriage return, bytes UTF-8 never uses, lead bytes of the unassigned planes 4-11.
_OPTIONAL_BYTES = frozenset([*range(0x20), 0x7F, 0xC0, 0xC1, 0xF1, 0xF2, *range(0xF5, 0x100)]) - {9, 10, 13}
_BYTE_TOKENS = "forced:byte_tokens"  # the vocabulary's memo keys
_STOPS = "forced:stops"


def _byte_tokens(vocab: "Vocabulary") -> tuple[frozenset[int], bool]:
    """The bytes that are a (non-special) token of their own, and whether every byte outside
    ``_OPTIONAL_BYTES`` is one."""

    def build() -> tuple[frozenset[int], bool]:
        special = vocab.special_ids
        singles = frozenset(b[0] for i, b in enumerate(vocab.token_bytes) if len(b) == 1 and i not in special)
        return singles, all(b in singles for b in range(256) if b not in _OPTIONAL_BYTES)

    known = vocab.backend_cache.get(_BYTE_TOKENS)  # read without the memo's lock: asked per row and step
    return known if known is not None else vocab.cached(_BYTE_TOKENS, build)


def _two_allowed(vocab: "Vocabulary", byte_tokens: frozenset[int], text: str, toks: Sequence[int]) -> bool:
    """Whether the mask before forced ``text`` certainly allows two tokens: the first token of its
    tokenization, when longer than one byte and a prefix of the text, and its first byte's token."""
    if not toks:
        return False
    first = int(toks[0])
    if first in vocab.special_ids or not 0 <= first < vocab.num_tokens:
        return False
    data = vocab.token_bytes[first]
    return len(data) > 1 and text.encode().startswith(data) and data[0] in byte_tokens


_VIEWS: dict[int, tuple["weakref.ref[torch.Tensor]", np.ndarray]] = {}


def _host_row(bitmask: torch.Tensor, words: int) -> np.ndarray:
    """Row 0 of a host buffer as numpy, memoised per buffer (callers pass the same buffer every
    step, and slicing a tensor costs more than the fill it serves); a few buffers at most."""
    known = _VIEWS.get(id(bitmask))
    if known is not None and known[0]() is bitmask and known[1].shape[0] == words:
        return known[1]
    view = bitmask[0, :words].numpy()
    if len(_VIEWS) >= 64:
        _VIEWS.clear()
    _VIEWS[id(bitmask)] = (weakref.ref(bitmask), view)
    return view


def _stop_set(vocab: "Vocabulary", stop_ids: Collection[int]) -> frozenset[int]:
    """EOS and ``stop_ids``; the vocabulary's own set when there are no others (asked per row and step)."""
    eos = vocab.backend_cache.get(_STOPS)
    if eos is None:
        eos = vocab.cached(_STOPS, lambda: frozenset(int(t) for t in vocab.eos_ids))
    return eos.union(int(t) for t in stop_ids) if stop_ids else eos


def single_allowed_token(row: torch.Tensor | np.ndarray, vocab_size: int) -> int | None:
    """The one token id whose bit is set in the int32 bitmask ``row`` (None: zero or several).
    A CPU row is read through numpy, whose word count is far cheaper than ``torch.nonzero``:
    the proposer asks this wherever it filled a mask."""
    words = (vocab_size + 31) // 32
    if isinstance(row, torch.Tensor):
        if not row.is_cpu:
            row = row.cpu()
        row = row[:words].numpy()
    r = row[:words]
    if np.count_nonzero(r) != 1:
        return None
    word_index = int(r.view(np.uint32).argmax())  # the one non-zero word is the largest unsigned one
    word = int(r[word_index]) & 0xFFFFFFFF
    if word & (word - 1):
        return None  # several bits in the one word
    tok = word_index * 32 + word.bit_length() - 1
    return tok if tok < vocab_size else None


def forced_tokens(
    matcher: "Matcher | ReasoningPhase",
    max_tokens: int,
    *,
    encode: Encode | None = None,
    stop_ids: Collection[int] = (),
    bitmask: torch.Tensor | None = None,
    then: Callable[[Matcher, list[int], list[SeenMask]], None] | None = None,
) -> ForcedRun:
    """The tokens the grammar forces from ``matcher``'s state, at most ``max_tokens``; state unchanged.

    ``encode`` (text -> token ids, no special tokens) enables forced strings; without it only
    one-token masks count. ``bitmask`` is an optional reusable ``(1, words)`` int32 buffer.
    ``then(matcher, tokens, masks)``: continues the run where it ended (the matcher stands after it,
    ``masks`` has one entry per position up to there); what it appends and walks is rolled back
    with the run (``lookup.continue_run``: the lookup drafts).
    """
    if max_tokens <= 0 or matcher.is_terminated():
        return NOTHING
    vocab = matcher.vocab
    byte_tokens, probe = _byte_tokens(vocab)  # without every byte a token: fill everywhere
    text = matcher.jump_forward_probe() if probe else None
    if text == "":  # the common case, before any set-up: two or more next bytes, no fill
        return NOTHING if then is None else _continued(matcher, then, [], [None], 0)
    vocab_size = vocab.vocab_size
    words = (vocab_size + 31) // 32
    if bitmask is None or bitmask.dim() != 2 or bitmask.shape[1] < words:
        bitmask = torch.empty((1, words), dtype=torch.int32)
    on_host = bitmask.is_cpu
    stops = _stop_set(vocab, stop_ids)
    row: np.ndarray | torch.Tensor | None = None  # the buffer's view, made at the first fill (most runs fill none)
    out: list[int] = []
    masks: list[SeenMask] = []
    single = 0
    asked = 0  # the position ``text`` answers for
    chains = True  # until the backend says it cannot name its one-token runs
    try:
        while len(out) < max_tokens and not matcher.is_terminated():
            if chains:  # one native call for a whole run of one-token masks, no fill
                ids = matcher.forced_token_ids(max_tokens - len(out))
                chains = ids is not None
                if ids:
                    n = len(out)
                    for t in ids:
                        t = int(t)
                        if t in stops or not matcher.accept_token(t):
                            break
                        out.append(t)
                        masks.append(t)
                    single += len(out) - n
                    if len(out) - n < len(ids) or len(out) >= max_tokens or matcher.is_terminated():
                        break
            if len(out) != asked:  # the first position's answer is above
                asked = len(out)
                text = matcher.jump_forward_probe() if probe else None
                if text == "":  # two or more next bytes, each a token: nothing forced, no fill (the
                    # verifier's own walk filling it measured no dearer than a fill here)
                    masks.append(None)
                    break
            toks = encode(text) if text and encode is not None else None
            if toks is not None and _two_allowed(vocab, byte_tokens, text, toks):
                masks.append(None)  # no one-token mask here: the string is taken without a fill
            else:
                constrained = matcher.fill_next_token_bitmask(bitmask, 0)
                if row is None:
                    row = _host_row(bitmask, words) if on_host else bitmask[0]
                tok = single_allowed_token(row, vocab_size) if constrained else None
                if tok is not None:
                    if tok in stops:
                        masks.append(tok)
                        break
                    if not matcher.accept_token(tok):
                        break
                    out.append(tok)
                    masks.append(tok)
                    single += 1
                    continue
                # several tokens allowed: kept for a verifier (not an empty row, which it must refuse itself)
                masks.append(row.copy() if constrained and on_host and row.any() else None)
                if encode is None:
                    break
                if text is None:
                    text = matcher.find_jump_forward_string()
                if not text:
                    break
                if toks is None:
                    toks = encode(text)
            taken = 0
            for t in toks:
                t = int(t)
                if len(out) >= max_tokens or t in stops or not matcher.accept_token(t):
                    break
                out.append(t)
                if taken:
                    masks.append(None)  # inside the string: this position's mask was not filled
                taken += 1
            if taken == 0:
                break
    except BaseException:
        if out:
            matcher.rollback(len(out))
        raise
    if then is not None and len(out) < max_tokens:
        del masks[len(out) + 1:]
        if len(masks) <= len(out):
            masks.append(None)
        return _continued(matcher, then, out, masks, single)
    if out:
        matcher.rollback(len(out))
    return ForcedRun(tuple(out), single, tuple(masks))


def _continued(matcher: "Matcher | ReasoningPhase", then: Callable, out: list[int], masks: list[SeenMask],
               single: int) -> ForcedRun:
    """The run ``out`` (walked on ``matcher``) as ``then`` continues it; the matcher rolled back."""
    n = len(out)
    try:
        then(matcher, out, masks)
    finally:
        if out:
            matcher.rollback(len(out))
    if not out:
        return NOTHING
    single += sum(isinstance(m, int) for m in masks[n:len(out)])
    return ForcedRun(tuple(out), single, tuple(masks[:len(out) + 1]))
