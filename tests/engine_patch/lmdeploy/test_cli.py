"""``tokenrails lmdeploy ...``: LMDeploy's CLI in-process, activation reaching children."""
from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

from tokenrails.engine_patch.lmdeploy import lmdeploy_cli as cli
from tokenrails.engine_patch.lmdeploy import startup

from . import spawn_child

REPO = Path(__file__).resolve().parents[3]


def test_help_and_status(capsys):
    assert cli.main(["--help"]) == 0
    assert "install-hook" in capsys.readouterr().out
    assert cli.main(["status"]) == 0
    assert "pth_installed=" in capsys.readouterr().out


def test_lmdeploy_command_runs_with_upgrade(monkeypatch, capsys):
    """Also after ``cpu.serve`` built its parser in this process: it builds on LMDeploy's
    ``api_server`` parser without registering it on LMDeploy's class-level CLI, whose own
    registration would then conflict."""
    import tokenrails.engine_patch.lmdeploy as patch
    from tokenrails.engine_patch.lmdeploy.cpu import serve

    assert "--session-len" in serve.build_parser().format_help()
    monkeypatch.delenv("TOKENRAILS_LMDEPLOY", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    try:
        code = cli.main(["serve", "api_server", "--help"])  # LMDeploy's own argparse
        assert code == 0
        assert "api_server" in capsys.readouterr().out
        assert patch.is_active() and os.environ["TOKENRAILS_LMDEPLOY"] == "1"
        if not startup.pth_installed():
            assert os.environ["PYTHONPATH"].split(os.pathsep)[0].endswith("_sitecustomize")
    finally:
        patch.deactivate()


def test_sitecustomize_fallback_reaches_spawned_child(monkeypatch):
    """Without the .pth installed, the CLI's PYTHONPATH directory activates children."""
    monkeypatch.setenv("TOKENRAILS_LMDEPLOY", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(cli._SITECUSTOMIZE_DIR), str(REPO)]))
    with mp.get_context("spawn").Pool(1) as pool:
        rep = pool.apply(spawn_child.report_after_engine_import)
    assert rep["active"] and rep["logits_patched"] and rep["before"]["tokenrails"] is False
