"""Does a generation's output have the structure its example asked for?

Used by ``bench/outlines_doc_examples.py`` (through its runner); the oracles are independent of
the library that generated the output wherever one exists: pydantic (``model_validate_json`` /
``TypeAdapter``), ``jsonschema``, ``re.fullmatch`` (the ``regex`` module when ``re`` cannot read a
pattern), membership for choices, Python's own parsers for ``int``/``float``/``bool``/dates, Lark's
Earley parser for a CFG. Only outlines 1.x's regex DSL terms (``types.Regex``, ``either``...) are
turned into a regex by the library under test (``to_regex`` of the ``outlines`` imported), as
there is no other reader of that DSL.

``check(api, request, output)`` returns ``None`` when the output fits, else a one-line reason.
``api`` is ``"0.x"`` (``outlines.generate.*``: parsed Python values) or ``"1.x"`` (``Generator`` /
``model(prompt, output_type)``: text).
"""
from __future__ import annotations

import dataclasses
import datetime
import enum
import inspect
import json
import re
import typing
from typing import Any

Reason = typing.Optional[str]


def _short(value: Any, n: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= n else text[:n] + "..."


def fullmatch(pattern: str, text: Any) -> Reason:
    if not isinstance(text, str):
        return f"not a string: {_short(text)}"
    try:
        ok = re.fullmatch(pattern, text) is not None
    except re.error:
        import regex

        ok = regex.fullmatch(pattern, text) is not None
    return None if ok else f"{_short(text)} does not fullmatch {_short(pattern, 60)}"


def cfg_parses(grammar: str, text: Any) -> Reason:
    """Lark's Earley parser on the grammar itself (``%import common.X`` is Lark's own library)."""
    import lark

    if not isinstance(text, str):
        return f"not a string: {_short(text)}"
    try:
        parser = lark.Lark(grammar, start="start", parser="earley")
    except Exception as exc:  # a grammar only the generator's dialect reads: say so, do not judge
        return f"unchecked: Lark cannot read the grammar ({type(exc).__name__})"
    try:
        parser.parse(text)
    except lark.exceptions.LarkError as exc:
        return f"{_short(text)} is not in the grammar ({type(exc).__name__})"
    return None


def json_schema(schema: Any, value: Any) -> Reason:
    import jsonschema

    if isinstance(schema, str):
        schema = json.loads(schema)
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        return f"schema violation: {exc.message[:120]}"
    return None


def _loads(text: Any) -> tuple[Any, Reason]:
    if not isinstance(text, str):
        return None, f"not a string: {_short(text)}"
    try:
        return json.loads(text), None
    except ValueError as exc:
        return None, f"not JSON ({exc.msg} at {exc.pos}): {_short(text)}"


def _is_pydantic_model(t: Any) -> bool:
    return isinstance(t, type) and hasattr(t, "model_validate_json") and hasattr(t, "model_fields")


def _signature_model(fn: Any) -> Any:
    """A pydantic model of a function's parameters (outlines turns a function into that JSON)."""
    import pydantic

    fields = {}
    fn_name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "Function")
    for name, p in inspect.signature(fn).parameters.items():
        ann = Any if p.annotation is inspect.Parameter.empty else p.annotation
        fields[name] = (ann, ... if p.default is inspect.Parameter.empty else p.default)
    return pydantic.create_model(fn_name + "Args", **fields)


def _type_adapter_json(t: Any, text: Any) -> Reason:
    import pydantic

    if not isinstance(text, str):
        return f"not a string: {_short(text)}"
    try:
        pydantic.TypeAdapter(t).validate_json(text)
    except pydantic.ValidationError as exc:
        return f"does not validate as {_short(t, 50)}: {str(exc).splitlines()[0][:100]}: {_short(text)}"
    return None


def _is_term(obj: Any) -> bool:
    """An outlines 1.x DSL term (``types.Regex``, ``String``, ``either(...)``, ``types.integer``)."""
    return any(c.__name__ == "Term" for c in type(obj).__mro__)


