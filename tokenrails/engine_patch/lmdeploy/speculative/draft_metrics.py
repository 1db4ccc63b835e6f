"""The draft ledger: every speculative-decoding counter of a request, in one bounded record.

Counted in the engine process for every speculative method (a draft model such as EAGLE, the
model-free grammar proposer, both). A request's ``usage.speculative`` (``draft_usage.py``) is
``request_stats``: ``draft_tokens`` verified (k per verification step, or the row's own run under
adaptive grammar drafts); ``accepted_draft_tokens`` by LMDeploy's rejection sampler (what a step
emitted, up to and including a stop token, minus its bonus token); ``forced_draft_tokens`` from
the grammar's forced continuation (the grammar proposer's drafts, or those that replaced an EAGLE
draft's guesses, ``grammar_eagle.py``); ``verify_steps``. The grammar proposer credits its own
plans here too (``grammar_*``; ``grammar_totals`` over every request). One lock, one cap: ended
requests are kept, the oldest dropped past ``MAX_TRACKED_REQUESTS``.

A step's counts are committed at LMDeploy's stopping check of that step (``defer``), not when the
verification runs: the engine sends the next step before it reads this one's outputs, so a row that
stopped (EOS, stop word, length) runs one more step, whose output the engine drops. Only the
stopping check knows such rows (``num_appendable_ids <= 0`` before the step); counting them made a
request's counters depend on whether that late step ended before its usage was read.
"""
from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any, Callable, Hashable, Sequence

import torch

from ..step.rank_manager import METRICS_SOURCES
from ..step.stopped_rows import ended_flags
from .adaptive_drafts import row_lengths

logger = logging.getLogger(__name__)
COUNTERS_FAILED = "tokenrails: draft counters failed (the step is unaffected)"

MAX_TRACKED_REQUESTS = 4096

__all__ = ["DraftCounters", "request_stats", "record_verification", "record_forced", "record_grammar_step", "defer",
           "drafted_counts", "emitted_counts", "row_keys", "stop_ids", "grammar_totals", "reset", "all_requests", "install"]


@dataclass
class DraftCounters:
    verify_steps: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    forced_draft_tokens: int = 0
    grammar_draft_steps: int = 0
    grammar_drafted: int = 0
    grammar_draft_accepted: int = 0
    grammar_forced: int = 0
    grammar_draft_emitted: int = 0

    def usage(self) -> dict[str, int]:
        """The request's ``usage.speculative`` ({} before its first verification or forced draft);
        the grammar proposer's drafts count as forced."""
        if not (self.verify_steps or self.forced_draft_tokens):
            return {}
        return {"draft_tokens": self.draft_tokens, "accepted_draft_tokens": self.accepted_draft_tokens,
                "forced_draft_tokens": self.forced_draft_tokens + self.grammar_drafted,
                "verify_steps": self.verify_steps}


_LOCK = threading.Lock()
_REQUESTS: "OrderedDict[Hashable, DraftCounters]" = OrderedDict()
_TOTAL = DraftCounters()  # the grammar proposer's counters over every request


def _of(key: Hashable) -> DraftCounters:
    st = _REQUESTS.get(key)
    if st is None:
        st = _REQUESTS[key] = DraftCounters()
        while len(_REQUESTS) > MAX_TRACKED_REQUESTS:
            _REQUESTS.popitem(last=False)
    return st


def request_stats(session_id: Hashable) -> dict[str, int]:
    """The request's ``usage.speculative`` counters ({} when it never took a speculative step)."""
    with _LOCK:
        st = _REQUESTS.get(session_id)
        return st.usage() if st is not None else {}


if request_stats not in METRICS_SOURCES:  # LMDeployGuidedManager.request_metrics carries the counters
    METRICS_SOURCES.append(request_stats)


def all_requests() -> dict[Hashable, dict[str, int]]:
    """Every tracked request's counters, all of them (a copy)."""
    with _LOCK:
        return {k: {**asdict(v), **v.usage()} for k, v in _REQUESTS.items()}


def grammar_totals() -> dict[str, int]:
    """The grammar proposer's counters over every request since the last ``reset``."""
    with _LOCK:
        return {k: v for k, v in asdict(_TOTAL).items() if k.startswith("grammar_")}


def reset() -> None:
    global _TOTAL
    with _LOCK:
        _REQUESTS.clear()
        _TOTAL = DraftCounters()


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


def emitted_counts(output_token_ids, stops: frozenset[int]) -> list[int]:
    """Tokens each row's verification produced (rows of ids, or a tensor): up to the first negative
    id (rejected positions), including a stop token and nothing after it (the engine drops what
    follows a stop)."""
    if isinstance(output_token_ids, torch.Tensor):
        output_token_ids = output_token_ids.reshape(output_token_ids.shape[0], -1).tolist()
    counts = []
    for row in output_token_ids:
        n = 0
        for t in row:
            if t < 0:
                break
            n += 1
            if t in stops:
                break
        counts.append(n)
    return counts


def record_verification(session_ids: Sequence[Hashable], num_drafts: int | Sequence[int],
                        output_token_ids: Sequence[Sequence[int]], stops: frozenset[int],
                        stopped: Sequence[bool] = ()) -> None:
    """One verification step: each row verified ``num_drafts`` drafts (one count for every row, or
    one per row); what it accepted is what it emitted minus the bonus token. Rows marked in
    ``stopped`` (ended before this step) are not counted."""
    emitted = emitted_counts(output_token_ids, stops)
    drafted = [int(num_drafts)] * len(emitted) if isinstance(num_drafts, int) else [int(d) for d in num_drafts]
    with _LOCK:
        for i, (key, n, d) in enumerate(zip(session_ids, emitted, drafted)):
            if key is None or (i < len(stopped) and stopped[i]):
                continue
            st = _of(key)
            st.verify_steps += 1
            st.draft_tokens += d
            st.accepted_draft_tokens += min(d, max(n - 1, 0))


