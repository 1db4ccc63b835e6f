"""Public names that moved, kept importable for one release with a ``DeprecationWarning``.

Users' code must not break on an upgrade without warning: a removed public name comes back here
as an alias that works exactly as before, warns once per call site, and names its replacement and
the release that removes it. CHANGELOG.md lists every entry; tests/test_public_api.py pins them.
"""
from __future__ import annotations

import warnings
from typing import Any

REMOVED_IN = "0.3.0"


def warn_moved(old: str, new: str, *, stacklevel: int = 3) -> None:
    """One warning format for every alias, so users can filter on it. ``stacklevel`` 3 names the
    alias's caller; for a deprecated module that is the user's ``import`` line (``warnings`` skips
    the import machinery's frames), where Python's default filter shows it."""
    warnings.warn(f"{old} is deprecated and will be removed in tokenrails {REMOVED_IN}; use {new}",
                  DeprecationWarning, stacklevel=stacklevel)


def _guide_spec_from_request(cls: type, obj: Any) -> Any:
    """The classmethod ``GuideSpec.from_request`` was before request parsing left the core."""
    warn_moved("GuideSpec.from_request", "tokenrails.spec_from_request")
    from .requests import spec_from_request

    return spec_from_request(obj)


#: ``Matcher`` members that served a sequence's reasoning phase, which the sequence owns now:
#: name -> (where it went, what a grammar matcher answered, read as a property)
_MATCHER_PHASE_MEMBERS: dict[str, tuple[str, Any, bool]] = {
    "answering": ("SequenceState.answering", True, True),
    "thinking": ("SequenceState.thinking", False, True),
    "preamble": ("Finalization.thinking", False, True),
    "in_gap": ("SequenceState.in_gap", False, True),
    "grammar_matcher": ("SequenceState.batch_matcher", None, False),
    "rollback_limit": ("SequenceState.rollback_limit", None, False),
    "forced_prefix": ("SequenceState.forced_prefix", None, False),
    "refusal": ("ReasoningPhase.refusal", "by the grammar", False),
}


def _matcher_member(name: str, new: str, value: Any, prop: bool) -> Any:
    def member(self: Any) -> Any:
        warn_moved(f"Matcher.{name}", new)
        return self if name == "grammar_matcher" else value

    return property(member) if prop else member


def install() -> None:
    """Attach the aliases that live on core classes. Called by the package ``__init__``: the core
    may not import the request parser (tests/test_layering.py), the package above it may."""
    from .guided.backend import Matcher
    from .guided.spec import GuideSpec

    if "from_request" not in GuideSpec.__dict__:
        GuideSpec.from_request = classmethod(_guide_spec_from_request)  # type: ignore[attr-defined]
    for name, (new, value, prop) in _MATCHER_PHASE_MEMBERS.items():
        if name not in Matcher.__dict__:
            setattr(Matcher, name, _matcher_member(name, new, value, prop))
