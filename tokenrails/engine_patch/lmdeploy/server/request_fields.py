"""vLLM / outlines request fields (``guided_json``, ``structured_outputs``...) read over HTTP.

LMDeploy's pydantic request models drop every field they do not declare, so a client moving from
vLLM (``extra_body={"guided_json": ...}``) would get 200 and unconstrained text. The upgrade declares
these fields on the chat and completion request models (and ``response_format`` on completions),
then folds what the client sent into the request's ``response_format`` as one packed object,
``{"type": "request_fields", "request_fields": {...}}``, holding the fields verbatim next to the
client's own ``response_format``. Every check downstream sees one non-text constraint:

* the front check and the engine parse it with ``tokenrails.requests`` (two constraints, an unknown
  backend, an option that cannot apply: a typed error, HTTP 400 with the reason);
* ``tool_choice="required"`` refuses it like any other ``response_format``;
* TurboMind refuses it (stock's check knows no such type; TurboMind would run it unconstrained).

Folding never validates, so it cannot fail where LMDeploy does not expect an exception: the
verdict comes from the format check, with LMDeploy's own clean-up.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from ....requests.response_format import BUDGET_KEY
from ...reasoning_settings import REQUEST_KEY
from .request_parsing import PACKED, WideResponseFormat

TOP_LEVEL_KEYS = (REQUEST_KEY, BUDGET_KEY)  # tokenrails' own format keys stay beside the packed fields

# vLLM's legacy top-level fields, its ``structured_outputs``, and ``guided_decoding``
# (a ``GuidedDecodingParams`` dict): what ``tokenrails.requests.parse_request`` reads from a body.
FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_json_object",
          "guided_whitespace_pattern", "guided_decoding_backend", "structured_outputs", "guided_decoding")


def sent_fields(request: Any) -> dict[str, Any]:
    """The request fields of ``FIELDS`` the client sent (None means not sent)."""
    return {name: value for name in FIELDS if (value := getattr(request, name, None)) is not None}


def fold(request: Any) -> Any:
    """``request`` with its vLLM fields packed into ``response_format`` (unchanged without any)."""
    fields = sent_fields(request)
    if not fields or not hasattr(request, "model_copy"):
        return request
    packed: dict[str, Any] = dict(fields)
    lifted: dict[str, Any] = {}
    own = getattr(request, "response_format", None)
    if own is not None:
        own = own.model_dump() if hasattr(own, "model_dump") else own
        if isinstance(own, dict):  # the engine reads its own keys at the top level
            lifted = {k: own[k] for k in TOP_LEVEL_KEYS if k in own}
            own = {k: v for k, v in own.items() if k not in TOP_LEVEL_KEYS}
        packed["response_format"] = own
    fmt: dict[str, Any] = {"type": PACKED, PACKED: packed, **lifted}
    cleared = {name: None for name in fields}
    return request.model_copy(update={"response_format": WideResponseFormat(**fmt), **cleared})


def with_body_budget(request: Any) -> Any:
    """``request`` whose chat-body ``tokenrails_budget`` also applies to its ``response_format`` (a
    key the format sets itself wins); tool calls read the body field themselves (tool_budget.py)."""
    value = getattr(request, BUDGET_KEY, None)
    fmt = getattr(request, "response_format", None)
    if value is None or fmt is None or not hasattr(request, "model_copy"):
        return request
    own = fmt.model_dump() if hasattr(fmt, "model_dump") else fmt
    if not isinstance(own, dict) or own.get("type", "text") == "text" or BUDGET_KEY in own:
        return request
    return request.model_copy(update={"response_format": WideResponseFormat(**{**own, BUDGET_KEY: value})})


def widen(p: Any, model: type, extra: dict[str, Any] | None = None) -> None:
    """Declare ``FIELDS`` (and ``extra``: name → annotation) on a request model, undoably."""
    from pydantic.fields import FieldInfo

    fields = dict(model.__pydantic_fields__)
    added = {name: FieldInfo(annotation=Any, default=None) for name in FIELDS if name not in fields}
    for name, annotation in (extra or {}).items():
        if name not in fields:
            added[name] = FieldInfo(annotation=annotation, default=None)
    if not added:
        return
    p.set(model, "__pydantic_fields__", {**fields, **added})
    model.model_rebuild(force=True)


def folding_generation_config(original: Callable) -> Callable:
    """``build_serving_generation_config`` of ``/v1/completions`` reading the folded request."""

    @functools.wraps(original)
    def build(request: Any, *args: Any, **kwargs: Any):
        return original(fold(request), *args, **kwargs)

    return build
