"""The budget rule over HTTP: one CPU api_server started with ``--budget close`` (the engine-wide
default) and grammar drafts (k = 3), embedded SmolLM2, greedy.

* a request without the key is closed within ``max_tokens`` (parses, validates, ``finish_reason``
  "stop"), and ``usage.budget_closed`` says so, streamed (final usage chunk) and not; one that
  sends ``"tokenrails_budget": "off"`` runs into the limit as plain guided decoding does, without
  the field; a request whose output fits reports ``budget_closed: false``;
* the grammar drafts ran (``usage.speculative``) and never took the output past the budget;
* a ``max_tokens`` below the shortest output is refused up front: HTTP 400 before any token, with
  the count the core computes on this vocabulary, streamed or not;
* tool calls take the budget (the body's ``tokenrails_budget`` or the default): a named
  ``tool_choice`` and ``required`` close their call within ``max_tokens`` and the arguments
  validate; ``auto`` and arguments the DFA lowering cannot enforce are refused with 400.
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

from ..budget_cases import PROMPT, SCHEMA  # noqa: E402
from .test_real_server import _stop, start_ready  # noqa: E402

pytestmark = pytest.mark.slow

K = 3
from .schemas import PERSON  # noqa: E402
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city",
                                           "parameters": WEATHER}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _fmt(schema=SCHEMA, **extra):
    return {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}, **extra}


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    log = tmp_path_factory.mktemp("budget") / "server.log"
    proc, base, model_id = start_ready(model_dir, log, "--budget", "close", "--grammar-drafts", str(K))
    try:
        yield base, model_id
    finally:
        _stop(proc)


def _chat(server, content, max_tokens, **extra):
    base, model_id = server
    body = {"model": model_id, "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": max_tokens, **extra}
    return httpx.post(f"{base}/v1/chat/completions", timeout=300, json=body)


def _stream(server, content, max_tokens, **extra):
    base, model_id = server
    body = {"model": model_id, "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}, **extra}
    chunks = []
    with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=300, json=body) as s:
        if s.status_code != 200:
            s.read()
            return s.status_code, s.text, []
        for line in s.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    return 200, text, chunks


def test_default_closes_reports_and_opts_out(server, shortest):
    n = shortest + 2
    r = _chat(server, PROMPT, n, response_format=_fmt())
    assert r.status_code == 200, r.text
    data = r.json()
    choice, usage = data["choices"][0], data["usage"]
    assert choice["finish_reason"] == "stop", data
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
    assert usage["budget_closed"] is True and usage["completion_tokens"] <= n, usage
    assert usage["speculative"]["draft_tokens"] > 0, usage  # the grammar drafts ran, within the budget

    off = _chat(server, PROMPT, n, response_format=_fmt(tokenrails_budget="off")).json()
    assert off["choices"][0]["finish_reason"] == "length", off  # plain guided decoding: a broken prefix
    assert "budget_closed" not in off["usage"], off["usage"]
    body_off = _chat(server, PROMPT, n, response_format=_fmt(), tokenrails_budget="off").json()
    assert body_off["choices"][0]["finish_reason"] == "length", body_off  # the chat body's key, too

    fits = _chat(server, "Give me a person as JSON.", 64, response_format=_fmt(PERSON)).json()
    assert fits["choices"][0]["finish_reason"] == "stop", fits
    jsonschema.validate(json.loads(fits["choices"][0]["message"]["content"]), PERSON)
    assert fits["usage"]["budget_closed"] is False, fits["usage"]

    status, text, chunks = _stream(server, PROMPT, n, response_format=_fmt())
    assert status == 200, text
    final = [c for c in chunks if c.get("usage")]
    assert len(final) == 1 and final[0]["usage"]["budget_closed"] is True, chunks[-3:]
    assert text == choice["message"]["content"]  # the same greedy request, streamed
    finish = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
    finish = [f for f in finish if f]
    assert finish == ["stop"], finish


def test_too_small_is_refused_up_front_with_the_count(server, shortest):
    r = _chat(server, PROMPT, shortest - 1, response_format=_fmt())
    assert r.status_code == 400, r.text
    assert f"needs {shortest} tokens" in r.text and f"max_tokens={shortest - 1}" in r.text, r.text
    status, text, chunks = _stream(server, PROMPT, shortest - 1, response_format=_fmt())
    assert status == 400 and f"needs {shortest} tokens" in text and not chunks, text
    ok = _chat(server, PROMPT, shortest, response_format=_fmt())  # exactly the shortest: served, closed
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "stop", ok.text
    jsonschema.validate(json.loads(ok.json()["choices"][0]["message"]["content"]), SCHEMA)


@pytest.mark.parametrize("tool_choice", [NAMED, "required"], ids=["named", "required"])
def test_tool_calls_close_within_max_tokens(server, tool_choice):
    n = 34
    r = _chat(server, "What is the weather in San Francisco, California for the next ten days?", n,
              tools=TOOLS, tool_choice=tool_choice, tokenrails_budget="close")
    assert r.status_code == 200, r.text
    data = r.json()
    calls = data["choices"][0]["message"].get("tool_calls") or []
    assert len(calls) >= 1, data
    for call in calls:
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)
    assert data["choices"][0]["finish_reason"] == "tool_calls", data
    assert data["usage"]["completion_tokens"] <= n and data["usage"]["budget_closed"] is True, data["usage"]
    off = _chat(server, "What is the weather in San Francisco, California for the next ten days?", n,
                tools=TOOLS, tool_choice=tool_choice, tokenrails_budget="off").json()
    assert off["choices"][0]["finish_reason"] == "length", off  # without the rule: a cut-off call


def test_tool_calls_the_rule_cannot_close_are_refused(server):
    auto = _chat(server, "Weather in Rome?", 40, tools=TOOLS, tool_choice="auto")
    assert auto.status_code == 400 and "auto" in auto.text, auto.text
    bounded = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"days": {"type": "integer", "multipleOf": 3}},
        "required": ["days"]}}}]
    r = _chat(server, "Weather in Rome?", 40, tools=bounded, tool_choice=NAMED)
    assert r.status_code == 400 and "multipleOf" in r.text, r.text
    off = _chat(server, "Weather in Rome?", 40, tools=TOOLS, tool_choice="auto", tokenrails_budget="off")
    assert off.status_code == 200, off.text  # opted out: served as before
