"""Issue 27.5: an engine-side guided error reaches the HTTP response with its typed message.

Before: the engine's ``Response.err_msg`` ("GuideLimitError: ...") was dropped by
``EngineInstance.async_stream_infer`` and the server answered a generic 400 "The requested feature
is not supported." (500 "An internal server error occurred." for a rejected token). Here the real
(patched) LMDeploy methods run over stand-ins for the request queue and the RPC stream, with a
pickle between them as between the engine process and the api_server.
"""
from __future__ import annotations

import asyncio
import pickle
from types import SimpleNamespace

import pytest

MESSAGE = "GuideLimitError: limit max_enum_values=10000 exceeded at #: got 20000"


async def _engine_side_output(resp_type, err_msg):
    """What the engine process's ``EngineInstance.async_stream_infer`` yields for a failed row."""
    from lmdeploy.messages import GenerationConfig, ResponseType
    from lmdeploy.pytorch.engine.engine_instance import EngineInstance
    from lmdeploy.pytorch.engine.request import RequestSender, Response

    def response(kind, msg="", done=False):
        event = asyncio.Event()
        event.set()
        return Response(type=kind, sender_id=0, event=event, err_msg=msg, is_done=done)

    sender = RequestSender.__new__(RequestSender)

    async def prepare_send():
        return None

    sender.manager = SimpleNamespace(prepare_send=prepare_send)
    sender.is_loop_alive = lambda: True
    replies = iter([response(ResponseType.SUCCESS, done=True), response(resp_type)])
    sender.send_async = lambda kind, data: next(replies)
    failed = response(resp_type, err_msg, done=True)  # what the engine loop answered
    instance = SimpleNamespace(max_input_len=100, req_sender=sender)
    outputs = []
    RequestSender_async_recv = RequestSender.async_recv
    try:
        # the generator's receive goes through the (patched) class method, with ``failed``
        sender.async_recv = lambda resp, wait_main=False: RequestSender_async_recv(sender, failed, wait_main)
        async for out in EngineInstance.async_stream_infer(instance, 1, [1, 2, 3], gen_config=GenerationConfig()):
            outputs.append(out)
    finally:
        del sender.async_recv
    return outputs[-1]


async def _server_side_error(output):
    """What the api_server's ``AsyncEngine`` raises for that output, after the RPC pickle."""
    from lmdeploy.pytorch.engine.mp_engine.base import MPEngineInstance
    from lmdeploy.serve.core.async_engine import AsyncEngine

    async def stream(method, init_done, *args, **kwargs):
        init_done.set()
        yield pickle.loads(pickle.dumps(output))

    fake = SimpleNamespace(
        session_states={7: SimpleNamespace(cancelled=False, init_done=asyncio.Event(), cleanup_task=None)},
        engine=SimpleNamespace(pending_cancel_sessions=set(), _collective_rpc_streaming_async=stream),
        _cleanup_session=lambda *a: None)
    last = None
    async for last in MPEngineInstance.async_stream_infer(fake, 7):
        pass
    return AsyncEngine._request_error_from_status(last.status)


@pytest.mark.parametrize("kind,status", [("NOT_SUPPORTED", 400), ("INTERNAL_ENGINE_ERROR", 500)])
def test_engine_error_message_reaches_the_request_error(upgraded, kind, status):
    from lmdeploy.messages import ResponseType

    async def main():
        out = await _engine_side_output(getattr(ResponseType, kind), MESSAGE)
        return await _server_side_error(out)

    error = asyncio.run(main())
    assert error.message == MESSAGE
    assert int(error.status_code) == status


def test_requests_without_an_engine_message_keep_lmdeploys_error(upgraded):
    from lmdeploy.messages import ResponseType
    from lmdeploy.serve.core.exceptions import ERROR_MESSAGES, ErrorCode

    async def main():
        out = await _engine_side_output(ResponseType.NOT_SUPPORTED, "")
        return await _server_side_error(out)

    error = asyncio.run(main())
    assert error.message == ERROR_MESSAGES[ErrorCode.UNSUPPORTED_FEATURE]


def test_the_engine_loop_keeps_a_failed_rows_message(upgraded):
    """``EngineLoop._send_resp`` answers through ``response_reqs``, which reset ``err_msg`` to ''
    (found by the real-server attack test: the relay had nothing to carry)."""
    from lmdeploy.messages import ResponseType
    from lmdeploy.pytorch.engine import engine_loop
    from lmdeploy.pytorch.engine.request import Response

    sent = []
    manager = SimpleNamespace(response=sent.append)
    resp = Response(type=ResponseType.NOT_SUPPORTED, sender_id=0, event=asyncio.Event(), err_msg=MESSAGE, is_done=True)
    engine_loop.response_reqs(manager, resp, ResponseType.NOT_SUPPORTED, data={})
    assert sent == [resp] and resp.err_msg == MESSAGE
    ok = Response(type=ResponseType.SUCCESS, sender_id=0, event=asyncio.Event(), err_msg="stale")
    engine_loop.response_reqs(manager, ok, ResponseType.SUCCESS, data={})
    assert ok.err_msg == ""  # a normal step's response is LMDeploy's, unchanged
