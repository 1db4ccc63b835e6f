"""LMDeploy's own guided-manager calls, answered by the upgrade's manager (after ``deactivate()``).

``deactivate()`` restores LMDeploy's classes, but an engine built while the upgrade was active
keeps its ``LMDeployGuidedManager``. Its next steps then run stock code — LMDeploy's
``FusedLogitsProcessor`` and spec agent — which calls the stock manager's API
(``get_processors``, ``fill_bitmap``, ``accept_token``, ...). Without these methods that step
raised ``AttributeError`` and killed the engine (seen when a benchmark deactivated between calls
while the agent finished a step it had launched ahead). Here those calls keep enforcing every
constraint with tokenrails' matchers:

* a request mid-generation continues from its own state (the round the upgrade last saw for
  ``(session_id, seq_id)``), reasoning included;
* a request that starts after ``deactivate()`` gets the stock identity ``(seq_id,)``: stock
  LMDeploy keys matchers by ``(session_id, seq_id)`` only, so a session's second round meets a
  finished matcher there as it does on stock (it fails closed: EOS only);
* a format that does not parse or compile fails that row closed (EOS only), never unconstrained;
* LMDeploy's own speculative helper forks matchers to check drafts: a fork here fails closed (EOS
  only at the draft positions, so the drafts are rejected and the row goes on from its verified
  tokens) rather than guessing at a copy of the state.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable

import torch

from ....guided.bitmask import eos_only_row
from ....guided.errors import GuideError, UnsupportedGuideError
from ....guided.sequence import GuidedRow
from ....kernels import allocate_token_bitmask, apply_token_bitmask_inplace
from ..server.request_parsing import spec_of


@dataclass
class StockHandle:
    """What ``get_processors`` returns per row: the row's identity, or why it fails closed."""

    owner: Any
    row: GuidedRow | None
    error: GuideError | None = None

    def fork(self) -> "StockHandle":
        return StockHandle(self.owner, None, UnsupportedGuideError(
            "a stock speculative step on an engine built upgraded, after deactivate(): drafts are not checked"))

    def is_terminated(self) -> bool:
        if self.row is None:
            return False
        state = self.owner.core().sequence(self.row.session_id, self.row.seq_id)
        return (state is not None and state.error is None and state.matcher is not None
                and state.matcher.is_terminated())  # EOS accepted: the row has ended


class StockCalls:
    """Mixed into ``LMDeployGuidedManager``: the stock ``GuidedDecodingManager`` API."""

    _rounds: dict[tuple[Hashable, Hashable], Hashable]

    def get_processors(self, session_ctx: list[dict[str, Any]], response_formats: tuple) -> dict[int, StockHandle]:
        handles = {}
        for i, fmt in enumerate(response_formats or ()):
            if not isinstance(fmt, dict) or fmt.get("type", "text") == "text":
                continue
            entry = session_ctx[i]
            handles[i] = self.get_processor(entry["session_id"], entry["seq_id"], fmt)
        return handles

    def get_processor(self, session_id: Hashable, seq_id: Hashable, response_format: Any) -> StockHandle:
        try:
            spec = spec_of(response_format)
            if spec is None:
                return StockHandle(self, None)
            seq_key = self._rounds.get((session_id, seq_id), (seq_id,))  # a live state keeps its reasoning
            return StockHandle(self, GuidedRow(session_id, seq_key, spec))
        except GuideError as exc:
            return StockHandle(self, None, exc)

    def allocate_batched_bitmap(self, batch_size: int) -> torch.Tensor:
        return allocate_token_bitmask(batch_size, self.vocab_size)

    def fill_bitmap(self, processor: StockHandle, guided_bitmask: torch.Tensor, index: int) -> None:
        if processor.row is None and processor.error is None:
            return  # a format without a constraint ("text")
        with torch.inference_mode():  # the step allocated the bitmask in inference mode; this is a worker thread
            self._fill_row(processor, guided_bitmask, index)

    def _fill_row(self, processor: StockHandle, guided_bitmask: torch.Tensor, index: int) -> None:
        if processor.error is not None:
            eos_only_row(guided_bitmask[index], self.core().vocab.eos_ids)
            return
        filled = self.core().fill_rows([processor.row])  # a failed state's row comes back EOS-only
        guided_bitmask[index].copy_(filled.bitmask[0].to(guided_bitmask.device))

    def accept_token(self, processor: StockHandle, token: int) -> None:
        if processor.row is not None:
            self.core().accept_tokens([int(token)], [processor.row])

    @staticmethod
    def apply_batched_bitmap(logits: torch.Tensor, guided_bitmask: torch.Tensor) -> None:
        apply_token_bitmask_inplace(logits, guided_bitmask.to(logits.device))
