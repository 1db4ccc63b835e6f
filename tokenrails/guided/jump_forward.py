"""Jump-forward: append the text the grammar forces without sampling it, token-safe.

Which tokens the grammar forces is decided in one place, ``forced.forced_tokens``. This module's
job is appending that text as tokens next to the ones the sequence holds: ``tokenize(previous) +
tokenize(s)`` is usually not how the model would tokenize the joined text (``"`` + ``name`` vs
``"name``), so the last few constrained tokens are re-tokenized with ``s`` and the result is used
only when it is unambiguous, makes progress and the grammar accepts it. The rule and its results
(``token_ids`` None: text only; ``()``: nothing to append) are specified once, in
docs/semantics.md section 3.

The transformers decode loop uses it with ``max_rollback=1`` (only the token it just sampled may
be re-tokenized) and applies the result with ``SequenceState.apply_jump``, the same accept path as
a sampled token, so the recorded history stays exact. While thinking nothing is forced except the
rest of the end marker at the thinking cap; while optional thinking is undecided, no jump.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from .bitmask import eos_only_row, words_for
from .forced import forced_tokens
from .sequence import SequenceState
from .vocabulary import Vocabulary, whole_utf8_prefix

__all__ = ["JumpForward", "compute_jump_forward", "text_encoder"]


@dataclass(frozen=True)
class JumpForward:
    """``text``: the forced string from the current state ('' when the grammar has a choice).

    ``token_ids``: tokens to append after removing the sequence's last ``rollback_tokens``
    tokens; None when the tokenization is ambiguous (or no tokenizer was given).
    """

    text: str
    token_ids: tuple[int, ...] | None
    rollback_tokens: int = 0

    @property
    def is_noop(self) -> bool:
        return not self.token_ids and self.rollback_tokens == 0


NOTHING = JumpForward("", (), 0)

Encoder = Callable[[str], Sequence[int]]


def text_encoder(tokenizer: Any) -> Encoder:
    """Plain-text tokenization with a ``transformers`` tokenizer (no BOS/EOS added). Text that
    spells a special token comes back as that special id, which the rule refuses (ambiguous)."""

    def encode(text: str) -> list[int]:
        return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]

    return encode


def compute_jump_forward(
    st: SequenceState, vocab: Vocabulary, encode: Encoder | None = None, *, max_rollback: int = 4,
    max_tokens: int = 256,
) -> JumpForward:
    """The forced continuation of ``st`` (``forced.forced_tokens``, at most ``max_tokens`` tokens)
    retokenized with the sequence's last tokens (docs/semantics.md section 3). A peek: the state (matcher,
    history, thinking state) is exactly as on entry."""
    if st.error is not None:
        return NOTHING
    forced = st.forced_prefix()
    if forced is not None:  # the answer has not begun: only what the sequence forces now
        if not forced:
            return NOTHING
        data = b"".join(vocab.token_bytes[t] for t in forced)
        return JumpForward(data.decode("utf-8", errors="replace"), tuple(forced), 0)
    matcher = st.resolve()
    if matcher is None or matcher.is_terminated():
        return NOTHING
    text = _forced_text(vocab, forced_tokens(matcher, max_tokens, encode=encode).tokens) if encode else ""
    if not text:  # nothing forced, or forced text the rule cannot take as tokens: text only
        text = matcher.find_jump_forward_string()
        return JumpForward(text, None, 0) if text else NOTHING
    hist = st.history
    limit = st.rollback_limit()  # e.g. never back into a thinking section
    deepest = min(max_rollback, len(hist), len(hist) if limit is None else limit)
    tokenized = False
    for r in range(deepest, -1, -1):
        prev = hist[len(hist) - r:] if r else []
        prev_bytes = b"".join(vocab.token_bytes[t] for t in prev)
        try:
            joined = (prev_bytes + text.encode("utf-8")).decode("utf-8")
        except UnicodeDecodeError:
            continue  # r splits a character: try fewer tokens
        ids = [int(t) for t in encode(joined)]
        if not ids or any(t in vocab.special_ids or not 0 <= t < vocab.num_tokens for t in ids):
            continue
        if b"".join(vocab.token_bytes[t] for t in ids) != joined.encode("utf-8"):
            continue
        tokenized = True
        ids = _back_off_last(vocab, matcher, prev, ids)
        common = 0
        while common < min(len(prev), len(ids)) and prev[common] == ids[common]:
            common += 1
        rollback, append = r - common, tuple(ids[common:])
        dropped = sum(len(vocab.token_bytes[t]) for t in prev[common:])
        if sum(len(vocab.token_bytes[t]) for t in append) <= dropped:
            continue  # no net progress (e.g. the joined text is one token): never shrink output
        if _accepts_after_rollback(matcher, hist, rollback, append):
            if st.budget is not None and not st.budget.jump_fits(matcher, hist, rollback, append, st.budget_left()):
                return JumpForward(text, (), 0)  # the jump's tokenization would not leave room to finish
            return JumpForward(text, append, rollback)
    return JumpForward(text, () if tokenized else None, 0)


def _forced_text(vocab: Vocabulary, tokens: Sequence[int]) -> str:
    """The text of the forced run's leading tokens: cut before a special token (its text would
    retokenize to the special id) and before a split UTF-8 character."""
    n = next((i for i, t in enumerate(tokens) if t in vocab.special_ids), len(tokens))
    return whole_utf8_prefix(b"".join(vocab.token_bytes[t] for t in tokens[:n]))


def _back_off_last(vocab: Vocabulary, matcher, prev: list[int], ids: list[int]) -> list[int]:
    """Drop the last token unless the joined text ends the output (only EOS may follow)."""
    r = len(prev)
    matcher.rollback(r) if r else None
    n = matcher.validate_tokens(ids)
    ends = False
    if n == len(ids):
        for t in ids:
            matcher.accept_token(t)
        ends = _only_eos(vocab, matcher)
        matcher.rollback(len(ids))
    for t in prev:
        ok = matcher.accept_token(t)
        assert ok, "re-accepting the sequence's own tokens failed"
    return ids if ends else ids[:-1]


def _only_eos(vocab: Vocabulary, matcher) -> bool:
    words = words_for(vocab.vocab_size)
    mask = torch.zeros((1, words), dtype=torch.int32)
    matcher.fill_next_token_bitmask(mask, 0)
    expect = torch.zeros((1, words), dtype=torch.int32)
    eos_only_row(expect[0], vocab.eos_ids)
    return torch.equal(mask, expect)


def _accepts_after_rollback(matcher, hist: list[int], rollback: int, append: tuple[int, ...]) -> bool:
    """Whether ``append`` is accepted after dropping ``rollback`` tokens; state restored."""
    if rollback:
        matcher.rollback(rollback)
    ok = matcher.validate_tokens(list(append)) == len(append)
    if rollback:
        for t in hist[len(hist) - rollback:]:
            assert matcher.accept_token(t), "re-accepting the sequence's own tokens failed"
    return ok
