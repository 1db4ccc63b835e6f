"""``outlines.models.utils`` (1.x): schema helpers shared by model integrations."""
from __future__ import annotations

from ....requests import disable_additional_properties


def set_additional_properties_false_json_schema(schema: dict) -> dict:
    """``schema`` with ``additionalProperties: false`` on every object schema (nested, nullable
    ``["object", "null"]`` included) that does not set it itself — what strict-mode APIs require."""
    return disable_additional_properties(schema)


__all__ = ["set_additional_properties_false_json_schema"]
