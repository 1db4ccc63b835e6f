"""LMDeploy's OpenAI api_server over real HTTP, on the CPU path, with the upgrade active.

The server is ``python -m tokenrails.engine_patch.lmdeploy.cpu.serve`` in a subprocess: LMDeploy's
own ``api_server.serve`` with a CPU engine config. LMDeploy runs the engine in a *spawned* process
(``ZMQMPEngine``); the CPU path reaches it through the config's pickle, the upgrade through
``activate()``'s exported environment and start-up hook. Requests are OpenAI-shaped bodies sent with
httpx: response_format kinds validated by oracles, a bad schema answered 400, streaming, and
concurrent requests. ``choice`` and ``grammar`` succeeding proves the upgrade runs in the engine
process (stock LMDeploy's engine has no such kinds).
"""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import warnings
from pathlib import Path

import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")  # LMDeploy's server modules import it
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")

from harness import server_attack as atk  # noqa: E402
from harness.server_attack import free_port as _free_port, stop_server as _stop  # noqa: E402,F401

pytestmark = pytest.mark.slow

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
START_TIMEOUT = 240


# LMDeploy 0.18 race (not ours): ``ZMQMPEngine._start_mp_proc`` leaves ``with mp.Manager()`` (shutting
# the manager down) as soon as the spawned engine publishes its RPC port, while the engine process
# is still leaving ``with condition:`` — its ``release()`` call to the manager can lose its reply
# (``EOFError`` in ``_mp_proc``), and the engine process dies before loading the model. Rare, more
# likely on a loaded machine; the server start is retried for that failure only.
START_ATTEMPTS = 3
MANAGER_RACE = "EOFError"


def _start(model, log, *extra_args, tool_call_parser="qwen", **start_kw):
    return atk.start_server(model, log, extra_args=extra_args, tool_call_parser=tool_call_parser, **start_kw)


def _wait_ready(proc, base, log):
    """The served model id, or None when the server process exited first."""
    model_id = atk.wait_ready(proc, base, START_TIMEOUT)
    if model_id is None and proc.poll() is None:
        pytest.fail(f"api_server not ready after {START_TIMEOUT}s:\n{log.read_text()[-4000:]}")
    return model_id


def start_ready(model, log, *extra_args, tool_call_parser="qwen", **start_kw):
    """A ready server (proc, base URL, model id); the start is retried for LMDeploy's manager race only.
    ``start_kw`` go to ``harness.server_attack.start_server`` (``limits=``, ``stock=``)."""
    for attempt in range(START_ATTEMPTS):
        proc, base = _start(model, log, *extra_args, tool_call_parser=tool_call_parser, **start_kw)
        try:
            model_id = _wait_ready(proc, base, log)
        except BaseException:
            _stop(proc)
            raise
        if model_id is not None:
            return proc, base, model_id
        _stop(proc)
        text = log.read_text()
        if MANAGER_RACE not in text or attempt == START_ATTEMPTS - 1:
            pytest.fail(f"api_server exited with {proc.returncode}:\n{text[-4000:]}")
        warnings.warn(f"api_server start {attempt + 1}: LMDeploy's engine-start manager race ({MANAGER_RACE}); retrying")
    raise AssertionError("unreachable")


@pytest.fixture
def server(shared_server):
    """The upgraded api_server this module shares with others that only send it requests (conftest)."""
    return shared_server


def _body(model_id, prompt, **kw):
    return {"model": model_id, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": 40, **kw}


def _post(server, body):
    base, _, _, _ = server
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=180)


def _content(resp):
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    return choice["message"]["content"], choice["finish_reason"]


def test_engine_runs_in_a_spawned_process(server):
    _, _, proc, _ = server
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    names = [Path(f"/proc/{pid}/comm").read_text().strip() for pid in children if Path(f"/proc/{pid}/comm").exists()]
    assert "ZMQMPEngine" in names, names


