"""Jump-forward: append text the grammar forces without one forward pass per token.

The rule (see docs/transformers.md):

1. After the sampled token ``t`` is accepted, ask the matcher for the forced string ``s``.
2. Back off ``t`` (matcher rollback 1; ``t`` was not fed to the model yet, so no cache change):
   its bytes may merge with ``s`` into different tokens.
3. Tokenize ``bytes(t) + s`` as plain text (no special tokens) → ``r``. Give up (feed ``t``
   alone) when that text is not valid UTF-8, when ``r`` contains a special id, or when the bytes
   of ``r`` are not exactly ``bytes(t) + s``.
4. Hold back the last token of ``r``: it may merge with the free text that follows, so the
   model picks that boundary itself at the next step (the grammar still forces the text).
5. Accept ``r[:-1]`` token by token; if any is rejected, undo them, re-accept ``t`` and feed
   ``t`` alone. Otherwise feed all of ``r[:-1]`` in ONE forward pass.

Every token fed is therefore accepted by the matcher: jump-forward never weakens the constraint.
"""
from __future__ import annotations

from typing import Any, Callable

from ...guided.backend import Matcher
from ...guided.vocabulary import Vocabulary


def make_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """Plain-text tokenization: no BOS/EOS, special-token text not parsed as special."""

    def encode(text: str) -> list[int]:
        try:
            return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
        except TypeError:  # tokenizers without split_special_tokens
            return list(tokenizer.encode(text, add_special_tokens=False))

    return encode


def plan_jump(
    matcher: Matcher,
    vocab: Vocabulary,
    encode: Callable[[str], list[int]],
    sampled: int,
    budget: int,
) -> list[int] | None:
    """Tokens to feed instead of ``sampled`` (already accepted), or None for no jump.

    On success the matcher has accepted exactly the returned tokens (``sampled`` backed off);
    on None its state is as on entry. ``budget`` caps how many tokens may be returned.
    """
    if budget < 2 or matcher.is_terminated():
        return None
    forced = matcher.find_jump_forward_string()
    if not forced:
        return None
    head = vocab.token_bytes[sampled]
    target = head + forced.encode("utf-8")
    try:
        text = target.decode("utf-8")
    except UnicodeDecodeError:  # t ends mid-character: leave the boundary to the model
        return None
    ids = encode(text)
    special = vocab.special_ids
    if not ids or any(i in special or i >= vocab.num_tokens for i in ids):
        return None
    if b"".join(vocab.token_bytes[i] for i in ids) != target:
        return None
    ids = ids[:-1][:budget]
    if not ids or ids == [sampled]:
        return None
    matcher.rollback(1)
    accepted = 0
    for tok in ids:
        if not matcher.accept_token(tok):
            break
        accepted += 1
    if accepted == len(ids):
        return ids
    matcher.rollback(accepted)
    if not matcher.accept_token(sampled):  # cannot happen: it was accepted from this very state
        raise RuntimeError("matcher refused to re-accept a token it had accepted")
    return None
