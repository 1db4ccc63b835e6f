"""``IATA``: an enum of airport codes (from the ``airportsdata`` package, installed on demand)."""
from __future__ import annotations

from enum import Enum


def _iata() -> type[Enum]:
    import airportsdata

    codes = sorted({a["iata"] for a in airportsdata.load().values() if a.get("iata")})
    return Enum("IATA", {c: c for c in codes})  # type: ignore[return-value]


def __getattr__(name: str):
    if name == "Airport":  # the enum's own name (``IATA.__qualname__``): pickle finds the class by it
        return globals()["IATA"] if "IATA" in globals() else __getattr__("IATA")
    if name == "IATA":
        value = globals()["IATA"] = _iata()
        from .. import _identity

        _identity.adopt("types.airports:IATA")  # outlines' enum is ``outlines.types.airports.Airport``
        return value
    raise AttributeError(name)
