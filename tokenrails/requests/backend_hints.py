"""vLLM-style backend hints (``guided_decoding_backend``, ``backend``): validated and recorded.

A hint never changes the constraint's language silently: its options that do (``:disable-any-
whitespace``, ``:no-additional-properties``) are applied to the spec; the engine name is mapped
to a tokenrails backend (or ``None`` = auto) that callers may use for routing.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..guided.errors import InvalidGuideError

# vLLM / SGLang / TGI engine names -> tokenrails backend (None: let "auto" choose).
ENGINE_TO_BACKEND: dict[str, str | None] = {
    "auto": None,
    "outlines": "fsm",
    "fsm": "fsm",
    "xgrammar": "xgrammar",
    "guidance": "llguidance",
    "llguidance": "llguidance",
    "lm-format-enforcer": None,
    "lm_format_enforcer": None,
}
# Options vLLM accepted after a colon, e.g. "xgrammar:disable-any-whitespace,no-fallback".
KNOWN_OPTIONS = frozenset({"no-fallback", "disable-any-whitespace", "no-additional-properties"})


@dataclass(frozen=True)
class BackendHint:
    """A parsed hint: ``backend`` is a tokenrails backend name or None (auto)."""

    engine: str
    backend: str | None
    options: frozenset[str]


def parse_backend_hint(value: object) -> BackendHint | None:
    """Parse ``"name[:opt,opt]"``; unknown names/options raise ``InvalidGuideError``."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidGuideError(f"backend hint must be a string, got {type(value).__name__}")
    name, _, opts = value.strip().partition(":")
    name = name.strip().lower()
    if name not in ENGINE_TO_BACKEND:
        raise InvalidGuideError(
            f"unknown guided decoding backend {value!r}; known: {sorted(ENGINE_TO_BACKEND)}"
        )
    options = frozenset(o.strip() for o in opts.split(",") if o.strip())
    unknown = options - KNOWN_OPTIONS
    if unknown:
        raise InvalidGuideError(
            f"unknown backend option(s) {sorted(unknown)} in {value!r}; known: {sorted(KNOWN_OPTIONS)}"
        )
    return BackendHint(engine=name, backend=ENGINE_TO_BACKEND[name], options=options)
