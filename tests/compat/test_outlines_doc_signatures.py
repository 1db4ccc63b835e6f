"""Calls outlines' documentation makes with keyword arguments, which must keep outlines' parameter
names (found by bench/outlines_doc_examples.py: 0.1.14's chain-of-thought cookbook)."""
from __future__ import annotations

import json

import pydantic
import pytest

from tokenrails.compat.outlines.fsm import json_schema as fsm_json_schema
from tokenrails.compat.outlines.integrations import utils as integration_utils


class Answer(pydantic.BaseModel):
    value: int


@pytest.mark.parametrize("module", [fsm_json_schema, integration_utils])
@pytest.mark.parametrize("schema", [Answer, Answer.model_json_schema(), json.dumps(Answer.model_json_schema())])
def test_convert_json_schema_to_str_takes_json_schema_by_keyword(module, schema):
    text = module.convert_json_schema_to_str(json_schema=schema)
    assert json.loads(text) == Answer.model_json_schema()
