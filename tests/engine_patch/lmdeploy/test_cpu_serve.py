"""cpu.serve takes LMDeploy's own ``serve api_server`` arguments, sizes the session for the model,
and says when ``max_tokens`` was cut to fit the session (session_budget.py).

Fast: argument parsing and KV sizing. Slow: one real server for the module (CPU path, upgrade on),
real HTTP: the served model name, a ``max_tokens`` beyond the session (served, and the response
says how many tokens were granted: header, body field, the stream's finishing chunk), a prompt
that alone exceeds the session (LMDeploy's typed 400), an instructor-sized request (a ~1,500-token
prompt and ``max_tokens`` 1,024) served whole.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lmdeploy")
httpx = pytest.importorskip("httpx")

from tokenrails.engine_patch.lmdeploy.server import session_budget  # noqa: E402
from tokenrails.engine_patch.lmdeploy.cpu import serve  # noqa: E402
from harness.server_attack import free_port, stop_server, wait_ready  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
NAME = "smollm2-test"


def test_lmdeploys_own_arguments_are_accepted(model_dir):
    args = serve.parse_args([str(model_dir), "--model-name", NAME, "--session-len", "4096", "--tp", "3",
                             "--dtype", "bfloat16", "--reasoning-parser", "qwen-qwq", "--tool-call-parser", "qwen",
                             "--max-batch-size", "2", "--cache-max-entry-count", "0.1", "--server-name", "0.0.0.0",
                             "--server-port", "8001", "--log-level", "INFO", "--api-keys", "k1", "k2",
                             "--chat-template", "qwen2d5"])
    assert (args.model_name, args.session_len, args.tp, args.dtype) == (NAME, 4096, 3, "bfloat16")
    assert (args.reasoning_parser, args.tool_call_parser, args.max_batch_size) == ("qwen-qwq", "qwen", 2)
    assert (args.server_name, args.server_port, args.log_level, args.api_keys) == ("0.0.0.0", 8001, "INFO", ["k1", "k2"])
    assert args.cache_max_entry_count == 0.1 and args.cache_max_entry_given and args.chat_template == "qwen2d5"
    assert (args.device, args.backend, args.eager_mode) == ("cpu", "pytorch", True)
    short = serve.parse_args([str(model_dir), "--host", "127.0.0.2", "--port", "8002", "--num-blocks", "40"])
    assert (short.server_name, short.server_port, short.num_gpu_blocks) == ("127.0.0.2", 8002, 40)
    with pytest.raises(SystemExit):
        serve.parse_args([str(model_dir), "--backend", "turbomind"])  # no CPU build


def test_the_session_fits_the_model_and_the_cache_fits_the_session(model_dir):
    context = json.loads((Path(model_dir) / "config.json").read_text())["max_position_embeddings"]
    args = serve.parse_args([str(model_dir)])
    serve.size_kv_cache(args)
    assert args.session_len == context  # LMDeploy's default, the model's context (8,192 for SmolLM2)
    assert args.num_gpu_blocks * args.cache_block_seq_len >= args.session_len  # one request may use it all
    given = serve.parse_args([str(model_dir), "--session-len", "2048", "--num-gpu-blocks", "20"])
    serve.size_kv_cache(given)
    assert (given.session_len, given.num_gpu_blocks) == (2048, 20)
    share = serve.parse_args([str(model_dir), "--cache-max-entry-count", "0.01"])
    serve.size_kv_cache(share)
    size = serve.block_bytes(str(model_dir), share.cache_block_seq_len, share.dtype)
    expected = max(serve.MIN_BLOCKS, int(0.01 * serve.available_bytes() // size))  # (memory moves a little)
    assert abs(share.num_gpu_blocks - expected) <= max(2, expected // 5)


def test_cut_of():
    assert session_budget.cut_of(100, 30, 1024) is None
    assert session_budget.cut_of(None, 30, 1024) is None
    assert session_budget.cut_of(1000, 30, 1024) == {"requested": 1000, "served": 994, "session_len": 1024}
    assert session_budget.cut_of(1000, 1024, 1024) is None  # the prompt alone: LMDeploy's 400


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    port = free_port()
    log = tmp_path_factory.mktemp("cpu_serve") / "server.log"
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "tokenrails.engine_patch.lmdeploy.cpu.serve", str(model_dir),
                                 "--model-name", NAME, "--server-port", str(port), "--max-batch-size", "2",
                                 "--log-level", "WARNING"],
                                stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(REPO), start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        model_id = wait_ready(proc, base, 240)
        assert model_id, log.read_text()[-4000:]
        yield base, model_id
    finally:
        stop_server(proc)


def _chat(base: str, prompt: str, max_tokens: int, **kw):
    return httpx.post(f"{base}/v1/chat/completions", timeout=300, json={
        "model": NAME, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
        "response_format": {"type": "regex_schema", "regex_schema": "hi|hello"}, **kw})


@pytest.mark.slow
def test_served_under_its_model_name(server):
    base, model_id = server
    assert model_id == NAME
    resp = _chat(base, "Say hi", 4)
    assert resp.status_code == 200, resp.text
    assert re.fullmatch("hi|hello", resp.json()["choices"][0]["message"]["content"])
    assert session_budget.HEADER not in resp.headers and session_budget.FIELD not in resp.json()


@pytest.mark.slow
def test_max_tokens_beyond_the_session_is_served_and_said(server):
    base, _ = server
    resp = _chat(base, "Say hi", 9000)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert re.fullmatch("hi|hello", body["choices"][0]["message"]["content"])
    cut = body[session_budget.FIELD]
    assert cut["requested"] == 9000 and cut["session_len"] == 8192
    assert cut["served"] == cut["session_len"] - body["usage"]["prompt_tokens"]
    assert resp.headers[session_budget.HEADER] == (
        f"requested=9000, served={cut['served']}, session-len={cut['session_len']}")


@pytest.mark.slow
def test_max_tokens_beyond_the_session_streamed(server):
    base, _ = server
    body = {"model": NAME, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 9000, "stream": True,
            "temperature": 0, "response_format": {"type": "regex_schema", "regex_schema": "hi|hello"}}
    events = []
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=300) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: "):]))
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    assert re.fullmatch("hi|hello", text)
    finishing = [e for e in events if e.get("choices") and e["choices"][0].get("finish_reason")]
    assert finishing and finishing[-1][session_budget.FIELD]["requested"] == 9000
    assert all(session_budget.FIELD not in e for e in events if e not in finishing)


@pytest.mark.slow
def test_a_prompt_longer_than_the_session_is_a_400(server):
    base, _ = server
    resp = _chat(base, "hello " * 9000, 8)
    assert resp.status_code == 400, resp.text
    assert "context length" in resp.text


@pytest.mark.slow
def test_an_instructor_sized_request_is_served_whole(server):
    """The default session (the model's 8,192) takes what broke the old 1,024: a long system prompt
    with a JSON schema and max_tokens 1,024."""
    base, _ = server
    resp = _chat(base, "Describe the weather. " * 270 + "Now say hi.", 1024)  # ~1,110 prompt tokens: past 1,024
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["usage"]["prompt_tokens"] > 1024
    assert session_budget.FIELD not in body and session_budget.HEADER not in resp.headers
