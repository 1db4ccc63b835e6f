"""An empty answer that the client's constraint allows is the string "", not null.

LMDeploy's response parser turns an empty completion into ``content: null`` (its convention for
"the model said nothing, maybe it only called tools"). For ``choice: [""]`` or a regex that admits
the empty string, "" *is* the constrained answer, and a client that checks ``content in choices``
or ``re.fullmatch`` gets ``None`` instead. :func:`patched_parse_complete` keeps "" for the
constraint kinds that can admit it, when no tool call was made, on the PyTorch engine; JSON kinds
never admit "" and tool formats keep stock's null; TurboMind answers exactly as stock.
"""
from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

# response_format kinds whose language may contain the empty string
_MAY_BE_EMPTY = frozenset({"choice", "regex_schema", "regex", "grammar", "ebnf", "lark"})


def _format_kind(request: Any) -> str | None:
    fmt = getattr(request, "response_format", None)
    if fmt is None:
        return None
    return fmt.get("type") if isinstance(fmt, dict) else getattr(fmt, "type", None)


def patched_parse_complete(original: Callable) -> Callable:
    """``ResponseParser.parse_complete`` whose empty content is "" when the constraint allows it."""

    @functools.wraps(original)
    def parse_complete(self: Any, text: str, *args: Any, **kwargs: Any) -> Any:
        content, tool_calls, reasoning = original(self, text, *args, **kwargs)
        if content is None and not tool_calls and _format_kind(getattr(self, "request", None)) in _MAY_BE_EMPTY:
            from .engines import serving_turbomind

            if not serving_turbomind():  # TurboMind answers exactly as stock
                content = ""
        return content, tool_calls, reasoning

    return parse_complete


def install(p: Any) -> None:
    """On LMDeploy's default response parser (an LMDeploy without server parsers: nothing to do)."""
    try:
        rp = importlib.import_module("lmdeploy.serve.parsers.response_parser")
    except ImportError:
        return
    cls = getattr(rp, "BaseResponseParser", None)
    if cls is not None and "parse_complete" in cls.__dict__:
        p.set(cls, "parse_complete", patched_parse_complete(cls.parse_complete))
