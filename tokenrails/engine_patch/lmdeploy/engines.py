"""What the upgrade may promise depends on the engine that will run the request.

The upgrade enforces its wider set of constraints (``choice``, ``grammar``, structural tags in every
shape, ``tokenrails_reasoning``) only in LMDeploy's PyTorch engine. TurboMind compiles
``response_format`` itself and, for anything its compiler does not take, logs a warning and runs the
request **unconstrained**; the gpt-oss (harmony) parser clears what it cannot wrap in its final
channel. So:

* a request for a TurboMind engine gets exactly stock LMDeploy's check (stock's kinds pass,
  everything else is refused with HTTP 400 and the reason), found from the engine running
  ``AsyncEngine.preprocess`` (a context variable set around it);
* harmony: ``choice`` and ``grammar`` are wrapped in the final channel like stock wraps JSON and
  regexes; any other non-text format it cannot wrap is refused, never cleared. With tools, harmony
  replaces the client's ``response_format`` by the tool grammar: a kind only the upgrade accepts
  (``choice``, ``grammar``, ``structural_tag``, the reasoning key) is then refused with the reason
  instead of dropped; stock's own kinds keep stock's behaviour (replaced, with a log line).
"""
from __future__ import annotations

import contextvars
import functools
import json
import logging
from typing import Any, Callable

logger = logging.getLogger("tokenrails.lmdeploy")

ENGINE_BACKEND: contextvars.ContextVar[str | None] = contextvars.ContextVar("tokenrails_engine_backend", default=None)
_STOCK: dict[str, Callable] = {}


def remember_stock_check(check: Callable) -> None:
    """Keep LMDeploy's own early check (called at activation, before it is replaced)."""
    _STOCK["ensure"] = check


def patched_preprocess(original: Callable) -> Callable:
    """``AsyncEngine.preprocess`` with the engine's backend name visible to the format check."""

    @functools.wraps(original)
    async def preprocess(self, *args: Any, **kwargs: Any):
        token = ENGINE_BACKEND.set(getattr(self, "backend", None))
        try:
            return await original(self, *args, **kwargs)
        finally:
            ENGINE_BACKEND.reset(token)

    return preprocess


_PROCESS_BACKENDS: set[str] = set()  # the backends of the AsyncEngines built in this process


def patched_async_engine_init(original: Callable) -> Callable:
    """``AsyncEngine.__init__`` that records which engine this process serves with: a response
    parser is built before ``preprocess`` (where ``ENGINE_BACKEND`` is set) and must know too."""

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        backend = getattr(self, "backend", None)
        if isinstance(backend, str):
            _PROCESS_BACKENDS.add(backend)

    return __init__


def serving_turbomind() -> bool:
    """This request will run on TurboMind: the running ``preprocess``'s engine says so, else the
    only kind of engine this process serves with."""
    current = ENGINE_BACKEND.get()
    if current is not None:
        return current == "turbomind"
    return _PROCESS_BACKENDS == {"turbomind"}


def stock_check_for_turbomind(response_format: Any) -> None:
    """Stock LMDeploy's early check, unchanged: what TurboMind would compile, and nothing else.

    Raises ``ValueError`` (LMDeploy's preprocess answers HTTP 400) for every other kind, and for
    the per-request reasoning and budget keys, which only the PyTorch engine reads.
    """
    from ...requests.response_format import BUDGET_KEY
    from ..reasoning import REQUEST_KEY

    fmt = response_format.model_dump() if hasattr(response_format, "model_dump") else response_format
    if isinstance(fmt, str):
        fmt = json.loads(fmt)
    for key in (REQUEST_KEY, BUDGET_KEY):
        if isinstance(fmt, dict) and key in fmt:
            raise ValueError(f"Unsupported response format: {key} needs the PyTorch engine (this is TurboMind)")
    kind = fmt.get("type", "text") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_schema", "json_object", "regex_schema", "structural_tag"):
        raise ValueError(
            f"Unsupported response format: type {kind!r} is enforced by tokenrails only in the PyTorch engine; "
            "TurboMind would run this request unconstrained"
        )
    _STOCK["ensure"](fmt)


