"""Request parsing: LMDeploy's early check and the OpenAI server route through ``GuideSpec``.

The HTTP test mounts LMDeploy's real ``/v1/chat/completions`` router (FastAPI test client) over
a stand-in engine whose ``preprocess`` runs the same early check ``AsyncEngine.preprocess`` runs
and then reports the ``response_format`` that reached the engine.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tokenrails import GuideSpec
from tokenrails.requests import spec_from_request

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
VALID = [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}, "json_schema"),
    ({"type": "json_object"}, "json_object"),
    ({"type": "regex_schema", "regex_schema": "[0-9]{3}"}, "regex"),
    ({"type": "choice", "choice": ["red", "blue"]}, "choice"),
    ({"type": "grammar", "grammar": 'root ::= "yes" | "no"'}, "grammar"),
    ({"type": "structural_tag", "structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}],
      "triggers": ["<f>"]}, "structural_tag"),
]
INVALID = [
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": 5}}},
    {"type": "regex_schema", "regex_schema": "(unclosed"},
    {"type": "choice", "choice": []},
    {"type": "nonsense"},
]


def _ensure():
    from lmdeploy.serve.core import async_engine

    return async_engine.ensure_response_format_compilable  # the name preprocess() calls


@pytest.mark.parametrize("rf,kind", VALID)
def test_early_check_accepts_every_kind(upgraded, rf, kind):
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import spec_of

    _ensure()(rf)
    assert spec_of(rf).kind == kind


@pytest.mark.parametrize("rf,kind", [v for v in VALID if v[1] in ("choice", "grammar")])
def test_stock_refuses_choice_and_grammar(rf, kind):
    import tokenrails.engine_patch.lmdeploy as patch

    patch.deactivate()
    with pytest.raises(ValueError):
        _ensure()(rf)


@pytest.mark.parametrize("rf", INVALID)
def test_early_check_gives_400_with_reason(upgraded, rf):
    from lmdeploy.serve.core.exceptions import RequestError

    with pytest.raises(RequestError) as info:
        _ensure()(rf)
    assert info.value.status_code == 400
    assert "response_format" in info.value.message


def test_unsupported_feature_is_named(upgraded):
    from lmdeploy.serve.core.exceptions import ErrorCode, RequestError

    with pytest.raises(RequestError) as info:
        _ensure()({"type": "regex_schema", "regex_schema": r"(a)\1"})
    assert info.value.status_code == 400
    assert info.value.code in (ErrorCode.UNSUPPORTED_FEATURE, ErrorCode.INVALID_REQUEST)


def _stand_in_engine():
    """An async engine whose ``preprocess`` runs the early check, then reports what reached it."""
    from lmdeploy.serve.core import async_engine
    from lmdeploy.serve.core.exceptions import ErrorCode, RequestError

    class Engine:
        model_name = "m"
        arch = "LlamaForCausalLM"
        tokenizer = SimpleNamespace(model=SimpleNamespace(model=None))

        async def preprocess(self, messages, session, gen_config=None, **kw):
            if gen_config is not None and gen_config.response_format is not None:
                async_engine.ensure_response_format_compilable(gen_config.response_format)
            raise RequestError(ErrorCode.INVALID_REQUEST, "REACHED " + json.dumps(gen_config.response_format))

    return Engine()


def _client(engine=None):
    """LMDeploy's OpenAI router over ``engine`` (default: a new stand-in engine)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from lmdeploy.serve.openai.endpoints import create_openai_router
    from lmdeploy.serve.parsers import ResponseParserManager

    parser = ResponseParserManager.get("default")
    ctx = SimpleNamespace(async_engine=engine or _stand_in_engine(), response_parser_cls=parser, default_gen_config={},
                          engine_config=SimpleNamespace(adapters=None),
                          create_session=lambda sid: SimpleNamespace(session_id=sid),
                          session_manager=SimpleNamespace(has=lambda sid: False))
    app = FastAPI()
    app.include_router(create_openai_router(ctx))  # built after activation, like serve() does
    return TestClient(app)


def _post(client, rf):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": rf}
    return client.post("/v1/chat/completions", json=body)


@pytest.mark.parametrize("rf,kind", VALID)
def test_http_every_kind_reaches_engine(upgraded, rf, kind):
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import spec_of

    r = _post(_client(), rf)
    message = r.json()["message"]
    assert message.startswith("REACHED "), message
    sent = json.loads(message.split("REACHED ", 1)[1])  # what the engine would receive
    assert spec_of(sent).key == spec_from_request(rf).key


@pytest.mark.parametrize("rf", INVALID[:3])
def test_http_invalid_is_400(upgraded, rf):
    r = _post(_client(), rf)
    assert r.status_code == 400 and "REACHED" not in r.text and "response_format" in r.text


def test_http_stock_rejects_choice_at_schema():
    import tokenrails.engine_patch.lmdeploy as patch

    patch.deactivate()
    r = _post(_client(), {"type": "choice", "choice": ["a"]})
    assert r.status_code in (400, 422) and "REACHED" not in r.text


def test_budget_key_survives_folding_of_vllm_fields(upgraded):
    """``tokenrails_budget`` sent beside vLLM's ``guided_*`` fields stays a top-level key of the
    folded format, so the engine closes the vLLM constraint within max_tokens instead of reading
    the key as part of the client's format."""
    from lmdeploy.serve.openai.protocol import ChatCompletionRequest

    from tokenrails.engine_patch.lmdeploy.server.request_fields import fold
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import parse_format
    from tokenrails.guided.budget import is_budget_spec

    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                guided_regex="[0-9]{3}",
                                response_format={"type": "text", "tokenrails_budget": "close"})
    folded = fold(req).response_format.model_dump()
    assert folded["tokenrails_budget"] == "close"
    assert "tokenrails_budget" not in (folded["request_fields"].get("response_format") or {})
    spec, _ = parse_format(folded)
    assert spec.kind == "regex" and spec.pattern == "[0-9]{3}"
    assert is_budget_spec(spec)


def test_client_identity_rides_in_the_format_and_is_not_part_of_the_constraint():
    """The api_server's client identity reaches the engine in the format (``tokenrails_client``):
    written over anything the client sent, never part of the spec (the cache is shared)."""
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import CLIENT_KEY, client_of, parse_format, with_client
    from tokenrails.guided.clients import LOCAL

    rf = {"type": "regex_schema", "regex_schema": "[0-9]{3}", CLIENT_KEY: "key:forged"}
    with_client(rf, "key:0123456789abcdef")
    assert client_of(rf) == "key:0123456789abcdef"
    assert parse_format(rf)[0].key == parse_format({"type": "regex_schema", "regex_schema": "[0-9]{3}"})[0].key
    assert client_of({"type": "regex_schema", "regex_schema": "a"}) == LOCAL
