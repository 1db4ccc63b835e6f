"""Valid arguments whenever the model calls a tool, not only for ``tool_choice="required"``.

Stock LMDeploy constrains a chat request only for ``tool_choice="required"``; with ``"auto"`` (the
OpenAI default) or a named function a call with a wrong argument reaches the client. The upgrade
gives those requests the same kind of format, built where LMDeploy builds its own
(``ResponseParser.__init__``), so streaming deltas and parsed calls are LMDeploy's own:

* ``auto``: free text until the model opens a call (the parser's trigger), then that tool's
  schema, then free again; parallel calls where the format has them;
* a named function: exactly one call of it (xgrammar's forced tool choice, else the parser's own
  required format or JSON envelope; no format at all: served as stock, never refused);
* ``required`` with a reasoning parser: at least one call, the first right away after thinking.

With a reasoning parser the formats are built *without* a thinking part and the thinking section
goes to the reasoning gate, optional (``thinking_setting``): xgrammar's ``reasoning=True`` tags
assume the prompt opened the section and refuse a model's own ``<think>``. TurboMind requests get
exactly what stock sends. Not applied when the client sent its own ``response_format``
(``{"type": "text"}`` opts out), when the parser has no ``auto`` model (InternLM), or, for
``auto``/named, when the switch is off (``activate(tool_calls=False)`` / ``TOKENRAILS_TOOL_CALLS=0``).
docs/lmdeploy.md ("Tool calls beyond tool_choice=required") has the parser families and tests.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from ..boot import settings

logger = logging.getLogger("tokenrails.lmdeploy")


def enabled() -> bool:
    return settings.current().tool_calls is not False  # activate(tool_calls=...), default on


def _tool_dicts(tools: list[Any]) -> list[dict]:
    """OpenAI tool shapes; LMDeploy's parser may have flattened them to bare functions."""
    out = []
    for t in tools:
        d = t.model_dump(mode="json") if hasattr(t, "model_dump") else dict(t)
        if "function" not in d and "name" in d:
            d = {"type": "function", "function": d}
        out.append(d)
    return out


def _named_function(tool_choice: Any) -> str | None:
    if tool_choice is None or isinstance(tool_choice, str):
        return None
    data = tool_choice.model_dump(mode="json") if hasattr(tool_choice, "model_dump") else tool_choice
    fn = data.get("function") if isinstance(data, dict) else None
    return fn.get("name") if isinstance(fn, dict) else None


def tool_call_format(parser: Any, request: Any, client_request: Any = None) -> dict | None:
    """The structural tag enforcing tool-call arguments for ``request`` (as the parser adjusted
    it) under ``auto`` or a named function, without a thinking part, or None to leave it as stock
    leaves it. ``client_request``: the request as the client sent it, whose own
    ``response_format`` (``{"type": "text"}`` included) always wins."""
    tools = getattr(request, "tools", None)
    tool_parser = getattr(parser, "tool_parser", None)
    sent = client_request if client_request is not None else request
    if not tools or tool_parser is None or getattr(sent, "response_format", None) is not None \
            or getattr(request, "response_format", None) is not None:
        return None
    choice = getattr(request, "tool_choice", None)
    name = _named_function(choice)
    if name is None and choice not in (None, "auto"):
        return None  # "none" stays free; "required" is stock's own format
    cls = type(tool_parser)
    model = _structural_model(cls, parser)
    tool_list = _tool_dicts(tools)
    if model is None:
        return None if name is None else _named_call_without_model(cls, tools, name)
    tool_choice = "auto" if name is None else {"type": "function", "function": {"name": name}}
    return _model_tag(model, tool_list, tool_choice, request)


