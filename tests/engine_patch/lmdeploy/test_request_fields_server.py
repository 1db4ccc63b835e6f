"""vLLM's request fields over real HTTP: the CPU api_server enforces them or answers 400.

``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` / ``structured_outputs``
(with ``guided_decoding_backend``), sent in the body as the openai SDK's ``extra_body`` sends them,
on ``/v1/chat/completions`` and ``/v1/completions``. Outputs are checked with oracles (jsonschema,
``re.fullmatch``, membership); a request with two constraints or an unknown backend is a 400 with
the reason. Stock LMDeploy drops these fields and answers 200 with free text.
"""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.slow

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
GRAMMAR = 'root ::= num " " op " " num\nop ::= "+" | "-"\nnum ::= [1-9] [0-9]?'
GRAMMAR_RE = r"[1-9][0-9]? [+-] [1-9][0-9]?"


@pytest.fixture
def server(shared_server):
    """The upgraded api_server shared with other modules (conftest)."""
    base, model_id, _, _ = shared_server
    return base, model_id


def _chat(server, prompt, max_tokens=40, **fields):
    base, model_id = server
    body = {"model": model_id, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": max_tokens, **fields}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=180)


def _completion(server, prompt, max_tokens=30, **fields):
    base, model_id = server
    body = {"model": model_id, "prompt": prompt, "temperature": 0, "max_tokens": max_tokens, **fields}
    return httpx.post(f"{base}/v1/completions", json=body, timeout=180)


def _text(resp, key="message"):
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    text = choice["message"]["content"] if key == "message" else choice["text"]
    assert choice["finish_reason"] == "stop", (choice, text)
    return text


def test_chat_guided_json_with_the_openai_sdk(server):
    base, model_id = server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=180)
    resp = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Give me a person as JSON."}], temperature=0,
        max_tokens=48, extra_body={"guided_json": PERSON, "guided_decoding_backend": "xgrammar"})
    assert resp.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(resp.choices[0].message.content), PERSON)


def test_chat_guided_regex_choice_grammar(server):
    text = _text(_chat(server, "Write a date.", guided_regex=r"20[0-9]{2}-[01][0-9]"))
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]", text), text
    choices = ["yes", "no", "maybe"]
    assert _text(_chat(server, "Is the sky green?", guided_choice=choices)) in choices
    text = _text(_chat(server, "Write a sum.", guided_grammar=GRAMMAR))
    assert re.fullmatch(GRAMMAR_RE, text), text


def test_chat_structured_outputs(server):
    text = _text(_chat(server, "Give a code.", structured_outputs={"regex": "[A-Z]{3}-[0-9]{2}"}))
    assert re.fullmatch("[A-Z]{3}-[0-9]{2}", text), text


def test_completions_guided_fields_and_response_format(server):
    text = _text(_completion(server, "The answer is", guided_choice=["alpha", "beta"]), key="text")
    assert text in ("alpha", "beta"), text
    text = _text(_completion(server, "Code:", guided_regex="[0-9]{4}"), key="text")
    assert re.fullmatch("[0-9]{4}", text), text
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    text = _text(_completion(server, "A person as JSON:", max_tokens=48, response_format=fmt), key="text")
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("path", ["chat", "completions"])
def test_two_constraints_are_400(server, path):
    send = _chat if path == "chat" else _completion
    fmt = {"type": "regex_schema", "regex_schema": "[0-9]+"}
    resp = send(server, "Hi", response_format=fmt, guided_json=PERSON)
    assert resp.status_code == 400, resp.text
    assert "more than one constraint" in resp.text and "guided_json" in resp.text


def test_unknown_backend_is_400(server):
    resp = _chat(server, "Hi", guided_regex="[0-9]+", guided_decoding_backend="no-such-backend")
    assert resp.status_code == 400, resp.text
    assert "no-such-backend" in resp.text


def test_whitespace_pattern_option_reaches_the_engine(server):
    text = _text(_chat(server, "Give me a person as JSON.", max_tokens=48, guided_json=PERSON,
                       guided_whitespace_pattern=""))
    jsonschema.validate(json.loads(text), PERSON)
    assert not re.search(r'[\s](?=(?:[^"]*"[^"]*")*[^"]*$)', text), text  # no whitespace outside strings
