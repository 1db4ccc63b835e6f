"""The api_server says when it served fewer tokens than ``max_tokens`` asked for.

When the prompt plus ``max_tokens`` exceeds the session length, LMDeploy's engine lowers
``max_new_tokens`` to what is left and logs a warning in the engine process: the client sees only
an early ``finish_reason: "length"``. Stock serves such requests and so does the upgrade, but the
answer says so: the header ``x-tokenrails-max-tokens`` and the body field ``max_tokens_cut``
(``{"requested", "served", "session_len"}``; a stream: on the chunk with the ``finish_reason``).
Requests without ``max_tokens`` are never marked (docs/lmdeploy.md, "max_tokens beyond the session").

``preprocess`` (where the prompt's length is first known) records the cut into a per-request
holder that an ASGI middleware opened (``MaxTokensNotice``, added where LMDeploy mounts its metrics
on the app); the middleware writes it into the response.
"""
from __future__ import annotations

import contextvars
import functools
import json
import logging
from typing import Any, Callable

log = logging.getLogger(__name__)
HEADER = "x-tokenrails-max-tokens"
FIELD = "max_tokens_cut"
PATHS = ("/v1/chat/completions", "/v1/completions")
NOTICE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("tokenrails_max_tokens_notice", default=None)


def cut_of(requested: int | None, input_len: int, session_len: int | None) -> dict | None:
    """What LMDeploy's engine will serve when ``requested`` tokens do not fit the session, else None."""
    if requested is None or session_len is None or input_len >= session_len:
        return None
    if requested + input_len <= session_len:
        return None
    return {"requested": int(requested), "served": int(session_len - input_len), "session_len": int(session_len)}


def patched_preprocess(original: Callable) -> Callable:
    """``AsyncEngine.preprocess`` that records a coming cut of ``max_new_tokens`` (never changes it)."""

    @functools.wraps(original)
    async def preprocess(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = await original(self, *args, **kwargs)
        if getattr(self, "backend", None) != "pytorch":  # the cut described is the PyTorch engine's
            return result
        gen_config = getattr(result, "gen_config", None)
        cut = cut_of(getattr(gen_config, "max_new_tokens", None), int(getattr(result, "input_token_len", 0) or 0),
                      getattr(self, "session_len", None))
        holder = NOTICE.get()
        if cut is not None and holder is not None:
            holder.update(cut)
        return result

    return preprocess


class MaxTokensNotice:
    """ASGI middleware: opens the holder per completion request, writes a recorded cut into the
    response (header and body for JSON, the finishing chunk for a stream)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope.get("type") != "http" or scope.get("path") not in PATHS:
            await self.app(scope, receive, send)
            return
        holder: dict = {}
        token = NOTICE.set(holder)
        start: dict | None = None
        body: list[bytes] = []

        async def send_noted(message: dict) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                if not holder:  # nothing recorded (yet): the response goes out as it is
                    await send(message)
                    return
                start = message  # JSON: held until the body is complete
                if _content_type(message).startswith("text/event-stream"):
                    start = None
                    await send(message)
                return
            if message["type"] == "http.response.body":
                if start is not None:
                    body.append(message.get("body", b""))
                    if message.get("more_body", False):
                        return
                    await _send_json(send, start, b"".join(body), holder)
                    return
                if holder and message.get("body"):
                    message = dict(message, body=_note_stream(message["body"], holder))
            await send(message)

        try:
            await self.app(scope, receive, send_noted)
        finally:
            NOTICE.reset(token)


def _content_type(start: dict) -> str:
    for name, value in start.get("headers", []):
        if name.lower() == b"content-type":
            return value.decode("latin-1").lower()
    return ""


async def _send_json(send: Callable, start: dict, raw: bytes, cut: dict) -> None:
    try:
        doc = json.loads(raw)
        if isinstance(doc, dict) and "choices" in doc:
            doc[FIELD] = dict(cut)
            raw = json.dumps(doc).encode()
    except ValueError:
        pass
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
    headers += [(b"content-length", str(len(raw)).encode()),
                (HEADER.encode(), f"requested={cut['requested']}, served={cut['served']}, "
                                  f"session-len={cut['session_len']}".encode())]
    await send(dict(start, headers=headers))
    await send({"type": "http.response.body", "body": raw, "more_body": False})


def _note_stream(chunk: bytes, cut: dict) -> bytes:
    """The field on each SSE event of ``chunk`` whose choice finishes."""
    out = []
    for event in chunk.split(b"\n\n"):
        if event.startswith(b"data: ") and event != b"data: [DONE]":
            try:
                doc = json.loads(event[len(b"data: "):])
            except ValueError:
                doc = None
            if isinstance(doc, dict) and any(c.get("finish_reason") for c in doc.get("choices") or []):
                doc[FIELD] = dict(cut)
                event = b"data: " + json.dumps(doc).encode()
        out.append(event)
    return b"\n\n".join(out)


def patched_mount_metrics(original: Callable) -> Callable:
    """``api_server.mount_metrics(app, ...)`` (called once per app, before it serves) that also adds
    :class:`MaxTokensNotice` to the app."""

    @functools.wraps(original)
    def mount_metrics(app: Any, *args: Any, **kwargs: Any) -> Any:
        app.add_middleware(MaxTokensNotice)
        return original(app, *args, **kwargs)

    return mount_metrics
