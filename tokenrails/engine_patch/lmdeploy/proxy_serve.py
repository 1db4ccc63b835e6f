"""LMDeploy's proxy (``lmdeploy serve proxy``) with a replica's error status kept.

    python -m tokenrails.engine_patch.lmdeploy.proxy_serve [the arguments of `lmdeploy serve proxy`]

LMDeploy 0.18's proxy answers every non-streaming request ``JSONResponse(json.loads(body))``, HTTP
200: a replica's 400 (a bad ``response_format``) reaches an OpenAI client as a completion it
cannot parse. Here the proxy module's ``JSONResponse`` takes its status from an error body (an
OpenAI error object keeps its code; the proxy's "replica unreachable" answer becomes a 502).

A request whose connection a replica refused (``aiohttp.ClientConnectorError``: not one byte left
the proxy) goes to another live replica of the same model and the dead one leaves the node list,
instead of failing until the health check drops it. An error after the connection opened may have
reached the replica: never retried, so a request is generated at most once.

``main`` calls ``activate()`` first, which widens the api_server's ``ChatCompletionRequest`` the
proxy validates with, so it passes the kinds only the upgrade has (``choice``, ``grammar``).
Everything else is LMDeploy's own CLI; docs/lmdeploy.md ("Data parallel") has the details.
"""
from __future__ import annotations

import json
import logging
import sys
from typing import Any, AsyncIterator

API_TIMEOUT = 10402  # lmdeploy.serve.proxy.utils.ErrorCodes.API_TIMEOUT: the replica did not answer
_ORIGINAL: dict[str, Any] = {}
FORWARDS = ("forward_raw_request_generate", "forward_raw_request_stream_generate")
log = logging.getLogger(__name__)


def status_of(content: Any) -> int | None:
    """The HTTP status an error body stands for, or None for a normal body."""
    if not isinstance(content, dict):
        return None
    code = content.get("code")
    if content.get("object") == "error" and isinstance(code, int) and 400 <= code < 600:
        return code
    if content.get("error_code") == API_TIMEOUT and "choices" not in content:
        return 502
    return None


def _model_of(body: bytes) -> str | None:
    try:
        model = json.loads(body).get("model")
    except (ValueError, AttributeError):
        return None
    return model if isinstance(model, str) else None


def _next_replica(manager: Any, dead: str, body: bytes) -> str | None:
    """Drop ``dead`` from the node list; another live replica serving the request's model, or None."""
    log.warning("proxy: replica %s refused the connection; removed from the node list, request sent elsewhere", dead)
    manager.remove(dead)
    model = _model_of(body)
    return None if model is None else manager.get_node_url(model)


async def _open(manager: Any, raw_request: Any, node_url: str, endpoint: str) -> tuple[Any, Any]:
    """A session and the replica's response to the forwarded request (headers read, body not)."""
    import aiohttp

    session = aiohttp.ClientSession()
    try:
        response = await session.post(node_url.rstrip("/") + endpoint, headers=manager._prepare_headers(raw_request),
                                       data=await raw_request.body(), timeout=manager.aiotimeout)
    except BaseException:
        await session.close()
        raise
    return session, response


async def _connect_live(manager: Any, raw_request: Any, node_url: str, endpoint: str) -> tuple[str, Any, Any]:
    """Forward to ``node_url``, or - while the connection is refused - to the next live replica.
    Returns (the replica that took the request, session, response); raises the last refusal when
    no replica is left. Anything raised after a connection opened propagates (never retried)."""
    import aiohttp

    body = await raw_request.body()
    tried: set[str] = set()
    while True:
        try:
            return (node_url, *await _open(manager, raw_request, node_url, endpoint))
        except aiohttp.ClientConnectorError:
            tried.add(node_url)
            nxt = _next_replica(manager, node_url, body)
            if nxt is None or nxt in tried:
                raise
            node_url = nxt


def _accounting(manager: Any, first: str, used: str) -> float | None:
    """The route counted the request on ``first``; a retry counts it on the replica that took it."""
    return manager.pre_call(used) if used != first and used in manager.nodes else None


