"""LMDeploy request parsing routed through ``tokenrails.requests.spec_from_request``.

* ``spec_of(response_format)``: the engine-side conversion (memoized per format object).
* ``parse_format``: the spec plus the request's reasoning setting, the extra key
  ``response_format["tokenrails_reasoning"]`` (see tokenrails/engine_patch/reasoning.py); the key
  is removed before the format reaches ``spec_from_request``. ``response_format["tokenrails_budget"]
  = "close"`` makes the spec a budget spec (tokenrails/guided/budget.py: closed within the
  request's ``max_new_tokens``; DFA constraints only, else ``UnsupportedGuideError``); without the
  key the engine default applies (``activate(budget=...)``, ``--budget``), ``"off"`` opts out.
* ``validate_spec``: the verdict of compiling a spec against a probe vocabulary (memoized); LMDeploy's
  early check (front_check.ensure_response_format_compilable) raises it as HTTP 400.
* ``WideResponseFormat``: the server's ``response_format`` model widened to every kind.
"""
from __future__ import annotations

import contextvars
import json
import threading
from collections import OrderedDict
from typing import Any

from pydantic import BaseModel, ConfigDict, model_serializer

from ...guided.budget import budget_spec
from ...guided.errors import GuideError, InvalidGuideError, detached_copy
from ...guided.limits import DEFAULT_LIMITS, GuideLimits
from ...guided.spec import GuideSpec
from ...requests import spec_from_request
from ...requests.response_format import BUDGET_KEY
from ..reasoning import REQUEST_KEY, ReasoningSetting, parse_setting, split_request_setting
from .settings import BUDGET_VALUES, budget_default

__all__ = ["WideResponseFormat", "parse_format", "spec_of",
           "validate_spec"]


def parse_format(response_format: Any) -> tuple[GuideSpec | None, ReasoningSetting | None]:
    """(``GuideSpec`` or None, the request's reasoning setting or None) of a ``response_format``.

    Raises ``GuideError`` for a bad constraint or a bad ``tokenrails_reasoning`` value.
    """
    if response_format is None:
        return None, None
    if isinstance(response_format, GuideSpec):
        return response_format, None
    rf = response_format
    if isinstance(rf, str) and REQUEST_KEY in rf:
        try:
            rf = json.loads(rf)
        except ValueError:
            rf = response_format  # not JSON: let from_request report it
    if hasattr(rf, "model_dump") and not isinstance(rf, type) and not (
            {REQUEST_KEY, BUDGET_KEY}.isdisjoint(getattr(rf, "model_extra", None) or {})):
        rf = rf.model_dump()
    rf, raw = split_request_setting(rf)
    setting = parse_setting(raw)
    budget = None
    if isinstance(rf, dict) and BUDGET_KEY in rf:
        budget = rf[BUDGET_KEY]
        rf = {k: v for k, v in rf.items() if k != BUDGET_KEY}
        if budget is not None and budget not in BUDGET_VALUES:
            raise InvalidGuideError(f"{BUDGET_KEY} must be \"close\" or \"off\" (or absent), got {budget!r}")
    if budget is None:
        budget = budget_default()  # activate(budget=...) / --budget; the request's own key wins
    body = body_of(rf)  # vLLM fields the api_server folded in (request_fields.py)
    if body is not None:
        _refuse_non_string_choices(body.get("response_format"))
        for where in ("structured_outputs", "guided_decoding"):
            params = body.get(where)
            if isinstance(params, dict):
                _refuse_non_strings(f"{where}.choice", params.get("choice"))
        _refuse_non_strings("guided_choice", body.get("guided_choice"))
        spec = spec_from_request(body)
    elif isinstance(rf, dict) and rf.get("type", "text") == "text":
        return None, setting
    else:
        _refuse_non_string_choices(rf)
        spec = spec_from_request(rf)
    if budget == "close" and spec is not None:
        spec = budget_spec(spec)
    return spec, setting


PACKED = "request_fields"  # the response_format type the api_server folds vLLM fields into


def body_of(fmt: Any) -> dict[str, Any] | None:
    """The packed request body (request_fields.py) of a folded ``response_format`` (dict or model), else None."""
    kind = fmt.get("type") if isinstance(fmt, dict) else getattr(fmt, "type", None)
    if kind != PACKED:
        return None
    body = fmt.get(PACKED) if isinstance(fmt, dict) else (getattr(fmt, "model_extra", None) or {}).get(PACKED)
    if not isinstance(body, dict) or not body:
        raise InvalidGuideError(f"response_format type {PACKED!r} needs a non-empty {PACKED!r} object")
    nested = body.get("response_format")
    if isinstance(nested, dict) and nested.get("type") == PACKED:
        raise InvalidGuideError(f"response_format type {PACKED!r} cannot nest another")
    return body


