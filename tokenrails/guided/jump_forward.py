"""Jump-forward: append the text the grammar forces without sampling it, token-safe.

The forced string ``s`` is what every valid continuation starts with. Appending it as tokens needs
a rule, because ``tokenize(previous text) + tokenize(s)`` is usually not how the model would have
tokenized the joined text (``"`` + ``name`` vs ``"name``). The rule (documented in
docs/semantics.md):

1. Take the last ``r`` constrained tokens (``r`` = ``max_rollback`` or fewer, never into the
   prompt or the thinking section, and never splitting a UTF-8 character), join their text with
   ``s`` and tokenize the whole with the model's tokenizer (no special tokens added).
2. The result is used only if it is unambiguous: its tokens' bytes concatenate to exactly that
   text and none of them is a special token.
3. Its last token is left for the model to sample (it may merge with the text that follows),
   unless ``s`` ends the output (afterwards only EOS is allowed).
4. Tokens shared with the existing ones are kept; ``rollback_tokens`` = tokens to drop from the
   end of the sequence, ``token_ids`` = tokens to append after dropping them.
5. The jump must make progress: the appended bytes are strictly more than the dropped ones
   (so jumping can never loop or shrink the output).
6. The grammar must accept ``token_ids`` after the rollback (checked without changing the state).

Larger ``r`` is tried first (most context), down to 0. When no ``r`` is unambiguous,
``token_ids`` is None: the engine may only use ``text``. When some are unambiguous but none makes
progress, ``token_ids`` is ``()``: nothing to append; the mask still forces the text.
Engines that cannot append several tokens in one step should not call this (off by default).

While thinking there is nothing to jump over, except at the thinking cap: then the rest of the
end marker is forced and returned as ``token_ids`` (``rollback_tokens`` = 0). While an optional
thinking section is undecided (the model may still open it) nothing is forced: no jump.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .batch_step import RowStatus, StepStatus

if TYPE_CHECKING:
    from .manager import GuidedDecodingManager, SequenceState

__all__ = ["JumpForward", "apply_jump_forward", "compute_jump_forward"]


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


def compute_jump_forward(
    mgr: "GuidedDecodingManager", st: "SequenceState", tokenizer: Any = None, *, max_rollback: int = 4
) -> JumpForward:
    if st.error is not None or (st.think is not None and st.think.opening):
        return NOTHING
    if st.think is not None and not st.think.done:
        return _forced_end_marker(mgr, st)
    matcher = mgr.resolve_matcher(st)
    if matcher is None or matcher.is_terminated():
        return NOTHING
    text = matcher.find_jump_forward_string()
    if not text:
        return NOTHING
    if tokenizer is None:
        return JumpForward(text, None, 0)
    vocab = mgr.vocab
    hist = st.history
    tokenized = False
    for r in range(min(max_rollback, len(hist)), -1, -1):
        prev = hist[len(hist) - r:] if r else []
        prev_bytes = b"".join(vocab.token_bytes[t] for t in prev)
        try:
            joined = (prev_bytes + text.encode("utf-8")).decode("utf-8")
        except UnicodeDecodeError:
            continue  # r splits a character: try fewer tokens
        ids = [int(t) for t in tokenizer.encode(joined, add_special_tokens=False)]
        if not ids or any(t in vocab.special_ids or not 0 <= t < vocab.num_tokens for t in ids):
            continue
        if b"".join(vocab.token_bytes[t] for t in ids) != joined.encode("utf-8"):
            continue
        tokenized = True
        ids = _back_off_last(mgr, matcher, prev, ids)
        common = 0
        while common < min(len(prev), len(ids)) and prev[common] == ids[common]:
            common += 1
        rollback, append = r - common, tuple(ids[common:])
        dropped = sum(len(vocab.token_bytes[t]) for t in prev[common:])
        if sum(len(vocab.token_bytes[t]) for t in append) <= dropped:
            continue  # no net progress (e.g. the joined text is one token): never shrink output
        if _accepts_after_rollback(matcher, hist, rollback, append):
            return JumpForward(text, append, rollback)
    return JumpForward(text, () if tokenized else None, 0)


def _forced_end_marker(mgr: "GuidedDecodingManager", st: "SequenceState") -> JumpForward:
    """At the thinking cap the rest of the end marker is forced token by token: jump over it."""
    tracker, think = st.tracker, st.think
    assert tracker is not None and think is not None
    ids: list[int] = []
    while not think.done and tracker.forcing(think):
        tok = tracker.forced_token(think)
        nxt = tracker.advance(think, tok)
        assert nxt is not None, "the forced marker token was refused"
        ids.append(tok)
        think = nxt
    if not ids:
        return NOTHING
    data = b"".join(mgr.vocab.token_bytes[t] for t in ids)
    return JumpForward(data.decode("utf-8", errors="replace"), tuple(ids), 0)


def _back_off_last(mgr: "GuidedDecodingManager", matcher, prev: list[int], ids: list[int]) -> list[int]:
    """Drop the last token unless the joined text ends the output (only EOS may follow)."""
    r = len(prev)
    matcher.rollback(r) if r else None
    n = matcher.validate_tokens(ids)
    ends = False
    if n == len(ids):
        for t in ids:
            matcher.accept_token(t)
        ends = _only_eos(mgr, matcher)
        matcher.rollback(len(ids))
    for t in prev:
        ok = matcher.accept_token(t)
        assert ok, "re-accepting the sequence's own tokens failed"
    return ids if ends else ids[:-1]


def _only_eos(mgr: "GuidedDecodingManager", matcher) -> bool:
    words = (mgr.vocab.vocab_size + 31) // 32
    mask = torch.zeros((1, words), dtype=torch.int32)
    matcher.fill_next_token_bitmask(mask, 0)
    expect = torch.zeros((1, words), dtype=torch.int32)
    from ..kernels._common import eos_only_row

    eos_only_row(expect[0], mgr.vocab.eos_ids)
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


def apply_jump_forward(mgr: "GuidedDecodingManager", st: "SequenceState", jump: JumpForward) -> RowStatus:
    """Roll the matcher back ``jump.rollback_tokens`` and accept ``jump.token_ids``."""
    if jump.token_ids is None:
        raise ValueError("this jump has no token ids (ambiguous tokenization): only its text can be used")
    if jump.rollback_tokens > len(st.history):
        raise ValueError(f"cannot roll back {jump.rollback_tokens} tokens: only {len(st.history)} were generated")
    if st.error is not None:
        return RowStatus(StepStatus.ERROR, st.error, accepted=0)
    if jump.rollback_tokens and st.think is not None and not st.think.done:
        raise ValueError("cannot roll back: the answer has not started (thinking, or the optional "
                         "thinking decision is still open)")
    matcher = mgr.resolve_matcher(st)
    if matcher is None:
        return RowStatus(StepStatus.ERROR, st.error, accepted=0)
    if jump.rollback_tokens:
        matcher.rollback(jump.rollback_tokens)
        del st.history[len(st.history) - jump.rollback_tokens:]
    eos = set(mgr.vocab.eos_ids)
    status = RowStatus(StepStatus.OK)
    n = 0
    for tok in jump.token_ids:
        status = mgr.step.accept_one(st, int(tok), eos)
        if status.failed:
            break
        n += 1
    return RowStatus(status.state, status.error, accepted=n)