def patched_generate(original: Any) -> Any:
    """``NodeManager.forward_raw_request_generate`` (non-streaming) with the retry on refusal."""

    async def forward_raw_request_generate(self: Any, raw_request: Any, node_url: str, endpoint: str) -> str:
        try:
            used, session, response = await _connect_live(self, raw_request, node_url, endpoint)
        except Exception as exc:  # noqa: BLE001 - LMDeploy answers every failure with its 10402 body
            log.error("proxy: %s%s failed: %r", node_url, endpoint, exc)
            return self.handle_api_timeout(node_url)
        start = _accounting(self, node_url, used)
        try:
            async with session, response:
                return await response.text()
        except Exception as exc:  # noqa: BLE001 - reached the replica: never retried
            log.error("proxy: %s%s failed: %r", used, endpoint, exc)
            return self.handle_api_timeout(used)
        finally:
            if start is not None:
                self.post_call(used, start)

    forward_raw_request_generate.__wrapped__ = original  # type: ignore[attr-defined]
    return forward_raw_request_generate


def patched_stream_generate(original: Any) -> Any:
    """``NodeManager.forward_raw_request_stream_generate`` with the retry on refusal (only before
    the replica's first byte: a stream is never restarted)."""
    from lmdeploy.serve.proxy.utils import APIServerException

    async def forward_raw_request_stream_generate(self: Any, raw_request: Any, node_url: str,
                                                  endpoint: str) -> AsyncIterator[bytes]:
        try:
            used, session, response = await _connect_live(self, raw_request, node_url, endpoint)
        except Exception as exc:  # noqa: BLE001
            log.error("proxy: %s%s failed: %r", node_url, endpoint, exc)
            yield self.handle_api_timeout(node_url)
            return
        start = _accounting(self, node_url, used)
        try:
            async with session, response:
                if response.status != 200:
                    raise APIServerException(status_code=response.status, body=await response.read())
                async for line in response.content:
                    if line.strip():
                        yield line + b"\n\n"
        except APIServerException:
            raise
        except Exception as exc:  # noqa: BLE001 - reached the replica: never retried
            log.error("proxy: %s%s failed: %r", used, endpoint, exc)
            yield self.handle_api_timeout(used)
        finally:
            if start is not None:
                self.post_call(used, start)

    forward_raw_request_stream_generate.__wrapped__ = original  # type: ignore[attr-defined]
    return forward_raw_request_stream_generate


def install() -> None:
    """Patch the proxy module's ``JSONResponse`` and its node manager's forwarding (idempotent;
    :func:`uninstall` reverts)."""
    if _ORIGINAL:
        return
    from lmdeploy.serve.proxy import proxy as px

    for name, make in zip(FORWARDS, (patched_generate, patched_stream_generate)):
        original = px.NodeManager.__dict__[name]
        _ORIGINAL[name] = original
        setattr(px.NodeManager, name, make(original))

    base = px.JSONResponse

    class StatusJSONResponse(base):  # type: ignore[misc, valid-type]
        """``JSONResponse`` whose default 200 yields to the status an error body carries."""

        def __init__(self, content: Any = None, status_code: int = 200, *args: Any, **kwargs: Any) -> None:
            if status_code == 200:
                status_code = status_of(content) or 200
            super().__init__(content, status_code, *args, **kwargs)

    _ORIGINAL["JSONResponse"] = base
    px.JSONResponse = StatusJSONResponse


def uninstall() -> None:
    if not _ORIGINAL:
        return
    from lmdeploy.serve.proxy import proxy as px
    px.JSONResponse = _ORIGINAL.pop("JSONResponse")
    for name in FORWARDS:
        setattr(px.NodeManager, name, _ORIGINAL.pop(name))


def main(argv: list[str] | None = None) -> None:
    from . import activate

    activate()  # before the proxy module is imported: its routes validate with the widened request model
    install()
    from lmdeploy.cli.entrypoint import run

    sys.argv = ["lmdeploy", "serve", "proxy", *(sys.argv[1:] if argv is None else argv)]
    run()


if __name__ == "__main__":
    main()
