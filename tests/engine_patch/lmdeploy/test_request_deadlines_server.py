"""No request delays another, on the real api_server (CPU path, the engine in its spawned process).

Slow compiles are injected as in test_engine_fairness_server.py (slow_compile_site/sitecustomize.py:
a sleep, so an expensive compile that costs the shared machine no CPU): a pattern holding ``MARKER``
compiles ``DELAY`` s longer in the engine; one also holding ``FRONT_MARKER`` makes the api_server's
front check ``FRONT_DELAY`` s longer too.

* One deadline per request: the front check's wait and the engine's compile wait together end at
  the request's ``compile_timeout_s`` (``TIMEOUT``), never one full deadline each.
* The engine's request handles (LMDeploy's pool of ``--max-batch-size``, first come first served):
  one client's requests whose grammars are still compiling take at most its share, so another
  client's request gets a handle at once instead of queueing behind all of them.
"""
from __future__ import annotations

import asyncio
import re
import time

import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from .slow_compile_server import slow_compile_server  # noqa: E402

pytestmark = pytest.mark.slow
MARKER = "slowdue"
FRONT_MARKER = "slowfront"
DELAY = 10.0  # the engine's compile of a MARKER pattern
FRONT_DELAY = 8.0  # the front check's compile of a FRONT_MARKER pattern
TIMEOUT = 12.0  # compile_timeout_s: below FRONT_DELAY + DELAY, above each
HANDLES = 4  # --max-batch-size: LMDeploy's request handles
SLACK = 3.0  # loaded CI machines: the bound is deadline + 1 s


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    env = {"TOKENRAILS_TEST_SLOW_MARKER": MARKER, "TOKENRAILS_TEST_SLOW_DELAY": str(DELAY),
           "TOKENRAILS_TEST_SLOW_FRONT_MARKER": FRONT_MARKER, "TOKENRAILS_TEST_SLOW_FRONT_DELAY": str(FRONT_DELAY)}
    log = tmp_path_factory.mktemp("deadlines") / "server.log"
    with slow_compile_server(model_dir, log, env, "--max-batch-size", str(HANDLES),
                             limits={"compile_timeout_s": TIMEOUT}) as (base, model_id):
        # the first guided request waits for the engine's vocabulary (built in the background)
        _post(base, model_id, "key-W", "[0-9][0-9]", 4)
        yield base, model_id


def _body(model_id: str, pattern: str, max_tokens: int) -> dict:
    return {"model": model_id, "messages": [{"role": "user", "content": "Write a code."}], "temperature": 0,
            "max_tokens": max_tokens, "response_format": {"type": "regex_schema", "regex_schema": pattern}}


def _post(base: str, model_id: str, key: str, pattern: str, max_tokens: int) -> httpx.Response:
    return httpx.post(f"{base}/v1/chat/completions", json=_body(model_id, pattern, max_tokens),
                      headers={"Authorization": f"Bearer {key}"}, timeout=300)


async def _ask(client, base: str, model_id: str, key: str, pattern: str, max_tokens: int) -> tuple[float, httpx.Response]:
    t0 = time.monotonic()
    resp = await client.post(f"{base}/v1/chat/completions", json=_body(model_id, pattern, max_tokens),
                             headers={"Authorization": f"Bearer {key}"})
    return time.monotonic() - t0, resp


def test_the_front_checks_wait_and_the_engines_share_one_deadline(server):
    base, model_id = server
    pattern = f"([0-9][0-9]|{FRONT_MARKER}{MARKER}{time.time_ns()})"
    t0 = time.monotonic()
    resp = _post(base, model_id, "key-D", pattern, 6)
    took = time.monotonic() - t0
    print(f"front check {FRONT_DELAY} s + engine compile {DELAY} s, deadline {TIMEOUT} s: answered in {took:.2f} s "
          f"({resp.status_code})")
    assert took >= FRONT_DELAY * 0.9  # the front check did take its time
    assert took < TIMEOUT + SLACK, f"answered after {took:.2f} s, deadline {TIMEOUT} s"
    assert resp.status_code != 200 and "compile_timeout_s" in resp.text, resp.text  # failed closed, typed


def test_one_clients_slow_grammars_take_only_its_share_of_the_handles(server):
    base, model_id = server
    nonce = str(time.time_ns())

    async def run():
        async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=HANDLES + 4)) as client:
            flood = [asyncio.create_task(_ask(client, base, model_id, "key-A", f"([0-9][0-9]|{MARKER}{nonce}x{i})", 6))
                     for i in range(HANDLES)]
            await asyncio.sleep(1.5)  # A's requests hold their handles, their compiles have started
            fresh = f"(b{nonce}|[a-c][a-c][a-c])"
            b_took, b_resp = await _ask(client, base, model_id, "key-B", fresh, 12)
            return b_took, b_resp, fresh, await asyncio.gather(*flood)

    b_took, b_resp, fresh, flood = asyncio.run(run())
    print(f"client B answered in {b_took:.2f} s while client A's {HANDLES} requests (compiles of {DELAY} s) "
          f"were in: A's answers {sorted(round(t, 1) for t, _ in flood)} s, {[r.status_code for _, r in flood]}")
    assert b_resp.status_code == 200, b_resp.text
    choice = b_resp.json()["choices"][0]
    assert re.fullmatch(fresh, choice["message"]["content"]) and choice["finish_reason"] == "stop", choice
    assert b_took < DELAY / 2, f"B waited {b_took:.2f} s for a handle behind A's compiles ({DELAY} s each)"
    ok = 0
    for i, (took, resp) in enumerate(flood):  # A's own: constrained, or failed closed by their deadline
        if resp.status_code == 200:
            ok += 1
            choice = resp.json()["choices"][0]
            if choice["finish_reason"] == "stop":
                assert re.fullmatch(f"([0-9][0-9]|{MARKER}{nonce}x{i})", choice["message"]["content"]), choice
        else:  # its deadline ran out behind A's own (the fail-closed prefill after it is load-bound)
            assert "compile_timeout_s" in resp.text, resp.text
    assert ok >= 1  # A's share did compile
