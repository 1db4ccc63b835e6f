"""LMDeploy request parsing routed through ``tokenrails.requests.spec_from_request``.

A ``response_format`` may carry the upgrade's own keys, each removed before the format is parsed:
``tokenrails_reasoning`` (the request's reasoning setting, engine_patch/reasoning_settings.py),
``tokenrails_budget`` (``"close"``: a budget spec closed within ``max_new_tokens``, DFA
constraints only, guided/budget.py; ``"off"`` opts out of the engine default), and, set by the
api_server, ``tokenrails_client`` (whose compile it is) and ``tokenrails_deadline`` (the
request's compile deadline, put on the request's spec object, never in the spec).
``validate_spec`` is the verdict of compiling a spec in the ``probe_manager`` (the engine's
backend and limits); LMDeploy's early check (front_check.py) raises it as HTTP 400.
``WideResponseFormat`` is the server's ``response_format`` model widened to every kind.
"""
from __future__ import annotations

import contextvars
import json
import threading
import time
from collections import OrderedDict
from typing import Any

from pydantic import BaseModel, ConfigDict, model_serializer

from ....guided.budget import budget_spec
from ....guided.clients import LOCAL
from ....guided.compile_timeouts import with_deadline
from ....guided.errors import GuideError, InvalidGuideError
from ....guided.limits import DEFAULT_LIMITS, GuideLimits
from ....guided.spec import GuideSpec
from ....requests import spec_from_request
from ....requests.response_format import BUDGET_KEY
from ...reasoning_settings import REQUEST_KEY, ReasoningSetting, parse_setting, split_request_setting
from ..boot.settings import BUDGET_VALUES, budget_default

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
            {REQUEST_KEY, BUDGET_KEY, CLIENT_KEY, DEADLINE_KEY}.isdisjoint(getattr(rf, "model_extra", None) or {})):
        rf = rf.model_dump()
    deadline = None
    if isinstance(rf, dict) and (CLIENT_KEY in rf or DEADLINE_KEY in rf):  # who asked and until when:
        deadline = _monotonic(rf.get(DEADLINE_KEY))                         # not part of the constraint
        rf = {k: v for k, v in rf.items() if k not in (CLIENT_KEY, DEADLINE_KEY)}
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
    if spec is not None:
        with_deadline(spec, deadline)
    return spec, setting


CLIENT_KEY = "tokenrails_client"  # the api_server's client identity, carried to the engine


def client_of(response_format: Any) -> str:
    """The client a request's compile is charged to (``CLIENT_KEY``, set by the api_server from
    the request's API key or address, replacing any value the client sent), else ``LOCAL``."""
    fields = response_format if isinstance(response_format, dict) else getattr(response_format, "model_extra", None)
    value = fields.get(CLIENT_KEY) if isinstance(fields, dict) else None
    return value[:96] if isinstance(value, str) and value else LOCAL


def with_client(response_format: Any, client: str) -> None:
    """Record ``client`` in the request's own format dict (in place: the front check's verdict is
    keyed by the object), so the engine's compile pool knows whose compile it runs."""
    if isinstance(response_format, dict):
        response_format[CLIENT_KEY] = client
    elif isinstance(getattr(response_format, "model_extra", None), dict):  # the server's format model
        setattr(response_format, CLIENT_KEY, client)


DEADLINE_KEY = "tokenrails_deadline"  # when the request's compile wait ends (wall clock), carried to the engine


def with_request_deadline(response_format: Any, deadline: float) -> None:
    """Record the request's deadline (``time.time()``) in its own format (in place, as
    ``with_client``): the engine's managers fail its row then, however long the request took to
    reach them (a wall clock, so it means the same in the engine's and its ranks' processes)."""
    if isinstance(response_format, dict):
        response_format[DEADLINE_KEY] = deadline
    elif isinstance(getattr(response_format, "model_extra", None), dict):
        setattr(response_format, DEADLINE_KEY, deadline)


