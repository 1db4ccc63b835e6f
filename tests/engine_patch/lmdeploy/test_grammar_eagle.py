"""Grammar-aware EAGLE drafts (engine_patch/lmdeploy/grammar_eagle.py) in LMDeploy 0.18's real engine on CPU.

The draft is LMDeploy's EAGLE draft with random weights (``cpu/draft.py``): on its own it is almost
never accepted. Where the grammar forces tokens, the forced run replaces its guesses. Oracles:
greedy outputs token for token equal to plain guided decoding (no speculation) with and without
grammar-aware drafts; accepted drafts with grammar-aware drafts >= without, on the same requests;
the per-request counters add up (accepted <= drafted, forced <= drafted).
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")
jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.slow

from .schemas import PERSON  # noqa: E402
ORDER = {"type": "object", "properties": {
    "status": {"enum": ["pending", "shipped", "delivered"]},
    "express": {"type": "boolean"}}, "required": ["status", "express"], "additionalProperties": False}
PATTERN = r"(alpha|beta)-[0-9]{2}\.done"
K = 3


def _compact(schema):
    from tokenrails import GuideSpec
    return GuideSpec.json_schema(json.dumps(schema), any_whitespace=False)


def _requests():
    return [
        ("Give me a person as JSON.", _compact(PERSON), 40),
        ("An order as JSON.", _compact(ORDER), 40),
        ("A code please.", {"type": "regex_schema", "regex_schema": PATTERN}, 16),
        ("Hi", None, 8),
    ]


@pytest.fixture(scope="module")
def draft_dir(model_dir, tmp_path_factory):
    from tokenrails.engine_patch.lmdeploy.cpu.draft import random_eagle_draft
    return str(random_eagle_draft(model_dir, tmp_path_factory.mktemp("eagle"), seed=0))


def _run(model_dir, draft_dir, *, spec: bool, aware: bool, monkeypatch):
    from lmdeploy import GenerationConfig, pipeline
    from lmdeploy.messages import SpeculativeConfig

    from tokenrails.engine_patch.lmdeploy import activate, deactivate
    from tokenrails.engine_patch.lmdeploy.speculative import draft_metrics, grammar_eagle
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    torch.set_num_threads(1)
    monkeypatch.setenv(grammar_eagle.ENV_SWITCH, "1" if aware else "0")
    draft_metrics.reset()
    reqs = _requests()
    activate()
    try:
        config = SpeculativeConfig(method="eagle", model=draft_dir, num_speculative_tokens=K) if spec else None
        pipe = pipeline(model_dir, backend_config=cpu_engine_config(max_batch_size=4, session_len=512),
                        speculative_config=config)
        try:
            outs = pipe([r[0] for r in reqs], gen_config=[
                GenerationConfig(max_new_tokens=n, top_k=1, response_format=rf) for _, rf, n in reqs])
        finally:
            pipe.close()
        return outs, draft_metrics.all_requests()
    finally:
        deactivate()


def _sum(stats, key):
    return sum(s[key] for s in stats.values())


def test_grammar_aware_eagle_greedy_identity_and_acceptance(model_dir, draft_dir, monkeypatch):
    plain, _ = _run(model_dir, draft_dir, spec=False, aware=False, monkeypatch=monkeypatch)
    jsonschema.validate(json.loads(plain[0].text), PERSON)
    jsonschema.validate(json.loads(plain[1].text), ORDER)
    eagle, base = _run(model_dir, draft_dir, spec=True, aware=False, monkeypatch=monkeypatch)
    aware, stats = _run(model_dir, draft_dir, spec=True, aware=True, monkeypatch=monkeypatch)
    assert [o.token_ids for o in eagle] == [o.token_ids for o in plain]
    assert [o.token_ids for o in aware] == [o.token_ids for o in plain]
    assert len(stats) == len(plain) and len(base) == len(plain), (stats, base)
    for s in list(stats.values()) + list(base.values()):
        assert 0 <= s["accepted_draft_tokens"] <= s["draft_tokens"] == K * s["verify_steps"], s
        assert s["forced_draft_tokens"] <= s["draft_tokens"], s
    assert _sum(base, "forced_draft_tokens") == 0
    assert _sum(stats, "forced_draft_tokens") >= 10
    # the grammar forcing pays: more drafts accepted, never more verification steps for the same
    # tokens. The step count of a batch also depends on when each row joined it (the scheduler, not
    # the drafts): the EAGLE-only run measured 27 or 28 steps over identical outputs on this machine,
    # the grammar-aware run 27, so the strict comparison is on accepted drafts only.
    assert _sum(stats, "accepted_draft_tokens") > _sum(base, "accepted_draft_tokens"), (stats, base)
    assert _sum(stats, "verify_steps") <= _sum(base, "verify_steps"), (stats, base)
