"""Large request bodies against the real api_server (CPU path): refused before LMDeploy parses them.

While a client pings ``/v1/models`` every 0.1 s, hostile bodies (100,000 stop words, an 8 MB
message, 100,000 turns, 256 tools x 1,000 properties, a 72 MB body) each get a typed 400/413
with the limit's name at once, pings stay fast, a normal request is still served, and stop words
LMDeploy cannot use are logged once per request, not once per word. On the same server:
``choice: [""]`` answers the string "" (LMDeploy's parser made every empty answer null).
"""
from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from harness import server_attack as atk  # noqa: E402


pytestmark = pytest.mark.slow


@pytest.fixture
def server(shared_server):
    """The upgraded api_server shared with other modules (conftest); the log checks read only what
    this module's requests added."""
    base, model_id, _, log = shared_server
    return base, model_id, log


def _chat(model_id: str, **extra) -> dict:
    return {"model": model_id, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
            "temperature": 0, **extra}


def test_large_bodies_are_refused_at_once_and_pings_stay_fast(server):
    base, model_id, log = server
    results, quiet, during, failures = atk.run_bodies(base, model_id, log)
    expected = {name: (status, needle) for name, _, status, needle in atk.large_bodies(model_id)}
    print(*results, f"pings quiet p99 {atk.percentile(quiet, 0.99):.3f} s, during the bodies "
          f"p99 {atk.percentile(during, 0.99):.3f} s max {max(during):.3f} s", sep="\n")
    assert not failures, failures
    for r in results:
        status, needle = expected[r.name]
        assert r.status == status, r
        payload = json.loads(r.message)
        assert payload["code"] == status and payload["type"] == "invalid_request_error", payload
        assert needle in payload["message"] or payload.get("param") == needle, payload
        assert r.seconds < 5.0, r
        assert r.log_bytes < 2000, r  # one line per refusal, never one per item
    # parsed on the loop, the bodies stalled pings up to 8 s (docs/lmdeploy.md); a loaded machine's
    # scheduling alone gave 1.03 s, past a 0.25 s floor
    assert atk.percentile(during, 0.99) < max(2.0, 2 * atk.percentile(quiet, 0.99)), results


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
