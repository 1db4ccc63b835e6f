"""Output types written as outlines users write them, one per typing form outlines 1.3's
``python_types_to_terms`` handles (plus forms it refuses). Imported both by the shim's tests and,
in a subprocess, next to the real outlines (tests/compat/outlines_peer.py), so the two sides
convert the very same objects. Nothing here imports outlines.
"""
from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import Annotated, Any, Dict, List, Literal, NewType, Optional, Set, Tuple, Union

from typing_extensions import TypedDict  # what outlines 1.3 recognises on every Python

from pydantic import BaseModel, Field


class Event(BaseModel):  # outlines 1.x README: "event or I don't know"
    title: str
    day: Literal["monday", "tuesday"]
    attendees: List[str] = Field(max_length=3)


@dataclasses.dataclass
class Point:
    x: int
    y: float


class Movie(TypedDict):
    title: str
    year: int


class Color(enum.Enum):
    red = "red"
    dark_blue = "dark blue"


class Level(enum.IntEnum):
    low = 1
    high = 10


def add(a: int, b: str = "x") -> None:  # a callable: its signature is the schema
    """Add."""


UserId = NewType("UserId", int)

# name -> output type
FORMS: dict[str, Any] = {
    "int": int, "float": float, "bool": bool, "str": str,
    "date": datetime.date, "time": datetime.time, "datetime": datetime.datetime,
    "annotated_int": Annotated[int, "an age"], "newtype_int": UserId,
    "literal_str": Literal["yes", "no"], "literal_mixed": Literal[1, 2.5, True, "a.b"],
    "enum_str": Color, "enum_int": Level,
    "union_int_str": Union[int, str], "optional_int": Optional[int], "union_three_none": Union[int, str, None],
    "pep604_union": int | bool,
    "union_model_literal": Union[Event, Literal["I don't know"]],
    "optional_model": Optional[Point],
    "list_int": List[int], "list_literal": List[Literal["x", "y z"]], "list_str": list[str],
    "list_optional": List[Optional[int]],
    "tuple_fixed": Tuple[int, str, bool], "tuple_variadic": Tuple[float, ...], "tuple_empty": Tuple[()],
    "tuple_literal": tuple[Literal["a"], int],
    "dict_str_int": Dict[str, int], "dict_int_str": Dict[int, str], "dict_literal_key": Dict[Literal["a", "b"], int],
    "dict_literal_int_key": Dict[Literal[1, 2], str], "dict_float_key": dict[float, bool],
    "dict_nested": Dict[str, Union[int, str, List[Tuple[int, str]]]],
    "list_of_dicts": List[Dict[str, Optional[float]]],
    "pydantic": Event, "dataclass": Point, "typeddict": Movie, "callable": add,
    "dict": dict,
}

# forms outlines 1.3 refuses (TypeError): the shim must refuse them too (a typed error)
REFUSED: dict[str, Any] = {"set": Set[int], "bytes": bytes, "frozenset": frozenset, "object": object()}
