"""How ``backend="auto"`` orders backends for a request (the table is in docs/backends.md).

The order is decided once per request, at compile time, never mid-generation. Each backend's
``check()`` still refuses (``UnsupportedGuideError``) what it cannot enforce exactly, so the
ladder is an optimisation: correctness never depends on it.

* regex / choice → ``fsm`` (exact DFA, token index) → llguidance (lazy DFA: no state blow-up on
  ``(a|b)*a(a|b){30}``) → xgrammar.
* grammar → xgrammar (its EBNF dialect is the documented one) → llguidance (Lark/GBNF).
* structural_tag → xgrammar only.
* json_schema / json_object → by features, then cost:
  - a keyword xgrammar drops (``xgrammar_unenforced``) or a place where it is stricter than
    JSON Schema (``xgrammar_stricter``: unanchored patterns, strict mode) → llguidance first;
  - a schema seen before on this vocabulary → xgrammar first: its compile is cached and its
    per-token mask is cheapest over a long generation;
  - a one-off schema → llguidance first: ~1 ms to the first mask instead of xgrammar's
    (sometimes multi-second) compile.
"""
from __future__ import annotations

import re
import threading
from collections import OrderedDict

from .errors import GuideError
from .limits import GuideLimits
from .schema_semantics import is_strict, policy_schema
from .backends.xgrammar_coverage import xgrammar_looser, xgrammar_stricter, xgrammar_unenforced
from .limit_checks import scan_repeat_bounds
from .spec import GuideSpec
from .vocabulary import Vocabulary

_SEEN_MAX = 4096  # remembered spec keys per vocabulary (bounded: an LRU of keys only)
_SEEN_LOCK = threading.Lock()


def auto_ladder(spec: GuideSpec, vocab: Vocabulary, limits: GuideLimits) -> list[str]:
    """Backends to try, best first. Each refuses (UnsupportedGuideError) what it cannot enforce."""
    return route(spec, vocab, limits)[0]


def route(spec: GuideSpec, vocab: Vocabulary, limits: GuideLimits) -> tuple[list[str], str]:
    """``(ladder, reason)``; the reason is for logs and the conformance report."""
    kind = spec.kind
    if kind == "regex":  # bounds every backend checks: before any of them runs (fsm is last)
        scan_repeat_bounds(spec.pattern, limits)
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
# is not tried first: 300 x ``[\u0000-\uffff]{0,9}`` (2,700) took fsm's native compile ~10 s before
# its deadline check (30 s at the default deadline), llguidance's lazy DFA 0.04 s.
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
    """Record ``spec.key`` for this vocabulary; True when it was already recorded."""
    with _SEEN_LOCK:
        seen = vocab.backend_cache.get("routing:seen")
        if seen is None:
            seen = vocab.backend_cache["routing:seen"] = OrderedDict()
        if spec.key in seen:
            seen.move_to_end(spec.key)
            return True
        seen[spec.key] = None
        if len(seen) > _SEEN_MAX:
            seen.popitem(last=False)
        return False