def test_json_schema(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    text, finish = _content(_post(server, _body(server[1], "Give me a person as JSON.", response_format=fmt)))
    assert finish == "stop"
    jsonschema.validate(json.loads(text), PERSON)


def test_bad_schema_is_400(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "object",
                                                                            "properties": {"a": {"type": "nonsense"}}}}}
    resp = _post(server, _body(server[1], "Hi", response_format=fmt))
    assert resp.status_code == 400, resp.text
    assert "response_format" in resp.json()["message"]


def test_choice_and_grammar_run_in_the_engine_process(server):
    """Kinds only the upgrade has: the spawned engine process enforces them (stock would fail)."""
    text, finish = _content(_post(server, _body(server[1], "Is the sky blue?",
                                                response_format={"type": "choice", "choice": ["yes", "no"]})))
    assert finish == "stop" and text in ("yes", "no"), text
    grammar = 'root ::= num " " op " " num\nop ::= "+" | "-"\nnum ::= [1-9] [0-9]?'
    text, finish = _content(_post(server, _body(server[1], "Write a sum.",
                                                response_format={"type": "grammar", "grammar": grammar})))
    assert finish == "stop" and re.fullmatch(r"[1-9][0-9]? [+-] [1-9][0-9]?", text), text


def test_structural_tag(server):
    tag = {"type": "tag", "begin": "<person>", "content": {"type": "json_schema", "json_schema": PERSON},
           "end": "</person>"}
    text, finish = _content(_post(server, _body(server[1], "Describe a person.",
                                                response_format={"type": "structural_tag", "format": tag})))
    m = re.fullmatch(r"<person>(.*)</person>", text, re.S)
    assert finish == "stop" and m, text
    jsonschema.validate(json.loads(m.group(1)), PERSON)


def stream_chat(base: str, body: dict) -> tuple[list[str], list[str]]:
    """A streamed chat completion: its content pieces and finish reasons, in order (status 200 asserted)."""
    pieces, finishes = [], []
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=180) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[len("data: "):])["choices"][0]
            pieces.append(choice["delta"].get("content") or "")
            if choice.get("finish_reason"):
                finishes.append(choice["finish_reason"])
    return pieces, finishes


def test_streaming_regex(server):
    base, model_id, _, _ = server
    pattern = r"[0-9]{3}-[a-z]{2}"
    body = _body(model_id, "Write a code.", stream=True,
                 response_format={"type": "regex_schema", "regex_schema": pattern})
    pieces, finishes = stream_chat(base, body)
    assert len([p for p in pieces if p]) > 1  # really streamed, token by token
    assert re.fullmatch(pattern, "".join(pieces)), pieces
    assert finishes == ["stop"]


def test_concurrent_requests(server):
    """Guided and unguided requests in flight together (batched by the engine), each validated."""
    base, model_id, _, _ = server
    pattern = r"[A-Z]{2}[0-9]{2}"
    bodies = [
        _body(model_id, "Give me a person as JSON.",
              response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}),
        _body(model_id, "Write a code.", response_format={"type": "regex_schema", "regex_schema": pattern}),
        _body(model_id, "Pick a colour.", response_format={"type": "choice", "choice": ["red", "green", "blue"]}),
        _body(model_id, "Say hello.", max_tokens=8),
        _body(model_id, "Another person as JSON, please.",
              response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}),
    ]

    async def run():
        async with httpx.AsyncClient(timeout=180) as client:
            return await asyncio.gather(*(client.post(f"{base}/v1/chat/completions", json=b) for b in bodies))

    person, code, colour, hello, person2 = [_content(r) for r in asyncio.run(run())]
    jsonschema.validate(json.loads(person[0]), PERSON)
    jsonschema.validate(json.loads(person2[0]), PERSON)
    assert re.fullmatch(pattern, code[0]), code
    assert colour[0] in ("red", "green", "blue"), colour
    assert hello[0] and hello[1] == "length", hello


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Tokyo"]}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Local time in a city.",
                                           "parameters": WEATHER}}]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}],
                         ids=["required", "named"])