def _refuse_non_string_choices(rf: Any) -> None:
    """``choice`` items must be strings: ``[1, {"a": 1}, None]`` was turned into strings (and the
    answer "None" returned with 200); refused instead, never silently rewritten."""
    kind = rf.get("type") if isinstance(rf, dict) else getattr(rf, "type", None)
    if kind == "choice":
        _refuse_non_strings("choice", rf.get("choice") if isinstance(rf, dict) else getattr(rf, "choice", None))


def _refuse_non_strings(label: str, choices: Any) -> None:
    if isinstance(choices, list):
        for i, item in enumerate(choices):
            if not isinstance(item, str):
                raise InvalidGuideError(
                    f"{label}[{i}] is a {type(item).__name__}, not a string: choices are the exact texts "
                    "the model may answer")


def spec_of(response_format: Any) -> GuideSpec | None:
    """The ``GuideSpec`` of an LMDeploy ``response_format`` (dict, JSON text, model) or None."""
    return parse_format(response_format)[0]


class _ValidatedKeys:
    """Bounded memo of spec keys already proven compilable (and of their errors).

    Errors are stored as ``detached_copy``: no traceback (whose frames held the parsed spec),
    message capped at 2,000 characters, so 1,024 entries are a few MB at most whatever the
    payloads were (it kept +2.7 MB per distinct refused ~1 MB spec before)."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, GuideError | None] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[bool, GuideError | None]:
        with self._lock:
            if key not in self._items:
                return False, None
            self._items.move_to_end(key)
            return True, self._items[key]

    def put(self, key: str, err: GuideError | None) -> None:
        err = None if err is None else detached_copy(err)
        with self._lock:
            self._items[key] = err
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)


_VALIDATED = _ValidatedKeys()
# (id of the checked response_format object, verdict) the api_server's off-loop check found for
# this request's task (front_check.py); LMDeploy's synchronous call inside ``preprocess`` (same
# object) raises it without parsing or compiling again.
FRONT_VERDICT: contextvars.ContextVar[tuple[int, GuideError | None] | None] = contextvars.ContextVar(
    "tokenrails_front_verdict", default=None)


def memo_get(key: str) -> tuple[bool, GuideError | None]:
    """``(seen, detached error or None)`` for a spec key."""
    return _VALIDATED.get(key)


def memo_put(key: str, err: GuideError | None) -> None:
    _VALIDATED.put(key, err)
_PROBE_VOCAB = None
_PROBE_LOCK = threading.Lock()


def _probe_vocab():
    """A tiny byte-level vocabulary: compiling against it checks a constraint without a tokenizer."""
    global _PROBE_VOCAB
    with _PROBE_LOCK:
        if _PROBE_VOCAB is None:
            from ...guided.vocabulary import Vocabulary

            _PROBE_VOCAB = Vocabulary([bytes([b]) for b in range(256)] + [b"</s>"], eos_ids=(256,),
                                      name="tokenrails-probe")
        return _PROBE_VOCAB


def validate_spec(spec: GuideSpec, limits: GuideLimits | None = None) -> None:
    """Raise the ``GuideError`` compiling ``spec`` would raise (bounded memo; cheap probe vocab)."""
    seen, err = _VALIDATED.get(spec.key)
    if seen:
        if err is not None:
            raise detached_copy(err)
        return
    from ...guided.registry import compile_guide

    try:
        compile_guide(spec, _probe_vocab(), "auto", limits=limits or DEFAULT_LIMITS)
    except GuideError as exc:
        _VALIDATED.put(spec.key, exc)
        raise
    except Exception as exc:  # a backend bug: refuse the request, never go unconstrained
        wrapped = InvalidGuideError(f"the {spec.kind} constraint cannot be compiled: {exc!r}")
        _VALIDATED.put(spec.key, wrapped)
        raise wrapped from exc
    _VALIDATED.put(spec.key, None)


class WideResponseFormat(BaseModel):
    """OpenAI ``response_format`` plus every kind tokenrails enforces.

    Unknown fields are kept (structural tags carry ``structures``/``triggers``/``format``);
    ``None`` fields are dropped on dump so the engine sees exactly what the client sent.
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    type: str
    json_schema: Any = None
    regex_schema: str | None = None
    choice: list[Any] | None = None
    grammar: str | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        js = data.get("json_schema")
        if isinstance(js, dict) and "json_schema" in js and "schema" not in js:
            js = dict(js)
            js["schema"] = js.pop("json_schema")  # OpenAI's key (LMDeploy's JsonSchema alias)
            data["json_schema"] = js
        return {k: v for k, v in data.items() if v is not None}
