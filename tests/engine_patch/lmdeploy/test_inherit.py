"""A plain ``activate(...)`` in Python reaches spawned children with its settings (issue 13 part 4).

Before: only the calling process was patched; LMDeploy's engine process (``enable_mp_engine``) and
TP workers, where the model agent builds the guided manager, came out stock, silently.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import pytest

import tokenrails as tr
import tokenrails.engine_patch.lmdeploy as patch

from . import spawn_child

REPO = Path(__file__).resolve().parents[3]


def spawn(fn):
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn)


def test_spawned_agent_process_gets_the_upgrade_and_the_settings(monkeypatch):
    monkeypatch.delenv("TOKENRAILS_LMDEPLOY", raising=False)
    monkeypatch.delenv("TOKENRAILS_LMDEPLOY_BACKEND", raising=False)
    monkeypatch.delenv("TOKENRAILS_REASONING", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # tokenrails importable, nothing else arranged
    # activate() patches LMDeploy's Ray executor; importing ray sets RAY_CLIENT_MODE once, on its own
    pytest.importorskip("lmdeploy.pytorch.engine.executor.ray_executor")
    before = dict(os.environ)
    patch.activate(backend="fsm", limits=tr.GuideLimits(max_enum_values=77), reasoning="off")
    try:
        report = spawn(spawn_child.report_settings_after_agent_import)
    finally:
        patch.deactivate()
    assert report == {"active": True, "backend": "fsm", "max_enum_values": 77, "reasoning": "off"}
    assert dict(os.environ) == before  # deactivate() put the environment back
    assert spawn(spawn_child.report_settings_after_agent_import)["active"] is False


def _ray_report(**remote_options):
    ray = pytest.importorskip("ray")

    task = ray.remote(spawn_child.report_in_ray_worker).options(**remote_options)
    return ray.get(task.remote(), timeout=120)


def test_ray_worker_gets_the_upgrade_and_the_settings(monkeypatch):
    """A Ray cluster started before ``activate`` (its workers never saw our environment) gets the
    settings through LMDeploy's own ``_update_runtime_envs``, as the Ray executor passes them."""
    ray = pytest.importorskip("ray")
    for name in ("TOKENRAILS_LMDEPLOY", "TOKENRAILS_LMDEPLOY_BACKEND", "TOKENRAILS_REASONING",
                 "TOKENRAILS_LMDEPLOY_LIMITS", "TOKENRAILS_TOOL_CALLS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        assert _ray_report()["active"] is False  # the cluster as it was started: stock
        patch.activate(backend="fsm", limits=tr.GuideLimits(max_enum_values=55), reasoning="off")
        try:
            from lmdeploy.pytorch.engine.executor import ray_executor

            runtime_env = ray_executor._update_runtime_envs({})
            report = _ray_report(runtime_env=runtime_env)
        finally:
            patch.deactivate()
        from lmdeploy.pytorch.engine.executor import ray_executor as rx

        assert "TOKENRAILS_LMDEPLOY" not in rx._update_runtime_envs({}).get("env_vars", {})
    finally:
        ray.shutdown()
    report.pop("pid")
    assert report == {"active": True, "backend": "fsm", "max_enum_values": 55, "reasoning": "off"}