def patched_build_response_format_grammar(original: Callable) -> Callable:
    """Harmony's final-channel wrapper, extended to ``choice`` and ``grammar``; refuses (ValueError:
    the request fails with 400) instead of returning None, which would clear the constraint."""

    def build(fmt: dict) -> dict:
        kind = fmt.get("type", "text")
        if kind in ("choice", "grammar"):
            from ...guided.backends.xgrammar_backend import choice_ebnf

            ebnf = choice_ebnf([str(c) for c in fmt.get("choice") or []]) if kind == "choice" else fmt.get("grammar")
            if not ebnf:
                raise ValueError(f"response_format {kind!r} has nothing to enforce")
            tag = original({"type": "json_object"})
            final = _final_tag(tag)
            final["content"] = {"type": "grammar", "grammar": ebnf}
            return tag
        tag = original(fmt)
        if tag is None:
            raise ValueError(f"response_format type {kind!r} cannot be enforced for this model's harmony format; "
                             "refused rather than cleared")
        return tag

    return staticmethod(build)


_STOCK_CLIENT_KINDS = frozenset({"text", "json_schema", "json_object", "regex_schema"})


def patched_maybe_inject_tool_grammar(original: Callable) -> Callable:
    """Harmony's ``_maybe_inject_tool_grammar``, which builds every harmony structural tag (the format
    then owns the thinking: see ``_harmony_owns_thinking``). With tools, a client ``response_format``
    is replaced by the tool grammar. Stock's request model only let its own kinds through; the widened one lets
    ``choice``/``grammar``/``structural_tag`` (and ``tokenrails_reasoning``) in, and they must not
    be dropped silently: ValueError (the server answers 400 with the reason)."""

    @functools.wraps(original)
    def inject(self) -> None:
        request = getattr(self, "request", None)
        fmt = getattr(request, "response_format", None)
        tools = getattr(request, "tools", None)
        if tools and getattr(request, "tool_choice", "auto") != "none" and isinstance(fmt, dict):
            from ..reasoning import REQUEST_KEY

            kind = fmt.get("type", "text")
            if kind not in _STOCK_CLIENT_KINDS or REQUEST_KEY in fmt:
                what = REQUEST_KEY if kind in _STOCK_CLIENT_KINDS else f"type {kind!r}"
                raise ValueError(
                    f"response_format {what} cannot be enforced together with tools for this model's harmony "
                    "format (the tool grammar replaces it); refused rather than dropped")
            if kind != "text":
                logger.info("tokenrails: harmony replaces the client's %s response_format by the tool grammar "
                            "(as stock LMDeploy does)", kind)
        original(self)
        _harmony_owns_thinking(self)

    return inject


def _harmony_owns_thinking(parser: Any) -> None:
    """Harmony's structural tags carry the analysis channel (its thinking) themselves: the
    engine-wide reasoning gate stands aside for the request (one owner of the thinking section).
    Not on TurboMind, which has no gate and refuses the key."""
    request = getattr(parser, "request", None)
    fmt = getattr(request, "response_format", None)
    if not isinstance(fmt, dict) or fmt.get("type") != "structural_tag" or serving_turbomind():
        return
    from ..reasoning import REQUEST_KEY

    if REQUEST_KEY not in fmt and hasattr(request, "model_copy"):
        parser.request = request.model_copy(update={"response_format": {**fmt, REQUEST_KEY: "off"}})


def _final_tag(tag: Any) -> dict:
    """The final-channel tag of stock's structural tag (its last sequence element)."""
    try:
        final = tag["format"]["elements"][-1]
        if final.get("type") == "tag" and "final" in str(final.get("begin")):
            return final
    except (TypeError, KeyError, IndexError):
        pass
    raise ValueError("LMDeploy's harmony structural tag has an unexpected shape; refusing the constraint")
