"""litellm's OpenAI-compatible provider against the upgraded CPU api_server, ``response_format=Model``.

litellm turns the pydantic model into a ``json_schema`` format; with
``enable_json_schema_validation`` it validates the answer against that schema itself, and the test
parses it into the model.
"""
from __future__ import annotations

import pytest

jsonschema = pytest.importorskip("jsonschema")

from .conftest import side_by_side  # noqa: E402
from .shapes import CITY_PROMPT, City  # noqa: E402

pytestmark = pytest.mark.slow


def test_completion_with_response_format(servers, monkeypatch):
    litellm = pytest.importorskip("litellm")  # imported where the test runs: seconds of imports at collection otherwise
    monkeypatch.setattr(litellm, "enable_json_schema_validation", True)
    monkeypatch.setattr(litellm, "telemetry", False, raising=False)

    def call(s):
        response = litellm.completion(model=f"openai/{s.model}", api_base=s.v1, api_key="none",
                                      messages=[{"role": "user", "content": CITY_PROMPT}], response_format=City,
                                      temperature=0, max_tokens=64, num_retries=0, timeout=300)
        return City.model_validate_json(response.choices[0].message.content)

    up, _ = side_by_side(servers, "litellm completion(response_format=City)", call)
    city = up.get()
    assert isinstance(city, City)
    jsonschema.validate(city.model_dump(), City.model_json_schema())
