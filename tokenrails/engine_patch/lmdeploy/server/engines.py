"""What the upgrade may promise depends on the engine that will run the request.

The upgrade enforces its wider set of constraints (``choice``, ``grammar``, structural tags in every
shape, ``tokenrails_reasoning``) only in LMDeploy's PyTorch engine. TurboMind compiles
``response_format`` itself and runs what its compiler does not take **unconstrained** (a log
line); the gpt-oss (harmony) parser clears what it cannot wrap in its final channel. So:

* a request for TurboMind (the engine running ``AsyncEngine.preprocess``, a context variable)
  gets exactly stock's check and stock's chat request path: no request-level refusals
  (front_check.py), no tool-call formats (tool_calls.py); stock's kinds pass, others are a 400;
* harmony on the PyTorch engine: ``choice`` and ``grammar`` are wrapped in the final channel as
  stock wraps JSON and regexes; a non-text format it cannot wrap is refused, never cleared. With
  tools, where stock replaces the client's ``response_format`` by the tool grammar, the format
  goes in that grammar's final-channel answer (``auto``) or is refused with the reason (a named or
  required call). Harmony on TurboMind: stock's wrapper, and stock's refusals.
"""
from __future__ import annotations

import contextvars
import functools
import json
from typing import Any, Callable


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
    from ....requests.response_format import BUDGET_KEY
    from ...reasoning_settings import REQUEST_KEY

    fmt = response_format.model_dump() if hasattr(response_format, "model_dump") else response_format
    if isinstance(fmt, str):
        fmt = json.loads(fmt)
    for key in (REQUEST_KEY, BUDGET_KEY):
        if isinstance(fmt, dict) and key in fmt:
            raise ValueError(f"Unsupported response format: {key} needs the PyTorch engine (this is TurboMind)")
    kind = fmt.get("type", "text") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_schema", "json_object", "regex_schema", "structural_tag"):
        raise ValueError(f"Unsupported response format: {_turbomind_refusal(kind)}")
    _STOCK["ensure"](fmt)


def patched_build_response_format_grammar(original: Callable) -> Callable:
    """Harmony's final-channel wrapper, extended to ``choice``, ``grammar`` and the vLLM fields the
    server folded in (request_fields.py); refuses (ValueError: the request fails with 400) instead
    of returning None, which would clear the constraint. TurboMind: stock's wrapper unchanged for
    stock's kinds, every other kind refused (stock's request model refuses them too)."""

    def build(fmt: dict) -> dict:
        kind = fmt.get("type", "text")
        if serving_turbomind():
            if kind not in _STOCK_CLIENT_KINDS:
                raise ValueError(_turbomind_refusal(kind))
            return original(fmt)
        if kind == _packed_kind():
            fmt = _plain_format(fmt)
            kind = fmt.get("type")
        if kind in ("choice", "grammar"):
            from ....guided.backends.xgrammar_backend import choice_ebnf

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


def _turbomind_refusal(kind: Any) -> str:
    what = (f"response_format type {kind!r}" if kind != _packed_kind() else
            "vLLM's guided_* / structured_outputs fields (send response_format json_schema or regex_schema)")
    return f"{what} is enforced by tokenrails only in the PyTorch engine; TurboMind would run this request unconstrained"


def _packed_kind() -> str:
    from .request_parsing import PACKED

    return PACKED


def _plain_format(fmt: dict) -> dict:
    """The response_format kind a folded vLLM request amounts to, when it carries no option the
    harmony wrapper cannot express (a whitespace rule, a backend hint): else ValueError."""
    from ....guided.errors import GuideError
    from .request_parsing import spec_of

    try:
        spec = spec_of(fmt)
    except GuideError as exc:
        raise ValueError(f"invalid response_format: {exc}") from None
    plain = None
    if spec is not None and spec.options in ((), (("any_whitespace", True),)):
        plain = {"json_schema": lambda: {"type": "json_schema", "json_schema": {"name": "guided_json",
                                                                                  "schema": spec.schema}},
                 "json_object": lambda: {"type": "json_object"},
                 "regex": lambda: {"type": "regex_schema", "regex_schema": spec.pattern},
                 "choice": lambda: {"type": "choice", "choice": spec.choices},
                 "grammar": lambda: {"type": "grammar", "grammar": spec.ebnf}}.get(spec.kind, lambda: None)()
    if plain is None:
        raise ValueError("these guided decoding fields cannot be enforced in this model's harmony format "
                         "(an option or kind its final-channel wrapper cannot express); refused rather than dropped")
    return plain


