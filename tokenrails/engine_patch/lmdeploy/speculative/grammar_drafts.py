"""Grammar drafts: speculative decoding in LMDeploy's engine where the grammar is the draft model.

A guided row's next tokens are often fixed by its grammar (braces, quotes, key names, separators).
``GrammarProposer`` is registered in LMDeploy 0.18's own proposer registry (``SPEC_PROPOSERS``)
under ``METHOD``; with ``SpeculativeConfig(method=METHOD, num_speculative_tokens=k)`` every
step proposes, per guided row, the tokens ``guided.forced.forced_tokens`` finds from the row's
current matcher state (peek only), continued (``settings.lookup_drafts()``, on by default) with
prompt-lookup tokens the grammar allows (``guided.lookup``: what followed the row's last tokens in
its prompt and output). LMDeploy verifies them as any draft: one target forward over
the row's ``1 + k`` positions, the grammar's masks on every position (``spec_helper.py``), its own
rejection sampler, untouched. So the output is that of plain guided decoding: greedy token for
token, sampled in distribution (a draft is accepted with the target's probability of it, which
is 1 where the mask leaves one token). The matcher advances by accepted tokens only (``spec_helper.py``).

A row's forced run may be shorter than ``k`` (often empty: unguided rows, choices); the proposer
ends it with ``adaptive_drafts.PAD`` and the engine verifies only ``1 + (the run)`` positions for
that row (``adaptive_drafts.py``: LMDeploy's sampler cut per row). How the rows reach the target
forward is ``draft_shapes.py``'s choice: ragged (``1 + L_i`` positions, the CPU path) or padded to
one bucketed width for every row (what LMDeploy's CUDA attention kernels and graphs accept).

No draft model: the proposer declares ``needs_draft_model = False``; the agent's draft-model
steps (graph runner, warm-up, draft KV cache) are skipped for it, nothing else of LMDeploy's
speculative path changes. ``activate(grammar_drafts=k)`` / ``TOKENRAILS_GRAMMAR_DRAFTS=k`` turns
it on for engines built without a ``speculative_config`` of their own.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from typing import Any, Callable, Hashable, Sequence

import torch

from ....guided.errors import GuideError
from . import draft_ahead
from ..step.lmdeploy_step import report as report_row_errors
from ....guided.sequence import GuidedRow
from . import adaptive_drafts, draft_metrics, draft_shapes, spec_helper
from .._patching import Patcher, require_attrs
from ..boot import settings
from .adaptive_drafts import PAD

logger = logging.getLogger(__name__)

METHOD = "tokenrails_grammar"
ENV_DRAFTS = settings.ENV_DRAFTS
# verification shapes (draft_shapes.py): "0" ragged, "1" every row padded to k, "buckets", unset: per device
ENV_FIXED = draft_shapes.ENV_SHAPE

__all__ = ["METHOD", "ENV_DRAFTS", "ENV_FIXED", "configured_drafts", "install"]


# ---- settings (the record in boot/settings.py: activate(grammar_drafts=...), its environment) ----
def pop_cli_option(argv: list[str]) -> tuple[list[str], int | None]:
    """``--grammar-drafts K`` / ``--grammar-drafts=K`` taken out of an LMDeploy command line."""
    out: list[str] = []
    value: str | None = None
    it = iter(range(len(argv)))
    for i in it:
        arg = argv[i]
        if arg == "--grammar-drafts":
            if i + 1 >= len(argv):
                raise SystemExit("--grammar-drafts needs a number of draft tokens per step")
            value = argv[i + 1]
            next(it, None)
        elif arg.startswith("--grammar-drafts="):
            value = arg.split("=", 1)[1]
        else:
            out.append(arg)
    if value is None:
        return out, None
    try:
        k = int(value)
    except ValueError:
        raise SystemExit(f"--grammar-drafts takes an integer, got {value!r}") from None
    if k < 0:
        raise SystemExit(f"--grammar-drafts must be >= 0, got {k}")
    return out, k


def configured_drafts() -> int:
    return settings.current().grammar_drafts or 0


# ---- the proposal ----------------------------------------------------------------------------
_ENCODERS: dict[int, tuple[Any, Callable[[str], Sequence[int]]]] = {}
ENCODE_MEMO = 4096  # forced strings remembered per tokenizer


def _encoder(tokenizer: Any) -> Callable[[str], Sequence[int]] | None:
    """Canonical tokenization of a forced string (the model's tokenizer, no special tokens),
    memoised per tokenizer: a grammar forces the same few strings (key names, separators) over
    and over, and each tokenizer call would sit on the step's path."""
    if tokenizer is None or not hasattr(tokenizer, "encode"):
        return None
    held = _ENCODERS.get(id(tokenizer))
    if held is not None and held[0] is tokenizer:
        return held[1]

    @functools.lru_cache(maxsize=ENCODE_MEMO)
    def encode(text: str) -> tuple[int, ...]:
        try:
            return tuple(tokenizer.encode(text, add_special_tokens=False))
        except TypeError:  # a tokenizer without the keyword
            return tuple(tokenizer.encode(text))

    _ENCODERS[id(tokenizer)] = (tokenizer, encode)
    return encode


def plan_drafts(helper: Any, session_ctx: list | None, response_formats: Any, fillers: list[int],
                num_drafts: int, *, guesses: dict | None = None, report: "_PlanReport | None" = None,
                handles: dict | None = None) -> tuple[list[list[int]], list[int], list[int]]:
    """Per row: ``num_drafts`` draft ids (forced tokens, lookup tokens, then the row's filler:
    ``PAD`` in the engine, which verifies no position for it), and how many are grammar drafts and
    how many come from one-token masks. Rows not guided, failed, thinking or with nothing forced get
    fillers only. Every matcher is left where it was.

    ``guesses`` (``draft_ahead``): runs computed beside the previous forward, used for a row only
    when it accepted what the guess assumed. A row whose proposal raises gets fillers and its error
    in ``report`` (the step fails that row only); ``report`` also receives the rows proposed.
    ``handles``: the step's row handles when the caller has them (the accept's, same step)."""
    batch = len(fillers)
    drafts = [[fillers[i]] * num_drafts for i in range(batch)]
    counts, singles = [0] * batch, [0] * batch
    if handles is None:
        handles = helper.get_processors(session_ctx, response_formats) if session_ctx else {}
    if not handles:
        return drafts, counts, singles
    owner = getattr(helper, "_mgr", None)
    if not getattr(owner, "is_tokenrails", False):
        return drafts, counts, singles  # stock helper (upgrade not active): propose nothing
    core = owner.core()
    encode = _encoder(getattr(owner, "_tokenizer", None))
    words = (core.vocab.vocab_size + 31) // 32
    buf = _mask_buffer(words)
    guesses = guesses or {}
    lookup = settings.lookup_drafts()
    take_prompt = getattr(owner, "take_prompt", None)
    for idx, h in handles.items():
        if idx >= batch or h.error is not None:
            continue
        key = None
        try:
            row = h.row  # prepared once per step (reasoning resolved); None when the row failed
            if row is None:
                continue
            key = (row.session_id, row.seq_id)
            guess = guesses.get(key)
            run = core.guessed_run(row, guess) if guess else None
            if run is not None:  # guessed with lookup tokens when lookup was on (``draft_ahead``)
                if report is not None:
                    report.guessed += 1
            else:  # under the step lock; the verification reuses the masks the run saw
                prompt: Any = lookup and (True if take_prompt is None else functools.partial(take_prompt, key))
                run = core.forced_tokens(row, num_drafts, encode=encode, bitmask=buf, propose=True, lookup=prompt)
                if report is not None:
                    report.inline += 1
                    report.missed += guess is not None
        except Exception as exc:  # noqa: BLE001 - one row's failure must not end the others
            err = exc if isinstance(exc, GuideError) else GuideError(
                f"grammar drafts: the proposal failed for this row: {type(exc).__name__}: {exc}")
            h.error = err
            if report is not None:
                report.errors[idx] = err
            logger.warning("tokenrails: grammar-draft proposal failed for row %d: %r", idx, exc)
            continue
        if run.tokens:
            drafts[idx][: len(run.tokens)] = list(run.tokens)
            counts[idx], singles[idx] = len(run.tokens), run.single
        if report is not None:
            report.rows[idx] = (key, row, tuple(run.tokens))
    if report is not None:
        report.core, report.encode = core, encode
    return drafts, counts, singles


_BUFFERS = threading.local()


def _mask_buffer(words: int) -> torch.Tensor:
    """A reusable ``(1, words)`` mask row per thread (engines in one process propose on their own
    threads): a fresh allocation each step costs more than the peek it serves."""
    buf = getattr(_BUFFERS, "row", None)
    if buf is None or buf.shape[1] != words:
        buf = _BUFFERS.row = torch.empty((1, words), dtype=torch.int32)
    return buf


class _PlanReport:
    """What ``plan_drafts`` did beyond the drafts: rows proposed (for the guesses of the next step),
    per-row errors, and how rows were served."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[Hashable, GuidedRow, tuple[int, ...]]] = {}  # batch index -> (key, row, drafts)
        self.errors: dict[int, GuideError] = {}
        self.core: Any = None
        self.encode: Any = None
        self.guessed = self.inline = self.missed = 0


class _Plan:
    """One step's proposal and how it was made (for ``draft_ahead.record`` and the next guesses)."""

    def __init__(self, result: tuple[list[list[int]], list[int], list[int]], report: _PlanReport,
                 critical: float, waited: float):
        self.result, self.report, self.critical, self.waited = result, report, critical, waited


def _ahead_of(proposer: Any) -> draft_ahead.Ahead:
    ahead = proposer.__dict__.get("_tokenrails_ahead")
    if ahead is None:
        ahead = proposer.__dict__["_tokenrails_ahead"] = draft_ahead.Ahead()
    return ahead


def _plan(proposer: Any, ctx: Any, formats: Any, pads: list[int], k: int, handles: dict | None = None) -> _Plan:
    """The step's proposal: guesses joined, the other rows proposed on this thread."""
    t0 = time.perf_counter()
    ahead = _ahead_of(proposer)
    guesses, waited = ahead.take()
    if ahead.lookup != settings.lookup_drafts():
        guesses = {}  # made under the other lookup setting
    report = _PlanReport()
    result = plan_drafts(proposer.guided_helper, ctx, formats, pads, k, guesses=guesses, report=report,
                         handles=handles)
    return _Plan(result, report, time.perf_counter() - t0, waited)


def _follow_accept(proposer: Any) -> None:
    """Have the spec helper propose right after it accepts a step's tokens, in the same thread hop
    (or inline): the proposal needs only the accepted state and the step's row handles."""
    st = spec_helper.state_of(proposer.guided_helper)
    if st is None or st.follow is not None:
        return
    k = int(proposer.num_speculative_tokens)

    def follow(handles: dict, batch: int) -> _Plan:
        return _plan(proposer, None, None, [PAD] * batch, k, handles=handles)

    st.follow = follow


async def _propose_rows(proposer: Any, ctx: Any, formats: Any, pads: list[int], k: int
                        ) -> tuple[list[list[int]], list[int], list[int]]:
    """The step's proposal: the one made after the accept when there is one, else made here (inline
    for a short step, else off the event loop); errors reported for their rows, and the next step's
    guesses started beside the coming forward."""
    helper = proposer.guided_helper
    st = spec_helper.state_of(helper)
    plan = st.take_planned(ctx) if st is not None else None
    if plan is None or len(plan.result[0]) != len(pads):
        handles = helper.get_processors(ctx, formats) if ctx else {}
        if not handles or (st is not None and st.short(handles)):
            plan = _plan(proposer, ctx, formats, pads, k, handles=handles)
        else:
            plan = await asyncio.to_thread(_plan, proposer, ctx, formats, pads, k, handles)
    report = plan.report
    if report.errors:
        report_row_errors(getattr(helper, "_mgr", None), report.errors)
    if st is not None and report.core is not None and report.rows and draft_ahead.prefill_enabled():
        st.prefill = _ahead_of(proposer).submit(_prefill, report.core, report.rows, len(pads))
    if draft_ahead.enabled() and report.core is not None:
        _ahead_of(proposer).start(report.core, list(report.rows.values()), k, report.encode, settings.lookup_drafts())
    draft_ahead.record(plan.critical, plan.waited, report.guessed, report.inline, report.missed)
    _follow_accept(proposer)
    return plan.result


def _prefill(core: Any, proposed: dict[int, tuple[Hashable, GuidedRow, tuple[int, ...]]], batch: int) -> Any:
    """The next verification's masks, filled on the worker while its forward runs (the drafts are
    known and the rows stand where the verification finds them); the verification applies them
    when they still fit (``GuidedDecodingManager.apply_filled_spec``), else fills its own."""
    rows: list[GuidedRow | None] = [None] * batch
    drafts: list[tuple[int, ...]] = [()] * batch
    for idx, (_, row, run) in proposed.items():
        if idx < batch:
            rows[idx], drafts[idx] = row, run
    return core.fill_spec(rows, drafts)


def _proposer_class():
    from lmdeploy.pytorch.spec_decode.proposers.base import BaseSpecProposer, ProposalMethod
    from lmdeploy.pytorch.strategies.ar_spec.model_agent import ARSpecExtraInputs

    class GrammarProposer(BaseSpecProposer):
        """Drafts the tokens each guided row's grammar forces; no draft model.

        Uses the agent's one-shot proposal hook (``ProposalMethod.DIFFUSION``: "propose the
        whole block at once"), so the agent never runs a draft-model forward for it.
        """

        proposal_method = ProposalMethod.DIFFUSION
        needs_draft_model = False

        def __init__(self, specdecode_config: Any, device: Any = None):
            super().__init__(specdecode_config, device=device)
            self._last: dict[Hashable, tuple[int, int]] = {}  # the previous step's (drafted, forced) by row key
            logger.warning("tokenrails: grammar drafts on: up to %d forced (then lookup) tokens drafted per guided "
                           "row and step, no draft model", self.num_speculative_tokens)

        def build_model(self, empty_init: bool, target_model: torch.nn.Module = None, build_model_ctx=None):
            self.target_model = target_model  # nothing to build

        async def get_outputs(self, *args: Any, **kwargs: Any):
            raise RuntimeError("grammar drafts have no draft-model forward (one-shot proposal only)")

        async def propose(self, model_inputs: Any, extra_inputs: Any, sampling_inputs: Any, proposal_ctx: Any = None):
            batch = int(model_inputs.seq_length.size(0))
            k = int(self.num_speculative_tokens)
            next_ids = extra_inputs.next_token_ids
            pads = [PAD] * batch  # a row's forced run ends where PAD begins: nothing past it is kept
            ctx = sampling_inputs.session_ctx if sampling_inputs is not None else None
            keys = draft_metrics.row_keys(ctx, batch)
            self._account(model_inputs, extra_inputs, keys)
            if model_inputs.is_chunk and not model_inputs.is_last_chunk:
                drafts, counts, singles = [[pads[i]] * k for i in range(batch)], [0] * batch, [0] * batch
            else:
                drafts, counts, singles = await _propose_rows(
                    self, ctx, sampling_inputs.response_formats if sampling_inputs is not None else None, pads, k)
            self._last = {key: (counts[i], singles[i]) for i, key in enumerate(keys) if key is not None}
            device = next_ids.device if next_ids is not None else model_inputs.input_ids.device
            out = torch.tensor(drafts, dtype=torch.long, device=device).reshape(batch, k)
            return ARSpecExtraInputs(
                output_draft_token_ids=out,
                next_token_ids=extra_inputs.next_token_ids,
                num_rejected_tokens=extra_inputs.num_rejected_tokens,
                output_token_ids=extra_inputs.output_token_ids,
                logprobs=extra_inputs.logprobs,
            )

        def _account(self, model_inputs: Any, extra_inputs: Any, keys: list[Hashable]) -> None:
            """Credit the previous step's drafts with what this step's verification accepted."""
            out_ids = extra_inputs.output_token_ids
            if out_ids is None or model_inputs.is_dummy:
                return
            prev = self._last if model_inputs.is_decoding else {}  # a prefill verified nothing
            emitted = draft_metrics.emitted_counts(out_ids, draft_metrics.stop_ids(self))
            plans = [prev.get(key) for key in keys]
            draft_metrics.defer(model_inputs, lambda stopped: draft_metrics.record_grammar_step(
                keys, emitted, plans, stopped))

    GrammarProposer.__module__ = __name__
    GrammarProposer.__qualname__ = "GrammarProposer"
    return GrammarProposer


# ---- installation ----------------------------------------------------------------------------
def speculative_config_for(speculative_config: Any) -> Any:
    """The engine's speculative config: the user's own when given, else grammar drafts when
    configured (k > 0), else None (no speculative decoding)."""
    if speculative_config is not None or configured_drafts() <= 0:
        return speculative_config
    from lmdeploy.messages import SpeculativeConfig

    return SpeculativeConfig(method=METHOD, num_speculative_tokens=configured_drafts())


def _model_free(agent: Any) -> bool:
    return getattr(getattr(agent, "proposer", None), "needs_draft_model", True) is False


def install(p: Patcher) -> None:
    """Register the proposer and let LMDeploy's speculative agent run it without a draft model."""
    from lmdeploy.pytorch import config as config_mod
    from lmdeploy.pytorch.engine import config_builder
    from lmdeploy.pytorch.spec_decode import spec_agent
    from lmdeploy.pytorch.spec_decode.proposers.base import SPEC_PROPOSERS

    # a copy of the registry's table, so that deactivate() takes the method away again
    p.set(SPEC_PROPOSERS, "_module_dict", dict(SPEC_PROPOSERS.module_dict))
    SPEC_PROPOSERS.register_module(name=METHOD, module=_proposer_class(), force=True)

    agent_cls = spec_agent.SpecModelAgent
    require_attrs(agent_cls, ["build_graph_runner", "warmup", "get_model"], "SpecModelAgent")
    for name in ("build_graph_runner", "warmup", "get_model"):
        original = agent_cls.__dict__[name]

        def skip(self, *args: Any, __original=original, **kwargs: Any):
            if _model_free(self):
                return None  # no draft model: no graph runner, no warm-up, no weights
            return __original(self, *args, **kwargs)

        skip.__wrapped__ = original  # type: ignore[attr-defined]
        p.set(agent_cls, name, skip)

    spec_cfg = config_mod.SpecDecodeConfig
    require_attrs(spec_cfg, ["from_config"], "SpecDecodeConfig")
    original_from = spec_cfg.__dict__["from_config"].__func__

    def from_config(cls, method: str, *args: Any, **kwargs: Any):
        obj = original_from(cls, method, *args, **kwargs)
        if method == METHOD:
            obj.cache_config = None  # no draft KV cache
        return obj

    from_config.__wrapped__ = original_from  # type: ignore[attr-defined]
    p.set(spec_cfg, "from_config", classmethod(from_config))

    # each row verifies only its forced run: ragged decode inputs, LMDeploy's sampler cut per row
    adaptive_drafts.install(p, METHOD, _model_free)

    builder = config_builder.ConfigBuilder
    require_attrs(builder, ["build_specdecode_config"], "ConfigBuilder")
    original_build = builder.__dict__["build_specdecode_config"].__func__

    def build_specdecode_config(target_model, speculative_config, *args: Any, **kwargs: Any):
        return original_build(target_model, speculative_config_for(speculative_config), *args, **kwargs)

    build_specdecode_config.__wrapped__ = original_build  # type: ignore[attr-defined]
    p.set(builder, "build_specdecode_config", staticmethod(build_specdecode_config))
