"""Per-request draft counters in the api_server's usage (``usage.speculative``, draft_usage.py).

One CPU api_server with grammar drafts (engine in a spawned process): a greedy compact-JSON request,
non-streaming and streaming (``stream_options.include_usage``), both report the same counters in
``usage.speculative``; they add up (accepted <= drafted = k * verify steps, forced <= drafted,
verify steps + accepted = completion tokens: every step emits its accepted drafts plus one token);
grammar-forced drafts are counted.
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

from .test_real_server import _stop, start_ready  # noqa: E402

pytestmark = pytest.mark.slow

K = 3
from .schemas import PERSON  # noqa: E402


def _body(model_id, **extra):
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    return {"model": model_id, "messages": [{"role": "user", "content": "Give me a person as JSON."}],
            "temperature": 0, "max_tokens": 40, "response_format": rf, **extra}


def _check(spec, completion_tokens):
    assert set(spec) == {"draft_tokens", "accepted_draft_tokens", "forced_draft_tokens", "verify_steps"}, spec
    # adaptive grammar drafts: a row drafts its forced run only (at most K), nothing where nothing is forced
    assert spec["verify_steps"] > 0 and 0 < spec["draft_tokens"] <= K * spec["verify_steps"], spec
    assert 0 <= spec["accepted_draft_tokens"] <= spec["draft_tokens"], spec
    assert 0 < spec["forced_draft_tokens"] <= spec["draft_tokens"], spec
    # prefill emits the first token, every verification step its accepted drafts + 1, and the
    # request's EOS (the last step's) is not a completion token: the counts meet exactly
    assert spec["verify_steps"] + spec["accepted_draft_tokens"] == completion_tokens, (spec, completion_tokens)


def test_usage_carries_draft_counters_streaming_and_not(model_dir, tmp_path, monkeypatch):
    log = tmp_path / "server.log"
    monkeypatch.delenv("TOKENRAILS_GRAMMAR_DRAFTS", raising=False)
    proc, base, model_id = start_ready(model_dir, log, "--grammar-drafts", str(K), tool_call_parser=None)
    try:
        r = httpx.post(f"{base}/v1/chat/completions", timeout=300, json=_body(model_id))
        assert r.status_code == 200, r.text
        data = r.json()
        jsonschema.validate(json.loads(data["choices"][0]["message"]["content"]), PERSON)
        assert data["choices"][0]["finish_reason"] == "stop", data
        usage = data["usage"]
        _check(usage["speculative"], usage["completion_tokens"])

        chunks = []
        with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=300,
                          json=_body(model_id, stream=True, stream_options={"include_usage": True})) as s:
            assert s.status_code == 200
            for line in s.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
        final = [c for c in chunks if c.get("usage")]
        assert len(final) == 1, chunks[-3:]
        assert final[0]["usage"]["speculative"] == usage["speculative"]  # same greedy request, same counters
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
        assert text == data["choices"][0]["message"]["content"]
    finally:
        _stop(proc)
