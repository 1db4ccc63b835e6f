"""``outlines.fsm.types``: Python type → (regex, parser), as outlines 0.x ``generate.format`` did."""
from __future__ import annotations

import datetime
from enum import EnumMeta
from typing import Any, Callable, Tuple

INTEGER = r"[+-]?(0|[1-9][0-9]*)"
BOOLEAN = "(True|False)"
FLOAT = rf"{INTEGER}(\.[0-9]+)?([eE][+-][0-9]+)?"
DATE = r"(\d{4})-(0[1-9]|1[0-2])-([0-2][0-9]|3[0-1])"
TIME = r"([0-1][0-9]|2[0-3]):([0-5][0-9]):([0-5][0-9])"
DATETIME = rf"({DATE})(\s)({TIME})"

FormatFunction = Callable[[str], Any]


def python_types_to_regex(python_type: Any) -> Tuple[str, FormatFunction]:
    """The regex outlines 0.x used for ``python_type`` and a parser for the generated text.

    Difference: ``bool`` parses ``"False"`` to ``False`` (outlines' ``bool(text)`` gave True).
    """
    import re
    import typing

    if typing.get_origin(python_type) is typing.Annotated:  # Annotated[str, StringConstraints(pattern)]
        base, *meta = typing.get_args(python_type)
        for m in meta:
            pattern = getattr(m, "pattern", None)
            if isinstance(pattern, str):
                return pattern, str
        return python_types_to_regex(base)
    if python_type is str:
        return r'"[^"]*"', str
    if isinstance(python_type, EnumMeta):
        names = list(python_type.__members__)
        return "(" + "|".join(re.escape(n) for n in names) + ")", str
    if python_type is bool:
        return BOOLEAN, lambda s: s == "True"
    if python_type is int:
        return INTEGER, int
    if python_type is float:
        return FLOAT, float
    if python_type is datetime.datetime:
        return DATETIME, lambda s: datetime.datetime.strptime(s, "%Y-%m-%d %H:%M:%S")
    if python_type is datetime.date:
        return DATE, lambda s: datetime.datetime.strptime(s, "%Y-%m-%d").date()
    if python_type is datetime.time:
        return TIME, lambda s: datetime.datetime.strptime(s, "%H:%M:%S").time()
    raise NotImplementedError(f"The Python type {python_type} is not supported.")