def check_1x(output_type: Any, text: Any) -> Reason:
    """outlines 1.x: the generated text against an output type."""
    t = output_type
    origin = typing.get_origin(t)
    if t is None or t is str:
        return None if isinstance(text, str) else f"not a string: {_short(text)}"
    name = type(t).__name__
    if name == "JsonSchema" and hasattr(t, "schema"):
        value, err = _loads(text)
        return err or json_schema(t.schema, value)
    if name == "CFG" and hasattr(t, "definition"):
        return cfg_parses(t.definition, text)
    if name == "Choice" and hasattr(t, "items"):
        return None if text in [str(i) for i in t.items] else f"{_short(text)} not among {_short(t.items)}"
    if _is_term(t):
        import outlines.types.dsl as dsl  # the library under test: the only reader of its DSL

        return fullmatch(dsl.to_regex(t), text)
    if origin is typing.Literal:
        return None if text in [str(a) for a in typing.get_args(t)] else f"{_short(text)} not among {typing.get_args(t)}"
    if origin is typing.Union or (origin is not None and origin.__class__.__name__ == "UnionType") or \
            type(t).__name__ == "UnionType":
        reasons = [check_1x(a, text) for a in typing.get_args(t)]
        return None if any(r is None for r in reasons) else f"fits no member of the Union: {reasons[0]}"
    if t is int:
        return None if fullmatch(r"[+-]?(0|[1-9][0-9]*)", text) is None else f"not an int: {_short(text)}"
    if t is float:
        try:
            float(text)
            return None
        except (TypeError, ValueError):
            return f"not a float: {_short(text)}"
    if t is bool:
        return None if text in ("True", "False") else f"not a bool: {_short(text)}"
    if t in (datetime.date, datetime.time, datetime.datetime):
        try:
            t.fromisoformat(text)
            return None
        except (TypeError, ValueError):
            return f"not a {t.__name__}: {_short(text)}"
    if isinstance(t, type) and issubclass(t, enum.Enum):
        values = [str(m.value) for m in t]
        return None if text in values else f"{_short(text)} not among the Enum's values {values}"
    if _is_pydantic_model(t):
        try:
            t.model_validate_json(text)
            return None
        except Exception as exc:
            return f"{t.__name__}.model_validate_json failed: {str(exc).splitlines()[0][:100]}: {_short(text)}"
    if isinstance(t, dict):
        value, err = _loads(text)
        return err or json_schema(t, value)
    if isinstance(t, type) and (dataclasses.is_dataclass(t) or typing.is_typeddict(t)):
        return _type_adapter_json(t, text)
    if origin is not None or t in (list, dict, tuple):
        return _type_adapter_json(t, text)
    if inspect.isfunction(t):
        return _type_adapter_json(_signature_model(t), text)
    return f"unchecked: no oracle for output type {_short(t, 60)}"


def check_0x(kind: str, spec: Any, value: Any) -> Reason:
    """outlines 0.x ``generate.<kind>(model, spec)``: the parsed value it returned."""
    if kind == "text":
        return None if isinstance(value, str) else f"not a string: {_short(value)}"
    if kind == "regex":
        return fullmatch(spec, value)
    if kind == "cfg":
        return cfg_parses(spec, value)
    if kind == "choice":
        if isinstance(spec, type) and issubclass(spec, enum.Enum):
            values = [m.value for m in spec] + [m.name for m in spec] + list(spec)
            return None if value in values else f"{_short(value)} not among the Enum's values"
        return None if value in list(spec) else f"{_short(value)} not among {_short(list(spec))}"
    if kind == "format":
        if spec in (int, float, bool, str) or isinstance(spec, type):
            if spec is float and isinstance(value, int) and not isinstance(value, bool):
                return None
            return None if isinstance(value, spec) else f"{_short(value)} is not a {getattr(spec, '__name__', spec)}"
        return f"unchecked: format({_short(spec)})"
    if kind == "json":
        if _is_pydantic_model(spec):
            if not isinstance(value, spec):
                return f"not a {spec.__name__}: {_short(value)}"
            try:
                spec.model_validate_json(value.model_dump_json())
                return None
            except Exception as exc:
                return f"{spec.__name__} does not re-validate: {str(exc).splitlines()[0][:100]}"
        if isinstance(spec, (str, dict)):
            return json_schema(spec, value)
        if isinstance(spec, type) and issubclass(spec, enum.Enum):
            # members that are functions (``partial(add)``) stand for JSON of their arguments
            for member in spec:
                if callable(member.value):
                    if isinstance(value, dict) and check_0x("json", member.value, value) is None:
                        return None
                elif value == member.value:
                    return None
            return f"{_short(value)} fits none of the Enum's members"
        if callable(spec):
            import pydantic

            try:
                _signature_model(spec).model_validate(value)
                return None
            except pydantic.ValidationError as exc:
                return f"does not fit {getattr(spec, '__name__', spec)}'s signature: {str(exc).splitlines()[0][:100]}"
        if hasattr(spec, "to_json"):  # genson SchemaBuilder
            return json_schema(spec.to_json(), value)
        return f"unchecked: json({_short(spec)})"
    return f"unchecked: generate.{kind}"


def check(api: str, request: tuple[str, Any], output: Any, batched: bool = False) -> Reason:
    """``request`` = (kind, spec): 0.x ``("json", Character)``, 1.x ``("output_type", T)``.
    ``batched``: the output is a list (several prompts or samples), each element is checked."""
    kind, spec = request
    if batched and isinstance(output, list):
        for item in output:
            reason = check(api, request, item, batched=isinstance(item, list))
            if reason is not None:
                return reason
        return None
    return check_1x(spec, output) if api == "1.x" else check_0x(kind, spec, output)
