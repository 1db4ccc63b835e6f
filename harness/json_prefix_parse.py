"""The partial value of a JSON prefix: what a text cut anywhere (e.g. at a token cap) already fixes.

``parse_prefix`` reads RFC 8259 JSON (no NaN/Infinity; a repeated member name is an error: RFC 8259
leaves it undefined and Python's json keeps the last) and returns ``Complete`` for a whole document,
else the open value: ``PEmpty`` (nothing yet), ``PString``, ``PNumber``, ``PLiteral``, ``PArray``,
``PObject`` with their finished parts as Python values. ``PrefixError``: no completion of the text
is JSON. Used by harness/json_prefix_oracle.py.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# ---- the partial value ------------------------------------------------------------------------
class PrefixError(ValueError):
    """The text is not the beginning of any JSON document."""


@dataclass
class Complete:
    value: Any


@dataclass
class PEmpty:
    """A value that has not begun (only whitespace so far)."""


@dataclass
class PString:
    chars: str          # decoded characters so far
    pending: str = ""   # an escape sequence cut by the end of the text ("\\", "\\u0", ...)


@dataclass
class PNumber:
    text: str           # a prefix of a JSON number, at the end of the text


@dataclass
class PLiteral:
    text: str           # a proper prefix of true / false / null


@dataclass
class PArray:
    items: list[Any] = field(default_factory=list)  # finished items (values)
    tail: Any = None    # the open item (a partial node), PEmpty after a comma; None: none open


@dataclass
class PObject:
    members: list[tuple[str, Any]] = field(default_factory=list)  # finished members
    pkey: PString | None = None   # a member name being written
    key: str | None = None        # a finished member name whose value is open
    colon: bool = False           # ':' seen after ``key``
    tail: Any = None              # the open value (after ':'), a partial node
    need_member: bool = False     # after ',': a member must follow

    def keys(self) -> set[str]:
        return {k for k, _ in self.members} | ({self.key} if self.key is not None else set())


NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_WS = " \t\n\r"
ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
LITERALS = {"true": True, "false": False, "null": None}


def is_number_prefix(text: str) -> bool:
    """Some completion of ``text`` is a JSON number (one more digit always suffices)."""
    return bool(NUMBER.fullmatch(text) or NUMBER.fullmatch(text + "0"))


def parse_prefix(text: str) -> Any:
    """The partial value of a JSON prefix (``Complete`` if it is a whole document already)."""
    i = _skip_ws(text, 0)
    if i == len(text):
        return PEmpty()
    node, i = _value(text, i)
    if isinstance(node, Complete):
        j = _skip_ws(text, i)
        if j != len(text):
            raise PrefixError(f"text after the document at {j}: {text[j:j + 20]!r}")
    return node


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _value(text: str, i: int) -> tuple[Any, int]:
    """Parse a value starting at ``i`` (< len). A partial node is returned only at the end."""
    c = text[i]
    if c == "{":
        return _object(text, i + 1)
    if c == "[":
        return _array(text, i + 1)
    if c == '"':
        return _string(text, i + 1)
    if c == "-" or c.isdigit() and c.isascii():
        j = i
        while j < len(text) and text[j] in "+-.eE0123456789":
            j += 1
        num = text[i:j]
        if j == len(text):
            if not is_number_prefix(num):
                raise PrefixError(f"not a number prefix at {i}: {num!r}")
            return PNumber(num), j
        if not NUMBER.fullmatch(num):
            raise PrefixError(f"bad number at {i}: {num!r}")
        return Complete(json.loads(num)), j
    for word, value in LITERALS.items():
        if c == word[0]:
            part = text[i:i + len(word)]
            if part == word:
                return Complete(value), i + len(word)
            if i + len(part) == len(text) and word.startswith(part):
                return PLiteral(part), len(text)
            raise PrefixError(f"bad literal at {i}: {part!r}")
    raise PrefixError(f"unexpected {c!r} at {i}")


def _string(text: str, i: int) -> tuple[Any, int]:
    """After the opening quote. Returns Complete(str) or PString at the end of the text."""
    out: list[str] = []
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return Complete(_join_surrogates("".join(out))), i + 1
        if c == "\\":
            rest = text[i + 1:i + 6]
            if not rest:
                return PString(_join_surrogates("".join(out)), "\\"), n
            e = rest[0]
            if e in ESCAPES:
                out.append(ESCAPES[e])
                i += 2
                continue
            if e != "u":
                raise PrefixError(f"bad escape at {i}: {text[i:i + 2]!r}")
            digits = rest[1:5]
            if not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise PrefixError(f"bad \\u escape at {i}")
            if len(digits) < 4:
                return PString(_join_surrogates("".join(out)), "\\u" + digits), n
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        if ord(c) < 0x20:
            raise PrefixError(f"control character {c!r} in a string at {i}")
        out.append(c)
        i += 1
    chars = _join_surrogates("".join(out))
    if chars and 0xD800 <= ord(chars[-1]) <= 0xDBFF:  # may pair with the next escape: not yet known
        return PString(chars[:-1], "\\u" + format(ord(chars[-1]), "04x")), n
    return PString(chars), n


def _join_surrogates(s: str) -> str:
    """Pairs of surrogate escapes as one character, as json.loads decodes them."""
    if not any(0xD800 <= ord(c) <= 0xDFFF for c in s):
        return s
    return re.sub("[\ud800-\udbff][\udc00-\udfff]",
                  lambda m: chr(0x10000 + ((ord(m[0][0]) - 0xD800) << 10) + ord(m[0][1]) - 0xDC00), s)


def _array(text: str, i: int) -> tuple[Any, int]:
    arr = PArray()
    i = _skip_ws(text, i)
    if i == len(text):
        return arr, i
    if text[i] == "]":
        return Complete([]), i + 1
    while True:
        node, i = _value(text, i)
        if not isinstance(node, Complete):
            arr.tail = node
            return arr, i
        arr.items.append(node.value)
        i = _skip_ws(text, i)
        if i == len(text):
            return arr, i
        if text[i] == "]":
            return Complete(arr.items), i + 1
        if text[i] != ",":
            raise PrefixError(f"expected ',' or ']' at {i}")
        i = _skip_ws(text, i + 1)
        if i == len(text):
            arr.tail = PEmpty()
            return arr, i


def _object(text: str, i: int) -> tuple[Any, int]:
    obj = PObject()
    n = len(text)
    i = _skip_ws(text, i)
    if i == n:
        return obj, i
    if text[i] == "}":
        return Complete({}), i + 1
    while True:
        if text[i] != '"':
            raise PrefixError(f"expected a member name at {i}")
        key, i = _string(text, i + 1)
        if not isinstance(key, Complete):
            obj.pkey, obj.need_member = key, False
            return obj, i
        if key.value in obj.keys():
            raise PrefixError(f"repeated member name {key.value!r}")
        obj.key, obj.need_member = key.value, False
        i = _skip_ws(text, i)
        if i == n:
            return obj, i
        if text[i] != ":":
            raise PrefixError(f"expected ':' at {i}")
        obj.colon = True
        i = _skip_ws(text, i + 1)
        if i == n:
            obj.tail = PEmpty()
            return obj, i
        node, i = _value(text, i)
        if not isinstance(node, Complete):
            obj.tail = node
            return obj, i
        obj.members.append((obj.key, node.value))
        obj.key, obj.colon = None, False
        i = _skip_ws(text, i)
        if i == n:
            return obj, i
        if text[i] == "}":
            return Complete(dict(obj.members)), i + 1
        if text[i] != ",":
            raise PrefixError(f"expected ',' or '}}' at {i}")
        obj.need_member = True
        i = _skip_ws(text, i + 1)
        if i == n:
            return obj, i


def loads_strict(text: str) -> Any:
    """json.loads without NaN/Infinity and without repeated member names (this oracle's JSON)."""
    def pairs(items: list[tuple[str, Any]]) -> dict:
        out = dict(items)
        if len(out) != len(items):
            raise ValueError("repeated member name")
        return out

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
