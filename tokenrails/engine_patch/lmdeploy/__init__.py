"""Drop-in upgrade of LMDeploy's PyTorch-engine structured output (``activate()`` / ``deactivate()``).

``activate()`` patches LMDeploy in this process; ``TOKENRAILS_LMDEPLOY=1`` plus the start-up hook
(``startup.py``, installed as a ``.pth`` file) activates it in every process that imports
LMDeploy's engine (api_server engine process, TP workers). Patch points are found by
inspection; an LMDeploy without one fails with ``UnsupportedLMDeployError`` naming it.
See docs/lmdeploy.md.
"""
from __future__ import annotations

import importlib
import sys
import threading
from typing import Any

from ...guided.limits import GuideLimits
from .boot import inherit
from ._patching import Patcher, UnsupportedLMDeployError, is_patched, require_attrs, require_params

__all__ = ["UnsupportedLMDeployError", "activate", "deactivate", "is_active", "ENV_FLAG"]

ENV_FLAG = inherit.ENV_FLAG  # owned by the start-up hook (startup.py)
_PATCHER = Patcher()
_LOCK = threading.RLock()
_ACTIVE = False
_APPLYING = False  # the patches are going in on this thread (under _LOCK): a nested call returns


def is_active() -> bool:
    return _ACTIVE


def _patched_elsewhere() -> bool:
    """LMDeploy in this process already carries the upgrade, put there by another copy of this
    package (the first patch point's process-wide mark, _patching.py)."""
    gd = _mod("lmdeploy._guided_decoding")
    return is_patched(gd, "ensure_response_format_compilable")


