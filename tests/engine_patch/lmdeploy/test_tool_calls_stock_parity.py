"""Tool calls that worked on stock LMDeploy keep working (issue 25, point 2).

* a named ``tool_choice`` with a parser that has no xgrammar model (llama3): enforced in the parser's
  own JSON syntax, where the upgrade used to answer HTTP 400 ("does not support tool_choice=required")
  and stock serves it;
* gpt-oss (harmony) with tools replaces the client's ``response_format`` by the tool grammar: a kind
  only the upgrade accepts is refused with the reason instead of dropped; stock's kinds behave as on
  stock;
* a TurboMind engine gets exactly the request stock sends it (no upgrade format, no reasoning key);
* ``activate(fill_threads=N)`` reaches a spawned engine process like every other setting.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

import jsonschema
import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("xgrammar")

from . import spawn_child  # noqa: E402
from . import tool_markers as tm  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
SECOND_TOOL = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}


def _llama_tokenizer():
    name = "llama3.2" if tm.tokenizer_dir("llama3.2") is not None else "smollm2"
    return tm.load(name)


def test_named_tool_choice_with_llama3_is_enforced_not_refused(upgraded):
    tok, vocab, _ = _llama_tokenizer()
    tools = tm.TOOLS + [SECOND_TOOL]
    choice = {"type": "function", "function": {"name": "get_time"}}
    parser_cls, req, parser = tm.response_parser("llama3", tok, tools=tools, tool_choice=choice)
    fmt = parser.request.response_format
    assert fmt is not None and fmt["type"] == "structural_tag"
    ours = tm.Ours(vocab, fmt)
    # the model insists on the other tool with bad arguments, then on a bad zone
    bad = '<|python_tag|>{"name": "get_weather", "parameters": {"city": 5, "days": 42}}'
    worse = '{"zone": "Mars", "extra": 1}'
    out = tm.insistent_walk(ours, tok, [tok.encode(bad, add_special_tokens=False),
                                        tok.encode(worse, add_special_tokens=False)], seed=5)
    text = tok.decode(out, skip_special_tokens=False)
    for e in vocab.eos_ids:
        text = text.replace(tok.decode([e], skip_special_tokens=False), "")
    _, calls = tm.parse_calls(parser_cls, req, text)
    assert [c.function.name for c in calls] == ["get_time"], text
    jsonschema.validate(json.loads(calls[0].function.arguments), SECOND_TOOL["function"]["parameters"])


def test_named_tool_choice_llama3_the_models_own_call_is_accepted(upgraded):
    tok, vocab, _ = _llama_tokenizer()
    choice = {"type": "function", "function": {"name": "get_weather"}}
    parser_cls, req, parser = tm.response_parser("llama3", tok, tool_choice=choice)
    ours = tm.Ours(vocab, parser.request.response_format)
    text = '<|python_tag|>{"name": "get_weather", "parameters": ' + json.dumps(tm.ARGS) + "}"
    for t in tok.encode(text, add_special_tokens=False):
        assert bool(ours.allowed()[t]) and ours.accept(t), tok.decode([t])
    assert any(bool(ours.allowed()[e]) for e in vocab.eos_ids)
    _, calls = tm.parse_calls(parser_cls, req, text)
    assert [c.function.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].function.arguments) == tm.ARGS


def _harmony():
    return pytest.importorskip("lmdeploy.serve.parsers._openai_harmony").GptOssResponseParser


def _harmony_parser(response_format, tool_choice="auto"):
    """Harmony's request handling as its ``__init__`` runs it, without the harmony encoding (its
    vocabulary file is a download): the normalized request, then ``_maybe_inject_tool_grammar``."""
    from lmdeploy.serve.openai.protocol import ChatCompletionRequest
    from lmdeploy.serve.parsers.response_parser import normalize_chat_request

    cls = _harmony()
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=tm.TOOLS,
                                tool_choice=tool_choice, response_format=response_format)
    parser = cls.__new__(cls)
    parser.request = normalize_chat_request(req.model_copy(update={"tools": [t.model_dump() for t in req.tools]}))
    parser._maybe_inject_tool_grammar()
    return parser


@pytest.mark.parametrize("fmt", [{"type": "json_object", "tokenrails_reasoning": "off"},
                                 {"type": "structural_tag", "format": {"type": "const_string", "value": "x"}}],
                         ids=["reasoning-key", "structural_tag"])
def test_harmony_with_tools_refuses_a_format_it_would_drop(upgraded, fmt):
    with pytest.raises(ValueError, match="refused rather than dropped"):
        _harmony_parser(fmt)


@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"],
                         ids=["named", "required"])
def test_harmony_with_a_forced_call_refuses_a_format(upgraded, tool_choice):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}
    with pytest.raises(ValueError, match="must be a tool call"):
        _harmony_parser(fmt, tool_choice)


ANSWER = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
          "additionalProperties": False}
CALL = '<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>' + json.dumps(tm.ARGS) + "<|call|>"


@pytest.mark.parametrize("fmt,good,bad", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": ANSWER}}, '{"answer": 42}', '{"answer": "42"}'),
    ({"type": "regex_schema", "regex_schema": "[0-9]{3}"}, "123", "12a"),
    ({"type": "json_object"}, '{"k": [1]}', "plain words"),
    ({"type": "choice", "choice": ["sunny", "rainy"]}, "rainy", "cloudy"),
], ids=["json_schema", "regex_schema", "json_object", "choice"])
def test_harmony_with_tools_enforces_the_format_in_the_final_answer(upgraded, vocab, smollm2_tokenizer, fmt, good, bad):
    """``auto``: a tool call, or a final-channel answer in the client's format (stock: any text)."""
    import tokenrails as tr

    parser = _harmony_parser(fmt)
    tag = parser.request.response_format
    guide = tr.compile_guide(tr.spec_from_request(tag), vocab, "xgrammar")

    def accepts(text: str) -> bool:
        m = guide.matcher()
        return all(m.accept_token(t) for t in smollm2_tokenizer.encode(text, add_special_tokens=False)) and \
            m.accept_token(vocab.eos_ids[0])

    final = "<|channel|>final<|message|>{}<|end|>"
    thinking = "<|channel|>analysis<|message|>Let me see.<|end|><|start|>assistant"
    assert accepts(final.format(good)) and accepts(thinking + final.format(good))
    assert not accepts(final.format(bad)) and not accepts(thinking + final.format(bad))
    assert accepts(CALL) and accepts(thinking + CALL)  # a call stays a call
    assert not accepts(CALL.replace('"days": 3', '"days": 42'))


