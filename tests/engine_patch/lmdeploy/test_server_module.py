"""The api_server's own patches (request-body limits, the max_tokens cut notice) hold however the
upgrade was activated: also when it was activated before LMDeploy's server module was imported,
which is the start-up hook's order (``tokenrails lmdeploy serve api_server``, ``TOKENRAILS_LMDEPLOY=1``).
Fresh interpreters: the import order is the subject."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("fastapi")

REPO = Path(__file__).resolve().parents[3]
HOOK_DIR = REPO / "tokenrails" / "engine_patch" / "lmdeploy" / "boot" / "_sitecustomize"

PROBE = textwrap.dedent("""
    import importlib, json, sys
    {before}
    server = importlib.import_module("lmdeploy.serve.openai.api_server")
    from fastapi import FastAPI
    from tokenrails.engine_patch.lmdeploy._patching import MARK
    import tokenrails.engine_patch.lmdeploy as upgrade
    mark = server.__dict__.get(MARK, {{}}).get("mount_metrics")
    app = FastAPI()
    try:
        server.mount_metrics(app, None)
    except Exception:  # stock's own body needs a real backend config; the middlewares come first
        pass
    print(json.dumps({{"active": upgrade.is_active(),
                       "wrappers": [k.split(":")[0].rsplit("/", 1)[-1] for k in (mark.kinds if mark else ())],
                       "middleware": sorted(m.cls.__name__ for m in app.user_middleware)}}))
""")


def _probe(before: str, **env_extra: str) -> dict:
    import json

    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENRAILS_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), *env_extra.pop("extra_path", [])]))
    env.update(env_extra)
    proc = subprocess.run([sys.executable, "-c", PROBE.format(before=before)], capture_output=True, text=True,
                          timeout=180, env=env, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_start_up_hook_then_server_import_gets_the_server_patches():
    """The hook activates when ``import lmdeploy`` finishes, before the server module exists."""
    out = _probe("import lmdeploy", TOKENRAILS_LMDEPLOY="1", extra_path=[str(HOOK_DIR)])
    assert out["active"]
    assert out["wrappers"] == ["session_budget.py", "body_limits.py"]
    assert out["middleware"] == ["BodyLimitMiddleware", "ClientIdentityMiddleware", "MaxTokensNotice"], out


def test_explicit_activate_before_the_server_import():
    out = _probe("import tokenrails.engine_patch.lmdeploy as u; u.activate()")
    assert out["wrappers"] == ["session_budget.py", "body_limits.py"]
    assert out["middleware"] == ["BodyLimitMiddleware", "ClientIdentityMiddleware", "MaxTokensNotice"], out


def test_deactivate_before_the_server_import_leaves_it_stock():
    out = _probe("import tokenrails.engine_patch.lmdeploy as u; u.activate(); u.deactivate()")
    assert out["wrappers"] == [] and out["middleware"] == [], out


def test_activate_after_the_server_import_patches_at_once():
    out = _probe("importlib.import_module('lmdeploy.serve.openai.api_server'); "
                 "import tokenrails.engine_patch.lmdeploy as u; u.activate()")
    assert out["wrappers"] == ["session_budget.py", "body_limits.py"]
