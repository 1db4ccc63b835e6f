"""The budget rule under tensor parallel on LMDeploy 0.18's real engine, CPU path, TP = 3
(SmolLM2-135M's 3 KV heads), greedy, one batch (tp_budget_child.py).

The engine-wide default (``activate(budget="close")`` in the parent only) reaches the TP workers;
the sampling rank closes the record within its ``max_tokens`` (parses, validates, "stop"), the
flag comes back through the workers' outputs (``Response.budget_closed``), the per-request
``"off"`` runs into the limit, and an output that fits reports ``budget_closed`` false.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("lmdeploy")
jsonschema = pytest.importorskip("jsonschema")

from ..budget_cases import SCHEMA  # noqa: E402
from .test_real_engine_tp import REPO, _traceback  # noqa: E402
from .tp_budget_child import PERSON  # noqa: E402

pytestmark = pytest.mark.slow
TP = 3


@pytest.fixture(scope="module")
def shortest(model_dir):
    from transformers import AutoTokenizer

    from tokenrails import Vocabulary
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import parse_format
    from tokenrails.guided.budget import budget_table
    from tokenrails.guided.manager import GuidedDecodingManager

    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}, "tokenrails_budget": "close"}
    mgr = GuidedDecodingManager(Vocabulary.from_huggingface(AutoTokenizer.from_pretrained(model_dir)))
    try:
        return budget_table(mgr.get_compiled(parse_format(fmt)[0])).start
    finally:
        mgr.close()


def test_budget_default_closes_under_tp(shortest):
    tight = shortest + 2
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    for name in ("TOKENRAILS_LMDEPLOY", "TOKENRAILS_BUDGET"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-m", "tests.engine_patch.lmdeploy.tp_budget_child", "--tp", str(TP),
                           "--tight", str(tight)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("TP_RESULT ")]
    assert proc.returncode == 0 and lines, _traceback(proc.stderr)
    out = json.loads(lines[-1][len("TP_RESULT "):])
    closed, off, fits = out["closed"], out["off"], out["fits"]
    assert closed["finish_reason"] == "stop" and closed["budget_closed"] is True, closed
    assert closed["tokens"] <= tight
    jsonschema.validate(json.loads(closed["text"]), SCHEMA)
    assert off["finish_reason"] == "length" and off["budget_closed"] is None, off
    assert fits["finish_reason"] == "stop" and fits["budget_closed"] is False, fits
    jsonschema.validate(json.loads(fits["text"]), PERSON)