def test_stock_harmony_with_tools_drops_the_format():
    """The reference: stock's request then carries the tool grammar and nothing of the format."""
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "^zq9$"}}}
    parser = _harmony_parser(fmt)
    assert parser.request.response_format["type"] == "structural_tag"
    assert "zq9" not in json.dumps(parser.request.response_format)


@pytest.fixture
def turbomind():
    from tokenrails.engine_patch.lmdeploy.server import engines

    token = engines.ENGINE_BACKEND.set("turbomind")
    yield
    engines.ENGINE_BACKEND.reset(token)


def test_turbomind_gets_what_stock_sends(upgraded, turbomind):
    tok, _, _ = tm.load("smollm2")
    _, _, parser = tm.response_parser("qwen3", tok, tool_choice="auto")
    assert parser.request.response_format is None  # stock: auto is not constrained
    choice = {"type": "function", "function": {"name": "get_weather"}}
    _, _, parser = tm.response_parser("qwen3", tok, tool_choice=choice)
    assert parser.request.response_format is None
    _, _, parser = tm.response_parser("qwen3", tok, tool_choice="required")
    upgraded_fmt = parser.request.response_format
    upgraded.deactivate()
    _, _, stock = tm.response_parser("qwen3", tok, tool_choice="required")
    assert upgraded_fmt == stock.request.response_format


def test_the_engine_an_async_engine_serves_with_is_recorded(upgraded):
    from tokenrails.engine_patch.lmdeploy.server import engines

    class Fake:
        def __init__(self, backend):
            self.backend = backend

    saved = set(engines._PROCESS_BACKENDS)
    try:
        engines._PROCESS_BACKENDS.clear()
        engines.patched_async_engine_init(Fake.__init__)(Fake.__new__(Fake), "turbomind")
        assert engines.serving_turbomind()
        token = engines.ENGINE_BACKEND.set("pytorch")  # the running preprocess knows better
        assert not engines.serving_turbomind()
        engines.ENGINE_BACKEND.reset(token)
    finally:
        engines._PROCESS_BACKENDS.clear()
        engines._PROCESS_BACKENDS.update(saved)


def test_fill_threads_reach_a_spawned_engine_process(monkeypatch):
    import tokenrails.engine_patch.lmdeploy as patch

    for name in ("TOKENRAILS_LMDEPLOY", "TOKENRAILS_LMDEPLOY_FILL_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    before = dict(os.environ)
    patch.activate(fill_threads=3)
    try:
        from tokenrails.engine_patch.lmdeploy.boot import inherit

        assert inherit.child_env().get("TOKENRAILS_LMDEPLOY_FILL_THREADS") == "3"  # Ray workers too
        with mp.get_context("spawn").Pool(1) as pool:
            report = pool.apply(spawn_child.report_fill_threads_after_agent_import)
    finally:
        patch.deactivate()
    assert report == {"manager": "LMDeployGuidedManager", "fill_threads": 3}
    assert dict(os.environ) == before


def _harmony_plain(response_format):
    from lmdeploy.serve.openai.protocol import ChatCompletionRequest
    from lmdeploy.serve.parsers.response_parser import normalize_chat_request

    cls = _harmony()
    parser = cls.__new__(cls)
    parser.request = normalize_chat_request(ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], response_format=response_format))
    parser._maybe_inject_tool_grammar()
    return parser


def test_harmony_formats_own_their_thinking_the_gate_stands_aside(upgraded):
    """Harmony's tags read the analysis channel themselves: one owner of the thinking section."""
    from tokenrails.engine_patch.reasoning_settings import REQUEST_KEY

    with_tools = _harmony_parser(None).request.response_format
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}
    plain = _harmony_plain(schema).request.response_format
    for fmt in (with_tools, plain):
        assert fmt["type"] == "structural_tag" and fmt[REQUEST_KEY] == "off"


def test_harmony_on_turbomind_gets_no_reasoning_key(upgraded, turbomind):
    from tokenrails.engine_patch.reasoning_settings import REQUEST_KEY

    assert REQUEST_KEY not in _harmony_parser(None).request.response_format
