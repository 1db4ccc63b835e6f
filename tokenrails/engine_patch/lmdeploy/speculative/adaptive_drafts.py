"""Adaptive verification for grammar drafts: each row verifies only what its grammar forces.

LMDeploy 0.18 verifies exactly ``1 + k`` positions per row and step. With grammar drafts most
rows have fewer than ``k`` forced tokens most of the time (often none), and on a compute-bound
path (the CPU) every verified position costs a share of a forward pass. Here the grammar
proposer marks the end of each row's forced run with ``PAD`` (-1) in its ``[batch, k]`` draft
tensor, and the decode loop feeds the target model *ragged* rows: row ``i`` gets
``1 + L_i`` positions (its next token and its ``L_i`` forced tokens), so a step where nothing
is forced is a plain one-position decode. LMDeploy's packed inputs already carry one
``seq_length`` per row (that is how prefill batches work), and the attention takes per-row
query lengths.

Verification stays LMDeploy's own: the rejection sampler is called unchanged on a
``[batch, K + 1]`` block, ``K = max_i L_i``; row ``i``'s logits past its last real position
repeat that position's logits and its drafts there are fillers (its previous token). The
sampler's output is then cut after ``L_i + 1`` tokens per row, before the grammar's matchers
accept anything. Why that is exact: speculative sampling emits token ``j`` of a row with exactly
the target's distribution at position ``j`` given the tokens before it; position ``L_i`` is a
real position, so tokens ``0..L_i`` are an exact sample, and a prefix of an exact sample is one.
Under greedy decoding the cut tokens are simply the argmax chain, as in plain decoding.

Interfaces keep LMDeploy's fixed widths (drafts ``[batch, k]``, outputs ``[batch, k + 1]`` with
-1 for "no token"), so the engine's scheduler, stopping criteria and TP broadcasts see the
shapes they expect; the engine's copy of the drafts gets fillers instead of ``PAD`` (it only
counts them, for KV reservation, which stays an upper bound).

Only engines whose proposer is ``grammar_drafts.METHOD`` are affected. Not supported with it:
mrope (vision-language position ids) - refused with an error rather than run wrongly.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from . import draft_shapes

PAD = -1  # "no draft here": the end of a row's forced run in the proposer's [batch, k] tensor

__all__ = ["PAD", "row_lengths", "pack_rows", "pad_logits", "cut_after", "greedy_targets", "install"]


# ---- pure tensor helpers (unit-tested) ---------------------------------------------------------
def row_lengths(drafts: torch.Tensor) -> torch.Tensor:
    """How many real drafts each row has (``PAD`` only ever trails a row's forced run)."""
    if drafts.numel() == 0:
        return torch.zeros(drafts.size(0), dtype=torch.long, device=drafts.device)
    return (drafts >= 0).sum(dim=1).to(torch.long)


def pack_rows(next_ids: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The next decode step's packed ``[1, sum_i (1 + L_i)]`` input ids and per-row lengths:
    row ``i`` is its next token followed by its real drafts."""
    next_ids = next_ids.reshape(-1)
    full = torch.cat([next_ids[:, None], drafts.to(next_ids.dtype)], dim=1)
    keep = torch.cat([torch.ones_like(next_ids, dtype=torch.bool)[:, None], drafts >= 0], dim=1)
    return full[keep][None, :], keep.sum(dim=1).to(torch.long)


def fill_pads(drafts: torch.Tensor, fillers: torch.Tensor) -> torch.Tensor:
    """``drafts`` with every ``PAD`` replaced by the row's filler (a valid token id)."""
    return torch.where(drafts >= 0, drafts, fillers.reshape(-1, 1).to(drafts.dtype))


def row_starts(seq_length: torch.Tensor) -> torch.Tensor:
    return seq_length.cumsum(0) - seq_length


def pad_logits(logits: torch.Tensor, seq_length: torch.Tensor, width: int) -> torch.Tensor:
    """Packed ragged logits ``[sum q_i, V]`` as ``[batch * width, V]``: row ``i``'s positions
    ``>= q_i`` repeat its last real position (their tokens are cut, see ``cut_after``)."""
    batch = seq_length.numel()
    pos = torch.arange(width, device=logits.device)[None, :]
    last = (seq_length.to(logits.device) - 1)[:, None]
    src = row_starts(seq_length.to(logits.device))[:, None] + torch.minimum(pos, last)
    return logits.index_select(0, src.reshape(-1)).reshape(batch * width, -1)


def cut_after(output_token_ids: torch.Tensor, num_rejected: torch.Tensor, keep: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A rejection sampler's ``(output ids, rejected counts, last token)`` with each row cut
    after ``keep[i]`` tokens (``keep >= 1``). Width unchanged; cut positions become -1."""
    width = output_token_ids.size(1)
    emitted = torch.minimum(width - num_rejected.reshape(-1), keep.to(num_rejected.device))
    pos = torch.arange(width, device=output_token_ids.device)[None, :]
    out = torch.where(pos < emitted[:, None], output_token_ids, torch.full_like(output_token_ids, PAD))
    last = out.gather(1, (emitted - 1).clamp_min(0)[:, None]).reshape(-1)
    return out, (width - emitted).to(num_rejected.dtype), last


def widen(tensor: torch.Tensor, width: int, value: int) -> torch.Tensor:
    """``[batch, w]`` padded on the right with ``value`` to ``[batch, width]``."""
    if tensor.size(1) >= width:
        return tensor
    pad = tensor.new_full((tensor.size(0), width - tensor.size(1)), value)
    return torch.cat([tensor, pad], dim=1)


def _no_mrope(inputs: Any) -> None:
    if getattr(inputs, "mrope_pos_ids", None) is not None:
        raise NotImplementedError("tokenrails grammar drafts: models with mrope position ids are not supported")


# ---- the decode loop's inputs (LMDeploy's StepInputs, ragged) --------------------------------------
def _step_inputs_class():
    from lmdeploy.pytorch.model_inputs import ModelInputs
    from lmdeploy.pytorch.strategies.ar.model_inputs import get_model_inputs_next_decoding, merge_model_inputs
    from lmdeploy.pytorch.strategies.ar.step_inputs import (merge_sampling_delta, reindex_sampling_delta,
                                                            step_sampling_delta)
    from lmdeploy.pytorch.strategies.ar_spec.step_inputs import ARSpecStepInputs

    class RaggedStepInputs(ARSpecStepInputs):
        """Decode-loop state where row ``i`` carries ``1 + L_i`` positions, not ``1 + k``, or, where
        the attention needs one query length for all rows (``draft_shapes``), ``1 + K`` with the
        step's bucketed width ``K``."""

        shape_request = draft_shapes.AUTO  # set by the factory from the environment

        def _shaped(self, ids: torch.Tensor, q: torch.Tensor, longest: int) -> tuple[torch.Tensor, torch.Tensor]:
            mode = draft_shapes.mode_for(self.shape_request, ids.device)
            if mode == draft_shapes.RAGGED or q.numel() == 0:
                return ids, q
            width = draft_shapes.bucket_width(longest, int(self._num_spec_tokens), mode)
            return draft_shapes.pad_rows(ids, q, width)

        def _uniform(self, inputs):
            """Merged decode inputs (a finished prefill joining the batch) at one common width."""
            q = inputs.seq_length
            mode = draft_shapes.mode_for(self.shape_request, inputs.input_ids.device)
            if q.numel() == 0 or mode == draft_shapes.RAGGED:
                return inputs
            ids, padded = self._shaped(inputs.input_ids, q, int(q.max()) - 1)
            padded = padded.to(q.device)
            if torch.equal(padded, q):
                return inputs
            return inputs.clone(input_ids=ids, seq_length=padded, max_q_seqlen=int(padded.max()),
                                max_kv_seqlen=int(inputs.max_kv_seqlen) + int(padded.max()) - int(q.max()),
                                sum_kv_seqlen=int(inputs.sum_kv_seqlen) + int(padded.sum()) - int(q.sum()))

        def merge_prefill(self, inputs, extra_inputs, stopping_criteria, sampling_delta, next_token_ids,
                          model_metas, extra_outputs):
            _no_mrope(inputs)
            ids, q = pack_rows(next_token_ids, extra_inputs.output_draft_token_ids)
            ids, q = self._shaped(ids, q, int(q.max()) - 1 if q.numel() else 0)
            max_q = int(q.max()) if q.numel() else 1
            new = get_model_inputs_next_decoding(inputs, ids, max_q_seqlen=max_q, model_metas=model_metas)
            new.seq_length = q.to(inputs.seq_length.device)
            new.sum_kv_seqlen = int(inputs.sum_kv_seqlen) + int(q.sum())
            extra_inputs = extra_inputs.clone()
            stopping_criteria = stopping_criteria.clone()
            sampling_delta = step_sampling_delta(sampling_delta, next_token_ids)
            if self.model_inputs is None:
                self.model_inputs, self.extra_inputs = new, extra_inputs
                self.stopping_criteria, self.sampling_delta = stopping_criteria, sampling_delta
            else:
                self.model_inputs = self._uniform(merge_model_inputs(self.model_inputs, new))
                self.extra_inputs = self.extra_inputs.merge(extra_inputs)
                self.stopping_criteria = self.stopping_criteria.merge(stopping_criteria)
                self.sampling_delta = merge_sampling_delta(self.sampling_delta, sampling_delta, self._pad_token_id)

        def reindex(self, delta):
            inputs = self.model_inputs
            assert inputs.is_decoding, "only decoding inputs are reindexed"
            _no_mrope(inputs)
            idx = delta.indices
            q_all = inputs.seq_length
            q = q_all[idx]
            starts = row_starts(q_all)[idx]
            offsets = torch.arange(int(q.sum()), device=q.device) - torch.repeat_interleave(row_starts(q), q)
            positions = torch.repeat_interleave(starts, q) + offsets
            model_metas = inputs.model_metas
            if model_metas is not None and delta.indice_cpu is not None:
                model_metas = [model_metas[i] for i in delta.indice_cpu]
            self.model_inputs = ModelInputs(
                input_ids=inputs.input_ids[:, positions],
                seq_length=q,
                history_lengths=inputs.history_lengths[idx],
                block_offsets=delta.block_offsets if delta.block_offsets is not None else inputs.block_offsets[idx],
                is_decoding=True,
                num_ignored_history=(delta.num_ignored_history if delta.num_ignored_history is not None
                                     else inputs.num_ignored_history[idx]),
                max_q_seqlen=int(q.max()) if q.numel() else 1,
                max_kv_seqlen=delta.max_kv_seqlen or inputs.max_kv_seqlen,
                sum_kv_seqlen=delta.sum_kv_seqlen or inputs.sum_kv_seqlen,
                local_adapter_ids=inputs.local_adapter_ids[idx] if inputs.local_adapter_ids is not None else None,
                model_metas=model_metas,
                state_offsets=inputs.state_offsets[idx] if inputs.state_offsets is not None else None,
            )
            self.extra_inputs = self.extra_inputs.update(delta)
            self.stopping_criteria = self.stopping_criteria.update(delta)
            self.sampling_delta = reindex_sampling_delta(self.sampling_delta, delta)

        def step_decode(self, model_inputs, extra_inputs, stopping_criteria, sampling_delta, next_token_ids,
                        model_metas, extra_outputs):
            _no_mrope(model_inputs)
            width = extra_inputs.output_token_ids.size(1)
            emitted = width - extra_inputs.num_rejected_tokens  # positions whose KV stays: the tokens kept
            ids, q = pack_rows(next_token_ids, extra_inputs.output_draft_token_ids)
            ids, q = self._shaped(ids, q, int(q.max()) - 1 if q.numel() else 0)
            q = q.to(model_inputs.seq_length.device)
            max_q = int(q.max()) if q.numel() else 1
            self.model_inputs = model_inputs.clone(
                input_ids=ids,
                seq_length=q,
                history_lengths=model_inputs.history_lengths + emitted.to(model_inputs.history_lengths.device),
                is_decoding=True,
                model_metas=model_metas,
                max_q_seqlen=max_q,
                # upper bounds, like LMDeploy's own: kv_i <= old kv_i + new q_i
                max_kv_seqlen=int(model_inputs.max_kv_seqlen) + max_q,
                sum_kv_seqlen=int(model_inputs.sum_kv_seqlen) + int(q.sum()),
                logits_indices=None,
                seq_logit_length=None,
            )
            self.extra_inputs = extra_inputs
            self.stopping_criteria = stopping_criteria.clone()
            self.sampling_delta = step_sampling_delta(sampling_delta, next_token_ids)

    RaggedStepInputs.__module__ = __name__
    RaggedStepInputs.__qualname__ = "RaggedStepInputs"
    return RaggedStepInputs


def _agent_strategy_class():
    from lmdeploy.pytorch.strategies.ar_spec.model_agent import ARSpecExtraOutputs, ARSpecModelAgentStrategy

    class RaggedAgentStrategy(ARSpecModelAgentStrategy):
        """The engine's copy of the drafts carries fillers (the row's next token) where the
        proposer wrote ``PAD``: the scheduler only counts them (KV reservation)."""

        def make_extra_outputs(self, extra_inputs):
            drafts = extra_inputs.output_draft_token_ids
            nxt = extra_inputs.next_token_ids
            if drafts is not None and nxt is not None and drafts.numel():
                drafts = fill_pads(drafts, nxt)
            return ARSpecExtraOutputs(draft_token_ids=drafts)

    RaggedAgentStrategy.__module__ = __name__
    RaggedAgentStrategy.__qualname__ = "RaggedAgentStrategy"
    return RaggedAgentStrategy


# ---- verification: LMDeploy's sampler on a padded block, cut per row ---------------------------
def greedy_targets(logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The ``[batch, width]`` argmax ids of a padded ``[batch, width, V]`` block, computed only at
    each row's first ``keep[i]`` positions; a later position gets its row's last real id, as
    its logits repeat that position's (``pad_logits``). ``max(-1).indices`` is the argmax with
    the same tie rule (the first maximal index); on a CPU ``argmax`` has no fast bfloat16 kernel,
    and the padded positions would be reduced for nothing."""
    batch, width, vocab = logits.shape
    keep = keep.to(logits.device).clamp(1, width)
    pos = torch.arange(width, device=logits.device)[None, :]
    real = pos < keep[:, None]
    flat = (torch.arange(batch, device=logits.device)[:, None] * width + pos)[real]
    ids = logits.reshape(batch * width, vocab).index_select(0, flat).max(-1).indices
    src = row_starts(keep)[:, None] + torch.minimum(pos, keep[:, None] - 1)
    return ids[src.reshape(-1)].reshape(batch, width)


class _CuttingSampler:
    """LMDeploy's rejection sampler, then ``keep[i]`` tokens of row ``i`` kept. An all-greedy
    block skips the sampler's argmax over every padded position: the target ids come from
    ``greedy_targets`` and go to the sampler's own greedy verification (``forward_greedy``)."""

    def __init__(self, sampler: Callable, keep: torch.Tensor):
        self.sampler, self.keep = sampler, keep

    def __call__(self, logits: torch.Tensor, drafts: torch.Tensor, sampling_inputs: Any, *args: Any, **kwargs: Any):
        impl = getattr(self.sampler, "_impl", None)
        greedy = getattr(sampling_inputs, "max_top_k", None) == 1 and not args and kwargs.get("draft_probs") is None
        if greedy and impl is not None and hasattr(impl, "forward_greedy") and logits.dim() == 3:
            out, rejected, last = impl.forward_greedy(greedy_targets(logits, self.keep), drafts)
        else:
            out, rejected, last = self.sampler(logits, drafts, sampling_inputs, *args, **kwargs)
        return cut_after(out, rejected, self.keep)


def _first_tokens(model_inputs: Any) -> torch.Tensor:
    """Each row's first input token (its previous sampled token): the filler for its pads."""
    ids = model_inputs.input_ids.reshape(-1)
    return ids[row_starts(model_inputs.seq_length.to(ids.device))]


def patched_rejection_sampling(original: Callable, applies: Callable[[Any], bool]) -> Callable:
    async def _rejection_sampling(self, model_inputs, extra_inputs, sampling_inputs):
        if (not applies(self) or not model_inputs.is_decoding or model_inputs.is_dummy
                or extra_inputs.output_draft_token_ids is None):
            return await original(self, model_inputs, extra_inputs, sampling_inputs)
        k = int(self.num_spec_tokens)
        drafts = extra_inputs.output_draft_token_ids
        lengths = row_lengths(drafts)
        seq_length = model_inputs.seq_length
        width = int(lengths.max()) if lengths.numel() else 0  # K: the longest forced run of the step
        fillers = _first_tokens(model_inputs)
        padded_inputs = model_inputs.clone(seq_length=torch.full_like(seq_length, width + 1))
        padded_extra = extra_inputs.clone(
            target_logits=pad_logits(extra_inputs.target_logits, seq_length, width + 1),
            output_draft_token_ids=fill_pads(drafts[:, :width], fillers),
        )
        sampler = self.rejection_sampler
        self.rejection_sampler = _CuttingSampler(sampler, (lengths + 1).to(drafts.device))
        self.num_spec_tokens = width  # this step's block width, for LMDeploy's sampling code
        try:
            res = await original(self, padded_inputs, padded_extra, sampling_inputs)
        finally:
            self.rejection_sampler = sampler
            self.num_spec_tokens = k
        emitted = (width + 1) - res.num_rejected_tokens
        logprobs = res.logprobs
        if logprobs is not None and width < k:
            logprobs = _widen_logprobs(logprobs, width + 1, k + 1)
        q = seq_length.to(emitted.device)
        return res.clone(
            output_token_ids=widen(res.output_token_ids, k + 1, PAD),
            num_rejected_tokens=res.num_rejected_tokens + (k - width),
            last_token_indices=seq_length.cumsum(0) - 1 - (q - emitted),
            logprobs=logprobs,
        )

    _rejection_sampling.__wrapped__ = original  # type: ignore[attr-defined]
    return _rejection_sampling


def _widen_logprobs(logprobs: Any, width: int, full: int) -> Any:
    """Per-position logprobs of a ``[batch, width]`` block laid out as ``[batch, full]``."""
    vals, idx = logprobs.vals, logprobs.indices
    batch = vals.size(0) // width

    def grow(t: torch.Tensor) -> torch.Tensor:
        t = t.reshape(batch, width, -1)
        pad = t.new_zeros((batch, full - width, t.size(-1)))
        return torch.cat([t, pad], dim=1).reshape(batch * full, -1)

    return type(logprobs)(vals=grow(vals), indices=grow(idx))


# ---- installation ----------------------------------------------------------------------------
def install(p: Any, method: str, applies: Callable[[Any], bool]) -> None:
    """Ragged step inputs and engine-side fillers for engines whose proposer is ``method``;
    the padded-then-cut verification for spec agents where ``applies(agent)``."""
    from lmdeploy.pytorch.spec_decode import spec_agent
    from lmdeploy.pytorch.strategies.ar_spec import ARSpecStrategyFactory

    from .._patching import require_attrs

    require_attrs(ARSpecStrategyFactory, ["build_step_inputs", "build_model_agent_strategy"], "ARSpecStrategyFactory")
    step_cls, agent_cls = _step_inputs_class(), _agent_strategy_class()
    orig_step = ARSpecStrategyFactory.__dict__["build_step_inputs"]
    orig_agent = ARSpecStrategyFactory.__dict__["build_model_agent_strategy"]

    def _ours(factory: Any) -> bool:
        return getattr(factory.specdecode_config, "method", None) == method

    def build_step_inputs(self):
        base = orig_step(self)
        if not _ours(self):
            return base
        step = step_cls(_pad_token_id=base._pad_token_id, _num_spec_tokens=base._num_spec_tokens)
        step.shape_request = draft_shapes.requested_mode()
        return step

    def build_model_agent_strategy(self):
        if not _ours(self):
            return orig_agent(self)
        return agent_cls(self.specdecode_config.num_speculative_tokens)

    build_step_inputs.__wrapped__ = orig_step  # type: ignore[attr-defined]
    build_model_agent_strategy.__wrapped__ = orig_agent  # type: ignore[attr-defined]
    p.set(ARSpecStrategyFactory, "build_step_inputs", build_step_inputs)
    p.set(ARSpecStrategyFactory, "build_model_agent_strategy", build_model_agent_strategy)

    agent = spec_agent.SpecModelAgent
    require_attrs(agent, ["_rejection_sampling"], "SpecModelAgent")
    p.set(agent, "_rejection_sampling", patched_rejection_sampling(agent.__dict__["_rejection_sampling"], applies))
