"""Guided work once per TP group, on the rank that samples - not once per rank.

LMDeploy's model agent samples on the ranks with ``need_output`` (``rank % attn_tp == 0``: rank 0 of
each attention-TP group); ``broadcast_next_token`` then sends that rank's tokens to the others, which
never run the logits processor. Every rank still builds ``agent.guided_decoding_manager``; with the
upgrade that manager builds the tokenizer's ``Vocabulary`` in a thread, and the agent's step wrappers
compile each guided row's grammar before the forward (``agent.patched_async_step``) and fill its
mask during the forward (``overlap.start``) - work a follower then throws away. At TP = 8 that is
eight compiles and eight fills per guided step on the host's shared cores.

Here the TP worker's agent factory gives a follower rank a :class:`FollowerGuidedManager` instead: it is
not a tokenrails manager (``is_tokenrails`` is False), so the step wrappers skip it, and it builds
nothing. The ranks that keep a manager take their grammars compiled from the engine process
(engine_grammars.py), so it starts its compile workers on demand, not with the engine.
Speculative decoding keeps one manager per rank (its draft side may consult it on every
rank; see docs/lmdeploy.md "Scaling out").
"""
from __future__ import annotations

import inspect
import threading
from typing import Any, Callable

from . import guided_meter
from .._patching import DoublePatchError


class FollowerGuidedManager:
    """The guided manager of a TP rank that does not sample: holds nothing, does nothing.

    LMDeploy calls only ``clear()`` on a follower's manager (on stop/sleep); its tokens come from
    the sampling rank's broadcast, so nothing here can leave a step unconstrained. Any other guided
    call fails loudly (``AttributeError`` naming the call), which would mean this module misreads
    the engine.
    """

    is_tokenrails = False

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    def clear(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"tokenrails: guided call {name!r} on a TP rank that does not sample")


def samples(dist_ctx: Any) -> bool:
    """LMDeploy's rule for the ranks that sample (``BaseModelAgent.need_output``)."""
    config = getattr(dist_ctx, "dist_config", None)
    if dist_ctx is None or config is None:
        return True
    attn_tp = int(getattr(config, "attn_tp", 1) or 1)
    return int(getattr(dist_ctx, "rank", 0)) % attn_tp == 0


_SWAP_LOCK = threading.Lock()


def patched_build_model_agent(original: Callable, agent_module: Any) -> Callable:
    """``base_worker.build_model_agent`` (how every TP worker builds its agent): on a follower rank
    (and no speculative decoding) the agent's ``guided_decoding_manager`` is a
    :class:`FollowerGuidedManager`. (Not a wrapper of ``BaseModelAgent.__init__``: the CPU device
    path wraps that one, and ``deactivate()`` must not take its wrapper away.)"""
    if getattr(original, "_tokenrails_tp_ranks", False):  # its lock is not reentrant: wrap once
        raise DoublePatchError("tokenrails: base_worker.build_model_agent is already wrapped by tp_ranks")
    sig = inspect.signature(original)

    def build_model_agent(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind_partial(*args, **kwargs).arguments
        guided_meter.set_rank(getattr(bound.get("dist_ctx"), "rank", None))
        if samples(bound.get("dist_ctx")) or bound.get("specdecode_config") is not None:
            from .rank_manager import GUIDES_FROM_ENGINE

            token = GUIDES_FROM_ENGINE.set(True)  # its grammars compile in the engine process
            try:
                return original(*args, **kwargs)
            finally:
                GUIDES_FROM_ENGINE.reset(token)
        with _SWAP_LOCK:  # the agent's constructor builds its manager from this module global
            saved = agent_module.GuidedDecodingManager
            agent_module.GuidedDecodingManager = FollowerGuidedManager
            try:
                return original(*args, **kwargs)
            finally:
                agent_module.GuidedDecodingManager = saved

    build_model_agent.__wrapped__ = original  # type: ignore[attr-defined]
    build_model_agent._tokenrails_tp_ranks = True  # type: ignore[attr-defined]
    return build_model_agent


def install(patcher: Any, agent_module: Any, worker_module: Any) -> None:
    """Called by ``activate()`` (reverted by ``deactivate()`` with the rest of its patches)."""
    patcher.set(worker_module, "build_model_agent",
                patched_build_model_agent(worker_module.build_model_agent, agent_module))
    guided_meter.install(patcher)
