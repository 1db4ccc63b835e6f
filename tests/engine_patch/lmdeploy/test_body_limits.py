"""The body-limit middleware as ASGI (no server): it stops reading at the byte limit, refuses
over-long lists at the first element past the limit, passes everything else through unchanged,
and collapses LMDeploy's per-stop-word warnings to one line per request."""
from __future__ import annotations

import asyncio
import json
import logging

import pytest

from tokenrails.engine_patch.lmdeploy.server import body_limits as bl


class _App:
    def __init__(self):
        self.bodies: list[bytes] = []

    async def __call__(self, scope, receive, send):
        message = await receive()
        self.bodies.append(message["body"])
        assert message["more_body"] is False
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _run(mw, chunks: list[bytes], headers=()) -> tuple[int, dict | bytes, int]:
    """Status, body and how many chunks the middleware read."""
    sent: list[dict] = []
    read = 0

    async def receive():
        nonlocal read
        read += 1
        if read <= len(chunks):
            return {"type": "http.request", "body": chunks[read - 1], "more_body": read < len(chunks)}
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": list(headers)}
    asyncio.run(mw(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    status = sent[0]["status"]
    return status, (json.loads(body) if status != 200 else body), read


def test_stops_reading_at_the_byte_limit_without_content_length():
    app = _App()
    mw = bl.BodyLimitMiddleware(app, bl.BodyLimits(body_bytes=1000))
    status, body, read = _run(mw, [b"x" * 400] * 100)
    assert status == 413 and read == 3 and not app.bodies
    assert body["code"] == 413 and "TOKENRAILS_MAX_BODY_BYTES" in body["message"]


def test_declared_length_over_the_limit_reads_nothing():
    app = _App()
    mw = bl.BodyLimitMiddleware(app, bl.BodyLimits(body_bytes=1000))
    status, _, read = _run(mw, [b"x" * 10], headers=[(b"content-length", b"5000")])
    assert status == 413 and read == 0


@pytest.mark.parametrize("payload, param", [
    ({"stop": ["a"] * 5}, "stop"),
    ({"stop": "x" * 50}, "stop"),
    ({"messages": [{"role": "user", "content": "hi"}] * 5}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "y" * 60}]}]}, "messages"),
    ({"prompt": ["z" * 30, "z" * 30]}, "prompt"),
    ({"tools": [{"type": "function"}] * 5}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f" * 100}}]}, "tools"),
])
def test_counts_and_sizes_refused_with_the_param(payload, param):
    limits = bl.BodyLimits(stop_words=4, stop_bytes=40, messages=4, message_bytes=50, tools=4, tool_bytes=80)
    app = _App()
    status, body, _ = _run(bl.BodyLimitMiddleware(app, limits), [json.dumps(payload).encode()])
    assert status == 400 and body["param"] == param and body["type"] == "invalid_request_error", body
    assert not app.bodies


@pytest.mark.parametrize("raw", [
    json.dumps({"model": "m", "stop": ["a", "b"], "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:" + "A" * 500}}, {"type": "text", "text": "hi"}]}],
        "tools": [{"type": "function"}]}, indent=2).encode(),
    b'{"stop": [1, 2,',  # malformed: the app's own 400
    b"not json at all",
    "{\"messages\": [{\"content\": \"h\u00e9\"}]}".encode(),
])
def test_within_limits_passes_the_body_unchanged(raw):
    app = _App()
    limits = bl.BodyLimits(stop_words=4, stop_bytes=40, messages=4, message_bytes=50, tools=4, tool_bytes=80)
    status, body, _ = _run(bl.BodyLimitMiddleware(app, limits), [raw[:7], raw[7:]])
    assert status == 200 and app.bodies == [raw]


def test_limits_from_the_environment():
    limits = bl.BodyLimits.from_env({"TOKENRAILS_MAX_STOP_WORDS": "8", "TOKENRAILS_MAX_BODY_BYTES": "0"})
    assert limits.stop_words == 8 and limits.body_bytes == 0 and limits.tools == bl.BodyLimits().tools
    with pytest.raises(ValueError, match="TOKENRAILS_MAX_TOOLS"):
        bl.BodyLimits.from_env({"TOKENRAILS_MAX_TOOLS": "many"})


def test_stop_word_warnings_collapse_to_one_line_per_call(caplog):
    logger = logging.getLogger("lmdeploy")
    logger.addFilter(bl._FILTER)
    try:
        def convert(self):
            for i in range(50):
                logger.warning("The token w%d, its length of indexes [1, 2] is over than 1. Currently, "
                               "it can not be used as stop words", i)

        with caplog.at_level(logging.WARNING, logger="lmdeploy"):
            bl.patched_convert_stop_words(convert)(object())
            logger.warning("an unrelated warning")
    finally:
        logger.removeFilter(bl._FILTER)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "49 more" in lines[1] and lines[2] == "an unrelated warning"
