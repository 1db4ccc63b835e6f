"""Speculative-decoding counters of a request in the api_server's ``usage`` (``usage.speculative``),
and the budget rule's ``budget_closed`` (budget_report.py) on the same path.

vLLM and SGLang report speculative acceptance as engine metrics (vLLM: ``spec_decode_num_draft_tokens``
/ ``spec_decode_num_accepted_tokens``; SGLang: ``spec_verify_ct`` in a response's ``meta_info``).
Here a request's own counters (``draft_metrics.py``) ride along with its usage, streaming (the
final usage chunk, ``stream_options.include_usage``) and non-streaming::

    "usage": {"prompt_tokens": 31, "completion_tokens": 14, "total_tokens": 45, ...,
              "speculative": {"draft_tokens": 27, "accepted_draft_tokens": 5,
                              "forced_draft_tokens": 9, "verify_steps": 9}}

Absent when the request took no speculative step (the engine has no speculative decoding, or the
request ended at prefill). Mean accepted length = (accepted_draft_tokens + verify_steps) /
verify_steps.

Path, like ``error_relay.py``'s: engine side, ``EngineInstance.async_stream_infer`` puts the
request's counters on each ``EngineOutput`` as ``tokenrails_drafts`` (a plain attribute: it survives
the pickle to the api_server process); server side, the stream of outputs (the multi-process
``MPEngineInstance`` or the in-process ``EngineInstance``) notes them in a context variable of the
task iterating the stream, and ``UsageInfo.build`` adds them. ``UsageInfo`` is opened to one extra
field (``extra="allow"``; the response models that embed it are rebuilt). ``n > 1`` requests
(LMDeploy's fan-out runs each choice in a task of its own) get no field.
"""
from __future__ import annotations

import contextvars
import functools
import importlib
from typing import Any, Callable

from ..server import budget_report
from . import draft_metrics

FIELD = "speculative"
ATTR = "tokenrails_drafts"
DRAFTS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("tokenrails_drafts", default=None)

__all__ = ["FIELD", "install"]


def _session_id(args: tuple, kwargs: dict) -> Any:
    return kwargs["session_id"] if "session_id" in kwargs else (args[0] if args else None)


def engine_stream(original: Callable) -> Callable:
    """Engine side (and in-process server side): every output carries the request's counters."""

    @functools.wraps(original)
    async def async_stream_infer(self: Any, *args: Any, **kwargs: Any):
        DRAFTS.set(None)
        budget_report.CLOSED.set(None)
        sid = _session_id(args, kwargs)
        if sid is not None:
            budget_report.forget(sid)
        async for output in original(self, *args, **kwargs):
            closed = budget_report.session_closed(sid) if sid is not None else None
            if closed is not None:
                try:
                    setattr(output, budget_report.ATTR, closed)
                except AttributeError:
                    pass
                budget_report.CLOSED.set(closed)
            stats = draft_metrics.request_stats(sid) if sid is not None else {}
            if stats:
                try:
                    setattr(output, ATTR, stats)
                except AttributeError:  # a slotted output: counters stay engine-side
                    pass
                DRAFTS.set(stats)
            yield output

    return async_stream_infer


def server_stream(original: Callable) -> Callable:
    """Server side of a multi-process engine: note the counters the engine's outputs carry."""

    @functools.wraps(original)
    async def async_stream_infer(self: Any, *args: Any, **kwargs: Any):
        DRAFTS.set(None)
        budget_report.CLOSED.set(None)
        async for output in original(self, *args, **kwargs):
            closed = getattr(output, budget_report.ATTR, None)
            if closed is not None:
                budget_report.CLOSED.set(bool(closed))
            stats = getattr(output, ATTR, None)
            if stats:
                DRAFTS.set(dict(stats))
            yield output

    return async_stream_infer


def patched_build(original: Callable) -> Callable:
    @functools.wraps(original)
    def build(cls: Any, *args: Any, **kwargs: Any):
        usage = original(cls, *args, **kwargs)
        extra: dict[str, Any] = {}
        stats = DRAFTS.get()
        if stats:
            extra[FIELD] = dict(stats)
        closed = budget_report.CLOSED.get()
        if closed is not None:
            extra[budget_report.FIELD] = closed
        if extra:
            try:
                usage = cls.model_validate({**usage.model_dump(), **extra})
            except Exception:  # never fail a response over its counters
                pass
        return usage

    return classmethod(build)


def _open_usage(p: Any, proto: Any) -> None:
    """``UsageInfo`` accepts the extra field; every protocol model that embeds it is rebuilt."""
    usage = proto.UsageInfo
    p.set(usage, "model_config", {**usage.model_config, "extra": "allow"})
    usage.model_rebuild(force=True)
    from pydantic import BaseModel

    for obj in list(vars(proto).values()):
        if isinstance(obj, type) and issubclass(obj, BaseModel) and obj is not usage:
            if "usage" in getattr(obj, "model_fields", {}):
                obj.model_rebuild(force=True)


def patched_to_response(original: Callable) -> Callable:
    """``GenOut.to_response`` (the pipeline's ``Response``, built in the task that iterates the
    stream) with ``budget_closed`` for a budget request."""

    @functools.wraps(original)
    def to_response(self: Any, *args: Any, **kwargs: Any):
        resp = original(self, *args, **kwargs)
        closed = budget_report.CLOSED.get()
        if closed is not None:
            resp.budget_closed = closed
        return resp

    return to_response


def patched_extend(original: Callable) -> Callable:
    """``Response.extend`` keeping the later response's ``budget_closed`` (the pipeline merges a
    request's responses into its first one)."""

    @functools.wraps(original)
    def extend(self: Any, other: Any):
        out = original(self, other)
        closed = getattr(other, "budget_closed", None)
        if closed is not None:
            out.budget_closed = closed
        return out

    return extend


def _patch_pipeline_response(p: Any) -> None:
    try:
        ae = importlib.import_module("lmdeploy.serve.core.async_engine")
        messages = importlib.import_module("lmdeploy.messages")
    except ImportError:
        return
    if "to_response" in getattr(ae, "GenOut", object).__dict__:
        p.set(ae.GenOut, "to_response", patched_to_response(ae.GenOut.__dict__["to_response"]))
    if "extend" in messages.Response.__dict__:
        p.set(messages.Response, "extend", patched_extend(messages.Response.__dict__["extend"]))


def install(p: Any) -> None:
    targets = [
        ("lmdeploy.pytorch.engine.engine_instance", "EngineInstance", engine_stream),
        ("lmdeploy.pytorch.engine.mp_engine.base", "MPEngineInstance", server_stream),
    ]
    for module, cls_name, make in targets:
        try:
            owner = getattr(importlib.import_module(module), cls_name)
        except (ImportError, AttributeError):
            continue
        if "async_stream_infer" in owner.__dict__:
            p.set(owner, "async_stream_infer", make(owner.__dict__["async_stream_infer"]))
    _patch_pipeline_response(p)
    try:
        proto = importlib.import_module("lmdeploy.serve.openai.protocol")
    except ImportError:  # no server extras: nothing to report into
        return
    raw = proto.UsageInfo.__dict__.get("build")
    if isinstance(raw, classmethod):
        _open_usage(p, proto)
        p.set(proto.UsageInfo, "build", patched_build(raw.__func__))
