"""The engine's compile capacity is shared fairly between the api_server's clients.

The real api_server (CPU path, the engine in its spawned process). Every compile of a pattern
holding ``MARKER`` takes ``DELAY`` s longer inside the engine (slow_compile_site/sitecustomize.py:
a sleep, so an expensive compile that costs the shared machine no CPU; the front check is not
slowed). Client A (its own API key) sends ``FLOOD`` such patterns at once, enough to fill every
compile slot of the engine; then client B sends a fresh small pattern. The client identity rides
with the request into the engine, where A's compiles are capped at ``PER_CLIENT`` at once and
queue behind A's own: B's compile starts at once and B's answer comes back long before A's
compiles end. (With one anonymous client inside the engine, B's compile queued behind A's.)
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
MARKER = "slowfair"
DELAY = 8.0
FLOOD = 16  # the engine's compile threads (GuidedDecodingManager's compile_workers)
PER_CLIENT = 8  # TOKENRAILS_COMPILE_PER_CLIENT of this server


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    env = {"TOKENRAILS_TEST_SLOW_MARKER": MARKER, "TOKENRAILS_TEST_SLOW_DELAY": str(DELAY),
           "TOKENRAILS_COMPILE_PER_CLIENT": str(PER_CLIENT)}
    log = tmp_path_factory.mktemp("fairness") / "server.log"
    # LMDeploy's api_server lets max_batch_size requests into the engine at once (its request
    # handle pool): room for the whole flood and B, so the engine's compile pool is what decides
    # whose compile runs
    with slow_compile_server(model_dir, log, env, "--max-batch-size", str(FLOOD + 4),
                             limits={"compile_timeout_s": 60}) as (base, model_id):
        yield base, model_id


async def _ask(client, base: str, model_id: str, key: str, pattern: str, max_tokens: int) -> tuple[float, dict]:
    body = {"model": model_id, "messages": [{"role": "user", "content": "Write a code."}], "temperature": 0,
            "max_tokens": max_tokens, "response_format": {"type": "regex_schema", "regex_schema": pattern}}
    t0 = time.monotonic()
    resp = await client.post(f"{base}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    took = time.monotonic() - t0
    assert resp.status_code == 200, resp.text
    return took, resp.json()["choices"][0]


def test_one_clients_flood_does_not_delay_another_clients_compile(server):
    base, model_id = server
    nonce = str(time.time_ns())

    async def run():
        limits = httpx.Limits(max_connections=FLOOD + 4)
        async with httpx.AsyncClient(timeout=300, limits=limits) as client:
            # the first guided request waits for the engine's vocabulary (built in the background)
            await _ask(client, base, model_id, "key-W", "[0-9][0-9]", 4)
            flood = [asyncio.create_task(_ask(client, base, model_id, "key-A", f"([0-9][0-9]|{MARKER}{nonce}x{i})", 6))
                     for i in range(FLOOD)]
            await asyncio.sleep(1.5)  # A's compiles have started in the engine
            fresh = f"(b{nonce}|[a-c][a-c][a-c])"
            b_took, b_choice = await _ask(client, base, model_id, "key-B", fresh, 12)
            return b_took, b_choice, fresh, await asyncio.gather(*flood)

    b_took, b_choice, fresh, flood = asyncio.run(run())
    a_took = sorted(t for t, _ in flood)
    print(f"client B's fresh schema answered in {b_took:.2f} s while client A's {FLOOD} compiles of "
          f"{DELAY} s ran (A's answers: first {a_took[0]:.1f} s, last {a_took[-1]:.1f} s)")
    assert re.fullmatch(fresh, b_choice["message"]["content"]) and b_choice["finish_reason"] == "stop", b_choice
    for i, (_, choice) in enumerate(flood):  # A's answers are constrained too (6 tokens may cut the long branch)
        if choice["finish_reason"] == "stop":
            assert re.fullmatch(f"([0-9][0-9]|{MARKER}{nonce}x{i})", choice["message"]["content"]), choice
    assert b_took < DELAY / 2, f"B waited {b_took:.2f} s behind A's compiles ({DELAY} s each)"
    assert a_took[0] >= DELAY * 0.9  # A's compiles did take their time
