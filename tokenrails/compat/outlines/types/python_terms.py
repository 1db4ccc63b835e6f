"""outlines 1.x ``python_types_to_terms``: a Python type (or value) as a DSL term.

Containers render Python's own text forms (``[1, 2]``, ``("a", "b")``, ``{"k":1}``): inside
them, string values are JSON-quoted while ``None``, numbers and booleans stay bare. Behaviour
follows outlines 1.x's documented semantics and test cases; written here, not copied.
"""
from __future__ import annotations

import datetime
import re
import types as _pytypes
from typing import Any, Literal, get_args, get_origin

from . import terms as _terms
from .terms import CFG, Alternatives, JsonSchema, KleeneStar, Optional, Regex, Sequence, String, Term
from . import utils
from .type_regexes import BOOLEAN, DATE, DATETIME, INTEGER, NUMBER, STRING, TIME

MAX_DEPTH = 10
_NONE = "None"


def python_types_to_terms(ptype: Any, recursion_depth: int = 0) -> Term:
    if recursion_depth > MAX_DEPTH:
        raise RecursionError(f"maximum recursion depth ({MAX_DEPTH}) exceeded converting {ptype!r}")
    if isinstance(ptype, Term):
        return ptype
    simple = _simple_type(ptype)
    if simple is not None:
        return simple
    if ptype is dict:
        from .. import grammars

        return CFG(grammars.json)
    if isinstance(ptype, bool):
        return Regex(str(ptype))
    if isinstance(ptype, str):
        return String(ptype)
    if isinstance(ptype, (int, float)):
        return Regex(re.escape(str(ptype)))
    if ptype is None or ptype is type(None):
        return Regex(_NONE)
    if utils.is_dataclass(ptype) or utils.is_typed_dict(ptype) or utils.is_pydantic_model(ptype):
        return JsonSchema(ptype)
    if utils.is_genson_schema_builder(ptype):
        return JsonSchema(ptype.to_schema())
    if utils.is_enum(ptype):
        return Alternatives([python_types_to_terms(v, recursion_depth + 1) for v in _enum_choices(ptype)])
    origin, args = get_origin(ptype), get_args(ptype)
    if origin is Literal:
        return _handle_literal(args)
    if utils.is_union(ptype):
        return _handle_union(args, recursion_depth)
    if origin is list:
        return _handle_list(args, recursion_depth)
    if origin is tuple:
        return _handle_tuple(args, recursion_depth)
    if origin is dict:
        return _handle_dict(args, recursion_depth)
    if utils.is_callable(ptype):
        return JsonSchema(utils.get_schema_from_signature(ptype))
    raise TypeError(f"Type {ptype} is currently not supported")


def _simple_type(t: Any) -> Term | None:
    table = {int: INTEGER, float: NUMBER, bool: BOOLEAN, str: STRING, datetime.time: TIME,
             datetime.date: DATE, datetime.datetime: DATETIME}
    try:
        pattern = table.get(utils._unwrap(t))
    except TypeError:  # unhashable values
        return None
    return Regex(pattern) if pattern is not None else None


def _enum_choices(enum: Any) -> list[Any]:
    """Member values, plus functions assigned in the class body (``c = func``) — not methods
    written there (``def describe(self)``), which belong to the enum, not to its choices."""
    values = [m.value for m in enum]
    for name, value in enum.__dict__.items():
        if name.startswith("_") or not isinstance(value, _pytypes.FunctionType):
            continue
        if f"{enum.__name__}." in value.__qualname__:
            continue  # defined in the enum's own body: a method
        values.append(value)
    return values


def _handle_literal(args: tuple) -> Alternatives:
    return Alternatives([python_types_to_terms(a) for a in args])


def _handle_union(args: tuple, recursion_depth: int) -> Alternatives:
    """The members in order, ``None`` last (a bare keyword, never JSON-quoted in containers)."""
    terms = [python_types_to_terms(a, recursion_depth + 1) for a in args if a is not None and a is not type(None)]
    if any(a is None or a is type(None) for a in args):
        terms.append(Regex(_NONE))
    return Alternatives(terms)


def _ensure_json_quoted(term: Term) -> Term:
    """String values inside a container are JSON strings; everything else is as it is."""
    if isinstance(term, String):
        return String(f'"{term.value}"')
    if isinstance(term, Alternatives):
        return Alternatives([_ensure_json_quoted(t) for t in term.terms])
    return term


def _item(t: Any, recursion_depth: int) -> Term:
    return _ensure_json_quoted(python_types_to_terms(t, recursion_depth + 1))


def _repeated(open_: str, item: Term, close: str) -> Sequence:
    return Sequence([String(open_), item, KleeneStar(Sequence([String(", "), item])), String(close)])


def _handle_list(args: Any, recursion_depth: int) -> Sequence:
    if args is None or len(args) != 1:
        raise TypeError(f"Only homogeneous lists are supported, got {args}")
    return _repeated("[", _item(args[0], recursion_depth), "]")


def _handle_tuple(args: tuple, recursion_depth: int) -> Term:
    if len(args) == 0 or args == ((),):
        return String("()")
    if len(args) == 2 and args[1] is Ellipsis:
        return _repeated("(", _item(args[0], recursion_depth), ")")
    terms: list[Term] = [String("(")]
    for i, a in enumerate(args):
        if i:
            terms.append(String(", "))
        terms.append(_item(a, recursion_depth))
    terms.append(String(")"))
    return Sequence(terms)


def _quote_key(term: Term) -> Term:
    """JSON object keys are strings: literal keys and regex keys (``int``, ``float``...) are
    quoted, ``str``'s regex already is; other terms stay as they are (as in outlines 1.3)."""
    if isinstance(term, String):
        return String(f'"{term.value}"')
    if isinstance(term, Alternatives):
        return Alternatives([_quote_key(t) for t in term.terms])
    if isinstance(term, Regex) and term.pattern != STRING:
        return Sequence([String('"'), term, String('"')])
    return term


def _handle_dict(args: tuple, recursion_depth: int) -> Sequence:
    if args is None or len(args) != 2:
        raise TypeError(f"Dict must have exactly two type arguments, got {args}")
    key = _quote_key(python_types_to_terms(args[0], recursion_depth + 1))
    value = _item(args[1], recursion_depth)
    pair = [key, String(":"), value]
    return Sequence([String("{"), Optional(Sequence(pair + [KleeneStar(Sequence([String(", ")] + pair))])),
                     String("}")])


_terms.choice_item_term = python_types_to_terms  # Choice items convert as outlines converts them
