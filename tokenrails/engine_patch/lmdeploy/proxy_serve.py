"""LMDeploy's proxy (``lmdeploy serve proxy``) with a replica's error status kept.

    python -m tokenrails.engine_patch.lmdeploy.proxy_serve [the arguments of `lmdeploy serve proxy`]

LMDeploy 0.18's proxy forwards a non-streaming request to a replica, reads the body as text and
answers ``JSONResponse(json.loads(body))``: always HTTP 200. A request the replica refused (a bad
``response_format`` schema: 400 with the reason) reaches the client as a 200 whose body is an error
object, and an OpenAI client then fails to parse a completion instead of raising the 400. When the
replica cannot be reached (it died, or timed out) the proxy's own answer,
``{"error_code": 10402, "text": ...}``, is a 200 too.

Here the proxy module's ``JSONResponse`` is a subclass that takes its status from the body when the
body says it is an error: an OpenAI error object (``{"object": "error", "code": 4xx/5xx}``, what
LMDeploy's api_server sends) keeps its code; the proxy's "replica unreachable" answer becomes a 502.
Bodies are unchanged; successful responses and streaming are untouched (the streaming path already
re-raises a replica's status). Everything else is LMDeploy's own CLI.

The proxy also validates each request with the api_server's ``ChatCompletionRequest`` before it
forwards it, so LMDeploy's proxy refuses the kinds only the upgrade has (``choice``, ``grammar``: 422).
``main`` therefore calls ``activate()`` first, which widens that model in this process.
"""
from __future__ import annotations

import sys
from typing import Any

API_TIMEOUT = 10402  # lmdeploy.serve.proxy.utils.ErrorCodes.API_TIMEOUT: the replica did not answer
_ORIGINAL: dict[str, Any] = {}


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


def install() -> None:
    """Patch the proxy module's ``JSONResponse`` (idempotent; :func:`uninstall` reverts)."""
    if _ORIGINAL:
        return
    from lmdeploy.serve.proxy import proxy as px

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


def main(argv: list[str] | None = None) -> None:
    from . import activate

    activate()  # before the proxy module is imported: its routes validate with the widened request model
    install()
    from lmdeploy.cli.entrypoint import run

    sys.argv = ["lmdeploy", "serve", "proxy", *(sys.argv[1:] if argv is None else argv)]
    run()


if __name__ == "__main__":
    main()
