"""Sampling-strategy patches: every logits row carries its guided identity in ``session_ctx``.

LMDeploy builds ``SamplingInputs`` on the engine side every step. We add, per row,
``session_ctx[i]["tokenrails"]``: a ``GuidedRow`` (constraint + round-aware identity), a
``GuideError`` (the request's constraint is unusable: that row fails closed), or None (unguided).
The ``GuideSpec`` is computed once per request and memoized on its ``SamplingParam``.

dLLM: the stock strategy repeats ``response_formats`` per block position but not
``session_ctx`` (IndexError, or rows silently bound to the wrong sequence). Parallel block
decoding has no left-to-right order a grammar could follow, so each guided position is failed
with a clear ``UnsupportedGuideError`` instead.
"""
from __future__ import annotations

from typing import Any, Callable

from ...guided.batch_step import GuidedRow
from ...guided.errors import GuideError, UnsupportedGuideError
from .requests import spec_of

CTX_KEY = "tokenrails"
_MEMO_ATTR = "_tokenrails_spec"


def spec_for_param(param: Any) -> Any:
    """``GuideSpec | GuideError | None`` for a ``SamplingParam`` (memoized on the object)."""
    rf = getattr(param, "response_format", None)
    memo = getattr(param, _MEMO_ATTR, None)
    if memo is not None and memo[0] is rf:
        return memo[1]
    try:
        value: Any = spec_of(rf)
    except GuideError as exc:
        value = exc
    try:
        object.__setattr__(param, _MEMO_ATTR, (rf, value))
    except (AttributeError, TypeError):  # slotted/frozen param: recompute next step
        pass
    return value


def row_for_seq(seq: Any) -> Any:
    """The guided identity of one running sequence (see module doc)."""
    value = spec_for_param(seq.sampling_param)
    if value is None or isinstance(value, GuideError):
        return value
    round_start = getattr(seq, "output_start_pos", 0)
    return GuidedRow(seq.session.session_id, (seq.seq_id, int(round_start)), value)


def patched_ar_make_sampling_inputs(original: Callable) -> Callable:
    def make_sampling_inputs(self, seqs):
        out = original(self, seqs)
        ctx = out.session_ctx
        if ctx is not None and len(ctx) == len(seqs):
            for entry, seq in zip(ctx, seqs):
                entry[CTX_KEY] = row_for_seq(seq)
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
        for entry in ctx:
            row = entry.get(CTX_KEY)
            if isinstance(row, GuidedRow):
                row = UnsupportedGuideError(
                    "structured output is not supported with dLLM (block diffusion) decoding: "
                    "block positions are decoded in parallel, not left to right",
                    feature="dllm", backend="lmdeploy")
            for _ in range(block):
                expanded.append({**entry, CTX_KEY: row})
        out.session_ctx = expanded
        return out

    make_sampling_inputs.__wrapped__ = original
    return make_sampling_inputs
