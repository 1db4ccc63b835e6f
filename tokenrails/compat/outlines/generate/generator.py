"""``outlines.generate.generator`` (0.x): outlines' own token loop and its step functions.

The shim's ``generate.*`` run through ``transformers``' ``generate``; these are for code that
drives outlines' loop itself (custom samplers, hand-made FSMs, a model callable returning
``(logits, kv_cache)``). Semantics follow outlines 0.x: rows are ``batch * samples`` sequences,
a sampler returns ``(next_token_ids, ancestors, weights)`` and ``ancestors`` reorders rows
(beam search), each row has its own FSM and state.
"""
from __future__ import annotations

import math
from typing import Any, Iterator, List, NamedTuple, Optional

import torch


class GenerationState(NamedTuple):
    token_ids: torch.Tensor
    kv_cache: Any
    logits: torch.Tensor
    weights: torch.Tensor
    fsm_states: List[int]


def sequence_generator(
    model: Any,
    sampler: Any,
    fsms: List[Any],
    token_ids: torch.Tensor,
    sequence_weights: torch.Tensor,
    attention_masks: torch.Tensor,
    fsm_states: List[int],
    rng: Optional[torch.Generator] = None,
) -> Iterator[GenerationState]:
    """Yield one ``GenerationState`` per generated token until every row's FSM is final."""
    if rng is None:
        rng = torch.Generator()
    kv_cache = None
    while True:
        try:
            logits, kv_cache = model(token_ids, attention_masks, kv_cache)
        except IndexError as exc:  # outlines' wording for a prompt + output past the context
            raise ContextLengthExceededError("The input length exceeds the context length of the model.") from exc
        allowed = get_allowed_tokens(fsms, fsm_states)
        biased_logits = bias_logits(logits, allowed)
        next_token_ids, ancestors, sequence_weights = sampler(biased_logits, sequence_weights, rng)
        token_ids = update_token_ids(token_ids, next_token_ids, ancestors)
        attention_masks = update_attention_masks(attention_masks, ancestors)
        kv_cache = reorder_kv_cache(kv_cache, ancestors)
        if len(ancestors) > 1:
            fsms = reorder_fsms(fsms, ancestors)
            fsm_states = reorder_fsm_states(fsm_states, ancestors)
        fsm_states = get_next_fsm_states(fsms, fsm_states, next_token_ids)
        state = GenerationState(token_ids, kv_cache, logits, sequence_weights, fsm_states)
        yield state
        if is_generation_finished(fsms, fsm_states):
            return


class ContextLengthExceededError(Exception):
    """The prompt plus the generated tokens no longer fit the model's context."""


def get_next_fsm_states(fsms: List[Any], fsm_states: List[int], next_token_ids: torch.Tensor) -> List[int]:
    """Each row's FSM advanced by the row's sampled token."""
    return [fsm.get_next_state(state, int(token[0])) for fsm, state, token in zip(fsms, fsm_states, next_token_ids)]


def get_allowed_tokens(fsms: List[Any], fsm_states: List[int]) -> List[Optional[Any]]:
    """Each row's allowed token ids (``None``: anything)."""
    return [fsm.get_next_instruction(state).tokens for fsm, state in zip(fsms, fsm_states)]


def is_generation_finished(fsms: List[Any], fsm_states: List[int]) -> bool:
    return all(fsm.is_final_state(state) for fsm, state in zip(fsms, fsm_states))


def update_token_ids(token_ids: torch.Tensor, next_token_ids: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
    """Rows taken from their ancestors, each extended by its new token."""
    return torch.cat([torch.index_select(token_ids, 0, ancestors), next_token_ids], dim=-1)


def update_attention_masks(attention_masks: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
    """Rows taken from their ancestors, each one position longer (attended)."""
    masks = torch.index_select(attention_masks, 0, ancestors)
    ones = torch.ones(masks.shape[:-1] + (1,), dtype=masks.dtype, device=masks.device)
    return torch.cat([masks, ones], dim=-1)


def reorder_fsms(fsms: List[Any], ancestors: torch.Tensor) -> List[Any]:
    return [fsms[int(i)].copy() for i in ancestors]


def reorder_fsm_states(fsm_states: List[int], ancestors: torch.Tensor) -> List[int]:
    return [fsm_states[int(i)] for i in ancestors]


def reorder_kv_cache(kv_cache: Any, ancestors: torch.Tensor) -> Any:
    """The cache's rows in ancestor order (``None`` stays ``None``): a tuple of per-layer
    tuples of tensors, as outlines' models return it."""
    if kv_cache is None:
        return None
    reorder = getattr(kv_cache, "reorder_cache", None)
    if callable(reorder):  # a transformers Cache object reorders itself
        reorder(ancestors)
        return kv_cache
    return tuple(tuple(torch.index_select(t, 0, ancestors) for t in layer) for layer in kv_cache)


def bias_logits(logits: torch.Tensor, allowed_token_ids: List[Optional[Any]]) -> torch.Tensor:
    """``-inf`` on every token a row does not allow (a row allowing ``None`` is left alone)."""
    biased = torch.full_like(logits, -math.inf)
    for i, ids in enumerate(allowed_token_ids):
        if ids is None:
            biased[i] = logits[i]
            continue
        index = torch.as_tensor(ids, dtype=torch.long, device=logits.device).reshape(-1)
        biased[i, index] = logits[i, index]
    return biased


__all__ = [
    "ContextLengthExceededError", "GenerationState", "bias_logits", "get_allowed_tokens", "get_next_fsm_states",
    "is_generation_finished", "reorder_fsm_states", "reorder_fsms", "reorder_kv_cache", "sequence_generator",
    "update_attention_masks", "update_token_ids",
]
