"""Bounded request bodies for LMDeploy's api_server, checked before anything parses them.

LMDeploy validates a request with pydantic, renders its chat template and tokenizes every stop
word on the event loop, with no size limit: one huge body stalls every other client.
:class:`BodyLimitMiddleware` is a pure ASGI middleware that reads the body chunk by chunk,
answers 413 as soon as it passes ``body_bytes`` (buffering no more), then walks the JSON's watched
lists element by element and answers 400 at the first element past a count or size limit (the
walk costs what the limit allows, never what the body holds), yielding to the event loop as it
goes. Defaults never refuse what a normal client sends (docs/safety.md gives each one's reason);
``0`` turns a limit off.

Also here: LMDeploy's tokenizer logs a warning for every stop word it cannot use as one token;
:func:`patched_convert_stop_words` collapses those to one line per request.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import os
import re
import sys
from dataclasses import dataclass, fields
from typing import Any, Awaitable, Callable

# Spelled out, not built from a prefix: the settings list (tokenrails._env.SETTINGS) is checked
# against the names the source reads.
ENV_NAMES = {
    "body_bytes": "TOKENRAILS_MAX_BODY_BYTES",
    "stop_words": "TOKENRAILS_MAX_STOP_WORDS",
    "stop_bytes": "TOKENRAILS_MAX_STOP_BYTES",
    "messages": "TOKENRAILS_MAX_MESSAGES",
    "message_bytes": "TOKENRAILS_MAX_MESSAGE_BYTES",
    "tools": "TOKENRAILS_MAX_TOOLS",
    "tool_bytes": "TOKENRAILS_MAX_TOOL_BYTES",
}

Scope = dict
Message = dict
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass(frozen=True)
class BodyLimits:
    """Each limit 0 = off. Environment: ``TOKENRAILS_MAX_<NAME upper-cased>`` (e.g. ``TOKENRAILS_MAX_BODY_BYTES``)."""

    body_bytes: int = 64 * 1024 * 1024
    stop_words: int = 256
    stop_bytes: int = 64 * 1024
    messages: int = 8192
    message_bytes: int = 4 * 1024 * 1024
    tools: int = 512
    tool_bytes: int = 2 * 1024 * 1024

    @classmethod
    def from_env(cls, environ: dict | None = None) -> "BodyLimits":
        env = os.environ if environ is None else environ
        values: dict[str, int] = {}
        for f in fields(cls):
            name = ENV_NAMES[f.name]
            raw = env.get(name)
            if raw is None or raw.strip() == "":
                continue
            try:
                values[f.name] = max(0, int(raw))
            except ValueError as exc:
                raise ValueError(f"{name}={raw!r} is not an integer") from exc
        return cls(**values)


class BodyRefused(Exception):
    """A request over one of the limits: HTTP ``status``, the client's ``param``."""

    def __init__(self, status: int, param: str | None, message: str):
        super().__init__(message)
        self.status = status
        self.param = param


def _text_bytes(content: Any) -> int:
    """UTF-8 bytes of a message's text (a string, or the ``text`` of content parts); image and
    audio parts are not text the tokenizer reads on the loop, so they do not count."""
    if isinstance(content, str):
        return len(content.encode("utf-8", "surrogatepass"))
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                total += len(part["text"].encode("utf-8", "surrogatepass"))
            elif isinstance(part, str):
                total += len(part.encode("utf-8", "surrogatepass"))
        return total
    return 0


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_YIELD_CHARS = 1 << 18  # about 10 ms of parsing between two turns of the event loop


def _ws(text: str, idx: int) -> int:
    return _WS.match(text, idx).end()