def required_format(parser: Any, client_request: Any) -> dict | None:
    """``tool_choice="required"`` for a thinking request: the parser's own required format
    without its thinking part (the calls first, as without a reasoning parser), or None where
    stock's format stands (no reasoning, no tools, or a parser without a required format)."""
    tool_parser = getattr(parser, "tool_parser", None)
    tools = list(getattr(client_request, "tools", None) or [])
    if getattr(client_request, "tool_choice", None) != "required" or tool_parser is None or not tools \
            or not getattr(parser, "reasoning_enabled", False):
        return None
    cls = type(tool_parser)
    if _own_required_format(cls):
        return cls.build_required_response_format(tools, reasoning=False)
    model = _structural_model(cls, parser)
    if model is None:
        return None  # stock raised for this parser already
    return _model_tag(model, _tool_dicts(tools), "required", client_request)


def _structural_model(cls: type, parser: Any) -> str | None:
    """The parser's xgrammar model name, its reasoning variant when the request thinks."""
    model = getattr(cls, "structural_tag_model", None)
    if getattr(parser, "reasoning_enabled", False) and getattr(cls, "reasoning_structural_tag_model", None):
        model = cls.reasoning_structural_tag_model
    return model


def _model_tag(model: str, tools: list[dict], tool_choice: Any, request: Any) -> dict:
    """xgrammar's tag for the model's call syntax, without a thinking part (the gate owns it)."""
    import xgrammar as xgr

    parallel = getattr(request, "parallel_tool_calls", None) is not False
    return xgr.get_model_structural_tag(
        model, tools, tool_choice=tool_choice, reasoning="disabled", parallel_tool_calls=parallel,
    ).model_dump(mode="json")


def _own_required_format(cls: type) -> bool:
    """Whether the parser class builds its required format itself (InternLM's action blocks)."""
    from lmdeploy.serve.parsers.tool_parser.tool_parser import ToolParser

    own = getattr(cls.build_required_response_format, "__func__", None)
    return own is not None and own is not ToolParser.build_required_response_format.__func__


def thinking_setting(parser: Any) -> dict | None:
    """The request's reasoning-gate setting when its thinking is handed to the gate: the reasoning
    parser's markers, ``optional`` (the model may open the start marker itself or answer
    directly; a prompt that opened or closed the section decides first). None without reasoning."""
    reasoning_parser = getattr(parser, "reasoning_parser", None)
    if not getattr(parser, "reasoning_enabled", False) or reasoning_parser is None:
        return None
    start = getattr(parser, "_reasoning_open_tag", None) or reasoning_parser.get_reasoning_open_tag()
    end = getattr(parser, "_reasoning_close_tag", None) or reasoning_parser.get_reasoning_close_tag()
    if not end:
        return None
    if not start:  # no start marker to read: the section is open unless the prompt closed it
        return {"end": end}
    return {"start": start, "end": end, "optional": True}


def _named_call_without_model(cls: type, tools: list[Any], name: str) -> dict | None:
    """A named ``tool_choice`` for a parser without an xgrammar model: the parser's own required
    format over that tool (InternLM), else — a JSON-envelope parser (llama3) — exactly one call of
    that function in the parser's syntax. Never an error: where no format exists the request is
    served as stock serves it (unconstrained), and the log says so."""
    chosen = [t for t in tools if _tool_name(t) == name]
    if not chosen:
        return None
    from lmdeploy.serve.openai.protocol import Tool

    chosen_tools = [Tool.model_validate(d) for d in _tool_dicts(chosen)]
    if _own_required_format(cls):
        return cls.build_required_response_format(chosen_tools, reasoning=False)
    fmt = json_envelope_call(cls, chosen_tools[0])
    if fmt is None:
        logger.info("tokenrails: tool parser %s has no call format for tool_choice=%r; served as stock "
                    "LMDeploy serves it (arguments not enforced)", cls.__name__, name)
    return fmt


