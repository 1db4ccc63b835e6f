"""proxy_serve.py: the proxy's JSON answers keep the status their error body stands for."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("fastapi")
pytest.importorskip("aiohttp")

from tokenrails.engine_patch.lmdeploy import proxy_serve  # noqa: E402


def test_status_of_error_bodies():
    assert proxy_serve.status_of({"object": "error", "message": "bad response_format", "code": 400}) == 400
    assert proxy_serve.status_of({"object": "error", "message": "x", "code": 503}) == 503
    assert proxy_serve.status_of({"error_code": proxy_serve.API_TIMEOUT, "text": "Failed"}) == 502
    # normal completions, malformed codes, other shapes: untouched
    assert proxy_serve.status_of({"object": "chat.completion", "choices": []}) is None
    assert proxy_serve.status_of({"object": "error", "code": "400"}) is None
    assert proxy_serve.status_of({"object": "error", "code": 200}) is None
    assert proxy_serve.status_of(["error"]) is None


def test_install_patches_the_proxy_response_and_uninstall_restores_it():
    from lmdeploy.serve.proxy import proxy as px

    original = px.JSONResponse
    proxy_serve.install()
    try:
        body = {"object": "error", "message": "bad schema", "code": 400}
        resp = px.JSONResponse(body)  # what the proxy's route builds from a replica's 400 body
        assert resp.status_code == 400 and json.loads(resp.body) == body
        assert px.JSONResponse({"choices": []}).status_code == 200
        assert px.JSONResponse(body, status_code=404).status_code == 404  # an explicit status stays
    finally:
        proxy_serve.uninstall()
    assert px.JSONResponse is original
    assert original(body).status_code == 200  # LMDeploy's own proxy: the 400 is lost
