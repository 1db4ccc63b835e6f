"""A TurboMind-backed server gets exactly stock LMDeploy's request handling.

TurboMind cannot run here, so the engine call is captured: LMDeploy's real OpenAI router, its
``ChatRunner``, its response parsers (the qwen tool parser; gpt-oss harmony with its output decoder
stubbed, whose vocabulary file is a download) and the real ``AsyncEngine.preprocess`` of an
``AsyncEngine`` whose ``backend`` is ``"turbomind"``; only prompt rendering and ``generate`` are
stand-ins, and ``generate`` records the ``response_format`` that would reach TurboMind. Each request
class is sent through stock (deactivated) and upgraded; the outcome (served or refused, and what
reached the engine) must be the same. The upgrade's only intended differences on TurboMind are
refusals of what TurboMind would run unconstrained (``choice``/``grammar`` are refused by both,
stock with 422 from its request model) and vLLM's ``guided_*`` fields, which stock drops silently.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
ae = pytest.importorskip("lmdeploy.serve.core.async_engine")

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
JSON_FMT = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
MANY_TOOLS = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(300)]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
MISSING = {"type": "function", "function": {"name": "not_a_tool"}}

REQUEST_CLASSES = {
    "plain": {},
    "json_schema": {"response_format": JSON_FMT},
    "regex_schema": {"response_format": {"type": "regex_schema", "regex_schema": "[0-9]{3}"}},
    "json_object": {"response_format": {"type": "json_object"}},
    "bad_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": 5}}}},
    "choice": {"response_format": {"type": "choice", "choice": ["a", "b"]}},
    "grammar": {"response_format": {"type": "grammar", "grammar": 'root ::= "a"'}},
    "tools_auto": {"tools": [TOOL]},
    "tools_named": {"tools": [TOOL], "tool_choice": NAMED},
    "tools_named_missing": {"tools": [TOOL], "tool_choice": MISSING},
    "tools_required": {"tools": [TOOL], "tool_choice": "required"},
    "tools_required_with_format": {"tools": [TOOL], "tool_choice": "required", "response_format": JSON_FMT},
    "tools_auto_with_format": {"tools": [TOOL], "response_format": JSON_FMT},
    "many_tools": {"tools": MANY_TOOLS},
    "tools_none": {"tools": [TOOL], "tool_choice": "none"},
}


class Reached(Exception):
    pass


def _turbomind_engine(seen: list, backend: str = "turbomind"):
    """A real ``AsyncEngine`` (its ``preprocess``, patched or not) configured as TurboMind; prompt
    rendering and ``generate`` are stand-ins, ``generate`` records what reaches the engine."""
    from lmdeploy.serve.core.exceptions import ErrorCode, RequestError

    engine = object.__new__(ae.AsyncEngine)
    session = SimpleNamespace(session_id=1, _handle=None)

    async def get_prompt_input(**kw):
        return {"prompt": "p", "input_ids": [1, 2, 3]}

    def generate(request, stream_response=True):
        seen.append(request.gen_config.response_format)

        async def gen():
            raise RequestError(ErrorCode.INVALID_REQUEST, "REACHED")
            yield  # pragma: no cover

        return gen()

    engine.__dict__.update(
        backend=backend, model_name="m", arch="LlamaForCausalLM", session_len=4096, stop_words=None,
        hf_gen_cfg={}, tokenizer=SimpleNamespace(model=SimpleNamespace(model=None), eos_token_id=2),
        backend_config=SimpleNamespace(enable_prefix_caching=False),
        request_logger=SimpleNamespace(log_prompt=lambda *a, **k: None, log_inputs=lambda *a, **k: None),
        prompt_processor=SimpleNamespace(get_prompt_input=get_prompt_input),
        session_mgr=SimpleNamespace(get=lambda sid: session, remove=lambda s: None), generate=generate)
    return engine


def _parser_class(kind: str):
    from lmdeploy.serve.parsers import ResponseParserManager

    if kind == "qwen":
        cls = type("QwenParser", (ResponseParserManager.get("default"),), {})
        cls.set_parsers(tool_parser_name="qwen")
        return cls
    return ResponseParserManager.get("gpt-oss")


def outcome(parser: str, fields: dict, backend: str = "turbomind", message: list | None = None) -> tuple:
    """(served, what reached TurboMind) for one chat request over LMDeploy's real router
    (``message``: gets the response text)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from lmdeploy.serve.openai.endpoints import create_openai_router

    seen: list = []
    ctx = SimpleNamespace(async_engine=_turbomind_engine(seen, backend), response_parser_cls=_parser_class(parser),
                          default_gen_config={}, engine_config=SimpleNamespace(adapters=None),
                          create_session=lambda sid: 1, session_manager=SimpleNamespace(has=lambda sid: False,
                                                                                          remove=lambda s: None))
    app = FastAPI()
    app.include_router(create_openai_router(ctx))  # built after (de)activation, as serve() does
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    resp = TestClient(app).post("/v1/chat/completions", json=body)
    served = "REACHED" in resp.text
    if message is not None:
        message.append(resp.text)
    assert served or resp.status_code in (400, 422), resp.text
    return served, _compiled_view(seen[0]) if seen else None


