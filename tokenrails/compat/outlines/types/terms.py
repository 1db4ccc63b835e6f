"""The DSL's term classes and combinators (``Regex``, ``String``, ``JsonSchema``, ``Choice``,
``CFG``, sequences, alternatives, quantifiers) and ``to_regex``: a leaf that ``dsl`` (outlines'
public module) and ``python_terms`` both build on.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, List

from .... import InvalidGuideError


class Term:
    """Base of every output-type term: combinable (``+`` sequence, ``|`` alternatives,
    quantifiers), printable as a tree, usable as a pydantic field type, convertible to a regex."""

    # ---- pickling: the classes say ``outlines.types.dsl``; rebuild them from here instead ----
    def __reduce_ex__(self, protocol: Any) -> Any:
        cls = type(self)
        if globals().get(cls.__name__) is cls:
            return (_rebuild_term, (cls.__name__, dict(self.__dict__)))
        return super().__reduce_ex__(protocol)

    # ---- regex language ------------------------------------------------------------------
    def matches(self, value: Any) -> bool:
        """Whether ``str(value)`` is in the term's language."""
        return re.fullmatch(to_regex(self), str(value)) is not None

    def validate(self, value: str) -> str:
        if not self.matches(value):
            raise ValueError(f"{value!r} does not match {self!r}")
        return value

    # ---- combinators -----------------------------------------------------------------------
    def __add__(self, other: Any) -> "Sequence":
        return Sequence([self, _as_term(other)])

    def __radd__(self, other: Any) -> "Sequence":
        return Sequence([_as_term(other), self])

    def __or__(self, other: Any) -> "Alternatives":
        return Alternatives([self, _as_term(other)])

    def __ror__(self, other: Any) -> "Alternatives":
        return Alternatives([_as_term(other), self])

    def optional(self) -> "Optional":
        return Optional(self)

    def exactly(self, count: int) -> "QuantifyExact":
        return QuantifyExact(self, count)

    def at_least(self, count: int) -> "QuantifyMinimum":
        return QuantifyMinimum(self, count)

    def at_most(self, count: int) -> "QuantifyMaximum":
        return QuantifyMaximum(self, count)

    def between(self, min_count: int, max_count: int) -> "QuantifyBetween":
        return QuantifyBetween(self, min_count, max_count)

    def one_or_more(self) -> "KleenePlus":
        return KleenePlus(self)

    def zero_or_more(self) -> "KleeneStar":
        return KleeneStar(self)

    # ---- display ---------------------------------------------------------------------------
    def _display_node(self) -> str:
        raise NotImplementedError

    def _children(self) -> list["Term"]:
        return []

    def _display_children(self, indent: str) -> str:
        kids = self._children()
        return "".join(k.display_ascii_tree(indent, i == len(kids) - 1) for i, k in enumerate(kids))

    def display_ascii_tree(self, indent: str = "", is_last: bool = True) -> str:
        line = indent + ("└── " if is_last else "├── ") + self._display_node() + "\n"
        return line + self._display_children(indent + ("    " if is_last else "│   "))

    def __str__(self) -> str:
        return self.display_ascii_tree()

    # ---- pydantic: a string field in the term's language -------------------------------------
    def __get_validator__(self, _core_schema: Any) -> Any:
        pattern = re.compile(to_regex(self))

        def validate(value: Any) -> Any:
            if pattern.fullmatch(str(value)) is None:
                raise ValueError(f"Input should be in the language of the regular expression {pattern.pattern}")
            return value

        return validate

    def __get_pydantic_core_schema__(self, source_type: Any, handler: Any) -> Any:
        from pydantic_core import core_schema as cs

        return cs.no_info_plain_validator_function(self.__get_validator__(None))

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict:
        return {"type": "string", "pattern": to_regex(self)}


def _rebuild_term(name: str, state: dict) -> "Term":
    """Unpickle a term of this module (see ``Term.__reduce_ex__``)."""
    term = object.__new__(globals()[name])
    term.__dict__.update(state)
    return term


def _as_term(value: Any) -> "Term":
    return value if isinstance(value, Term) else String(str(value))


@dataclass
class String(Term):
    """A literal string."""

    value: str

    def _display_node(self) -> str:
        return f"String('{self.value}')"

    def __repr__(self) -> str:
        return f"String(value='{self.value}')"


@dataclass
class Regex(Term):
    """A regular expression (outlines' dialect)."""

    pattern: str

    def _display_node(self) -> str:
        return f"Regex('{self.pattern}')"

    def __repr__(self) -> str:
        return f"Regex(pattern='{self.pattern}')"


@dataclass
class CFG(Term):
    """A context-free grammar in EBNF (xgrammar's dialect; outlines used Lark)."""

    definition: str

    def _display_node(self) -> str:
        return f"CFG('{self.definition}')"

    def __repr__(self) -> str:
        return f"CFG(definition='{self.definition}')"

    @classmethod
    def from_file(cls, path: str) -> "CFG":
        with open(path, encoding="utf-8") as f:
            return cls(f.read())