def test_tool_choice_over_http(server, tool_choice):
    """``tool_choice`` required / named over HTTP (the server runs LMDeploy's ``qwen`` tool-call
    parser): the engine process enforces the tool-call format, LMDeploy's parser turns the output
    into ``tool_calls``, and every call names a given tool with arguments valid for its schema."""
    resp = _post(server, _body(server[1], "What is the weather in Paris?", tools=TOOLS, tool_choice=tool_choice,
                               max_tokens=80))
    assert resp.status_code == 200, resp.text
    message = resp.json()["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    assert calls, message
    names = {t["function"]["name"] for t in TOOLS}
    for call in calls:
        fn = call["function"]
        assert fn["name"] in names, call
        if isinstance(tool_choice, dict):
            assert fn["name"] == tool_choice["function"]["name"], call
        jsonschema.validate(json.loads(fn["arguments"]), WEATHER)


def test_budget_closes_json_over_http_streamed_and_not(server, model_dir):
    """``tokenrails_budget: "close"``: at a max_tokens below what the JSON takes, plain guided
    answers "length" with a broken prefix; with the key the answer is "stop" and validates."""
    from transformers import AutoTokenizer

    from tokenrails import GuideSpec, Vocabulary
    from tokenrails.guided.budget import budget_spec, budget_table
    from tokenrails.guided.manager import GuidedDecodingManager

    base, model_id, _, _ = server
    plain_fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    fmt = {**plain_fmt, "tokenrails_budget": "close"}
    mgr = GuidedDecodingManager(Vocabulary.from_huggingface(AutoTokenizer.from_pretrained(model_dir)))
    try:
        shortest = budget_table(mgr.get_compiled(budget_spec(GuideSpec.json_schema(PERSON)))).start
    finally:
        mgr.close()
    prompt = "Give me a person as JSON."
    full = _post(server, _body(model_id, prompt, response_format=fmt, max_tokens=80))
    text, finish = _content(full)
    assert finish == "stop"
    tight = max(shortest, full.json()["usage"]["completion_tokens"] - 2)
    _, finish = _content(_post(server, _body(model_id, prompt, response_format=plain_fmt, max_tokens=tight)))
    assert finish == "length"
    resp = _post(server, _body(model_id, prompt, response_format=fmt, max_tokens=tight))
    text, finish = _content(resp)
    assert finish == "stop" and resp.json()["usage"]["completion_tokens"] <= tight
    jsonschema.validate(json.loads(text), PERSON)
    pieces, finishes = stream_chat(base, _body(model_id, prompt, response_format=fmt, max_tokens=shortest,
                                               stream=True))
    assert finishes == ["stop"]
    jsonschema.validate(json.loads("".join(pieces)), PERSON)
    bad = _post(server, _body(model_id, prompt, max_tokens=8, response_format={
        "type": "grammar", "grammar": 'root ::= "a"', "tokenrails_budget": "close"}))
    assert bad.status_code == 400 and "budget" in bad.json()["message"], bad.text


BOOKING = {"type": "object", "properties": {
    "city": {"type": "string", "minLength": 2, "maxLength": 12, "title": "City"},
    "note": {"anyOf": [{"type": "string", "maxLength": 6}, {"type": "null"}], "default": None}},
    "required": ["city"]}  # what pydantic writes for Field(min_length=2, max_length=12) / constr(max_length=6)
BOOKING_TOOLS = [{"type": "function", "function": {"name": "book_hotel", "description": "Book a hotel.",
                                                   "parameters": BOOKING}}]


@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "book_hotel"}}, None],
                         ids=["named", "auto-unsent"])
def test_length_bounded_tool_schema_is_served_and_enforced(server, tool_choice):
    """A tool schema with string minLength/maxLength (stock serves it, unenforced): 200, and every
    call's arguments validate; ``tool_choice`` not sent is auto."""
    extra = {} if tool_choice is None else {"tool_choice": tool_choice}
    resp = _post(server, _body(server[1], "Book a hotel in Paris.", tools=BOOKING_TOOLS, max_tokens=60, **extra))
    assert resp.status_code == 200, resp.text
    calls = resp.json()["choices"][0]["message"].get("tool_calls") or []
    if tool_choice is not None:
        assert calls, resp.json()
    for call in calls:
        assert call["function"]["name"] == "book_hotel", call
        jsonschema.validate(json.loads(call["function"]["arguments"]), BOOKING)
