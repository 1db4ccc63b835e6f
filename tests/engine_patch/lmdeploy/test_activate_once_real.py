"""A user's script with a module-level ``activate()`` (user_script.py) on LMDeploy's real engine:
the api_server's engine process is patched once and answers a guided request. (The TP pipeline
started the same way, whose ranks each re-import the script: test_real_engine_tp.py's upgraded
TP = 3 run.)"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lmdeploy")
httpx = pytest.importorskip("httpx")

from harness.server_attack import free_port, stop_server, wait_ready  # noqa: E402

from .patch_layers import assert_patched_once  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).with_name("user_script.py")  # run, never imported (it activates at import)
REGEX = "[0-9]{3}-[a-z]{2}"


def _env(report: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PATCH_REPORT=str(report),
               PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    for name in ("TOKENRAILS_LMDEPLOY", "TOKENRAILS_LMDEPLOY_CPU"):
        env.pop(name, None)  # a fresh user shell
    return env


def _reports(report: Path) -> list[dict]:
    return [json.loads(line) for line in report.read_text().splitlines() if line.strip()]


def test_api_server_engine_process_is_patched_once(tmp_path):
    report = tmp_path / "layers.jsonl"
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, str(SCRIPT), "serve", str(port)], cwd=tmp_path, env=_env(report),
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        model_id = wait_ready(proc, base, 240)
        assert model_id, log.read_text()[-3000:]
        resp = httpx.post(f"{base}/v1/chat/completions", timeout=180, json={
            "model": model_id, "messages": [{"role": "user", "content": "Write a code."}], "max_tokens": 8,
            "temperature": 0, "response_format": {"type": "regex_schema", "regex_schema": REGEX}})
        assert resp.status_code == 200, resp.text
        assert re.fullmatch(REGEX, resp.json()["choices"][0]["message"]["content"])
    finally:
        stop_server(proc)
    assert_patched_once(_reports(report), processes=2)  # the server's process and its engine process
