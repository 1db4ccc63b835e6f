"""The engine-wide budget setting and the tool-call format the rule closes (no engine).

``activate(budget=...)`` / ``--budget`` / ``$TOKENRAILS_BUDGET`` make every constrained request a
budget request unless it says ``"tokenrails_budget"`` itself; the setting reaches child processes
(``child_env``). A named / required tool call becomes one regex with the family's markers whose
every walk is a call the parser reads with valid arguments; ``auto`` is refused.
"""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("lmdeploy")
jsonschema = pytest.importorskip("jsonschema")

from tokenrails.engine_patch.lmdeploy.boot import inherit, settings  # noqa: E402
from tokenrails.engine_patch.lmdeploy.server.request_parsing import parse_format  # noqa: E402
from tokenrails.guided.budget import is_budget_spec  # noqa: E402
from tokenrails.guided.errors import InvalidGuideError, UnsupportedGuideError  # noqa: E402

FMT = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object", "properties": {
    "a": {"type": "string"}}, "required": ["a"]}}}
ARGS = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"], "additionalProperties": False}
BEGIN = '<tool_call>\n{"name": "get_weather", "arguments": '
END = "}\n</tool_call>"
TAG = {"type": "tag", "begin": BEGIN, "content": {"type": "json_schema", "json_schema": ARGS}, "end": END}


@pytest.fixture
def default_close(monkeypatch):
    monkeypatch.setattr(settings, "_ACTIVATED", settings.Settings())
    monkeypatch.setenv(settings.ENV_BUDGET, "close")
    yield


def test_default_makes_budget_specs_and_the_request_key_wins(default_close):
    assert is_budget_spec(parse_format(FMT)[0])
    assert not is_budget_spec(parse_format({**FMT, "tokenrails_budget": "off"})[0])
    assert parse_format({"type": "text"})[0] is None
    with pytest.raises(UnsupportedGuideError, match="DFA"):  # the default never closes by an estimate
        parse_format({"type": "grammar", "grammar": 'root ::= "a"'})
    assert parse_format({"type": "grammar", "grammar": 'root ::= "a"', "tokenrails_budget": "off"})[0] is not None
    with pytest.raises(InvalidGuideError):
        parse_format({**FMT, "tokenrails_budget": "maybe"})


def test_without_a_default_nothing_changes(monkeypatch):
    monkeypatch.setattr(settings, "_ACTIVATED", settings.Settings())
    monkeypatch.delenv(settings.ENV_BUDGET, raising=False)
    assert not is_budget_spec(parse_format(FMT)[0])
    monkeypatch.setenv(settings.ENV_BUDGET, "sometimes")
    with pytest.raises(ValueError, match="TOKENRAILS_BUDGET"):
        settings.budget_default()


def test_cli_option_and_child_env(monkeypatch):
    assert settings.pop_budget_option(["serve", "--budget", "close", "m"]) == (["serve", "m"], "close")
    assert settings.pop_budget_option(["--budget=off"]) == ([], "off")
    with pytest.raises(SystemExit):
        settings.pop_budget_option(["--budget", "always"])
    with pytest.raises(ValueError):
        settings.configure(budget="always")
    monkeypatch.setenv(settings.ENV_BUDGET, "close")
    assert inherit.child_env()[settings.ENV_BUDGET] == "close"


def test_named_and_required_calls_become_a_closable_regex():
    from tokenrails.engine_patch.lmdeploy.server.tool_budget import closable_format
    from tokenrails.guided.limits import DEFAULT_LIMITS

    named = closable_format({"type": "structural_tag", "format": TAG}, DEFAULT_LIMITS)
    assert named["tokenrails_budget"] == "close" and is_budget_spec(parse_format(named)[0])
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Rome","days":3}}\n</tool_call>'
    assert re.fullmatch(named["regex_schema"], one)
    assert not re.fullmatch(named["regex_schema"], one.replace('"days":3', '"days":"3"'))
    call = json.loads(one[len("<tool_call>\n"):-len("\n</tool_call>")])
    jsonschema.validate(call["arguments"], ARGS)
    trig = {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": [TAG], "at_least_one": True,
            "stop_after_first": False}
    required = closable_format({"type": "structural_tag", "format": trig}, DEFAULT_LIMITS)
    assert re.fullmatch(required["regex_schema"], one + "\n" + one)
    single = closable_format({"type": "structural_tag", "format": trig}, DEFAULT_LIMITS, parallel=False)
    assert not re.fullmatch(single["regex_schema"], one + "\n" + one)
    with pytest.raises(UnsupportedGuideError, match="auto"):
        closable_format({"type": "structural_tag", "format": {**trig, "at_least_one": False}}, DEFAULT_LIMITS)
    with pytest.raises(UnsupportedGuideError):
        closable_format({"type": "structural_tag", "format": {"type": "any_text"}}, DEFAULT_LIMITS)


def test_body_budget_reaches_the_response_format(upgraded):
    from lmdeploy.serve.openai.protocol import ChatCompletionRequest

    from tokenrails.engine_patch.lmdeploy.server.request_fields import with_body_budget

    msgs = [{"role": "user", "content": "hi"}]
    req = with_body_budget(ChatCompletionRequest(model="m", messages=msgs, response_format=FMT,
                                                 tokenrails_budget="close"))
    assert is_budget_spec(parse_format(req.response_format.model_dump())[0])
    own = with_body_budget(ChatCompletionRequest(model="m", messages=msgs, tokenrails_budget="close",
                                                 response_format={**FMT, "tokenrails_budget": "off"}))
    assert not is_budget_spec(parse_format(own.response_format.model_dump())[0])  # the format's own key wins
