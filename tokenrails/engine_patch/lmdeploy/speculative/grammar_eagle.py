"""Grammar-aware drafts for a real draft model (EAGLE, EAGLE3, MTP) in LMDeploy's speculative path.

LMDeploy's autoregressive proposers already mask each draft position's logits with the row's
grammar (``guided_helper.prepare_bitmask`` on forked processors; on tokenrails a fork is a draft
cursor, ``spec_helper.py``, walking the row's own matcher with exact rollback). What the mask cannot do
is choose *well* where the grammar forces a string that has several tokenizations (``"name":``
after ``{`` allows ``"``, ``"n``, ``"name``...): the draft model's argmax among them is a guess
the target rarely shares. Here, at every draft position, the forced continuation from where the
cursor stands (``DraftCursor.forced``, peek only: ``guided/forced.py``'s one rule) replaces the
draft model's token: one-token masks and forced strings in their canonical tokenization, the
whole run queued so that a string's tokens are drafted as one tokenization. The draft model then
continues from the forced tokens (they are its next inputs), and its later guesses are masked at
the cursor's new state.

Exactness: only the draft changes. The target's verification (masks on every position, LMDeploy's
rejection sampler) is untouched, so greedy output equals plain guided decoding token for token
and sampled output keeps its distribution.

Installed by the engine patch: every autoregressive proposer class in LMDeploy's registry
(``SPEC_PROPOSERS``: eagle, eagle3, deepseek_mtp...) is registered again, under its own method
name, as a subclass whose ``guided_helper`` (the draft side's helper;
the agent's own, target-side helper is a different attribute) is a ``ForcingDraftHelper``.
``TOKENRAILS_GRAMMAR_EAGLE=0`` turns it off for engines built afterwards (the bench's baseline).
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Callable, Hashable

import torch

from . import draft_metrics
from .._patching import Patcher
from ...._env import env_switch

logger = logging.getLogger(__name__)

ENV_SWITCH = "TOKENRAILS_GRAMMAR_EAGLE"

__all__ = ["ENV_SWITCH", "enabled", "ForcingDraftHelper", "install"]


def enabled() -> bool:
    return env_switch(ENV_SWITCH, True)


def _encoder(owner: Any) -> Callable[[str], list[int]] | None:
    tok = getattr(owner, "_tokenizer", None)
    if tok is None or not hasattr(tok, "encode"):
        return None

    def encode(text: str) -> list[int]:
        try:
            return list(tok.encode(text, add_special_tokens=False))
        except TypeError:
            return list(tok.encode(text))

    return encode


class _StepPlan:
    """One draft step's forced queues, by batch row (the agent hands the same processors dict to
    every draft position of a step, and a new one to the next step)."""

    def __init__(self, processors: dict, num_drafts: int):
        self.processors = processors
        self.num_drafts = num_drafts
        self.position = 0
        self.queues: dict[int, deque[int]] = {}


class ForcingDraftHelper:
    """The draft side's ``GuidedSpecHelper``: everything delegated, except that accepting a
    position's drafts first puts the grammar's forced token in place of the draft model's."""

    def __init__(self, inner: Any, num_drafts: int):
        self.inner = inner
        self.num_drafts = max(1, int(num_drafts))
        self._plan: _StepPlan | None = None
        self._buf: torch.Tensor | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _owner(self) -> Any:
        owner = getattr(self.inner, "_mgr", None)
        return owner if getattr(owner, "is_tokenrails", False) else None

    def _plan_for(self, processors: dict) -> _StepPlan:
        plan = self._plan
        if plan is None or plan.processors is not processors:
            plan = self._plan = _StepPlan(processors, self.num_drafts)
        return plan

    def _forced_next(self, plan: _StepPlan, idx: int, handle: Any, encode: Any, words: int) -> int | None:
        queue = plan.queues.get(idx)
        if not queue:
            remaining = plan.num_drafts - plan.position
            if remaining <= 0 or getattr(handle, "error", None) is not None:
                return None
            if self._buf is None or self._buf.shape[1] != words:
                self._buf = torch.empty((1, words), dtype=torch.int32)
            run = handle.cursor().forced(remaining, encode=encode, bitmask=self._buf)
            if not run.tokens:
                return None
            queue = plan.queues[idx] = deque(run.tokens)
        return queue.popleft()

    async def accept_draft_tokens(self, draft_token_ids: torch.Tensor, processors: dict | None):
        owner = self._owner()
        if owner is None or not processors or not hasattr(next(iter(processors.values())), "cursor"):
            return await self.inner.accept_draft_tokens(draft_token_ids, processors)
        plan = self._plan_for(processors)
        ids = draft_token_ids[:, 0].tolist()
        encode = _encoder(owner)
        words = (owner.core().vocab.vocab_size + 31) // 32

        def run() -> tuple[dict[int, int], list[tuple[Hashable, int]]]:
            changed: dict[int, int] = {}
            forced: list[tuple[Hashable, int]] = []
            for idx, h in processors.items():
                if idx >= len(ids):
                    continue
                tok = self._forced_next(plan, idx, h, encode, words)
                if tok is None:
                    continue
                forced.append((getattr(h.raw, "session_id", None), 1))
                if int(tok) != int(ids[idx]):
                    changed[idx] = int(tok)
            return changed, forced

        changed, forced = await asyncio.to_thread(run)
        plan.position += 1
        for key, n in forced:
            draft_metrics.record_forced(key, n)
        if changed:
            with torch.inference_mode():
                for idx, tok in changed.items():
                    draft_token_ids[idx, 0] = tok
        return await self.inner.accept_draft_tokens(draft_token_ids, processors)


