"""Large request bodies against the real api_server (CPU path): refused before LMDeploy parses them.

While a client pings ``/v1/models`` every 0.1 s, hostile bodies (100,000 stop words, an 8 MB
message, 100,000 turns, 256 tools x 1,000 properties, a 40 MB body) each get a typed 400/413
with the limit's name at once, pings stay fast, a normal request is still served, and stop words
LMDeploy cannot use are logged once per request, not once per word. On the same server:
``choice: [""]`` answers the string "" (LMDeploy's parser made every empty answer null).
"""
from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from harness import server_attack as atk  # noqa: E402

from .test_real_server import start_ready  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    log = tmp_path_factory.mktemp("bodies") / "server.log"
    proc, base, model_id = start_ready(model_dir, log)
    try:
        yield base, model_id, log
    finally:
        atk.stop_server(proc)


def _chat(model_id: str, **extra) -> dict:
    return {"model": model_id, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
            "temperature": 0, **extra}


def _hostile(model_id: str) -> list[tuple[str, dict, int, str]]:
    many_props = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1000)}}
    return [
        ("100k stop words", _chat(model_id, stop=[f"w{i} x" for i in range(100_000)]), 400, "stop"),
        ("8 MB message", {**_chat(model_id), "messages": [{"role": "user", "content": "a " * 4_000_000}]},
         400, "messages"),
        ("100k turns", {**_chat(model_id), "messages": [{"role": ("user", "assistant")[i % 2], "content": "hi"}
                                                       for i in range(100_000)]}, 400, "messages"),
        ("256 tools x 1000 properties", _chat(model_id, tools=[
            {"type": "function", "function": {"name": f"f{i}", "parameters": many_props}} for i in range(256)]),
         400, "tools"),
        ("40 MB body", {**_chat(model_id), "padding": "x" * (40 * 1024 * 1024)}, 413, "TOKENRAILS_MAX_BODY_BYTES"),
    ]


def test_large_bodies_are_refused_at_once_and_pings_stay_fast(server):
    base, model_id, _ = server
    pings: list[float] = []
    failures: list[str] = []
    stop = threading.Event()

    def pinger() -> None:
        with httpx.Client(timeout=10) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    c.get(f"{base}/v1/models").raise_for_status()
                    pings.append(time.perf_counter() - t0)
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))
                time.sleep(0.1)

    # encoded before the pings start: the client's own encoding would hold this process's GIL
    hostile = [(name, json.dumps(body).encode(), status, needle) for name, body, status, needle in _hostile(model_id)]
    thread = threading.Thread(target=pinger, daemon=True)
    thread.start()
    try:
        time.sleep(1.0)
        quiet = list(pings)
        results = []
        with httpx.Client(timeout=60) as client:
            for name, body, status, needle in hostile:
                t0 = time.perf_counter()
                resp = client.post(f"{base}/v1/chat/completions", content=body,
                                   headers={"content-type": "application/json"})
                results.append((name, resp.status_code, time.perf_counter() - t0, resp.text[:200]))
                assert resp.status_code == status, results
                payload = resp.json()
                assert payload["code"] == status and payload["type"] == "invalid_request_error", payload
                assert needle in payload["message"] or payload.get("param") == needle, payload
        time.sleep(0.5)
    finally:
        stop.set()
        thread.join(timeout=15)
    attack = pings[len(quiet):]
    print(*results, f"pings quiet p99 {atk.percentile(quiet, 0.99):.3f} s, under attack "
          f"p99 {atk.percentile(attack, 0.99):.3f} s max {max(attack):.3f} s")
    assert not failures, failures
    assert atk.percentile(attack, 0.99) < max(0.25, 2 * atk.percentile(quiet, 0.99)), (attack, results)
    for name, _, seconds, _ in results:
        assert seconds < 5.0, results


def test_normal_request_still_served_and_stop_warnings_collapse(server):
    base, model_id, log = server
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    before = log.read_bytes()
    # 200 stop words LMDeploy's tokenizer cannot use as one token each (within the limit)
    words = [f"zq{i} unusable" for i in range(200)]
    resp = httpx.post(f"{base}/v1/chat/completions", json=_chat(model_id, stop=words, tools=tools), timeout=120)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
    time.sleep(0.5)
    grown = log.read_bytes()[len(before):].decode("utf-8", "replace")
    noted = [line for line in grown.splitlines() if "stop words" in line]
    assert 1 <= len(noted) <= 2, noted[:5] + [f"... {len(noted)} lines"]
    assert "199 more" in grown, grown[-2000:]


def test_choice_of_the_empty_string_answers_a_string(server):
    base, model_id, _ = server
    options = [""]
    resp = httpx.post(f"{base}/v1/chat/completions", timeout=120, json=_chat(
        model_id, response_format={"type": "choice", "choice": options}))
    assert resp.status_code == 200, resp.text
    content = resp.json()["choices"][0]["message"]["content"]
    assert content in options, content
