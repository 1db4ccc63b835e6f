"""A plain ``activate(...)`` in Python reaches spawned children with its settings (issue 13 part 4).

Before: only the calling process was patched; LMDeploy's engine process (``enable_mp_engine``) and
TP workers, where the model agent builds the guided manager, came out stock, silently.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

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
    before = dict(os.environ)
    patch.activate(backend="fsm", limits=tr.GuideLimits(max_enum_values=77), reasoning="off")
    try:
        report = spawn(spawn_child.report_settings_after_agent_import)
    finally:
        patch.deactivate()
    assert report == {"active": True, "backend": "fsm", "max_enum_values": 77, "reasoning": "off"}
    assert dict(os.environ) == before  # deactivate() put the environment back
    assert spawn(spawn_child.report_settings_after_agent_import)["active"] is False
