"""Check a finished output against its spec with an oracle independent of the grammar engine.

JSON schema → ``jsonschema``; regex → a DFA from the fsm backend's compiler (linear time: a
client pattern never runs on Python's backtracking ``re`` here — ``(a+)+b`` against an output cut
at ``max_new_tokens`` would freeze every thread); choice → membership. Grammars, structural tags
and patterns the DFA compiler refuses have no independent oracle here, so their verdict is the
matcher's own completion state.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ...guided.errors import GuideError
from ...guided.limits import GuideLimits
from ...guided.spec import GuideSpec

# the DFA is built once per request; bounded like any client pattern (time included)
_ORACLE_LIMITS = GuideLimits(compile_timeout_s=2.0)


@dataclass(frozen=True)
class Verdict:
    valid: bool
    method: str          # "jsonschema" | "json" | "fsm DFA" | "choice" | "matcher"
    reason: str = ""


def validate_output(spec: GuideSpec, text: str, matcher_complete: bool) -> Verdict:
    """Whether ``text`` satisfies ``spec``; ``matcher_complete`` is used where no oracle exists."""
    if spec.kind in ("json_schema", "json_object"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return Verdict(False, "json", f"not JSON: {exc}")
        if spec.kind == "json_object":
            ok = isinstance(value, dict)
            return Verdict(ok, "json", "" if ok else "not a JSON object")
        import jsonschema

        try:
            jsonschema.validate(value, spec.schema)
        except jsonschema.ValidationError as exc:
            return Verdict(False, "jsonschema", exc.message)
        except jsonschema.SchemaError as exc:  # schema the oracle cannot read: trust the matcher
            return Verdict(matcher_complete, "matcher", f"jsonschema cannot check it: {exc.message}")
        return Verdict(True, "jsonschema")
    if spec.kind == "regex":
        from ...guided.fsm.compiler import compile_regex

        try:
            dfa = compile_regex(spec.pattern, _ORACLE_LIMITS)
        except (GuideError, RecursionError, ValueError) as exc:
            return Verdict(matcher_complete, "matcher", f"no DFA for the pattern: {exc}")
        ok = dfa.fullmatch(text.encode("utf-8", "surrogatepass"))
        return Verdict(ok, "fsm DFA", "" if ok else "does not match the pattern")
    if spec.kind == "choice":
        ok = text in spec.choices
        return Verdict(ok, "choice", "" if ok else "not one of the choices")
    return Verdict(matcher_complete, "matcher", "" if matcher_complete else "grammar not complete")


_PUBLIC_ERRORS = ("GuideTimeoutError", "GuideLimitError", "InvalidGuideError", "UnsupportedGuideError",
                  "TokenRejectedError", "GuideError")


def error_category(err: BaseException) -> str:
    """The public tokenrails error class ``err`` belongs to (backends raise finer subclasses)."""
    for cls in type(err).__mro__:
        if cls.__name__ in _PUBLIC_ERRORS:
            return cls.__name__
    return type(err).__name__