def json_envelope_call(cls: type, tool: Any) -> dict | None:
    """One call of ``tool`` as a JSON-envelope parser writes it: ``OPEN{"name": NAME, "ARGS": {...}}CLOSE``
    (llama3: ``<|python_tag|>{"name": ..., "parameters": ...}``), arguments under the tool's schema.
    None for a parser that is not a JSON-envelope one."""
    try:
        from lmdeploy.serve.parsers.tool_parser.json_tool_parser import JsonToolParser
    except ImportError:
        return None
    if not issubclass(cls, JsonToolParser):
        return None
    from xgrammar.structural_tag import JSONSchemaFormat, StructuralTag, TagFormat

    open_tag = cls.get_tool_open_tag() or ""
    close_tag = cls.get_tool_close_tag() or ""
    begin = f"{open_tag}{{{json.dumps(cls.name_field)}: {json.dumps(tool.function.name)}, {json.dumps(cls.argument_field)}: "
    params = tool.function.parameters or {"type": "object"}
    return StructuralTag(format=TagFormat(begin=begin, content=JSONSchemaFormat(json_schema=params),
                                          end="}" + close_tag)).model_dump(mode="json")


def _tool_name(tool: Any) -> str | None:
    data = tool.model_dump(mode="json") if hasattr(tool, "model_dump") else tool
    fn = data.get("function", data) if isinstance(data, dict) else None
    return fn.get("name") if isinstance(fn, dict) else None


def format_owns_thinking(fmt: Any, close_tag: str | None) -> bool:
    """Whether a tool-call structural tag starts with its own thinking section: a tag opened by
    nothing (the prompt opened the thinking) and closed by the reasoning parser's ``close_tag``,
    as xgrammar's ``reasoning=True`` tags and InternLM's required format are built."""
    if not close_tag or not isinstance(fmt, dict) or fmt.get("type") != "structural_tag":
        return False
    node: Any = fmt.get("format")
    while isinstance(node, dict) and node.get("type") == "sequence" and node.get("elements"):
        node = node["elements"][0]
    if not isinstance(node, dict) or node.get("type") != "tag" or node.get("begin") not in ("", None):
        return False
    ends = node.get("end")
    ends = [ends] if isinstance(ends, str) else list(ends or [])
    return any(isinstance(e, str) and e.strip() == close_tag.strip() for e in ends)


def hand_thinking_to_format(parser: Any) -> None:
    """Exactly one owner of the thinking section per request: when the request's tool-call format
    still reads the thinking itself (a format this module did not rebuild), the engine-wide
    reasoning gate stands aside for this request (``tokenrails_reasoning: "off"``). Otherwise the
    model thinks twice: the gate consumes the thinking up to ``</think>``, and the format then
    wants a second one, refusing the call's first marker and the plain answer's EOS."""
    fmt = getattr(getattr(parser, "request", None), "response_format", None)
    if not getattr(parser, "reasoning_enabled", False) or not isinstance(fmt, dict):
        return
    from ...reasoning_settings import REQUEST_KEY

    if REQUEST_KEY in fmt:
        return
    reasoning_parser = getattr(parser, "reasoning_parser", None)
    close = getattr(parser, "_reasoning_close_tag", None) or (
        reasoning_parser.get_reasoning_close_tag() if reasoning_parser is not None else None)
    if format_owns_thinking(fmt, close):
        parser.request = parser.request.model_copy(update={"response_format": {**fmt, REQUEST_KEY: "off"}})


def patched_parser_init(original):
    """``ResponseParser.__init__`` that adds the tool-call format after LMDeploy's own setup
    (``auto``/named when the switch is on; ``required`` with thinking always), with the thinking
    section given to the reasoning gate; a format still carrying a thinking part keeps it."""

    def __init__(self, request, *args, **kwargs):
        original(self, request, *args, **kwargs)
        from .engines import serving_turbomind

        if serving_turbomind():
            return  # TurboMind gets exactly what stock sends it (its compiler, no reasoning gate)
        fmt = required_format(self, request)
        if fmt is None and enabled():
            fmt = tool_call_format(self, self.request, request)
        if fmt is not None:
            setting = thinking_setting(self)
            if setting is not None:
                from ...reasoning_settings import REQUEST_KEY

                fmt = {**fmt, REQUEST_KEY: setting}
            self.request = self.request.model_copy(update={"response_format": fmt})
        hand_thinking_to_format(self)
        from . import tool_budget

        tool_budget.apply(self, request)  # a budget request: the format as a DFA the rule closes

    __init__.__wrapped__ = original
    return __init__
