"""``outlines.generate`` (0.x): ``json``, ``regex``, ``choice``, ``format``, ``text``, ``cfg``.

Each builds one tokenrails-backed logits processor for the model's tokenizer and returns a
``SequenceGeneratorAdapter``; languages are outlines' (regex dialect, outlines-core JSON regex,
``(a|b)`` choices), CFGs are EBNF.
"""
from __future__ import annotations

import json as _pyjson
from enum import Enum
from typing import Any, Callable, List, Optional, Union

from ..fsm.json_schema import get_schema_from_enum, get_schema_from_signature
from ..fsm.types import python_types_to_regex
from ..processors.structured import (
    CFGLogitsProcessor,
    JSONLogitsProcessor,
    RegexLogitsProcessor,
    processor_for_spec,
)
from .... import GuideSpec
from .api import SequenceGeneratorAdapter


def regex(model: Any, regex_str: str, sampler: Any = None) -> SequenceGeneratorAdapter:
    return SequenceGeneratorAdapter(model, RegexLogitsProcessor(regex_str, tokenizer=model.tokenizer), sampler)


def json(model: Any, schema_object: Union[str, object, Callable], sampler: Any = None,
         whitespace_pattern: Optional[str] = None) -> SequenceGeneratorAdapter:
    """Pydantic model → instances; Enum, callable, dict or JSON text → ``json.loads`` output."""
    parse: Callable[[str], Any] = _pyjson.loads
    if isinstance(schema_object, type) and callable(getattr(schema_object, "model_validate_json", None)):
        schema: Any = schema_object.model_json_schema()
        parse = schema_object.model_validate_json
    elif isinstance(schema_object, type) and issubclass(schema_object, Enum):
        schema = get_schema_from_enum(schema_object)
    elif isinstance(schema_object, (str, dict)):
        schema = schema_object
    elif hasattr(schema_object, "to_json") and hasattr(schema_object, "add_schema"):  # genson
        schema = schema_object.to_json()
    elif callable(schema_object):
        schema = get_schema_from_signature(schema_object)
    else:
        raise ValueError(
            f"Cannot parse schema {schema_object}. The schema must be either a Pydantic object, "
            "a function or a string that contains the JSON Schema specification"
        )
    processor = JSONLogitsProcessor(schema, tokenizer=model.tokenizer, whitespace_pattern=whitespace_pattern)
    generator = SequenceGeneratorAdapter(model, processor, sampler)
    generator.format_sequence = parse
    return generator


def choice(model: Any, choices: Union[List[str], type[Enum]], sampler: Any = None) -> SequenceGeneratorAdapter:
    """A list → one of its strings; an Enum → its JSON ``oneOf``/``const`` values, parsed."""
    if isinstance(choices, type) and issubclass(choices, Enum):
        generator = json(model, _pyjson.dumps(get_schema_from_enum(choices)), sampler)
        return generator
    processor = processor_for_spec(GuideSpec.choice(list(choices)), model.tokenizer)
    return SequenceGeneratorAdapter(model, processor, sampler)


def format(model: Any, python_type: Any, sampler: Any = None) -> SequenceGeneratorAdapter:
    """Text parseable as ``python_type`` (int, float, bool, date/time, Enum names)."""
    regex_str, parse = python_types_to_regex(python_type)
    generator = regex(model, regex_str, sampler)
    generator.format_sequence = parse
    return generator


def text(model: Any, sampler: Any = None) -> SequenceGeneratorAdapter:
    return SequenceGeneratorAdapter(model, None, sampler)


def cfg(model: Any, cfg_str: str, sampler: Any = None) -> SequenceGeneratorAdapter:
    return SequenceGeneratorAdapter(model, CFGLogitsProcessor(cfg_str, tokenizer=model.tokenizer), sampler)


def fsm(model: Any, fsm: Any, sampler: Any = None) -> SequenceGeneratorAdapter:  # noqa: A002
    """Text accepted by an interegular FSM (converted back to a regex: same language)."""
    from ..fsm.fsm_regex import fsm_to_regex

    return SequenceGeneratorAdapter(model, RegexLogitsProcessor(fsm_to_regex(fsm), tokenizer=model.tokenizer), sampler)


__all__ = ["SequenceGeneratorAdapter", "cfg", "choice", "format", "fsm", "json", "regex", "text"]
