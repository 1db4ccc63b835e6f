"""outlines 1.x output-type terms: ``Regex``, ``String``, ``JsonSchema``, ``Choice``, ``CFG``.

Only the leaf terms people construct directly; each one maps to exactly one ``GuideSpec``
(``types.convert.spec_for_output_type``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, List, Optional

from ....guided.errors import InvalidGuideError


class Term:
    """Base of every output-type term."""

    def matches(self, value: str) -> bool:
        """Whether ``value`` is in the term's language (regex terms only)."""
        from .convert import regex_of

        return re.fullmatch(regex_of(self), value) is not None

    def validate(self, value: str) -> str:
        if not self.matches(value):
            raise ValueError(f"{value!r} does not match {self!r}")
        return value

    # a term used as a pydantic field annotation (``attr: types.email``): a string with the
    # term's regex as its ``pattern``
    def __get_pydantic_core_schema__(self, source_type: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        from .convert import regex_of

        return core_schema.str_schema(pattern=regex_of(self))


@dataclass
class String(Term):
    """A literal string."""

    value: str


@dataclass
class Regex(Term):
    """A regular expression (outlines' dialect)."""

    pattern: str


@dataclass
class CFG(Term):
    """A context-free grammar in EBNF (xgrammar's dialect; outlines used Lark)."""

    definition: str

    @classmethod
    def from_file(cls, path: str) -> "CFG":
        with open(path, encoding="utf-8") as f:
            return cls(f.read())


@dataclass
class Choice(Term):
    """One of ``items`` (strings, or values rendered with ``str``)."""

    items: List[Any]


class JsonSchema(Term):
    """A JSON schema: dict, JSON text, pydantic model, dataclass or TypedDict."""

    def __init__(self, schema: Any, whitespace_pattern: Optional[str] = None, ensure_ascii: bool = True):
        if isinstance(schema, dict):
            text = json.dumps(schema, ensure_ascii=ensure_ascii)
        elif isinstance(schema, str):
            text = schema
        elif isinstance(schema, type):
            from pydantic import TypeAdapter

            model_json_schema = getattr(schema, "model_json_schema", None)
            value = model_json_schema() if callable(model_json_schema) else TypeAdapter(schema).json_schema()
            text = json.dumps(value, ensure_ascii=ensure_ascii)
        else:
            raise InvalidGuideError(f"Cannot parse schema {schema!r}")
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidGuideError(f"JSON schema is not valid JSON: {exc}") from exc
        self.schema = text
        self.whitespace_pattern = whitespace_pattern

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, JsonSchema) and json.loads(self.schema) == json.loads(other.schema)
                and self.whitespace_pattern == other.whitespace_pattern)

    def __repr__(self) -> str:
        return f"JsonSchema(schema={self.schema!r})"


def to_regex(term: Any) -> str:
    """The regex of a regex-expressible term (outlines 1.x ``outlines.types.dsl.to_regex``)."""
    from .convert import regex_of

    return regex_of(term)


def regex(pattern: str) -> Regex:
    return Regex(pattern)


def json_schema(schema: Any, whitespace_pattern: Optional[str] = None) -> JsonSchema:
    return JsonSchema(schema, whitespace_pattern)


def cfg(definition: str) -> CFG:
    return CFG(definition)
