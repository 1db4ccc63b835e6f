"""Output type (Python type or DSL term) → ``GuideSpec``, with outlines 1.x's languages."""
from __future__ import annotations

import dataclasses
import datetime
import enum
import inspect
import re
import typing
from typing import Any, Literal, get_args, get_origin

from .... import GuideError, GuideSpec, UnsupportedGuideError
from .._json_language import json_spec
from ..regex_dialect import outlines_dialect
from ..grammars import grammar_spec
from .terms import CFG, Choice, JsonSchema, Regex, String, Term
# outlines 1.x ``outlines.types`` patterns for Python types.
from .type_regexes import BOOLEAN, DATE, DATETIME, INTEGER, NUMBER, STRING, TIME  # noqa: F401  (outlines names)

_SCALARS: dict[Any, str] = {
    int: INTEGER, float: NUMBER, bool: BOOLEAN, str: STRING,
    datetime.datetime: DATETIME, datetime.date: DATE, datetime.time: TIME,
}


def _literal_strings(values: typing.Iterable[Any]) -> list[str]:
    return [v if isinstance(v, str) else str(v) for v in values]


def _is_structured(t: Any) -> bool:
    if not isinstance(t, type):
        return False
    if callable(getattr(t, "model_json_schema", None)) or dataclasses.is_dataclass(t):
        return True
    return typing.is_typeddict(t)


def spec_for_output_type(output_type: Any) -> GuideSpec | None:
    """``None`` means unconstrained text. Unsupported types raise ``UnsupportedGuideError``.

    Common types take a direct route; every other form goes where outlines 1.x sends it
    (``python_types_to_terms``): a ``CFG`` term is a grammar, a ``JsonSchema`` term a JSON schema,
    anything else (unions, lists, tuples, dicts, literals inside them...) the term's regex.
    """
    if output_type is None or isinstance(output_type, GuideSpec):
        return output_type
    if isinstance(output_type, Term):
        return _spec_for_term(output_type)
    if output_type in _SCALARS:
        return GuideSpec.regex(outlines_dialect(_SCALARS[output_type]))
    if output_type is dict:  # outlines 1.x: its Lark JSON grammar (any JSON value)
        from ..grammars import json as json_grammar

        return grammar_spec(json_grammar)
    if get_origin(output_type) is Literal:
        return GuideSpec.choice(_literal_strings(get_args(output_type)))
    if isinstance(output_type, type) and issubclass(output_type, enum.Enum):
        return GuideSpec.choice(_literal_strings(m.value for m in output_type))
    if _is_structured(output_type):
        return json_spec(JsonSchema(output_type).schema)
    if inspect.isfunction(output_type) or inspect.ismethod(output_type):
        from ..fsm.json_schema import get_schema_from_signature

        return json_spec(get_schema_from_signature(output_type))
    from .python_terms import python_types_to_terms

    try:
        term = python_types_to_terms(output_type)
    except GuideError:
        raise
    except (TypeError, ValueError, RecursionError) as exc:  # what outlines raises for these
        raise UnsupportedGuideError(
            f"output type {output_type!r} is not supported (outlines 1.x refuses it too: {exc})",
            feature="output_type",
        ) from exc
    return _spec_for_term(term)


def _spec_for_term(term: Term) -> GuideSpec:
    if isinstance(term, Regex):
        return GuideSpec.regex(outlines_dialect(term.pattern))
    if isinstance(term, String):
        return GuideSpec.regex(re.escape(term.value))
    if isinstance(term, JsonSchema):
        return json_spec(term.schema, term.whitespace_pattern)
    if isinstance(term, Choice) and all(isinstance(i, (str, int, float)) for i in term.items):
        return GuideSpec.choice(_literal_strings(term.items))  # (terms among the items: their regex, below)
    if isinstance(term, CFG):
        return grammar_spec(term.definition)
    from .terms import to_regex

    try:  # combinators (sequences, alternatives, quantifiers) are regexes
        return GuideSpec.regex(outlines_dialect(to_regex(term)))
    except TypeError as exc:
        raise UnsupportedGuideError(f"term {term!r} is not supported", feature="output_type") from exc


def regex_of(output_type: Any) -> str:
    """The regex of a regex-expressible output type (for ``Term.matches``)."""
    spec = spec_for_output_type(output_type)
    if spec is None:
        return r"(?s:.*)"
    if spec.kind == "regex":
        return spec.pattern
    if spec.kind == "choice":
        return "(" + "|".join(re.escape(c) for c in spec.choices) + ")"
    raise UnsupportedGuideError(f"{spec.kind} output types have no regex", feature=spec.kind)