def _compiled_view(fmt):
    """What TurboMind compiles of a ``response_format``: LMDeploy's own (entry point, source) for
    its compiler (dumps differ in ``None`` fields and defaults the compiler never reads)."""
    from lmdeploy._guided_decoding import _grammar_source

    return None if fmt is None else _grammar_source(json.loads(json.dumps(fmt)))


@pytest.fixture
def harmony_offline(monkeypatch):
    """gpt-oss's parser without its output decoder (a download): request handling stays LMDeploy's."""
    harmony = pytest.importorskip("lmdeploy.serve.parsers._openai_harmony")
    monkeypatch.setattr(harmony, "get_encoding", lambda *a, **k: None)
    monkeypatch.setattr(harmony, "StreamableParser", lambda *a, **k: None)


def _both(parser: str, fields: dict) -> tuple[tuple, tuple]:
    import tokenrails.engine_patch.lmdeploy as patch

    patch.deactivate()
    stock = outcome(parser, fields)
    patch.activate()
    try:
        upgraded = outcome(parser, fields)
    finally:
        patch.deactivate()
    return stock, upgraded


@pytest.mark.parametrize("name", list(REQUEST_CLASSES))
def test_qwen_tool_parser_on_turbomind_is_stock(name):
    stock, upgraded = _both("qwen", REQUEST_CLASSES[name])
    assert upgraded == stock, (name, stock, upgraded)


@pytest.mark.parametrize("name", list(REQUEST_CLASSES))
def test_harmony_on_turbomind_is_stock(harmony_offline, name):
    stock, upgraded = _both("gpt-oss", REQUEST_CLASSES[name])
    assert upgraded == stock, (name, stock, upgraded)


def test_stock_serves_what_the_upgrade_used_to_refuse_on_turbomind():
    """The reference the parity rests on: stock serves these classes on TurboMind."""
    import tokenrails.engine_patch.lmdeploy as patch

    patch.deactivate()
    for name in ("plain", "json_schema", "tools_named_missing", "tools_required_with_format", "many_tools"):
        assert outcome("qwen", REQUEST_CLASSES[name])[0], name


@pytest.mark.parametrize("field", [{"guided_json": SCHEMA}, {"guided_regex": "[0-9]+"}])
def test_vllm_fields_on_turbomind_are_refused_not_dropped(field):
    import tokenrails.engine_patch.lmdeploy as patch

    patch.deactivate()
    assert outcome("qwen", field) == (True, None)  # stock: the field is dropped, the request unconstrained
    patch.activate()
    try:
        text: list = []
        assert outcome("qwen", field, message=text)[0] is False
        assert "guided_*" in text[0] and "PyTorch engine" in text[0]
    finally:
        patch.deactivate()


def test_harmony_tools_with_a_format_on_the_pytorch_engine(harmony_offline):
    """gpt-oss with tools and a response_format, over LMDeploy's router: stock sends the tool grammar
    and drops the format (a log line); the upgraded PyTorch engine's server sends the tool grammar
    with the format in its final-channel answer (``auto``), and answers 400 with the reason where
    the answer must be a call (a named function)."""
    import tokenrails.engine_patch.lmdeploy as patch

    fmt = {"type": "regex_schema", "regex_schema": "zq[0-9]{3}"}
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    auto = {"tools": [tool], "response_format": fmt}
    named = {**auto, "tool_choice": NAMED}
    patch.deactivate()
    for fields in (auto, named):
        served, compiled = outcome("gpt-oss", fields, backend="pytorch")
        assert served and compiled[0] == "structural_tag" and "zq[0-9]{3}" not in compiled[1]  # stock: format gone
    patch.activate()
    try:
        served, compiled = outcome("gpt-oss", auto, backend="pytorch")
        assert served and compiled[0] == "structural_tag" and "zq[0-9]{3}" in compiled[1]
        text: list = []
        assert outcome("gpt-oss", named, backend="pytorch", message=text)[0] is False
        assert "must be a tool call" in text[0]
    finally:
        patch.deactivate()
