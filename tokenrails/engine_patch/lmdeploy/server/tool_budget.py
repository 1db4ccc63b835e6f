"""Tool calls closed within ``max_tokens``: the call format rebuilt as a constraint the budget rule
can close exactly.

The upgrade's tool-call formats (tool_calls.py) are xgrammar structural tags; the budget rule
(guided/budget.py) needs a DFA, whose shortest completion it computes exactly. When a chat
request with tools asks for the budget (the body's ``tokenrails_budget``, else the engine default
``activate(budget=...)`` / ``--budget``), its structural tag is rewritten as one regex with the
same markers, spelled as the model family writes them (e.g. qwen's ``<tool_call>\\n{"name": NAME,
"arguments": `` ... ``}\\n</tool_call>``), and each tool's arguments lowered by the fsm backend's
JSON Schema lowering (``schema_to_regex``): a named ``tool_choice`` is exactly one call of that
function; ``required`` is one or more calls (one when ``parallel_tool_calls`` is false), calls
only: the prose a structural tag allows before a call is left out, since free text has no end
the rule could steer to. ``auto`` (prose or calls), formats with free text, and arguments the
lowering cannot enforce are refused (HTTP 400): never closed by an estimate.
"""
from __future__ import annotations

import json
from typing import Any

from ....guided.ecma_patterns import escape_code_point
from ....guided.errors import GuideError, UnsupportedGuideError
from ....guided.limits import GuideLimits
from ....requests.response_format import BUDGET_KEY
from ...reasoning_settings import REQUEST_KEY
from ..boot.settings import BUDGET_VALUES, budget_default

CALL_SEPARATOR = "\n"  # between parallel calls (every call-block parser reads it)


def requested(request: Any) -> str | None:
    """The chat request's budget setting: its own ``tokenrails_budget``, else the engine default."""
    own = getattr(request, BUDGET_KEY, None)
    if own is None:
        return budget_default()
    if own not in BUDGET_VALUES:
        raise ValueError(f"{BUDGET_KEY} must be \"close\" or \"off\", got {own!r}")
    return own


def literal(text: str) -> str:
    return "".join(escape_code_point(ord(c)) for c in text)


class _Lowering:
    def __init__(self, limits: GuideLimits, parallel: bool) -> None:
        self.limits = limits
        self.parallel = parallel

    def node(self, fmt: Any) -> str:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "const_string":
            return literal(fmt["value"])
        if kind == "json_schema":
            return self.schema(fmt["json_schema"])
        if kind == "tag":
            ends = fmt.get("end")
            ends = [ends] if isinstance(ends, str) else list(ends or [])
            if not ends:
                raise UnsupportedGuideError("a tool-call tag without an end marker", feature="budget")
            end = ends[0] if len(ends) == 1 else "(?:" + "|".join(literal(e) for e in ends) + ")"
            return literal(fmt.get("begin") or "") + self.node(fmt["content"]) + (
                literal(end) if len(ends) == 1 else end)
        if kind == "sequence":
            return "".join(self.node(e) for e in fmt["elements"])
        if kind == "or":
            return "(?:" + "|".join(self.node(e) for e in fmt["elements"]) + ")"
        if kind in ("triggered_tags", "tags_with_separator"):
            if kind == "triggered_tags" and not fmt.get("at_least_one"):
                raise UnsupportedGuideError(
                    "tool_choice=\"auto\" lets the model answer in free text, which has no end the budget rule "
                    "can steer to; send tool_choice \"required\" or a named function, or tokenrails_budget \"off\"",
                    feature="budget")
            one = "(?:" + "|".join(self.node(t) for t in fmt["tags"]) + ")"
            if fmt.get("stop_after_first") or not self.parallel:
                return one
            sep = literal(fmt.get("separator", CALL_SEPARATOR))
            return one + "(?:" + sep + one + ")*"
        raise UnsupportedGuideError(f"a {kind!r} part of a tool-call format cannot be closed exactly "
                                    "(it is not a fixed marker, a call or a JSON schema)", feature="budget")

    def schema(self, schema: Any) -> str:
        from ....guided.fsm.schema import schema_to_regex
        from ....requests import spec_from_request

        spec = spec_from_request({"type": "json_schema", "json_schema": {"name": "arguments", "schema": schema}})
        return "(?:" + schema_to_regex(spec, self.limits) + ")"


def closable_format(fmt: dict, limits: GuideLimits, parallel: bool = True) -> dict:
    """The structural tag ``fmt`` as a budget regex format (``REQUEST_KEY`` kept); raises
    ``UnsupportedGuideError`` for what cannot be closed exactly."""
    if fmt.get("type") != "structural_tag":
        raise UnsupportedGuideError(f"a {fmt.get('type')!r} tool-call format cannot be closed exactly",
                                    feature="budget")
    inner = fmt.get("format")
    if isinstance(inner, str):
        inner = json.loads(inner)
    out = {"type": "regex_schema", "regex_schema": _Lowering(limits, parallel).node(inner), BUDGET_KEY: "close"}
    if REQUEST_KEY in fmt:
        out[REQUEST_KEY] = fmt[REQUEST_KEY]
    return out


def apply(parser: Any, client_request: Any) -> None:
    """Rewrite the parser's tool-call format for a request that asks for the budget (see the
    module doc); a request without tools, or with the client's own format, is left alone.
    Raises ``ValueError`` (LMDeploy answers HTTP 400 with its message) for what cannot be closed."""
    request = getattr(parser, "request", None)
    fmt = getattr(request, "response_format", None)
    if not getattr(request, "tools", None) or not isinstance(fmt, dict) or fmt.get("type") != "structural_tag":
        return
    if getattr(client_request, "response_format", None) is not None:
        return
    setting = requested(client_request)
    if setting == "off" and budget_default() is not None:  # opted out of the engine default
        parser.request = request.model_copy(update={"response_format": {**fmt, BUDGET_KEY: "off"}})
    if setting != "close":
        return
    from ..boot.settings import configured_limits

    parallel = getattr(client_request, "parallel_tool_calls", None) is not False
    try:
        new = closable_format(fmt, configured_limits(), parallel)
    except GuideError as exc:
        raise ValueError(f"tool calls with {BUDGET_KEY}=\"close\": {exc}") from None
    parser.request = request.model_copy(update={"response_format": new})