def patched_maybe_inject_tool_grammar(original: Callable) -> Callable:
    """Harmony's ``_maybe_inject_tool_grammar``, which builds every harmony structural tag (the format
    then owns the thinking: see ``_harmony_owns_thinking``). With tools, stock replaces a client's
    ``response_format`` by the tool grammar and only logs it. The upgrade keeps both where harmony
    can: with ``tool_choice="auto"`` the tool grammar's final-channel answer (free text in stock's
    tag) must be in the client's format, a call stays a call. Where the answer must be a call (a
    named function, ``required``), or the format cannot be wrapped, the request is refused with
    the reason (ValueError: HTTP 400), never dropped. TurboMind: stock's behaviour."""

    @functools.wraps(original)
    def inject(self) -> None:
        request = getattr(self, "request", None)
        fmt = getattr(request, "response_format", None)
        kind = fmt.get("type", "text") if isinstance(fmt, dict) else None
        if serving_turbomind():
            if kind is not None and kind not in _STOCK_CLIENT_KINDS:
                raise ValueError(_turbomind_refusal(kind))
            original(self)
            return
        tools = getattr(request, "tools", None)
        choice = getattr(request, "tool_choice", "auto")
        answer = None
        if tools and choice != "none" and isinstance(fmt, dict):
            answer = _final_answer_content(self, fmt, kind, choice)
        original(self)
        if answer is not None:
            _constrain_final_answer(self, answer, kind)
        _harmony_owns_thinking(self)

    return inject


_FINAL_BEGIN = "<|channel|>final<|message|>"


def _final_answer_content(parser: Any, fmt: dict, kind: str | None, choice: Any) -> dict | None:
    """The client's format as the content of harmony's final-channel answer (None: no format);
    ValueError when tools and this format cannot both be enforced."""
    from ...reasoning_settings import REQUEST_KEY

    if kind == "text" and REQUEST_KEY not in fmt:
        return None
    what = f"type {kind!r}" if kind != "text" else REQUEST_KEY
    why = None
    if REQUEST_KEY in fmt or kind == "structural_tag":
        why = "harmony's tool grammar is a structural tag of its own, with its own thinking part"
    elif choice != "auto":
        why = "the answer must be a tool call, which has no place for the format"
    if why is not None:
        raise ValueError(f"response_format {what} cannot be enforced together with tools for this model's harmony "
                         f"format ({why}); refused rather than dropped: send the format without tools, or the "
                         "tools without a response_format")
    return _final_tag(parser._build_response_format_grammar(fmt))["content"]


def _constrain_final_answer(parser: Any, content: dict, kind: str | None) -> None:
    """Put ``content`` in the final-channel tag of the tool grammar harmony just built."""
    grammar = getattr(getattr(parser, "request", None), "response_format", None)
    tags = None
    if isinstance(grammar, dict) and grammar.get("type") == "structural_tag":
        tags = (grammar.get("format") or {}).get("tags")
    finals = [t for t in tags or () if isinstance(t, dict) and t.get("begin") == _FINAL_BEGIN]
    if len(finals) != 1:
        raise ValueError(f"response_format type {kind!r} cannot be enforced together with tools for this model: "
                         "harmony's tool grammar has no final-channel answer to put it in; refused rather than dropped")
    finals[0]["content"] = content


def _harmony_owns_thinking(parser: Any) -> None:
    """Harmony's structural tags carry the analysis channel (its thinking) themselves: the
    engine-wide reasoning gate stands aside for the request (one owner of the thinking section).
    Not on TurboMind, which has no gate and refuses the key."""
    request = getattr(parser, "request", None)
    fmt = getattr(request, "response_format", None)
    if not isinstance(fmt, dict) or fmt.get("type") != "structural_tag" or serving_turbomind():
        return
    from ...reasoning_settings import REQUEST_KEY

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