@dataclass
class Choice(Term):
    """One of ``items`` (strings, or values rendered with ``str``)."""

    items: List[Any]

    def _display_node(self) -> str:
        return f"Choice({self.items!r})"


class JsonSchema(Term):
    """A JSON schema: dict, JSON text, pydantic model, dataclass or TypedDict."""

    def __init__(self, schema: Any, whitespace_pattern: str | None = None, ensure_ascii: bool = True):
        if isinstance(schema, dict):
            text = json.dumps(schema, ensure_ascii=ensure_ascii)
        elif isinstance(schema, str):
            text = schema
        elif hasattr(schema, "to_schema") and callable(schema.to_schema):  # genson SchemaBuilder
            text = json.dumps(schema.to_schema(), ensure_ascii=ensure_ascii)
        elif isinstance(schema, type):
            from pydantic import TypeAdapter

            model_json_schema = getattr(schema, "model_json_schema", None)
            value = model_json_schema() if callable(model_json_schema) else TypeAdapter(schema).json_schema()
            text = json.dumps(value, ensure_ascii=ensure_ascii)
        else:
            raise InvalidGuideError(f"Cannot parse schema {schema!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidGuideError(f"JSON schema is not valid JSON: {exc}") from exc
        if isinstance(value, dict):  # outlines checks against the metaschema (jsonschema.SchemaError)
            import jsonschema

            jsonschema.validators.validator_for(value).check_schema(value)
        self.schema = text
        self.whitespace_pattern = whitespace_pattern

    @staticmethod
    def is_json_schema(obj: Any) -> bool:
        """A schema *object*: a JsonSchema, a genson builder, a pydantic model, TypedDict or
        dataclass (plain dicts and strings are not)."""
        from . import utils

        return (isinstance(obj, JsonSchema) or utils.is_genson_schema_builder(obj)
                or utils.is_pydantic_model(obj) or utils.is_typed_dict(obj) or utils.is_dataclass(obj))

    @staticmethod
    def convert_to(schema: Any, target_types: List[str]) -> Any:
        """``schema`` as the first of ``target_types`` it can become ("str", "dict", "pydantic",
        "typeddict", "dataclass", "genson"); the object itself when it already is one."""
        from . import json_schema_utils as jsu
        from . import utils

        kind = ("pydantic" if utils.is_pydantic_model(schema) else "typeddict" if utils.is_typed_dict(schema)
                else "dataclass" if utils.is_dataclass(schema) else "genson" if utils.is_genson_schema_builder(schema)
                else "jsonschema")
        for target in target_types:
            if target == kind:
                return schema
            text = schema.schema if isinstance(schema, JsonSchema) else JsonSchema(schema).schema
            if target == "str":
                return text
            if target == "dict":
                return json.loads(text)
            converter = {"pydantic": jsu.json_schema_dict_to_pydantic, "typeddict": jsu.json_schema_dict_to_typeddict,
                         "dataclass": jsu.json_schema_dict_to_dataclass}.get(target)
            if converter is not None:
                return converter(json.loads(text))
        raise ValueError(f"Cannot convert schema type {kind} to any of {target_types}")

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, JsonSchema) and json.loads(self.schema) == json.loads(other.schema)
                and self.whitespace_pattern == other.whitespace_pattern)

    def __repr__(self) -> str:
        return f"JsonSchema(schema='{self.schema}')"

    def _display_node(self) -> str:
        return f"JsonSchema('{self.schema}')"

    @classmethod
    def from_file(cls, path: str) -> "JsonSchema":
        with open(path, encoding="utf-8") as f:
            return cls(f.read())


# ---- composite terms ---------------------------------------------------------------------
def _non_negative(name: str, value: int, owner: str = "Quantify") -> None:
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"{owner}: `{name}` must be a non-negative integer.")


@dataclass
class Sequence(Term):
    terms: List[Term]

    def _display_node(self) -> str:
        return "Sequence"

    def _children(self) -> list[Term]:
        return list(self.terms)


@dataclass
class Alternatives(Term):
    terms: List[Term]

    def _display_node(self) -> str:
        return "Alternatives(|)"

    def _children(self) -> list[Term]:
        return list(self.terms)


@dataclass
class _Unary(Term):
    term: Term

    def _children(self) -> list[Term]:
        return [self.term]


@dataclass
class Optional(_Unary):
    def _display_node(self) -> str:
        return "Optional(?)"


@dataclass
class KleeneStar(_Unary):
    def _display_node(self) -> str:
        return "KleeneStar(*)"


@dataclass
class KleenePlus(_Unary):
    def _display_node(self) -> str:
        return "KleenePlus(+)"


@dataclass
class QuantifyExact(_Unary):
    count: int

    def __post_init__(self) -> None:
        _non_negative("count", self.count, "QuantifyExact")

    def _display_node(self) -> str:
        return f"Quantify({{{self.count}}})"


