"""Country enums (ISO 3166: ``Alpha2``, ``Alpha3``, ``Numeric``, ``Name``, ``Flag``), from
``pycountry``; built on first use."""
from __future__ import annotations

from enum import Enum


def _flag(alpha2: str) -> str:
    return "".join(chr(0x1F1E6 + ord(c) - ord("A")) for c in alpha2)


def _build(name: str) -> type[Enum]:
    import pycountry

    countries = list(pycountry.countries)
    values = {
        "Alpha2": [c.alpha_2 for c in countries],
        "Alpha3": [c.alpha_3 for c in countries],
        "Numeric": [c.numeric for c in countries],
        "Name": [c.name for c in countries],
        "Flag": [_flag(c.alpha_2) for c in countries],
    }[name]
    return Enum(name, {v: v for v in values})  # type: ignore[return-value]


# the enums' own names (``__qualname__``, outlines' spelling): pickle finds a class by it
_OWN_NAMES = {"Alpha_2": "Alpha2", "Alpha_3": "Alpha3", "Numeric_code": "Numeric"}


def __getattr__(name: str):
    if name in _OWN_NAMES:
        attr = _OWN_NAMES[name]
        return globals()[attr] if attr in globals() else __getattr__(attr)
    if name in ("Alpha2", "Alpha3", "Numeric", "Name", "Flag"):
        value = globals()[name] = _build(name)
        from .. import _identity

        _identity.adopt(f"types.countries:{name}")  # outlines' names: Alpha_2, Numeric_code...
        return value
    raise AttributeError(name)
