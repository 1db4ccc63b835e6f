"""The openai SDK against the upgraded CPU api_server: the SDK's own parsed objects, stock side by side.

``chat.completions.parse`` / ``.stream`` with pydantic ``response_format``, ``pydantic_function_tool``
tools under each ``tool_choice``, ``json_object``, ``responses.parse`` (LMDeploy 0.18 serves
``/v1/responses``) and vLLM's ``extra_body`` guided fields. The oracle is the object the SDK parsed,
validated again against the model's JSON schema with jsonschema.
"""
from __future__ import annotations

import json
import re

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from .conftest import side_by_side  # noqa: E402
from .shapes import (CITY_PROMPT, PERSON_PROMPT, TOOL_MESSAGES, Address, City, Color, GetTime,  # noqa: E402
                     GetWeather, Person, SearchWeb)

pytestmark = pytest.mark.slow



def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _parsed_message(completion):
    """The SDK's parsed message; a refusal or a missing object is an error of the call."""
    msg = completion.choices[0].message
    if msg.parsed is None:
        raise AssertionError(f"no parsed object (finish_reason={completion.choices[0].finish_reason}): {msg.content!r}")
    return msg


def test_parse_nested_models_enums_optional_lists(servers):
    def call(s):
        return _parsed_message(s.openai().chat.completions.parse(
            model=s.model, messages=_user(PERSON_PROMPT), response_format=Person, temperature=0, max_tokens=128))

    up, _ = side_by_side(servers, "openai chat.completions.parse(Person)", call)
    msg = up.get()
    person = msg.parsed
    assert isinstance(person, Person) and isinstance(person.address, Address) and isinstance(person.favourite, Color)
    assert all(isinstance(tag, str) for tag in person.tags)
    jsonschema.validate(json.loads(msg.content), Person.model_json_schema())


def test_stream_with_response_format(servers):
    def call(s):
        deltas = []
        with s.openai().chat.completions.stream(model=s.model, messages=_user(CITY_PROMPT), response_format=City,
                                                temperature=0, max_tokens=80) as stream:
            for event in stream:
                if event.type == "content.delta":
                    deltas.append(event.delta)
            final = stream.get_final_completion()
        return deltas, _parsed_message(final)

    up, _ = side_by_side(servers, "openai chat.completions.stream(City)", call)
    deltas, msg = up.get()
    assert len(deltas) > 1 and "".join(deltas) == msg.content  # really streamed, and the pieces make the whole
    assert isinstance(msg.parsed, City)
    jsonschema.validate(json.loads(msg.content), City.model_json_schema())


TOOLS = [openai.pydantic_function_tool(GetWeather), openai.pydantic_function_tool(GetTime)]
MODELS = {"GetWeather": GetWeather, "GetTime": GetTime, "SearchWeb": SearchWeb}
CHOICES = {"required": "required", "auto": "auto", "named": {"type": "function", "function": {"name": "GetTime"}}}


def _tool_calls(s, tools, tool_choice):
    completion = s.openai().chat.completions.parse(model=s.model, messages=TOOL_MESSAGES, tools=tools,
                                                   tool_choice=tool_choice, temperature=0, max_tokens=64)
    calls = completion.choices[0].message.tool_calls or []
    if not calls:
        raise AssertionError(f"no tool call: {completion.choices[0].message.content!r}")
    return calls


def _check_calls(calls, tools) -> None:
    for call in calls:
        model = MODELS[call.function.name]
        assert isinstance(call.function.parsed_arguments, model), call
        schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), schema)


@pytest.mark.parametrize("choice", list(CHOICES))
def test_pydantic_function_tools(servers, choice):
    up, _ = side_by_side(servers, f"openai pydantic_function_tool, tool_choice={choice}",
                         lambda s: _tool_calls(s, TOOLS, CHOICES[choice]))
    calls = up.get()
    _check_calls(calls, TOOLS)
    if choice == "named":
        assert [c.function.name for c in calls] == ["GetTime"]


@pytest.mark.parametrize("choice", ["required", "auto", "named"])
def test_pydantic_function_tool_with_max_length(servers, choice):
    tools = [openai.pydantic_function_tool(GetWeather), openai.pydantic_function_tool(SearchWeb)]
    tool_choice = {"type": "function", "function": {"name": "SearchWeb"}} if choice == "named" else choice
    up, _ = side_by_side(servers, f"openai tool with Field(max_length), tool_choice={choice}",
                         lambda s: _tool_calls(s, tools, tool_choice))
    _check_calls(up.get(), tools)


def test_json_object(servers):
    def call(s):
        completion = s.openai().chat.completions.create(model=s.model, messages=_user(CITY_PROMPT), temperature=0,
                                                        max_tokens=80, response_format={"type": "json_object"})
        return json.loads(completion.choices[0].message.content)

    up, _ = side_by_side(servers, "openai response_format=json_object", call)
    assert isinstance(up.get(), dict)


def test_responses_parse(servers):
    def call(s):
        response = s.openai().responses.parse(model=s.model, input=CITY_PROMPT, text_format=City, temperature=0,
                                              max_output_tokens=80)
        if response.output_parsed is None:
            raise AssertionError(f"no parsed object: {response.status} {response.output_text!r}")
        return response

    up, _ = side_by_side(servers, "openai responses.parse(City)", call)
    response = up.get()
    assert isinstance(response.output_parsed, City)
    jsonschema.validate(json.loads(response.output_text), City.model_json_schema())


def _guided(field: str, value, check, prompt: str, max_tokens: int):
    def call(s):
        completion = s.openai().chat.completions.create(model=s.model, messages=_user(prompt), temperature=0,
                                                        max_tokens=max_tokens, extra_body={field: value})
        text = completion.choices[0].message.content
        check(text)
        return text
    return call


def _json_check(text: str) -> None:
    jsonschema.validate(json.loads(text), City.model_json_schema())


def _regex_check(text: str) -> None:
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", text), text


def _choice_check(text: str) -> None:
    assert text in ("yes", "no"), text


GUIDED = {
    "guided_json": (City.model_json_schema(), _json_check, CITY_PROMPT, 60),
    "guided_regex": (r"\d{4}-\d{2}-\d{2}", _regex_check, "When was the Eiffel Tower built?", 20),
    "guided_choice": (["yes", "no"], _choice_check, "Is the sky blue?", 10),
}


@pytest.mark.parametrize("field", list(GUIDED))
def test_extra_body_guided_fields(servers, field):
    value, check, prompt, max_tokens = GUIDED[field]
    # stock LMDeploy has no such fields (it ignores them): nothing to compare, the upgraded call alone
    up, _ = side_by_side(servers, f"openai extra_body={{{field!r}: ...}}", _guided(field, value, check, prompt, max_tokens),
                         with_stock=False)
    check(up.get())