@dataclass
class QuantifyMinimum(_Unary):
    min_count: int

    def __post_init__(self) -> None:
        _non_negative("min_count", self.min_count, "QuantifyMinimum")

    def _display_node(self) -> str:
        return f"Quantify({{{self.min_count},}})"


@dataclass
class QuantifyMaximum(_Unary):
    max_count: int

    def __post_init__(self) -> None:
        _non_negative("max_count", self.max_count, "QuantifyMaximum")

    def _display_node(self) -> str:
        return f"Quantify({{,{self.max_count}}})"


@dataclass
class QuantifyBetween(_Unary):
    min_count: int
    max_count: int

    def __post_init__(self) -> None:
        _non_negative("min_count", self.min_count, "QuantifyBetween")
        _non_negative("max_count", self.max_count, "QuantifyBetween")
        if self.max_count < self.min_count:
            raise ValueError("QuantifyBetween: `max_count` must be greater than `min_count`.")

    def _display_node(self) -> str:
        return f"Quantify({{{self.min_count},{self.max_count}}})"


def _str_term(value: Any) -> Any:
    """outlines 1.3's DSL functions: a ``str`` argument is a literal ``String``; anything else is
    taken as the term it is."""
    return String(value) if isinstance(value, str) else value


def either(*terms: Any) -> Alternatives:
    """One of ``terms`` (regex ``(a|b)``)."""
    return Alternatives([_str_term(t) for t in terms])


def optional(term: Any) -> Optional:
    """``term`` or nothing (``(t)?``)."""
    return Optional(_str_term(term))


def exactly(count: int, term: Any) -> QuantifyExact:
    """``term`` repeated ``count`` times (``(t){n}``)."""
    return QuantifyExact(_str_term(term), count)


def at_least(count: int, term: Any) -> QuantifyMinimum:
    """``term`` repeated ``count`` times or more (``(t){n,}``)."""
    return QuantifyMinimum(_str_term(term), count)


def at_most(count: int, term: Any) -> QuantifyMaximum:
    """``term`` repeated at most ``count`` times (``(t){0,n}``)."""
    return QuantifyMaximum(_str_term(term), count)


def between(min_count: int, max_count: int, term: Any) -> QuantifyBetween:
    """``term`` repeated ``min_count`` to ``max_count`` times (``(t){m,n}``)."""
    return QuantifyBetween(_str_term(term), min_count, max_count)


def one_or_more(term: Any) -> KleenePlus:
    """``(t)+``."""
    return KleenePlus(_str_term(term))


def zero_or_more(term: Any) -> KleeneStar:
    """``(t)*``."""
    return KleeneStar(_str_term(term))


def choice_item_term(item: Any) -> Term:
    """A ``Choice`` item as a term: outlines' ``python_types_to_terms``, which ``python_terms``
    installs here when it is imported (it builds on this module, so this one cannot import it;
    binding it once also keeps old and new classes apart when ``sys.modules`` is purged)."""
    return item if isinstance(item, Term) else String(str(item))


def to_regex(term: Any) -> str:
    """The regex of a term, in outlines 1.x's shape: leaves grouped, quantifiers on groups,
    JSON schemas through outlines-core's own ``build_regex_from_schema``."""
    if isinstance(term, String):
        return re.escape(term.value)
    if isinstance(term, Regex):
        return f"({term.pattern})"
    if isinstance(term, JsonSchema):
        from outlines_core.json_schema import build_regex_from_schema

        return f"({build_regex_from_schema(term.schema, term.whitespace_pattern)})"
    if isinstance(term, Choice):
        return "(" + "|".join(to_regex(choice_item_term(i)) for i in term.items) + ")"
    if isinstance(term, Sequence):
        return "".join(to_regex(t) for t in term.terms)
    if isinstance(term, Alternatives):
        return "(" + "|".join(to_regex(t) for t in term.terms) + ")"
    if isinstance(term, Optional):
        return f"({to_regex(term.term)})?"
    if isinstance(term, KleeneStar):
        return f"({to_regex(term.term)})*"
    if isinstance(term, KleenePlus):
        return f"({to_regex(term.term)})+"
    if isinstance(term, QuantifyExact):
        return f"({to_regex(term.term)}){{{term.count}}}"
    if isinstance(term, QuantifyMinimum):
        return f"({to_regex(term.term)}){{{term.min_count},}}"
    if isinstance(term, QuantifyMaximum):
        return f"({to_regex(term.term)}){{0,{term.max_count}}}"
    if isinstance(term, QuantifyBetween):
        return f"({to_regex(term.term)}){{{term.min_count},{term.max_count}}}"
    raise TypeError(f"Cannot convert {term!r} to a regular expression")


def regex(pattern: str) -> Regex:
    return Regex(pattern)


def json_schema(schema: Any, whitespace_pattern: str | None = None) -> JsonSchema:
    return JsonSchema(schema, whitespace_pattern)


def cfg(definition: str) -> CFG:
    return CFG(definition)
