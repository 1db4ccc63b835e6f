"""instructor against the upgraded CPU api_server: ``response_model=`` in JSON_SCHEMA and TOOLS modes.

JSON_SCHEMA sends the model's schema as ``response_format``; TOOLS sends it as one tool with a
named ``tool_choice`` (stock leaves a named choice unconstrained). The oracle is the instance
instructor itself validated, checked again with jsonschema. ``max_retries=0``: one request, so a
failure is the server's answer, not a retry's.
"""
from __future__ import annotations

import pytest

instructor = pytest.importorskip("instructor")
jsonschema = pytest.importorskip("jsonschema")

from .conftest import side_by_side  # noqa: E402
from .shapes import CITY_PROMPT, City  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", ["JSON_SCHEMA", "TOOLS"])
def test_response_model(servers, mode):
    def call(s):
        client = instructor.from_openai(s.openai(), mode=getattr(instructor.Mode, mode))
        return client.chat.completions.create(model=s.model, messages=[{"role": "user", "content": CITY_PROMPT}],
                                              response_model=City, temperature=0, max_tokens=100, max_retries=0)

    up, _ = side_by_side(servers, f"instructor Mode.{mode}, response_model=City", call)
    city = up.get()
    assert isinstance(city, City)
    jsonschema.validate(city.model_dump(), City.model_json_schema())
