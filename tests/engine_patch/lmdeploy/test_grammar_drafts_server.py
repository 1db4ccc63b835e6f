"""Grammar drafts behind LMDeploy's OpenAI api_server (CPU path, engine in a spawned process).

``cpu.serve --grammar-drafts 3``: the setting reaches the engine process through the environment
(the proposer says so on the server's log); greedy JSON-schema answers over HTTP equal plain guided
decoding's (the in-process pipeline, same chat messages) and validate; a bad schema is a 400.
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

from .test_real_server import _stop, start_ready  # noqa: E402

pytestmark = pytest.mark.slow

from .schemas import PERSON  # noqa: E402
PROMPTS = ["Give me a person as JSON.", "Invent a character as JSON."]


def _messages(prompt):
    return [{"role": "user", "content": prompt}]


def test_grammar_drafts_over_http_equal_plain_guided(model_dir, tmp_path, monkeypatch):
    log = tmp_path / "server.log"
    monkeypatch.delenv("TOKENRAILS_GRAMMAR_DRAFTS", raising=False)  # the server's flag is the only source
    proc, base, model_id = start_ready(model_dir, log, "--grammar-drafts", "3", tool_call_parser=None)
    try:
        rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
        served = []
        for prompt in PROMPTS:
            r = httpx.post(f"{base}/v1/chat/completions", timeout=300, json={
                "model": model_id, "messages": _messages(prompt), "temperature": 0, "max_tokens": 40,
                "response_format": rf})
            assert r.status_code == 200, r.text
            served.append(r.json()["choices"][0]["message"]["content"])
        bad = httpx.post(f"{base}/v1/chat/completions", timeout=300, json={
            "model": model_id, "messages": _messages("x"), "max_tokens": 4,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}})
        assert bad.status_code == 400, bad.text
        assert "grammar drafts on: up to 3" in log.read_text(), log.read_text()[-4000:]
    finally:
        _stop(proc)

    from lmdeploy import GenerationConfig, pipeline

    from tokenrails.engine_patch.lmdeploy import activate, deactivate
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    activate(grammar_drafts=0)
    try:
        pipe = pipeline(model_dir, backend_config=cpu_engine_config(max_batch_size=4, session_len=512))
        try:
            plain = pipe([_messages(p) for p in PROMPTS],
                         gen_config=GenerationConfig(max_new_tokens=40, top_k=1, response_format=rf))
        finally:
            pipe.close()
    finally:
        deactivate()
    for text, ref in zip(served, plain):
        assert text == ref.text, (text, ref.text)
        jsonschema.validate(json.loads(text), PERSON)
