"""Which outlines release's behaviour the shim follows where releases disagree on the same call.

``generate.regex(model, r"[0-9]+")(prompt)`` is the same code under outlines 0.0.x and 0.1.x but
ends differently: 0.0.x's own token loop stopped as soon as every sequence's guide was in a
final state (an accepting state of the regex's automaton, or after EOS), so ``generate.format(model,
int)`` returns after one digit; 0.1.x and 1.x hand the processor to transformers' ``generate``,
which stops at EOS or the token cap. The shim follows 1.3.3 (and 0.1.x) unless told otherwise:
``install(api_version="0.0.46")``, ``set_api_version("0.0.46")`` or the environment variable
``TOKENRAILS_OUTLINES_API=0.0.46``.
"""
from __future__ import annotations

import os
import re
from typing import Callable

DEFAULT = "1.3.3"
_ENV = "TOKENRAILS_OUTLINES_API"
_chosen: str | None = None
_listeners: list[Callable[[], None]] = []


def _parse(version: str) -> tuple[int, ...]:
    match = re.fullmatch(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", version.strip())
    if match is None:
        raise ValueError(f"outlines API version {version!r} is not a version number like '0.0.46' or '1.3'")
    return tuple(int(p) for p in match.groups(default="0"))


def set_api_version(version: str | None) -> None:
    """Follow outlines ``version``'s behaviour (``None``: the environment variable, else 1.3.3)."""
    global _chosen
    if version is not None:
        _parse(version)
    _chosen = version
    for listener in list(_listeners):  # e.g. the stand-in classes take the chosen release's names
        listener()


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener()`` after every ``set_api_version``."""
    _listeners.append(listener)


def api_version() -> str:
    version = _chosen or os.environ.get(_ENV) or DEFAULT
    _parse(version)
    return version


def stops_at_first_accepting_state() -> bool:
    """outlines 0.0.x: ``generate.*`` generators end once every sequence's guide is final."""
    return _parse(api_version()) < (0, 1)


__all__ = ["DEFAULT", "api_version", "set_api_version", "stops_at_first_accepting_state"]