def _monotonic(value: Any) -> float | None:
    """A carried wall-clock deadline on this process' ``time.monotonic()`` clock, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return time.monotonic() + (float(value) - time.time())


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


# (id of the checked response_format object, verdict) the api_server's off-loop check found for
# this request's task (front_check.py); LMDeploy's synchronous call inside ``preprocess`` (same
# object) raises it without parsing or compiling again.
FRONT_VERDICT: contextvars.ContextVar[tuple[int, GuideError | None] | None] = contextvars.ContextVar(
    "tokenrails_front_verdict", default=None)
_PROBE_VOCAB = None
_PROBE_LOCK = threading.Lock()
_PROBES: OrderedDict[tuple[str, GuideLimits, Any], Any] = OrderedDict()
PROBE_CACHE_BYTES = 64 << 20  # compiled guides kept per manager (a probe guide is small)
PROBE_MANAGERS = 4  # (backend, limits, vocabulary) kept: one or two in a server, a few in tests


class _Same:
    """A key equal only to the same object: a tokenizer need not be hashable."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj


def _probe_vocab():
    """A tiny byte-level vocabulary: compiling against it checks a constraint without a tokenizer."""
    global _PROBE_VOCAB
    with _PROBE_LOCK:
        if _PROBE_VOCAB is None:
            from ....guided.vocabulary import Vocabulary

            _PROBE_VOCAB = Vocabulary([bytes([b]) for b in range(256)] + [b"</s>"], eos_ids=(256,),
                                      name="tokenrails-probe")
        return _PROBE_VOCAB


def _slot(limits: GuideLimits | None, backend: str | None, tokenizer: Any) -> tuple[str, GuideLimits, Any]:
    from ..boot import settings

    return (backend or settings.backend(), limits or DEFAULT_LIMITS, None if tokenizer is None else _Same(tokenizer))


def built_probe_manager(limits: GuideLimits | None = None, backend: str | None = None, tokenizer: Any = None) -> Any:
    """``probe_manager``'s manager if it exists already, else None (a look, never a build: the
    event loop must not build one, which imports and allocates for a good part of a second)."""
    slot = _slot(limits, backend, tokenizer)
    with _PROBE_LOCK:
        return _PROBES.get(slot)


def probe_manager(limits: GuideLimits | None = None, backend: str | None = None, tokenizer: Any = None) -> Any:
    """The core manager that checks specs for the api_server: the probe vocabulary (or, given
    ``tokenizer``, the model's own, where token counts are the engine's), the engine's backend
    setting and limits (a spec the engine would refuse is refused here, with the engine's reason),
    its compile cache, in-flight table and killable workers. One per (backend, limits,
    vocabulary): a verdict under one setting is never reused under another."""
    from ....guided.manager import GuidedDecodingManager
    from ..boot import settings
    from ..tokenizer_vocab import build_vocabulary

    slot = _slot(limits, backend, tokenizer)
    with _PROBE_LOCK:
        mgr = _PROBES.get(slot)
        if mgr is not None:
            _PROBES.move_to_end(slot)
            return mgr
    backend, limits = slot[0], slot[1]
    vocab = _probe_vocab() if tokenizer is None else build_vocabulary(tokenizer, None)
    mgr = GuidedDecodingManager(
        vocab, backend=backend, limits=limits.replace(cache_max_bytes=min(limits.cache_max_bytes, PROBE_CACHE_BYTES)),
        compile_workers=settings.FRONT_WORKERS, per_client=1, fill_threads=1,
        compile_processes=settings.compile_processes())
    with _PROBE_LOCK:
        kept = _PROBES.setdefault(slot, mgr)
        while len(_PROBES) > PROBE_MANAGERS:
            _PROBES.popitem(last=False)[1].close()
    if kept is not mgr:
        mgr.close()
    return kept


def validate_spec(spec: GuideSpec, limits: GuideLimits | None = None, backend: str | None = None) -> None:
    """Raise the ``GuideError`` compiling ``spec`` with the engine's backend would raise (probe
    vocabulary; the probe manager's cache remembers verdicts)."""
    probe_manager(limits, backend).get_compiled(spec)


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
