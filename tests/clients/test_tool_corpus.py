"""bench/tool_corpus.py's pure parts: BFCL function docs as OpenAI tools, and the call judge.

No server and no network: BFCL entries come from the sample committed under bench/data (verbatim
BFCL lines) plus one entry written here with the nested and Java-style types BFCL also uses.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")

from bench import tool_corpus as tc  # noqa: E402

SAMPLE = Path(tc.__file__).parent / "data" / "bfcl_v4_simple_python_sample.jsonl"
NESTED = {"id": "nested_0", "question": [[{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": "Order two lattes."}]],
          "function": [{"name": "shop.order", "description": "Place an order.", "parameters": {
              "type": "dict", "required": ["items"], "properties": {
                  "items": {"type": "array", "items": {"type": "dict", "properties": {
                      "name": {"type": "String"}, "count": {"type": "long"}, "size": {"type": "tuple",
                                                                                    "items": {"type": "float"}}},
                      "required": ["name"]}},
                  "note": {"type": "any", "description": "anything"},
                  "express": {"type": "bool", "default": False}}}}]}


def _types(schema) -> set[str]:
    found = set()
    if isinstance(schema, dict):
        if isinstance(schema.get("type"), str):
            found.add(schema["type"])
        for value in schema.values():
            found |= _types(value)
    elif isinstance(schema, list):
        for value in schema:
            found |= _types(value)
    return found


def test_bfcl_docs_become_openai_tools():
    sets = tc.bfcl_toolsets(SAMPLE.read_text().splitlines() + [json.dumps(NESTED)], "sample")
    assert len(sets) == 9 and all(s.messages for s in sets)
    for ts in sets:
        for tool in ts.tools:
            fn = tool["function"]
            assert tool["type"] == "function" and tc.NAME_OK.fullmatch(fn["name"]), fn["name"]
            jsonschema.Draft202012Validator.check_schema(fn["parameters"])
            assert fn["parameters"]["type"] == "object"
            assert _types(fn["parameters"]) <= {"object", "array", "string", "integer", "number", "boolean"}
    order = sets[-1].tools[0]["function"]
    assert order["name"] == "shop_order" and order["description"] == "Place an order."
    item = order["parameters"]["properties"]["items"]["items"]
    assert item["properties"]["size"] == {"type": "array", "items": {"type": "number"}}
    assert "type" not in order["parameters"]["properties"]["note"]  # BFCL's "any": no constraint
    # the mapped schema judges as BFCL means it: an object item, a float inside a tuple
    assert jsonschema.Draft202012Validator(order["parameters"]).is_valid(
        {"items": [{"name": "latte", "count": 2, "size": [0.5]}], "note": [1], "express": True})
    assert not jsonschema.Draft202012Validator(order["parameters"]).is_valid({"items": [{"count": 2}]})


def test_load_bfcl_takes_categories_round_robin(tmp_path):
    for category, n in (("a", 3), ("b", 1)):
        lines = [json.dumps({**NESTED, "id": f"{category}_{i}"}) for i in range(n)]
        (tmp_path / f"BFCL_v4_{category}.json").write_text("\n".join(lines) + "\n")
    assert [s.label for s in tc.load_bfcl(tmp_path, ["a", "b"], 3)] == ["a_0", "b_0", "a_1"]
    assert len(tc.load_bfcl(tmp_path, ["a", "b"], 10)) == 4


def test_the_prompt_keeps_the_entrys_system_message_after_ours():
    ts = tc.bfcl_toolsets([json.dumps(NESTED)], "x")[0]
    messages = tc.prompt_messages(ts)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "shop_order" in messages[0]["content"] and messages[0]["content"].endswith("Be brief.")


def _answer(ts, mode, calls, finish="tool_calls"):
    body = {"choices": [{"finish_reason": finish, "message": {"tool_calls": [
        {"function": {"name": n, "arguments": a}} for n, a in calls]}}], "usage": {"completion_tokens": 9}}
    return tc.judge(ts, mode, 200, 1.0, body)


def test_judge_validates_every_call_against_its_tool():
    ts = tc.bfcl_toolsets([json.dumps(NESTED)], "x")[0]
    good = json.dumps({"items": [{"name": "latte", "count": 2}]})
    assert _answer(ts, "required", [("shop_order", good)]).valid
    assert _answer(ts, "named", [("shop_order", good)]).valid
    wrong_type = json.dumps({"items": [{"name": 5}]})
    assert "items/0/name" in _answer(ts, "required", [("shop_order", wrong_type)]).problems[0]
    assert "not JSON" in _answer(ts, "required", [("shop_order", '{"items": [')]).problems[0]
    assert "unknown function" in _answer(ts, "required", [("shop_elsewhere", good)]).problems[0]
    assert _answer(ts, "required", []).problems == ["no call"] and not _answer(ts, "required", []).valid
    prose = _answer(ts, "auto", [])
    assert prose.served and not prose.checked  # auto without a call is not judged
    cut = _answer(ts, "named", [("shop_order", '{"items": [{"na')], finish="length")
    assert cut.cut and not cut.valid


def test_named_call_of_another_function_is_invalid():
    two = dict(NESTED, function=NESTED["function"] + [{"name": "shop.cancel", "parameters": {
        "type": "dict", "properties": {}, "required": []}}])
    ts = tc.bfcl_toolsets([json.dumps(two)], "x")[0]
    assert tc.tool_choice(ts, "named") == {"type": "function", "function": {"name": "shop_order"}}
    assert "named 'shop_order'" in _answer(ts, "named", [("shop_cancel", "{}")]).problems[0]
    assert _answer(ts, "required", [("shop_cancel", "{}")]).valid


def test_pydantic_tool_sets_are_valid_schemas_with_constraints():
    pytest.importorskip("openai")
    sets = tc.pydantic_toolsets()
    assert {s.source for s in sets} == {"pydantic:strict", "pydantic:schema"}
    text = json.dumps([s.tools for s in sets])
    for keyword in ("maxLength", "minLength", "pattern", "maximum", "exclusiveMinimum", "enum", "maxItems", "$defs"):
        assert f'"{keyword}"' in text, keyword
    for ts in sets:
        for tool in ts.tools:
            jsonschema.Draft202012Validator.check_schema(tool["function"]["parameters"])