def _mod(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise UnsupportedLMDeployError(f"cannot import {name}: {exc}") from exc


def _apply(p: Patcher) -> None:
    from .step import agent as agent_patch
    from .server import engines
    from .speculative import spec_helper as spec_patch
    from .step import lmdeploy_step as step_patch
    from .step import strategies as strat_patch
    from .step.rank_manager import LMDeployGuidedManager

    # -- request parsing / early validation (every name that bound the stock check) ----------
    gd = _mod("lmdeploy._guided_decoding")
    require_attrs(gd, ["ensure_response_format_compilable"], "lmdeploy._guided_decoding")
    from .server import front_check  # the early check off the event loop, request-level refusals

    engines.remember_stock_check(gd.ensure_response_format_compilable)
    p.set(gd, "ensure_response_format_compilable", front_check.ensure_response_format_compilable)
    ae = _mod("lmdeploy.serve.core.async_engine")
    if hasattr(ae, "ensure_response_format_compilable"):
        p.set(ae, "ensure_response_format_compilable", front_check.ensure_response_format_compilable)
    # which engine runs the request decides what may be promised (TurboMind: stock's kinds only)
    require_attrs(ae.AsyncEngine, ["preprocess", "_build_pytorch"], "AsyncEngine")

    p.set(ae.AsyncEngine, "preprocess",
          engines.patched_preprocess(front_check.checked_preprocess(ae.AsyncEngine.preprocess)))
    front_check.patch_chat_runner(p)
    _patch_session_budget(p, ae)
    from .server import body_limits  # request bodies bounded before LMDeploy parses them (body_limits.py)

    body_limits.install(p)
    from .server import handle_pool  # the engine's request handles shared fairly between clients

    handle_pool.install(p)
    _patch_server_module(p)
    from .server import error_relay  # engine-side typed errors reach the HTTP response with their message

    error_relay.patch(p)
    from .boot import mp_start  # the engine process survives LMDeploy's start-up race (mp_start.py)

    mp_start.install(p)
    from .boot import mp_stop  # a stopped api_server exits although its engine process is gone (mp_stop.py)

    mp_stop.install(p)
    p.set(ae.AsyncEngine, "__init__", engines.patched_async_engine_init(ae.AsyncEngine.__init__))
    _widen_server_format(p)
    _patch_harmony(p)
    _patch_tool_calls(p)
    from .server import empty_answer  # "" (not null) when the client's constraint allows the empty answer

    empty_answer.install(p)

    # -- sampling strategies ---------------------------------------------------------------------
    ar = _mod("lmdeploy.pytorch.strategies.ar.sampling").ARSamplingStrategy
    require_params(ar.make_sampling_inputs, ["seqs"], "ARSamplingStrategy.make_sampling_inputs")
    p.set(ar, "make_sampling_inputs", strat_patch.patched_ar_make_sampling_inputs(ar.make_sampling_inputs))
    dllm = _mod("lmdeploy.pytorch.strategies.dllm.sampling").DLLMSamplingStrategy
    if "make_sampling_inputs" in dllm.__dict__:
        p.set(dllm, "make_sampling_inputs",
              strat_patch.patched_dllm_make_sampling_inputs(dllm.__dict__["make_sampling_inputs"]))

    from .step import waiting_rows  # a sequence whose grammar is not compiled waits outside the batch

    ps = _mod("lmdeploy.pytorch.paging.prefill_scheduler")
    require_attrs(ps, ["_PrefillScheduler"], "paging.prefill_scheduler")
    require_params(ps._PrefillScheduler.schedule, ["waiting"], "_PrefillScheduler.schedule")
    waiting_rows.install(p, ps)

    # -- logits processor ------------------------------------------------------------------------
    lp = _mod("lmdeploy.pytorch.engine.logits_process")
    flp = lp.FusedLogitsProcessor
    require_params(flp.__init__, ["sampling_inputs", "logprobs_mode", "guided_decoding_manager"],
                   "FusedLogitsProcessor.__init__")
    require_attrs(flp, ["accept_guided_tokens", "cleanup_sessions", "sampling", "_wait_stream_once"],
                  "FusedLogitsProcessor")
    require_attrs(lp.SamplingInputs, ["session_ctx", "session_to_cleanup", "response_formats"], "SamplingInputs")
    p.set(flp, "__init__", step_patch.patched_init(flp.__init__))
    p.set(flp, "__call__", step_patch.patched_call(flp.__call__))
    p.set(flp, "accept_guided_tokens", step_patch.patched_accept(flp.accept_guided_tokens))
    p.set(flp, "cleanup_sessions", step_patch.patched_cleanup(flp.cleanup_sessions))

    # -- model agent: our manager per rank, prefetch, per-step context, errors ------------------
    am = _mod("lmdeploy.pytorch.engine.model_agent.agent")
    require_attrs(am, ["GuidedDecodingManager", "BaseModelAgent", "BatchedOutputs", "Tokenizer"], "model_agent.agent")
    p.set(am, "GuidedDecodingManager", LMDeployGuidedManager)
    from .step import engine_grammars  # TP: the scheduler's process compiles for its ranks

    eng = _mod("lmdeploy.pytorch.engine.engine")
    require_params(eng.Engine.__init__, ["model_path", "trust_remote_code"], "Engine.__init__")
    engine_grammars.install(p, eng, ae.AsyncEngine, am)
    base = am.BaseModelAgent
    require_params(base._step_postprocess_with_output, ["inputs"], "BaseModelAgent._step_postprocess_with_output")
    require_params(base._async_step, ["inputs", "sampling_inputs"], "BaseModelAgent._async_step")
    p.set(base, "_async_step", step_patch.patched_async_step(base._async_step))
    p.set(base, "_step_postprocess_with_output", step_patch.patched_postprocess(base._step_postprocess_with_output))
    from .step import stopped_rows  # rows that stopped get no guided work in the step after

    stopped_rows.install(p)
    from .step import tp_ranks  # TP > 1: guided work only on the rank that samples (tp_ranks.py)

    bw = _mod("lmdeploy.pytorch.engine.executor.base_worker")
    require_params(bw.build_model_agent, ["dist_ctx", "specdecode_config"], "base_worker.build_model_agent")
    tp_ranks.install(p, am, bw)
    for name in ("to_cpu", "to_numpy", "to_tensor"):
        if hasattr(am.BatchedOutputs, name):
            p.set(am.BatchedOutputs, name, agent_patch.patched_convert(getattr(am.BatchedOutputs, name)))
    el = _mod("lmdeploy.pytorch.engine.engine_loop").EngineLoop
    require_params(el._make_infer_outputs, ["batched_outputs", "running"], "EngineLoop._make_infer_outputs")
    p.set(el, "_make_infer_outputs", agent_patch.patched_make_infer_outputs(el._make_infer_outputs))

    # -- Ray workers (TP / DP on a Ray cluster): our settings in their runtime_env ----------------
    try:
        rx = importlib.import_module("lmdeploy.pytorch.engine.executor.ray_executor")
    except ImportError:  # Ray not installed: LMDeploy cannot start Ray workers either
        rx = None
    if rx is not None:
        require_attrs(rx, ["_update_runtime_envs"], "ray_executor")
        p.set(rx, "_update_runtime_envs", inherit.patched_update_runtime_envs(rx._update_runtime_envs))

    # -- speculative decoding helper -----------------------------------------------------------
    gsh = _mod("lmdeploy.pytorch.spec_decode.guided_spec_helper").GuidedSpecHelper
    for name, make in (
        ("get_processors", spec_patch.patched_get_processors),
        ("cleanup_sessions", spec_patch.patched_cleanup),
        ("prepare_bitmask", spec_patch.patched_prepare_bitmask),
        ("apply_bitmask", spec_patch.patched_apply_bitmask),
        ("accept_draft_tokens", spec_patch.patched_accept_draft),
        ("apply_serial_bitmask", spec_patch.patched_serial_bitmask),
        ("accept_rejection_sampled_tokens", spec_patch.patched_accept_rejection),
    ):
        require_attrs(gsh, [name], "GuidedSpecHelper")
        p.set(gsh, name, make(getattr(gsh, name)))

    # -- grammar drafts: a model-free proposer in LMDeploy's proposer registry (grammar_drafts.py)
    from .speculative import grammar_drafts

    grammar_drafts.install(p)
    # -- grammar-aware drafts for draft models (EAGLE...) and per-request draft counters ----------
    from .speculative import draft_usage, grammar_eagle

    grammar_eagle.install(p)
    draft_usage.install(p)  # the counters in the api_server's usage ("speculative")


def _patch_session_budget(p: Patcher, ae: Any) -> None:
    """A ``max_tokens`` cut to fit the session is said in the response (session_budget.py)."""
    from .server import session_budget

    p.set(ae.AsyncEngine, "preprocess", session_budget.patched_preprocess(ae.AsyncEngine.preprocess))


def _patch_server_module(p: Patcher) -> None:
    """The api_server module's own patches, now or when it is imported (server_module.py)."""
    from .server import body_limits, session_budget
    from .server.server_module import when_server_loaded

    def apply(server: Any) -> None:
        require_attrs(server, ["mount_metrics"], "lmdeploy.serve.openai.api_server")
        p.set(server, "mount_metrics", session_budget.patched_mount_metrics(server.mount_metrics))
        body_limits.patch_server(p, server)

    when_server_loaded(p, apply)


def _patch_tool_calls(p: Patcher) -> None:
    """Tool-call arguments enforced for ``auto`` and named ``tool_choice`` (tool_calls.py)."""
    try:
        rp = importlib.import_module("lmdeploy.serve.parsers.response_parser")
    except ImportError:  # no server parsers in this LMDeploy: no tool calls to constrain
        return
    from .server import tool_calls

    base = rp.BaseResponseParser
    require_params(base.__init__, ["request"], "BaseResponseParser.__init__")
    p.set(base, "__init__", tool_calls.patched_parser_init(base.__init__))


def _patch_harmony(p: Patcher) -> None:
    """gpt-oss: wrap choice/grammar in the final channel; refuse, never clear, what cannot be wrapped."""
    try:
        harmony = importlib.import_module("lmdeploy.serve.parsers._openai_harmony")
    except ImportError:  # no harmony support in this LMDeploy (or its server extras): nothing clears
        return
    from .server import engines

    for owner in vars(harmony).values():
        if isinstance(owner, type) and "_build_response_format_grammar" in owner.__dict__:
            original = owner.__dict__["_build_response_format_grammar"]
            p.set(owner, "_build_response_format_grammar",
                  engines.patched_build_response_format_grammar(original.__func__ if isinstance(original, staticmethod) else original))
        if isinstance(owner, type) and "_maybe_inject_tool_grammar" in owner.__dict__:
            p.set(owner, "_maybe_inject_tool_grammar",
                  engines.patched_maybe_inject_tool_grammar(owner.__dict__["_maybe_inject_tool_grammar"]))


def _widen_server_format(p: Patcher) -> None:
    """Let ``choice``, ``grammar`` and ``structural_tag`` through the OpenAI server's schema."""
    try:
        proto = importlib.import_module("lmdeploy.serve.openai.protocol")
    except ImportError:  # server extras (fastapi) not installed: nothing to widen
        return
    from ...requests.response_format import BUDGET_KEY
    from .server import request_fields
    from .server.request_parsing import WideResponseFormat

    req = proto.ChatCompletionRequest
    field = req.model_fields.get("response_format")
    if field is None:
        return
    p.set(field, "annotation", WideResponseFormat | None)
    p.set(proto, "ResponseFormat", WideResponseFormat)
    req.model_rebuild(force=True)
    # vLLM's guided_* / structured_outputs fields, read and folded into response_format (request_fields.py)
    request_fields.widen(p, req, {BUDGET_KEY: Any})  # tokenrails_budget for tool calls (tool_budget.py)
    completions = importlib.import_module("lmdeploy.serve.openai.endpoints.completions")
    require_attrs(completions, ["build_serving_generation_config"], "endpoints.completions")
    request_fields.widen(p, proto.CompletionRequest, {"response_format": WideResponseFormat | None})
    p.set(completions, "build_serving_generation_config",
          request_fields.folding_generation_config(completions.build_serving_generation_config))


def activate(*, backend: str | None = None, limits: GuideLimits | None = None,
             fill_threads: int | None = None, reasoning: Any = None,
             tool_calls: bool | None = None, grammar_drafts: int | None = None,
             budget: str | None = None, lookup_drafts: bool | None = None) -> None:
    """Patch LMDeploy in this process, once. Options apply to managers built afterwards.

    Idempotent in every process: a second call only updates the options; a call made while the
    patches are going in (the start-up hook fires when ``_apply`` imports LMDeploy's engine, as in
    a spawned TP rank that re-imports a script calling ``activate()`` at module level) returns at
    once; LMDeploy objects patched by another copy of this package are left as they are.

    ``reasoning``: the engine-wide reasoning default ("auto", "off", "START,END[,optional]
    [,max=N]", a ``ReasoningConfig``); None → ``$TOKENRAILS_REASONING`` → "auto". See
    tokenrails/engine_patch/reasoning_settings.py and docs/lmdeploy.md.
    ``tool_calls``: enforce tool-call arguments for ``auto`` and named ``tool_choice`` too
    (tool_calls.py); None → ``$TOKENRAILS_TOOL_CALLS`` → on.
    ``grammar_drafts``: k > 0 → engines built without a ``speculative_config`` draft the tokens
    the grammar forces, k per step (grammar_drafts.py); 0 → off; None → ``$TOKENRAILS_GRAMMAR_DRAFTS``.
    ``budget``: "close" → every constrained request is closed within its ``max_tokens``
    (guided/budget.py) unless it sends ``response_format["tokenrails_budget"]`` itself ("off" opts
    out); "off" → only requests that ask; None → ``$TOKENRAILS_BUDGET`` → off.
    ``lookup_drafts``: grammar drafts continue past the forced run with prompt-lookup tokens the
    grammar allows (guided/lookup.py); None → ``$TOKENRAILS_LOOKUP_DRAFTS`` → on.
    """
    global _ACTIVE, _APPLYING
    from .boot import settings

    with _LOCK:
        if _APPLYING:  # re-entered from the import hook while our own _apply imports LMDeploy
            return
        record = settings.configure(backend=backend, limits=limits, fill_threads=fill_threads, reasoning=reasoning,
                                    tool_calls=tool_calls, grammar_drafts=grammar_drafts, budget=budget,
                                    lookup_drafts=lookup_drafts)
        inherit.export(record)  # every child process too
        if _ACTIVE:
            return
        _APPLYING = True
        try:
            if not _patched_elsewhere():
                _apply(_PATCHER)
        except BaseException:
            _PATCHER.undo()
            _rebuild_server_models()
            raise
        finally:
            _APPLYING = False
        _ACTIVE = True


def deactivate() -> None:
    """Restore every patched attribute and the environment ``activate`` exported (managers already
    built keep working until dropped)."""
    global _ACTIVE
    with _LOCK:
        _PATCHER.undo()
        _rebuild_server_models()
        inherit.restore()
        from .boot import settings

        settings.reset()
        _ACTIVE = False


def _rebuild_server_models() -> None:
    proto = sys.modules.get("lmdeploy.serve.openai.protocol")
    if proto is not None:
        proto.ChatCompletionRequest.model_rebuild(force=True)
        proto.CompletionRequest.model_rebuild(force=True)
