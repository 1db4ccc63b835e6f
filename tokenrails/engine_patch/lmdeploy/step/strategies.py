"""Sampling-strategy patches: every logits row carries its guided identity in ``session_ctx``.

LMDeploy builds ``SamplingInputs`` on the engine side every step. We add, per row,
``session_ctx[i]["tokenrails"]`` (``step.CTX_KEY``): a ``GuidedRow`` (constraint + round-aware identity), a
``GuideError`` (the request's constraint is unusable: that row fails closed), or None (unguided).
The ``GuideSpec`` is computed once per request and memoized on its ``SamplingParam``.

Reasoning: the row is an ``LMDeployRow`` carrying the request's own reasoning setting
(``response_format["tokenrails_reasoning"]``, None = the engine default) and, on the round's
steps before its first generated token, the prompt's token ids (read once by the agent-side
manager to know whether the chat template opened or closed the thinking section).
A budget spec (``response_format["tokenrails_budget"]``) carries the request's ``max_new_tokens``
as the row's ``max_tokens``.

dLLM: the stock strategy repeats ``response_formats`` per block position but not
``session_ctx`` (IndexError, or rows silently bound to the wrong sequence). Parallel block
decoding has no left-to-right order a grammar could follow, so each guided position is failed
with a clear ``UnsupportedGuideError`` instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ....guided.budget import is_budget_spec
from ....guided.sequence import GuidedRow
from ....guided.errors import GuideError, InvalidGuideError, UnsupportedGuideError
from ...reasoning_settings import ReasoningSetting
from ..server.request_parsing import parse_format
from .engine_grammars import ATTR
from .lmdeploy_step import CTX_KEY, SEQ_KEY

_MEMO_ATTR = "_tokenrails_spec"


@dataclass(frozen=True, eq=False)
class LMDeployRow(GuidedRow):
    """A guided row as the strategy sees it; the agent-side manager turns it into a plain
    ``GuidedRow`` with its ``ReasoningConfig`` resolved (``LMDeployGuidedManager.prepare_row``).

    ``setting``: the request's reasoning setting (None: the engine default).
    ``prompt``: the round's prompt token ids, only before its first generated token.
    ``guide``: the grammar compiled in the engine process for ranks in other processes
    (engine_grammars.py), only before the first generated token; the rank keeps it.
    """

    setting: ReasoningSetting | None = None
    prompt: Any = None
    guide: Any = None


def format_for_param(param: Any) -> tuple[Any, ReasoningSetting | None]:
    """(``GuideSpec | GuideError | None``, reasoning setting) of a ``SamplingParam`` (memoized)."""
    rf = getattr(param, "response_format", None)
    memo = getattr(param, _MEMO_ATTR, None)
    if memo is not None and memo[0] is rf:
        return memo[1]
    try:
        value: Any = parse_format(rf)
    except GuideError as exc:
        value = (exc, None)
    try:
        object.__setattr__(param, _MEMO_ATTR, (rf, value))
    except (AttributeError, TypeError):  # slotted/frozen param: recompute next step
        pass
    return value


def prompt_ids(seq: Any) -> Any:
    """The round's prompt (token ids before ``output_start_pos``) while nothing was generated yet."""
    if int(getattr(seq, "num_new_tokens", 1) or 0) != 0:
        return None
    start = int(getattr(seq, "output_start_pos", 0) or 0)
    try:
        return seq.valid_ids[:start]
    except (AttributeError, TypeError):
        return None


def row_for_seq(seq: Any, grammars: Any = None) -> Any:
    """The guided identity of one running sequence (see module doc); ``grammars``: the engine
    process's compiles when the ranks run elsewhere (their result travels with the row)."""
    value, setting = format_for_param(seq.sampling_param)
    if value is None or isinstance(value, GuideError):
        return value
    guide = None
    if grammars is not None and int(getattr(seq, "num_new_tokens", 1) or 0) == 0:
        guide = grammars.handover(value)
        if isinstance(guide, GuideError):
            return guide  # failed where the scheduler compiled it: fails the same on every rank
    round_start = getattr(seq, "output_start_pos", 0)
    prompt = None if setting is not None and setting.kind == "off" else prompt_ids(seq)
    budget = getattr(seq.sampling_param, "max_new_tokens", None) if is_budget_spec(value) else None
    if is_budget_spec(value) and not budget:
        return InvalidGuideError("tokenrails_budget=\"close\" needs the request's max_new_tokens")
    return LMDeployRow(seq.session.session_id, (seq.seq_id, int(round_start)), value,
                       setting=setting, prompt=prompt, max_tokens=int(budget) if budget else None, guide=guide)


def patched_ar_make_sampling_inputs(original: Callable) -> Callable:
    def make_sampling_inputs(self, seqs):
        out = original(self, seqs)
        ctx = out.session_ctx
        if ctx is not None and len(ctx) == len(seqs):
            grammars = getattr(self, ATTR, None)
            for entry, seq in zip(ctx, seqs):
                entry[CTX_KEY] = row_for_seq(seq, grammars)
        return out

    make_sampling_inputs.__wrapped__ = original
    return make_sampling_inputs


def patched_dllm_make_sampling_inputs(original: Callable) -> Callable:
    def make_sampling_inputs(self, seqs):
        out = original(self, seqs)
        block = int(self.dllm_block_length)
        ctx = out.session_ctx or []
        if len(ctx) * block != out.batch_size:
            return out
        expanded = []
        for seq_index, entry in enumerate(ctx):
            row = entry.get(CTX_KEY)
            if isinstance(row, GuidedRow):
                row = UnsupportedGuideError(
                    "structured output is not supported with dLLM (block diffusion) decoding: "
                    "block positions are decoded in parallel, not left to right",
                    feature="dllm", backend="lmdeploy")
            for _ in range(block):
                copy = dict(entry)
                copy[CTX_KEY] = row
                copy[SEQ_KEY] = seq_index  # errors are reported per sequence (step.seq_errors)
                expanded.append(copy)
        out.session_ctx = expanded
        return out

    make_sampling_inputs.__wrapped__ = original
    return make_sampling_inputs