class _Tally:
    """The running count and text size of one watched list (``stop``, ``messages``, ``tools``)."""

    def __init__(self, key: str, limits: BodyLimits, param: str | None = None):
        self.key = key
        self.param = param or key
        self.count = 0
        self.size = 0
        self.max_count = {"stop": limits.stop_words, "messages": limits.messages, "tools": limits.tools}[key]
        self.max_size = {"stop": limits.stop_bytes, "messages": limits.message_bytes,
                         "tools": limits.tool_bytes}[key]

    def add(self, item: Any, raw: str) -> None:
        self.count += 1
        if self.max_count and self.count > self.max_count:
            raise BodyRefused(400, self.key, f"'{self.key}' has more than {self.max_count} entries; this server "
                              f"accepts at most {self.max_count} (TOKENRAILS_MAX_{_ENV[self.key][0]})")
        if self.key == "stop":
            self.size += _text_bytes(item)
        elif self.key == "messages":
            self.size += _text_bytes(item.get("content")) if isinstance(item, dict) else 0
        else:
            self.size += len(raw.encode("utf-8", "surrogatepass"))
        self.grow(0)

    def grow(self, size: int) -> None:
        self.size += size
        if self.max_size and self.size > self.max_size:
            what = "bytes of JSON" if self.key == "tools" else "bytes of text"
            raise BodyRefused(400, self.param, f"'{self.param}' holds more than {self.max_size} {what}; this server "
                              f"accepts at most {self.max_size} (TOKENRAILS_MAX_{_ENV[self.key][1]})")


_ENV = {"stop": ("STOP_WORDS", "STOP_BYTES"), "messages": ("MESSAGES", "MESSAGE_BYTES"),
        "tools": ("TOOLS", "TOOL_BYTES")}


async def check_body(text: str, limits: BodyLimits) -> None:
    """Raise :class:`BodyRefused` when a JSON request body is over a count or text limit.

    Walks the top-level object with ``raw_decode`` and the watched lists element by element, so it
    stops at the first element past a limit (a 100,000-entry list costs what 257 entries cost) and
    gives the event loop a turn every ~256 K characters. A body that is not a JSON object, or is
    malformed, passes: the app answers it as it always does.
    """
    try:
        await _walk(text, limits)
    except (ValueError, IndexError, AttributeError):
        return


async def _walk(text: str, limits: BodyLimits) -> None:
    idx = _ws(text, 0)
    if text[idx:idx + 1] != "{":
        return
    idx = _ws(text, idx + 1)
    if text[idx:idx + 1] == "}":
        return
    mark = 0
    while True:
        key, idx = _DECODER.raw_decode(text, idx)
        idx = _ws(text, idx)
        if not isinstance(key, str) or text[idx] != ":":
            return
        idx = _ws(text, idx + 1)
        if key in _ENV and text[idx] == "[":
            tally = _Tally(key, limits)
            idx = _ws(text, idx + 1)
            if text[idx] == "]":
                idx += 1
            else:
                while True:
                    item, end = _DECODER.raw_decode(text, idx)
                    tally.add(item, text[idx:end] if key == "tools" else "")
                    idx = _ws(text, end)
                    if end - mark > _YIELD_CHARS:
                        mark = end
                        await asyncio.sleep(0)
                    if text[idx] == ",":
                        idx = _ws(text, idx + 1)
                        continue
                    if text[idx] != "]":
                        return
                    idx += 1
                    break
        else:
            value, idx = _DECODER.raw_decode(text, idx)
            if key == "stop":  # one string
                _Tally("stop", limits).grow(_text_bytes(value))
            elif key == "prompt":  # /v1/completions: a string or a list of them
                _Tally("messages", limits, param="prompt").grow(_text_bytes(value))
            if idx - mark > _YIELD_CHARS:
                mark = idx
                await asyncio.sleep(0)
        idx = _ws(text, idx)
        if text[idx] == ",":
            idx = _ws(text, idx + 1)
            continue
        return


def error_body(status: int, param: str | None, message: str) -> bytes:
    """LMDeploy's (OpenAI-compatible) error object, as every other refusal of the server."""
    return json.dumps({"object": "error", "message": message, "type": "invalid_request_error",
                       "code": status, "param": param}).encode()


