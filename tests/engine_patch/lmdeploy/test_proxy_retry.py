"""proxy_serve.py: a request whose connection a dead replica refused goes to a live one; a request
that reached a replica is never sent twice.

LMDeploy's own proxy (through ``python -m tokenrails.engine_patch.lmdeploy.proxy_serve``) in a
subprocess, with small local HTTP servers standing in for api_servers (each counts the requests it
received). The dead replica is registered with a weight that makes the ``random`` routing pick it
first every time, as the health check has not dropped it yet.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("fastapi")
pytest.importorskip("aiohttp")
httpx = pytest.importorskip("httpx")

from harness.server_attack import free_port, stop_server  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
MODEL = "stand-in"
HEAVY = 10 ** 9  # the routing weight ("speed") that makes the proxy pick a replica first


class Replica:
    """A stand-in api_server: answers a chat completion naming itself (``swallow``: reads the
    request and closes the connection without an answer, as a replica dying mid-request)."""

    def __init__(self, name: str, swallow: bool = False) -> None:
        self.name, self.hits = name, 0
        replica = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode())
                else:
                    self._send(200, b"{}")

            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["content-length"])))
                replica.hits += 1
                if swallow:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                message = {"role": "assistant", "content": replica.name}
                if request.get("stream"):
                    chunk = {"object": "chat.completion.chunk", "choices": [
                        {"index": 0, "delta": message, "finish_reason": "stop"}]}
                    self._send(200, f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode(), "text/event-stream")
                else:
                    self._send(200, json.dumps({"object": "chat.completion", "model": MODEL, "choices": [
                        {"index": 0, "message": message, "finish_reason": "stop"}]}).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kill(self) -> None:
        self.server.shutdown()
        self.server.server_close()  # the port is closed: connections are refused


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("proxy") / "proxy.log"
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "tokenrails.engine_patch.lmdeploy.proxy_serve",
                                 "--server-name", "127.0.0.1", "--server-port", str(port), "--routing-strategy", "random",
                                 "--disable-cache-status"], stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                if httpx.get(f"{base}/nodes/status", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        yield base
    finally:
        stop_server(proc)


def _register(base: str, replica: Replica, speed: int) -> None:
    r = httpx.post(f"{base}/nodes/add", json={"url": replica.url, "status": {"models": [MODEL], "speed": speed}},
                   timeout=30)
    assert r.status_code == 200, r.text


def _nodes(base: str) -> set[str]:
    return set(httpx.get(f"{base}/nodes/status", timeout=10).json())


def _chat(base: str, stream: bool) -> tuple[int, str]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream}
    if not stream:
        r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
        return r.status_code, (r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else r.text)
    text = []
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.strip() and not line.startswith("data: "):
                return 502, line  # the proxy's error line ("replica unreachable") inside the stream
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[len("data: "):])
                if "choices" not in event:
                    return 502, line  # the proxy's "replica unreachable" line inside the stream
                text.append(event["choices"][0]["delta"].get("content") or "")
        return r.status_code, "".join(text)


def test_a_dead_replica_is_skipped_and_dropped(proxy):
    dead, live = Replica("dead"), Replica("live")
    _register(proxy, live, 1)
    _register(proxy, dead, HEAVY)
    assert _chat(proxy, stream=False) == (200, "dead")  # routed to the heavy one while it lives
    dead.kill()
    for i, stream in enumerate([False, True, False, True]):
        _register(proxy, dead, HEAVY)  # still listed, as before the health check notices
        before = live.hits
        assert _chat(proxy, stream) == (200, "live"), (i, stream)
        assert live.hits == before + 1  # sent once, to the live replica
        assert dead.url not in _nodes(proxy)  # marked down at once
    assert dead.hits == 1
    httpx.post(f"{proxy}/nodes/remove", params={"node_url": live.url}, timeout=10)
    live.kill()


def test_a_request_that_reached_a_replica_is_not_sent_again(proxy):
    swallower, live = Replica("swallower", swallow=True), Replica("live")
    _register(proxy, live, 1)
    for stream in (False, True):
        _register(proxy, swallower, HEAVY)
        before = swallower.hits
        status, text = _chat(proxy, stream)
        assert status != 200, (stream, text)  # the replica got it and died: an error, not a second generation
        assert swallower.hits == before + 1 and live.hits == 0
    for replica in (swallower, live):
        httpx.post(f"{proxy}/nodes/remove", params={"node_url": replica.url}, timeout=10)
        replica.kill()


def test_no_live_replica_left_answers_502(proxy):
    dead = Replica("dead")
    dead.kill()
    _register(proxy, dead, HEAVY)
    assert _chat(proxy, stream=False)[0] == 502
    assert dead.url not in _nodes(proxy)
