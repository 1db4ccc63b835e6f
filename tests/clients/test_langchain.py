"""LangChain's ``ChatOpenAI(base_url=...).with_structured_output`` against the upgraded CPU api_server.

``json_schema`` sends ``response_format``, ``function_calling`` one tool with a named
``tool_choice``, ``json_mode`` a ``json_object`` format with the keys in the prompt (the server
guarantees JSON, not the keys, hence a model whose keys may all be missing). The oracle is the
object LangChain's own output parser returned.
"""
from __future__ import annotations

import pytest

jsonschema = pytest.importorskip("jsonschema")

from .conftest import side_by_side  # noqa: E402
from .shapes import CITY_PROMPT, City, CityMaybe  # noqa: E402

pytestmark = pytest.mark.slow

SCHEMAS = {"json_schema": City, "function_calling": City, "json_mode": CityMaybe}


@pytest.mark.parametrize("method", list(SCHEMAS))
def test_with_structured_output(servers, method):
    langchain_openai = pytest.importorskip("langchain_openai")  # imported where the test runs, not at collection
    model_cls = SCHEMAS[method]

    def call(s):
        chat = langchain_openai.ChatOpenAI(base_url=s.v1, api_key="none", model=s.model, temperature=0, max_tokens=100,
                                           max_retries=0, timeout=300)
        parsed = chat.with_structured_output(model_cls, method=method).invoke(CITY_PROMPT)
        if parsed is None:  # function_calling: the parser found no tool call
            raise AssertionError("LangChain parsed no object")
        return parsed

    up, _ = side_by_side(servers, f"LangChain with_structured_output(method={method})", call)
    parsed = up.get()
    assert isinstance(parsed, model_cls)
    jsonschema.validate(parsed.model_dump(exclude_none=True), model_cls.model_json_schema())
