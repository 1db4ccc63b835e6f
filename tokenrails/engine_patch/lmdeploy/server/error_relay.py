"""A guided row's typed error, carried from the engine to the HTTP response.

The engine ends a row whose constraint failed with ``Response.err_msg = "GuideLimitError: ..."``
(agent.py), but LMDeploy drops the message on the way out and turns the status alone into a
generic ``RequestError``. Here, per request (a context variable of the task iterating the stream,
so concurrent requests never see each other's message):

* engine side: the engine loop's ``response_reqs`` keeps the message, ``RequestSender.async_recv``
  notes it, and ``EngineInstance.async_stream_infer`` puts it on the failed ``EngineOutput`` as
  ``err_msg`` (a plain attribute: it survives the pickle to the api_server process);
* server side: the stream of outputs notes it, and ``AsyncEngine._request_error_from_status``
  builds its ``RequestError`` with that message and the status' code (``NOT_SUPPORTED`` → 400,
  internal → 500), for streaming and non-streaming responses alike.
"""
from __future__ import annotations

import contextvars
import functools
import importlib
from typing import Any, Callable

_KEPT = 2000  # characters of a relayed message
ENGINE_ERROR: contextvars.ContextVar[str | None] = contextvars.ContextVar("tokenrails_engine_error", default=None)


def _is_error_output(output: Any) -> bool:
    from lmdeploy.messages import ResponseType

    return getattr(output, "status", None) not in (ResponseType.SUCCESS, ResponseType.FINISH, ResponseType.CANCEL)


def patched_async_recv(original: Callable) -> Callable:
    @functools.wraps(original)
    async def async_recv(self: Any, *args: Any, **kwargs: Any):
        resp = await original(self, *args, **kwargs)
        msg = getattr(resp, "err_msg", None)
        if msg:
            ENGINE_ERROR.set(str(msg)[:_KEPT])
        return resp

    return async_recv


def patched_stream(original: Callable) -> Callable:
    """An ``async_stream_infer`` whose failed output carries the request's message (engine side)
    and whose message is noted for ``_request_error_from_status`` (server side)."""

    @functools.wraps(original)
    async def async_stream_infer(self: Any, *args: Any, **kwargs: Any):
        ENGINE_ERROR.set(None)
        async for output in original(self, *args, **kwargs):
            msg = getattr(output, "err_msg", None)
            if msg is None and _is_error_output(output):
                msg = ENGINE_ERROR.get()
                if msg:
                    try:
                        output.err_msg = msg
                    except AttributeError:  # a slotted output: the message stays server-side only
                        pass
            if msg:
                ENGINE_ERROR.set(str(msg)[:_KEPT])
            yield output

    return async_stream_infer


def patched_error_from_status(original: Callable) -> Callable:
    @functools.wraps(original)
    def _request_error_from_status(status: Any):
        error = original(status)
        msg = ENGINE_ERROR.get()
        if not msg:
            return error
        from lmdeploy.serve.core.exceptions import RequestError

        return RequestError(error.code, msg)

    return staticmethod(_request_error_from_status)


def patched_response_reqs(original: Callable) -> Callable:
    """The engine loop's ``response_reqs`` resets ``err_msg`` to '' when it sends a response; the
    message agent.py put on a failed row's response is kept."""

    @functools.wraps(original)
    def response_reqs(req_manager: Any, resp: Any, resp_type: Any, data: Any = None, err_msg: str = ""):
        from lmdeploy.messages import ResponseType

        if not err_msg and getattr(resp, "err_msg", "") and resp_type not in (ResponseType.SUCCESS, ResponseType.FINISH):
            err_msg = resp.err_msg
        return original(req_manager, resp, resp_type, data, err_msg)

    return response_reqs


def patch(p: Any) -> None:
    """Apply every hook that exists in this LMDeploy (the server side needs only the last two)."""
    targets = [
        ("lmdeploy.pytorch.engine.request", "RequestSender", "async_recv", patched_async_recv),
        ("lmdeploy.pytorch.engine.engine_instance", "EngineInstance", "async_stream_infer", patched_stream),
        ("lmdeploy.pytorch.engine.mp_engine.base", "MPEngineInstance", "async_stream_infer", patched_stream),
    ]
    try:
        loop_module = importlib.import_module("lmdeploy.pytorch.engine.engine_loop")
    except ImportError:
        loop_module = None
    if loop_module is not None and hasattr(loop_module, "response_reqs"):
        p.set(loop_module, "response_reqs", patched_response_reqs(loop_module.response_reqs))
    for module, cls_name, attr, make in targets:
        try:
            owner = getattr(importlib.import_module(module), cls_name)
        except (ImportError, AttributeError):
            continue
        if attr in owner.__dict__:
            p.set(owner, attr, make(owner.__dict__[attr]))
    ae = importlib.import_module("lmdeploy.serve.core.async_engine").AsyncEngine
    raw = ae.__dict__.get("_request_error_from_status")
    if isinstance(raw, staticmethod):
        p.set(ae, "_request_error_from_status", patched_error_from_status(raw.__func__))
