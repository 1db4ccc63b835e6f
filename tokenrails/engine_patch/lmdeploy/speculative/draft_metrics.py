"""Per-request speculative-decoding counters: drafted, accepted and grammar-forced tokens.

Counted in the engine process, for every speculative method (a draft model such as EAGLE, the
model-free grammar proposer, both):

* ``draft_tokens``: draft tokens the target model verified for the request (k per verification
  step; LMDeploy drafts the same k for every row);
* ``accepted_draft_tokens``: of those, accepted by LMDeploy's rejection sampler (tokens a step
  produced, up to and including a stop token, minus the step's own "bonus" token);
* ``forced_draft_tokens``: draft tokens that came from the grammar's forced continuation
  (``guided/forced.py``): the grammar proposer's drafts, or the tokens that replaced an EAGLE
  draft's own guesses (``grammar_eagle.py``);
* ``verify_steps``: verification steps (target forward passes with drafts) the request took.

Read per request by ``LMDeployGuidedManager.request_metrics`` and carried into the api_server's
``usage`` (``draft_usage.py``). Counters of ended requests are kept, oldest dropped past
``MAX_TRACKED_REQUESTS``.
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence

import torch

from ..step.rank_manager import METRICS_SOURCES
from .adaptive_drafts import row_lengths
from .grammar_drafts import emitted_counts

MAX_TRACKED_REQUESTS = 4096

__all__ = ["DraftCounters", "request_stats", "record_verification", "drafted_counts", "record_forced", "reset", "all_requests", "install"]


@dataclass
class DraftCounters:
    verify_steps: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    forced_draft_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"draft_tokens": self.draft_tokens, "accepted_draft_tokens": self.accepted_draft_tokens,
                "forced_draft_tokens": self.forced_draft_tokens, "verify_steps": self.verify_steps}


_LOCK = threading.Lock()
_REQUESTS: "OrderedDict[Hashable, DraftCounters]" = OrderedDict()


def _of(key: Hashable) -> DraftCounters:
    st = _REQUESTS.get(key)
    if st is None:
        st = _REQUESTS[key] = DraftCounters()
        while len(_REQUESTS) > MAX_TRACKED_REQUESTS:
            _REQUESTS.popitem(last=False)
    return st


def request_stats(session_id: Hashable) -> dict[str, int]:
    """The request's counters ({} when it never took a speculative step). The grammar proposer's
    drafts (its own ledger, ``grammar_drafts.request_stats``) count as forced."""
    with _LOCK:
        st = _REQUESTS.get(session_id)
        out = st.as_dict() if st is not None else {}
    if out:
        from . import grammar_drafts

        out["forced_draft_tokens"] += int(grammar_drafts.request_stats(session_id).get("grammar_drafted", 0))
    return out


if request_stats not in METRICS_SOURCES:  # LMDeployGuidedManager.request_metrics carries the counters
    METRICS_SOURCES.append(request_stats)


def all_requests() -> dict[Hashable, dict[str, int]]:
    """Every tracked request's own counters (a copy; grammar-proposer drafts not merged)."""
    with _LOCK:
        return {k: v.as_dict() for k, v in _REQUESTS.items()}


def reset() -> None:
    with _LOCK:
        _REQUESTS.clear()


def record_forced(session_id: Hashable, n: int) -> None:
    if session_id is None or n <= 0:
        return
    with _LOCK:
        _of(session_id).forced_draft_tokens += int(n)


def drafted_counts(draft_token_ids: Sequence[Sequence[int]]) -> list[int]:
    """Real drafts per row: the ids before the row's ``adaptive_drafts.PAD`` (-1; the grammar
    proposer ends a row's forced run with it, a draft model's rows are full)."""
    if not draft_token_ids:
        return []
    return row_lengths(torch.as_tensor(draft_token_ids, dtype=torch.long)).tolist()


def record_verification(session_ids: Sequence[Hashable], num_drafts: int | Sequence[int],
                        output_token_ids: Sequence[Sequence[int]], stops: frozenset[int]) -> None:
    """One verification step: each row verified ``num_drafts`` drafts (one count for every row, or
    one per row); what it accepted is what it emitted minus the bonus token."""
    emitted = emitted_counts(output_token_ids, stops)
    drafted = [int(num_drafts)] * len(emitted) if isinstance(num_drafts, int) else [int(d) for d in num_drafts]
    with _LOCK:
        for key, n, d in zip(session_ids, emitted, drafted):
            if key is None:
                continue
            st = _of(key)
            st.verify_steps += 1
            st.draft_tokens += d
            st.accepted_draft_tokens += min(d, max(n - 1, 0))


def _stop_ids(agent: Any) -> frozenset[int]:
    owner = getattr(getattr(agent, "guided_helper", None), "_mgr", None)
    if getattr(owner, "is_tokenrails", False) and owner.ready:
        return frozenset(owner.core().vocab.eos_ids)
    return frozenset()


def patched_rejection_sampling(original: Callable) -> Callable:
    @functools.wraps(original)
    async def _rejection_sampling(self, model_inputs, extra_inputs, sampling_inputs):
        out = await original(self, model_inputs, extra_inputs, sampling_inputs)
        try:
            if model_inputs.is_decoding and not model_inputs.is_dummy and out.output_token_ids is not None:
                ctx = list(getattr(sampling_inputs, "session_ctx", None) or [])
                ids = out.output_token_ids.reshape(out.output_token_ids.shape[0], -1).tolist()
                keys = [e.get("session_id") if isinstance(e, dict) else None for e in ctx]
                keys = (keys + [None] * len(ids))[: len(ids)]
                drafts = getattr(extra_inputs, "output_draft_token_ids", None)
                drafted = (row_lengths(drafts.reshape(drafts.shape[0], -1)).tolist() if drafts is not None
                           else int(self.num_spec_tokens))
                record_verification(keys, drafted, ids, _stop_ids(self))
        except Exception:  # counters must never fail a step
            import logging

            logging.getLogger(__name__).exception("tokenrails: draft counters failed (the step is unaffected)")
        return out

    return _rejection_sampling


def install(p: Any) -> None:
    from lmdeploy.pytorch.spec_decode import spec_agent

    from .._patching import require_params

    agent_cls = spec_agent.SpecModelAgent
    original = agent_cls.__dict__["_rejection_sampling"]
    require_params(original, ["model_inputs", "extra_inputs", "sampling_inputs"], "SpecModelAgent._rejection_sampling")
    p.set(agent_cls, "_rejection_sampling", patched_rejection_sampling(original))
