"""One settings record (boot/settings.py ``Settings``): built from ``activate()``'s arguments over
the environment, exported once, read back whole by a spawned child; a later ``activate()`` call
only adds options, and ``deactivate()`` forgets them."""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
from pathlib import Path

import pytest

pytest.importorskip("lmdeploy")

import tokenrails.engine_patch.lmdeploy as patch  # noqa: E402
from tokenrails.engine_patch.lmdeploy.boot import settings  # noqa: E402
from tokenrails.guided.limits import GuideLimits  # noqa: E402
from tokenrails.guided.reasoning import ReasoningConfig  # noqa: E402

from . import spawn_child  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("TOKENRAILS_LMDEPLOY", "TOKENRAILS_LMDEPLOY_BACKEND", "TOKENRAILS_LMDEPLOY_LIMITS",
                 "TOKENRAILS_LMDEPLOY_FILL_THREADS", "TOKENRAILS_REASONING", "TOKENRAILS_TOOL_CALLS",
                 "TOKENRAILS_GRAMMAR_DRAFTS", "TOKENRAILS_BUDGET", "TOKENRAILS_LOOKUP_DRAFTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO))


def test_a_spawned_child_reads_every_setting_the_record_holds(clean_env):
    patch.activate(backend="fsm", limits=GuideLimits(max_enum_values=77), fill_threads=3, reasoning="off",
                   tool_calls=False, grammar_drafts=2, budget="close", lookup_drafts=False)
    try:
        mine = settings.current()
        with mp.get_context("spawn").Pool(1) as pool:
            child = pool.apply(spawn_child.report_settings_record)
    finally:
        patch.deactivate()
    unset = [f.name for f in dataclasses.fields(mine) if getattr(mine, f.name) is None]
    assert unset == [], f"the test must set every setting: {unset}"
    assert child == mine


def test_a_second_activate_keeps_the_first_one_s_options(clean_env):
    """``activate`` again with other options (a script, then the CLI): the earlier ones stay,
    a ``ReasoningConfig`` object too (it never travels through the environment)."""
    config = ReasoningConfig(start_ids=(1,), end_ids=(2,))
    patch.activate(reasoning=config, backend="fsm")
    try:
        patch.activate(budget="close")
        assert settings.reasoning_default() is config or getattr(settings.reasoning_default(), "config", None) is config
        assert settings.backend() == "fsm" and settings.budget_default() == "close"
    finally:
        patch.deactivate()


def test_deactivate_forgets_the_options(clean_env):
    patch.activate(backend="fsm", limits=GuideLimits(max_enum_values=77), fill_threads=3)
    patch.deactivate()
    assert (settings.backend(), settings.manager_limits(), settings.manager_fill_threads()) == ("auto", None, None)