def record_grammar_step(keys: Sequence[Hashable], emitted: Sequence[int],
                        plans: Sequence[tuple[int, int] | None], stopped: Sequence[bool] = ()) -> None:
    """One step of the grammar proposer: per row, the tokens it emitted and the (drafted, forced)
    plan of the previous step it verified (None: nothing verified); accepted = emitted minus the
    bonus token, at most what was drafted. Rows marked in ``stopped`` are not counted."""
    with _LOCK:
        _TOTAL.grammar_draft_steps += 1
        for i, key in enumerate(keys):
            if i < len(stopped) and stopped[i]:
                continue
            n = int(emitted[i]) if i < len(emitted) else 0
            plan = plans[i] if i < len(plans) else None
            for st in (_TOTAL, _of(key)) if key is not None else (_TOTAL,):
                st.grammar_draft_emitted += n
                if plan is not None:
                    st.grammar_drafted += plan[0]
                    st.grammar_forced += plan[1]
                    st.grammar_draft_accepted += min(plan[0], max(n - 1, 0))
            if key is not None:
                _of(key).grammar_draft_steps += 1


def row_keys(session_ctx: list | None, batch: int) -> list[Hashable]:
    """The ledger's key of each of ``batch`` rows: its session id (None past the context)."""
    ctx = list(session_ctx or [])[:batch]
    return [e.get("session_id") if isinstance(e, dict) else None for e in ctx] + [None] * (batch - len(ctx))


def stop_ids(agent: Any) -> frozenset[int]:
    """The stop tokens of a speculative agent or proposer (its guided helper's vocabulary; none
    before the vocabulary is built or without the upgrade's manager)."""
    owner = getattr(getattr(agent, "guided_helper", None), "_mgr", None)
    if getattr(owner, "is_tokenrails", False) and owner.ready:
        return frozenset(owner.core().vocab.eos_ids)
    return frozenset()


_PENDING = "_tokenrails_counts"  # on the step's ModelInputs: commits waiting for its stopping check


def defer(model_inputs: Any, commit: Callable[[list[bool]], None]) -> None:
    """Run ``commit(stopped)`` at this step's stopping check, ``stopped[i]`` True for a row that had
    ended before the step (its output is dropped by the engine, so it must not be counted)."""
    model_inputs.__dict__.setdefault(_PENDING, []).append(commit)


def patched_stopping_step(original: Callable) -> Callable:
    @functools.wraps(original)
    def step(self, next_token_ids, stop_words, inputs=None, extra_inputs=None):
        commits = inputs.__dict__.pop(_PENDING, None) if inputs is not None else None
        if commits:
            try:
                stopped = ended_flags(self)
                for commit in commits:
                    commit(stopped)
            except Exception:  # counters must never fail a step
                logger.exception(COUNTERS_FAILED)
        return original(self, next_token_ids, stop_words, inputs=inputs, extra_inputs=extra_inputs)

    return step


def patched_rejection_sampling(original: Callable) -> Callable:
    @functools.wraps(original)
    async def _rejection_sampling(self, model_inputs, extra_inputs, sampling_inputs):
        out = await original(self, model_inputs, extra_inputs, sampling_inputs)
        try:
            if model_inputs.is_decoding and not model_inputs.is_dummy and out.output_token_ids is not None:
                ids = out.output_token_ids.reshape(out.output_token_ids.shape[0], -1).tolist()
                keys = row_keys(getattr(sampling_inputs, "session_ctx", None), len(ids))
                drafts = getattr(extra_inputs, "output_draft_token_ids", None)
                drafted = (row_lengths(drafts.reshape(drafts.shape[0], -1)).tolist() if drafts is not None
                           else int(self.num_spec_tokens))
                stops = stop_ids(self)
                defer(model_inputs, lambda stopped: record_verification(keys, drafted, ids, stops, stopped))
        except Exception:  # counters must never fail a step
            logger.exception(COUNTERS_FAILED)
        return out

    return _rejection_sampling


def install(p: Any) -> None:
    """Installed after ``adaptive_drafts`` (whose ``_rejection_sampling`` runs LMDeploy's on a padded
    copy of the inputs): this wrapper is the outer one, so ``defer`` marks the step's own inputs,
    the object its stopping check receives."""
    from lmdeploy.pytorch.spec_decode import spec_agent

    from .._patching import require_params

    agent_cls = spec_agent.SpecModelAgent
    original = agent_cls.__dict__["_rejection_sampling"]
    require_params(original, ["model_inputs", "extra_inputs", "sampling_inputs"], "SpecModelAgent._rejection_sampling")
    p.set(agent_cls, "_rejection_sampling", patched_rejection_sampling(original))
    from lmdeploy.pytorch.strategies.ar_spec.model_agent import ARSpecStoppingCriteria

    step = ARSpecStoppingCriteria.__dict__["step"]
    require_params(step, ["next_token_ids", "stop_words", "inputs", "extra_inputs"], "ARSpecStoppingCriteria.step")
    p.set(ARSpecStoppingCriteria, "step", patched_stopping_step(step))
