"""The one routing rule: which backends may serve a spec, in what order (the table and its reasons
are in docs/backends.md).

Every caller asks ``backends_for``: ``compile_guide`` and ``check_guide``, the engines' managers
and front checks (with the engine's backend setting), the outlines shim (whose language needs are
the spec's routing options, ``GuideSpec.with_routing``). Decided once per request, at compile
time. Each backend's ``check()`` still refuses (``UnsupportedGuideError``) what it cannot enforce
exactly, so the order is an optimisation: correctness never depends on it.
"""
from __future__ import annotations

import re

from .errors import GuideError, UnsupportedGuideError
from .limits import GuideLimits
from .schema_semantics import is_strict, policy_schema
from .backends.xgrammar_coverage import xgrammar_looser, xgrammar_stricter, xgrammar_unenforced
from .limit_checks import check_spec_limits
from .spec import GuideSpec
from .vocabulary import Vocabulary

_SEEN_MAX = 4096  # remembered spec keys per vocabulary (bounded: an LRU of keys only)


def backends_for(spec: GuideSpec, vocab: Vocabulary, limits: GuideLimits, backend: str = "auto") -> list[str]:
    """Backends to try for ``spec``, best first; each refuses (``UnsupportedGuideError``) what it
    cannot enforce exactly.

    A caller that pinned ``backend`` gets only it, and a request naming another backend is
    refused, never compiled by the pinned one. Under ``auto`` the request's routing options put
    its backend first, then ``route``'s ladder; ``fallback=False`` keeps the first only.
    """
    wanted = spec.option("backend")
    fallback = spec.option("fallback", True)
    if backend != "auto":
        if wanted is not None and wanted != backend:
            raise UnsupportedGuideError(
                f"the request asks for backend {wanted!r}; this engine compiles with {backend!r} only",
                backend=wanted,
            )
        return [backend]
    if wanted is not None and not fallback:
        return [wanted]
    # every backend checks these: an over-limit spec costs no routing analysis (a second of Python
    check_spec_limits(spec, limits)  # for 28,000 properties) and no compile (fsm is tried last)
    ladder = route(spec, vocab, limits)[0]
    if wanted is not None:
        ladder = [wanted] + [name for name in ladder if name != wanted]
    return ladder if fallback else ladder[:1]


def route(spec: GuideSpec, vocab: Vocabulary, limits: GuideLimits) -> tuple[list[str], str]:
    """``(ladder, reason)``; the reason is for logs and the conformance report."""
    kind = spec.kind
    if kind == "regex" and repeat_total(spec.pattern) > FSM_REPEAT_TOTAL:
        return ["llguidance", "xgrammar", "fsm"], "regex: many bounded repeats, lazy DFA first"
    if kind in ("regex", "choice"):
        return ["fsm", "llguidance", "xgrammar"], "regex/choice: exact DFA first"
    if kind == "grammar":
        if spec.option("dialect") == "lark":
            return ["llguidance"], "grammar: Lark dialect, llguidance reads it natively"
        return ["xgrammar", "llguidance"], "grammar: xgrammar EBNF dialect first"
    if kind == "structural_tag":
        return ["xgrammar"], "structural_tag: xgrammar only"
    if kind == "json_schema":
        try:  # analyse what the backends compile: keyword-implied types explicit (schema_semantics)
            schema = policy_schema(spec, limits)
            dropped = xgrammar_unenforced(schema, is_strict(spec))
        except (RecursionError, GuideError):  # pathological nesting: let the checks report it
            return ["llguidance", "xgrammar"], "xgrammar would drop: unanalysable"
        if dropped:
            return ["llguidance", "xgrammar"], f"xgrammar would drop: {dropped[0]}"
        stricter = xgrammar_stricter(schema, is_strict(spec))
        if stricter:
            return ["llguidance", "xgrammar"], f"xgrammar is stricter: {stricter[0]}"
        looser = xgrammar_looser(schema)
        if looser:
            return ["llguidance", "xgrammar"], f"xgrammar is looser: {looser[0]}"
    if _seen_before(spec, vocab):
        return ["xgrammar", "llguidance"], "repeated schema: xgrammar cached compile"
    return ["llguidance", "xgrammar"], "one-off schema: lowest time to first mask"


# Bounded repeats a pattern may spell out (the sum of their upper bounds) before the eager DFA
# is not tried first: fsm builds every spelled-out state, llguidance's lazy DFA does not.
FSM_REPEAT_TOTAL = 1024
_BOUND = re.compile(r"\{\s*(\d{1,9})\s*(?:,\s*(\d{0,9})\s*)?\}")


def repeat_total(pattern: str) -> int:
    """Sum of the ``{m,n}`` upper bounds in ``pattern`` (a linear scan; routing only: ``{`` inside
    a class or escaped may be counted, which only changes the order of exact backends)."""
    total = 0
    for m in _BOUND.finditer(pattern):
        total += int(m.group(2) or m.group(1))
        if total > FSM_REPEAT_TOTAL:
            break
    return total


def _seen_before(spec: GuideSpec, vocab: Vocabulary) -> bool:
    """Record ``spec.key`` for this vocabulary (its bounded memo); True when it was already recorded."""
    first: list[bool] = []
    vocab.cached_lru("routing:seen", spec.key, lambda: first.append(True), _SEEN_MAX)
    return not first
