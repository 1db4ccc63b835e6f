"""Every-process activation: a spawned child (multiprocessing "spawn") sees the upgrade.

The ``.pth`` hook is written into this interpreter's site-packages for the test (exactly what
``tokenrails lmdeploy install-hook`` does) under a unique name and removed afterwards; it is
inert without ``TOKENRAILS_LMDEPLOY=1``.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import uuid
from pathlib import Path

import pytest

from tokenrails.engine_patch.lmdeploy import startup

from . import spawn_child

REPO = Path(__file__).resolve().parents[3]


def test_a_pth_line_written_by_0_1_0_still_finds_the_hook():
    """Users' site-packages keep the ``.pth`` line ``install-hook`` wrote; 0.1.0's loads
    ``engine_patch/lmdeploy/startup.py`` on every interpreter start (a missing file there is an
    error at each start and no upgraded children)."""
    import importlib.util

    root = Path(importlib.util.find_spec("tokenrails").submodule_search_locations[0])
    assert (root / "engine_patch" / "lmdeploy" / "startup.py").read_text(encoding="utf-8").count("def install(") == 1
    assert "'engine_patch', 'lmdeploy', 'startup.py'" in startup.PTH_LINE


def test_shipped_pth_file_matches_hook_line():
    shipped = Path(startup.__file__).with_name(startup.PTH_NAME)
    assert shipped.read_text(encoding="utf-8") == startup.PTH_LINE


@pytest.fixture
def pth_hook(monkeypatch):
    site = startup.site_dir()
    if not os.access(site, os.W_OK):
        pytest.skip(f"site-packages {site} is not writable")
    name = f"tokenrails_lmdeploy_test_{uuid.uuid4().hex[:8]}.pth"
    startup.install_pth(site, name)
    paths = [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))  # tokenrails importable at start-up
    try:
        yield
    finally:
        startup.uninstall_pth(site, name)


def _run_in_spawned_child(func):
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(func)


def test_spawned_child_is_upgraded(pth_hook, monkeypatch):
    monkeypatch.setenv("TOKENRAILS_LMDEPLOY", "1")
    rep = _run_in_spawned_child(spawn_child.report_after_engine_import)
    assert rep["active"] and rep["logits_patched"]
    assert rep["manager"] == "LMDeployGuidedManager"
    assert rep["before"]["tokenrails"] is False  # the hook itself imported nothing heavy


def test_hook_costs_nothing_without_lmdeploy(pth_hook, monkeypatch):
    monkeypatch.setenv("TOKENRAILS_LMDEPLOY", "1")
    rep = _run_in_spawned_child(spawn_child.report_without_lmdeploy)
    assert rep == {"tokenrails": False, "torch": False, "lmdeploy": False, "hook": True}


def test_spawned_child_without_flag_is_stock(pth_hook, monkeypatch):
    monkeypatch.delenv("TOKENRAILS_LMDEPLOY", raising=False)
    monkeypatch.delenv("TOKENRAILS_LMDEPLOY_CPU", raising=False)
    rep = _run_in_spawned_child(spawn_child.report_after_engine_import)
    assert not rep["active"] and not rep["logits_patched"]
    assert rep["manager"] == "GuidedDecodingManager"


def test_cpu_flag_registers_the_cpu_device_in_a_spawned_child_without_the_upgrade(pth_hook, monkeypatch):
    """TP workers and the api_server's engine process are spawned: ``cpu.enable()`` in the parent
    must reach them (before: ``RuntimeError: Unsupported device type: cpu`` in every TP worker)."""
    monkeypatch.delenv("TOKENRAILS_LMDEPLOY", raising=False)
    monkeypatch.setenv("TOKENRAILS_LMDEPLOY_CPU", "1")
    rep = _run_in_spawned_child(spawn_child.report_cpu_backend_after_engine_import)
    assert rep == {"backend": "cpu", "ccl": "gloo", "active": False}
