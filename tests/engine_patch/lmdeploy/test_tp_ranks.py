"""Guided work only on the TP rank that samples (engine_patch/lmdeploy/tp_ranks.py), without an engine:
LMDeploy's own ``base_worker.build_model_agent`` signature, a stand-in agent constructor."""
from __future__ import annotations

import types

import pytest

pytest.importorskip("lmdeploy")

from tokenrails.engine_patch.lmdeploy.step import tp_ranks  # noqa: E402


def _dist_ctx(rank: int, attn_tp: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(rank=rank, dist_config=types.SimpleNamespace(attn_tp=attn_tp))


class _Manager:
    is_tokenrails = True

    def __init__(self, tokenizer, vocab_size):
        self.args = (tokenizer, vocab_size)


def _factory():
    """A stand-in for LMDeploy's factory: the agent builds ``agent_module.GuidedDecodingManager``."""
    agent_module = types.SimpleNamespace(GuidedDecodingManager=_Manager)
    from lmdeploy.pytorch.engine.executor import base_worker

    def build_model_agent(model_path, model_config, cache_config, backend_config, misc_config,
                          dist_ctx=None, device_ctx=None, adapters=None, specdecode_config=None,
                          trust_remote_code=False):
        return agent_module.GuidedDecodingManager("tok", 100)

    build_model_agent.__signature__ = __import__("inspect").signature(base_worker.build_model_agent)
    return agent_module, tp_ranks.patched_build_model_agent(build_model_agent, agent_module)


def _build(factory, rank, attn_tp=3, spec=None):
    return factory(model_path="m", model_config=None, cache_config=None, backend_config=None,
                   misc_config=None, dist_ctx=_dist_ctx(rank, attn_tp), specdecode_config=spec)


def test_only_the_sampling_rank_of_each_tp_group_gets_a_guided_manager():
    agent_module, factory = _factory()
    kinds = [type(_build(factory, r)).__name__ for r in range(6)]
    assert kinds == ["_Manager", "FollowerGuidedManager", "FollowerGuidedManager"] * 2  # two TP=3 groups
    assert agent_module.GuidedDecodingManager is _Manager  # the swap is undone
    assert type(_build(factory, 1, attn_tp=1)) is _Manager  # TP = 1 (DP ranks each sample)


def test_speculative_decoding_keeps_a_manager_per_rank():
    _, factory = _factory()
    assert type(_build(factory, 1, spec=object())) is _Manager


def test_a_worker_processs_rank_boots_its_compile_workers_on_demand(vocab, monkeypatch):
    """A rank built by the worker's factory decodes with the grammars the engine process compiled
    (engine_grammars.py): its manager boots no compile worker with the engine; a manager built in
    the engine's own process (an in-process agent) still does."""
    import threading
    import time

    from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager
    from tokenrails.guided.compile_procs import ProcessCompiler

    warmed, in_process_warmed = [], threading.Event()
    monkeypatch.setattr(ProcessCompiler, "warm", lambda self: (warmed.append(self), in_process_warmed.set()))
    agent_module, factory = _factory()
    agent_module.GuidedDecodingManager = lambda tok, size: LMDeployGuidedManager(tok, size, vocab=vocab)
    rank = _build(factory, 0)
    in_process = LMDeployGuidedManager(None, vocab.vocab_size, vocab=vocab)
    try:
        assert in_process_warmed.wait(30)
        time.sleep(0.5)  # (the rank's manager was built first: a warm-up of its own would be in by now)
        assert rank.core()._procs is not None  # it can still start workers, on demand
        assert warmed == [in_process.core()._procs], warmed
    finally:
        rank.core().close()
        in_process.core().close()


def test_follower_manager_does_nothing_and_refuses_guided_calls():
    follower = tp_ranks.FollowerGuidedManager("tok", 10)
    follower.clear()
    assert follower.is_tokenrails is False  # the agent's step wrappers skip it (no compile, no fill)
    assert bool(follower)  # LMDeploy's `if self.guided_decoding_manager: ...clear()` still runs
    with pytest.raises(AttributeError, match="does not sample"):
        follower.get_processors([], [])


def test_activate_patches_the_worker_factory_and_deactivate_restores_it():
    from lmdeploy.pytorch.engine.executor import base_worker

    import tokenrails.engine_patch.lmdeploy as patch

    original = base_worker.build_model_agent
    patch.activate()
    try:
        assert base_worker.build_model_agent.__wrapped__ is original
    finally:
        patch.deactivate()
    assert base_worker.build_model_agent is original
