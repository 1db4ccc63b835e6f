"""Data parallel the way LMDeploy users run it: two api_server replicas (CPU path, upgrade active)
behind LMDeploy's own proxy, over real HTTP on 127.0.0.1.

Replicas: ``python -m tokenrails.engine_patch.lmdeploy.cpu.serve`` (as test_real_server.py).
Proxies: ``lmdeploy serve proxy`` itself (stock), and the same CLI through
``python -m tokenrails.engine_patch.lmdeploy.proxy_serve``, which keeps a replica's error status
(proxy_serve.py). Every kind, streaming, tool calls and 16 concurrent requests go through the
proxy, which spreads them over both replicas; then one replica is killed mid-run: its requests fail
with an error status, the other replica goes on serving, and no 200 carries an invalid output.
Opt-in by marker (slow): ``pytest -m slow tests/engine_patch/lmdeploy/test_proxy_dp.py``.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("fastapi")
pytest.importorskip("aiohttp")  # LMDeploy's proxy forwards with it
pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

from .test_real_server import _free_port, _stop, start_ready, stream_chat  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
REGEX = r"[0-9]{3}-[a-z]{2}"
GRAMMAR = 'root ::= num " " op " " num\nop ::= "+" | "-"\nnum ::= [1-9] [0-9]?'
GRAMMAR_RE = r"[1-9][0-9]? [+-] [1-9][0-9]?"
CHOICES = ["red", "green", "blue"]
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Tokyo"]}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                           "parameters": WEATHER}}]
# the proxy drops a replica that fails its health check within this (LMDeploy: 90 s); at 3 s a
# loaded machine's busy replicas missed it and were dropped alive
HEARTBEAT_S = 10


def _spawn_proxy(cmd: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", LMDEPLOY_CONTROLLER_HEART_BEAT_EXPIRATION=str(HEARTBEAT_S),
               PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd + ["--server-name", "127.0.0.1", "--server-port", str(port),
                                       "--disable-cache-status"],  # never read/write the package's node file
                                stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(REPO), start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"proxy exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{base}/nodes/status", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.5)
    _stop(proc)
    pytest.fail(f"proxy not ready:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from tokenrails.demo_model import ModelNotFoundError, resolve_model_dir
    try:
        model, _, _ = resolve_model_dir(quiet=True)
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    tmp = tmp_path_factory.mktemp("dp")
    started: list[subprocess.Popen] = []
    try:
        replicas = []
        with pytest.MonkeyPatch.context() as mp:
            # no spec here is large enough for a compile worker process (compile_procs.PROCESS_MIN_COST):
            # the two each engine would boot at start only cost their interpreters' start-up
            mp.setenv("TOKENRAILS_COMPILE_PROCESSES", "0")
            for i in range(2):
                proc, base, model_id = start_ready(model, tmp / f"replica{i}.log")
                started.append(proc)
                replicas.append((proc, base))
        ours, ours_base = _spawn_proxy([sys.executable, "-m", "tokenrails.engine_patch.lmdeploy.proxy_serve"],
                                       tmp / "proxy.log")
        started.append(ours)
        stock, stock_base = _spawn_proxy([str(Path(sys.executable).with_name("lmdeploy")), "serve", "proxy"],
                                         tmp / "stock_proxy.log")
        started.append(stock)
        for proxy_base in (ours_base, stock_base):
            for _, base in replicas:
                r = httpx.post(f"{proxy_base}/nodes/add", json={"url": base}, timeout=30)
                assert r.status_code == 200, r.text
        yield {"proxy": ours_base, "stock_proxy": stock_base, "model": model_id, "replicas": replicas}
    finally:
        for proc in started:
            _stop(proc)


def _body(model_id, prompt, **kw):
    return {"model": model_id, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": 40, **kw}


KINDS = {
    "json_schema": ("Give me a person as JSON.",
                    {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}),
    "regex": ("Write a code.", {"type": "regex_schema", "regex_schema": REGEX}),
    "choice": ("Pick a colour.", {"type": "choice", "choice": CHOICES}),
    "grammar": ("Write a sum.", {"type": "grammar", "grammar": GRAMMAR}),
    "structural_tag": ("Describe a person.", {"type": "structural_tag", "format": {
        "type": "tag", "begin": "<person>", "content": {"type": "json_schema", "json_schema": PERSON},
        "end": "</person>"}}),
}


def _valid(kind: str, text: str) -> bool:
    """The oracle of each kind."""
    try:
        if kind == "json_schema":
            jsonschema.validate(json.loads(text), PERSON)
        elif kind == "regex":
            return re.fullmatch(REGEX, text) is not None
        elif kind == "choice":
            return text in CHOICES
        elif kind == "grammar":
            return re.fullmatch(GRAMMAR_RE, text) is not None
        elif kind == "structural_tag":
            m = re.fullmatch(r"<person>(.*)</person>", text, re.S)
            if not m:
                return False
            jsonschema.validate(json.loads(m.group(1)), PERSON)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


async def _post_all(base: str, bodies: list[dict]) -> list[httpx.Response | Exception]:
    async with httpx.AsyncClient(timeout=300) as client:
        return await asyncio.gather(*(client.post(f"{base}/v1/chat/completions", json=b) for b in bodies),
                                    return_exceptions=True)


def _served_by(base: str) -> dict[str, int]:
    """Requests the proxy has completed per replica (its latency record)."""
    status = httpx.get(f"{base}/nodes/status", timeout=10).json()
    return {url: len(s.get("latency") or []) for url, s in status.items()}


def test_every_kind_through_the_proxy_on_both_replicas(cluster):
    base, model_id = cluster["proxy"], cluster["model"]
    kinds = list(KINDS) * 2  # in flight together: the proxy's least-loaded routing uses both replicas
    bodies = [_body(model_id, KINDS[k][0], response_format=KINDS[k][1]) for k in kinds]
    for kind, resp in zip(kinds, asyncio.run(_post_all(base, bodies))):
        assert not isinstance(resp, Exception) and resp.status_code == 200, (kind, resp)
        choice = resp.json()["choices"][0]
        assert choice["finish_reason"] == "stop" and _valid(kind, choice["message"]["content"]), (kind, choice)
    served = _served_by(base)
    assert sorted(served) == sorted(b for _, b in cluster["replicas"]), served
    assert all(n > 0 for n in served.values()), served


def test_bad_schema_is_a_400_with_the_reason_through_the_proxy(cluster):
    fmt = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {
        "type": "object", "properties": {"a": {"type": "nonsense"}}}}}
    body = _body(cluster["model"], "Hi", response_format=fmt)
    resp = httpx.post(f"{cluster['proxy']}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 400, resp.text
    assert "response_format" in resp.json()["message"], resp.text
    # LMDeploy's own proxy: the replica's 400 arrives as a 200 carrying the error object (proxy_serve.py)
    stock = httpx.post(f"{cluster['stock_proxy']}/v1/chat/completions", json=body, timeout=120)
    assert stock.status_code == 200 and stock.json()["code"] == 400, stock.text
    assert stock.json()["message"] == resp.json()["message"]


def test_streaming_through_the_proxy(cluster):
    body = _body(cluster["model"], "Write a code.", stream=True,
                 response_format={"type": "regex_schema", "regex_schema": REGEX})
    pieces, finishes = stream_chat(cluster["proxy"], body)
    assert len([p for p in pieces if p]) > 1, pieces
    assert re.fullmatch(REGEX, "".join(pieces)), pieces
    assert finishes == ["stop"]


@pytest.mark.parametrize("tool_choice", ["required", "named"])
def test_tool_calls_through_the_proxy(cluster, tool_choice):
    choice = "required" if tool_choice == "required" else {"type": "function", "function": {"name": "get_weather"}}
    body = _body(cluster["model"], "What is the weather in Paris?", tools=TOOLS, tool_choice=choice, max_tokens=60)
    resp = httpx.post(f"{cluster['proxy']}/v1/chat/completions", json=body, timeout=180)
    assert resp.status_code == 200, resp.text
    calls = resp.json()["choices"][0]["message"].get("tool_calls") or []
    assert calls, resp.text
    for call in calls:
        assert call["function"]["name"] == "get_weather", call
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)


def _mixed(model_id: str, n: int) -> tuple[list[str], list[dict]]:
    kinds = [list(KINDS)[i % len(KINDS)] for i in range(n)]
    return kinds, [_body(model_id, KINDS[k][0], response_format=KINDS[k][1], max_tokens=32) for k in kinds]


def test_sixteen_concurrent_requests(cluster):
    before = _served_by(cluster["proxy"])
    kinds, bodies = _mixed(cluster["model"], 16)
    for kind, resp in zip(kinds, asyncio.run(_post_all(cluster["proxy"], bodies))):
        assert not isinstance(resp, Exception) and resp.status_code == 200, (kind, resp)
        assert _valid(kind, resp.json()["choices"][0]["message"]["content"]), (kind, resp.text)
    after = _served_by(cluster["proxy"])
    assert all(after[u] > before.get(u, 0) for u in after), (before, after)  # both replicas took some


def test_a_replica_killed_mid_run(cluster):
    """Kill replica 0 (server and engine) while 8 requests are in flight: every answer is a valid
    output or an error status (never an invalid 200); replica 1 keeps serving through the proxy."""
    (dead, dead_base), (_, live_base) = cluster["replicas"]
    kinds, bodies = _mixed(cluster["model"], 8)

    async def run():
        task = asyncio.ensure_future(_post_all(cluster["proxy"], bodies))
        await asyncio.sleep(3)  # requests routed and decoding on both replicas
        os.killpg(dead.pid, signal.SIGKILL)
        return await task

    results = asyncio.run(run())
    for kind, resp in zip(kinds, results):
        assert not isinstance(resp, Exception), (kind, resp)  # the proxy itself answers
        if resp.status_code == 200:
            content = resp.json()["choices"][0]["message"]["content"]
            assert _valid(kind, content), (kind, content)
        else:
            assert resp.status_code >= 500, resp.text
    deadline = time.monotonic() + HEARTBEAT_S * 6  # the proxy's health check drops the dead replica
    while dead_base in _served_by(cluster["proxy"]) and time.monotonic() < deadline:
        time.sleep(1)
    assert list(_served_by(cluster["proxy"])) == [live_base]
    kinds, bodies = _mixed(cluster["model"], 4)
    for kind, resp in zip(kinds, asyncio.run(_post_all(cluster["proxy"], bodies))):
        assert not isinstance(resp, Exception) and resp.status_code == 200, (kind, resp)
        assert _valid(kind, resp.json()["choices"][0]["message"]["content"]), (kind, resp.text)