def grammar_aware(cls: type) -> type:
    """A subclass of proposer ``cls`` whose draft-side helper forces the grammar's tokens."""

    class GrammarAware(cls):  # type: ignore[misc, valid-type]
        tokenrails_grammar_aware = True

        @property
        def guided_helper(self) -> Any:
            return self.__dict__.get("_tokenrails_draft_helper")

        @guided_helper.setter
        def guided_helper(self, helper: Any) -> None:
            if isinstance(helper, ForcingDraftHelper):
                helper = helper.inner
            forcing = self.__dict__.setdefault("_tokenrails_forcing", enabled())  # decided once, at build
            if forcing:
                k = getattr(self, "num_speculative_tokens", None) or self.specdecode_config.num_speculative_tokens
                helper = ForcingDraftHelper(helper, k)
            self.__dict__["_tokenrails_draft_helper"] = helper

    GrammarAware.__name__ = GrammarAware.__qualname__ = f"GrammarAware{cls.__name__}"
    GrammarAware.__module__ = __name__
    return GrammarAware


def _forcing_class(cls: type, ProposalMethod: Any) -> bool:
    return (getattr(cls, "proposal_method", ProposalMethod.AUTOREGRESSIVE) == ProposalMethod.AUTOREGRESSIVE
            and getattr(cls, "needs_draft_model", True) is not False
            and not getattr(cls, "tokenrails_grammar_aware", False))


def install(p: Patcher) -> None:
    """Register a grammar-aware subclass of every autoregressive proposer under its own method name
    in LMDeploy's proposer registry (``SPEC_PROPOSERS``), and the per-request draft counters."""
    from lmdeploy.pytorch.spec_decode.proposers.base import SPEC_PROPOSERS, ProposalMethod

    from .._patching import is_patched

    if not is_patched(SPEC_PROPOSERS, "_module_dict"):  # grammar_drafts.install made the copy already
        p.set(SPEC_PROPOSERS, "_module_dict", dict(SPEC_PROPOSERS.module_dict))
    table = SPEC_PROPOSERS._module_dict  # a copy: deactivate() puts the stock classes back
    for name, cls in list(table.items()):
        if isinstance(cls, type) and _forcing_class(cls, ProposalMethod):
            table[name] = grammar_aware(cls)
    draft_metrics.install(p)