class BodyLimitMiddleware:
    """ASGI middleware: bodies of POST/PUT/PATCH requests within :class:`BodyLimits`, or a typed
    413/400 before the app sees them. One log line per refusal."""

    def __init__(self, app: Callable, limits: BodyLimits | None = None):
        self.app = app
        self.limits = limits if limits is not None else BodyLimits.from_env()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read(scope, receive)
            if body is None:  # the client went away while sending
                return
            if body:
                try:
                    text = body.decode("utf-8")
                except UnicodeDecodeError:  # not ours to judge: the app answers malformed bodies itself
                    text = ""
                await check_body(text, self.limits)
        except BodyRefused as refused:
            logging.getLogger("tokenrails").warning("refused %s %s: %s", scope.get("method"), scope.get("path"),
                                                    refused)
            await _respond(send, refused.status, error_body(refused.status, refused.param, str(refused)))
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes | None:
        limit = self.limits.body_bytes
        if limit:
            for name, value in scope.get("headers") or ():
                if name == b"content-length":
                    try:
                        declared = int(value)
                    except ValueError:
                        break
                    if declared > limit:
                        raise BodyRefused(413, None, _too_large(declared, limit))
                    break
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if limit and size > limit:
                raise BodyRefused(413, None, _too_large(size, limit, at_least=True))
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _too_large(size: int, limit: int, *, at_least: bool = False) -> str:
    return (f"request body is {'over ' if at_least else ''}{size} bytes; this server accepts at most {limit} "
            "(TOKENRAILS_MAX_BODY_BYTES)")


def _replay(body: bytes, receive: Receive) -> Receive:
    """The app's ``receive``: the whole body once, then the client's own events (disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _respond(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


# ---- one log line per request for the stop words LMDeploy cannot use ------------------------------
_STOP_WORD_NOTES = ("can not be used as stop words", "possible indexes may decoding")
_COLLAPSING: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("tokenrails_stop_logs", default=None)


class _StopWordLogFilter(logging.Filter):
    """Lets through the first per-stop-word warning of a request and counts the rest."""

    def filter(self, record: logging.LogRecord) -> bool:
        seen = _COLLAPSING.get()
        if seen is None:
            return True
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is not ours to drop
            return True
        if not any(note in text for note in _STOP_WORD_NOTES):
            return True
        seen[0] += 1
        return seen[0] == 1


_FILTER = _StopWordLogFilter()


def patched_convert_stop_words(original: Callable) -> Callable:
    """``GenerationConfig.convert_stop_bad_words_to_ids`` that logs at most two lines per call."""

    @functools.wraps(original)
    def convert(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _COLLAPSING.set([0])
        try:
            return original(self, *args, **kwargs)
        finally:
            seen = _COLLAPSING.get() or [0]
            _COLLAPSING.reset(token)
            if seen[0] > 1:
                logging.getLogger("lmdeploy").warning("%d more stop/bad words of this request cannot be used as "
                                                      "stop words (warnings collapsed)", seen[0] - 1)

    return convert


def patched_mount_metrics(original: Callable) -> Callable:
    """``api_server.mount_metrics(app, ...)`` (once per app, before it serves) that also adds the
    body limits and the client identity to the app."""

    @functools.wraps(original)
    def mount_metrics(app: Any, *args: Any, **kwargs: Any) -> Any:
        from .client_identity import ClientIdentityMiddleware

        app.add_middleware(BodyLimitMiddleware, limits=BodyLimits.from_env())
        app.add_middleware(ClientIdentityMiddleware)  # the fair share of compiles (front_check.py)
        return original(app, *args, **kwargs)

    return mount_metrics


def install(p: Any) -> None:
    """Stop-word warnings collapsed per request (the limits themselves: ``patch_server``)."""
    messages = sys.modules.get("lmdeploy.messages")
    if messages is not None and hasattr(messages.GenerationConfig, "convert_stop_bad_words_to_ids"):
        gc = messages.GenerationConfig
        p.set(gc, "convert_stop_bad_words_to_ids", patched_convert_stop_words(gc.convert_stop_bad_words_to_ids))
        lmdeploy_logger = logging.getLogger("lmdeploy")
        if _FILTER not in lmdeploy_logger.filters:
            lmdeploy_logger.addFilter(_FILTER)


def patch_server(p: Any, server: Any) -> None:
    """The limits on the api_server's app (``server`` is its module; called when it is loaded)."""
    p.set(server, "mount_metrics", patched_mount_metrics(server.mount_metrics))
