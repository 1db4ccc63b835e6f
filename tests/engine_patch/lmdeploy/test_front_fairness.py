"""The api_server's check shares compile capacity fairly between clients and stops what runs
past its deadline.

On the code before: a compile past the deadline kept running on a thread nobody could stop, the
abandoned-compile cap was one global switch (after one client's timeouts every client's fresh
schema got 400 ``max_abandoned_compiles``), and queued checks ran first come first served (one
client's expensive specs delayed everyone's).
"""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tokenrails import GuideSpec
from tokenrails.guided.backend import GuideBackend
from tokenrails.guided.errors import GuideLimitError, GuideTimeoutError
from tokenrails.guided.limits import GuideLimits
from tokenrails.guided.registry import get_backend, register_backend, unregister_backend

pytest.importorskip("fastapi")

from tokenrails.guided.clients import CLIENT


class SlowBackend(GuideBackend):
    """``slow`` patterns take ``delay`` seconds (an uninterruptible native compile, as far as
    Python can tell); the rest compile with fsm."""

    name = "fairness-test"
    kinds = frozenset({"regex"})
    delay = 2.0

    def compile(self, spec):
        if "slow" in spec.pattern:
            time.sleep(SlowBackend.delay)
        return get_backend("fsm", self.vocab, self.limits).compile(spec)


@pytest.fixture
def slow_engine_backend(upgraded):
    register_backend(SlowBackend.name, SlowBackend)
    yield SlowBackend
    unregister_backend(SlowBackend.name)


def _nonce() -> str:
    return str(time.time_ns())


def _regex(pattern: str) -> GuideSpec:
    """A regex the engine's ``auto`` setting compiles with the test backend (a client's backend hint)."""
    return GuideSpec.regex(pattern).with_routing(SlowBackend.name, fallback=False)


async def _as_client(client: str, spec: GuideSpec, limits: GuideLimits):
    from tokenrails.engine_patch.lmdeploy.server import front_check

    CLIENT.set(client)  # this task's own context (the middleware's job in the server)
    start = time.perf_counter()
    err = await front_check.FRONT.verdict(spec, limits)
    return err, time.perf_counter() - start


def test_one_clients_timeouts_do_not_close_the_check_to_others(slow_engine_backend):
    slow_engine_backend.delay = 6.0
    limits = GuideLimits(compile_timeout_s=0.5, max_abandoned_compiles=2)

    async def main():
        for i in range(2):
            err, _ = await _as_client("key:attacker", _regex(f"slow{i}-{_nonce()}"), limits)
            assert isinstance(err, GuideTimeoutError), err
        attacker, _ = await _as_client("key:attacker", _regex(f"[ab]-{_nonce()}"), limits)
        other, seconds = await _as_client("key:other", _regex(f"[cd]-{_nonce()}"), limits)
        return attacker, other, seconds

    attacker, other, seconds = asyncio.run(main())
    assert isinstance(attacker, GuideLimitError) and attacker.limit == "max_abandoned_compiles", attacker
    assert other is None, f"another client's fresh spec was refused: {other}"
    assert seconds < 3.0  # behind the attacker's compiles it would wait their 6 s


def test_a_clients_expensive_specs_queue_behind_its_own(slow_engine_backend):
    slow_engine_backend.delay = 2.0
    limits = GuideLimits(compile_timeout_s=20)

    async def main():
        heavy = [asyncio.create_task(_as_client("key:busy", _regex(f"slow{i}-{_nonce()}"), limits))
                 for i in range(4)]
        await asyncio.sleep(0.2)  # the busy client's checks hold or queue for the slots
        fresh = await _as_client("key:fresh", _regex(f"[0-9]{{2}}-{_nonce()}"), limits)
        results = await asyncio.gather(*heavy)
        return fresh, results

    (err, seconds), results = asyncio.run(main())
    assert err is None and all(r[0] is None for r in results)
    assert seconds < 1.0, f"a fresh client's small spec waited {seconds:.1f} s behind another client's"


def _compile_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.is_alive()
            and t.name in ("tokenrails-compile", "tokenrails-front-check")]


def test_a_tool_format_past_its_deadline_is_stopped(upgraded):
    """A tool whose parameters hold a 10,000-object enum (the structural tag a tool call compiles
    to; xgrammar needs ~10 s for it even on the probe vocabulary): refused at the deadline, and
    nothing keeps compiling it afterwards."""
    from tokenrails.engine_patch.lmdeploy.server import front_check
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import spec_of

    schema = {"type": "object", "properties": {"x": {"enum": [{"k": f"v{i}", "n": i} for i in range(10_000)]}},
              "required": ["x"], "description": _nonce()}
    fmt = {"type": "structural_tag", "triggers": ["<tool_call>"], "structures": [
        {"begin": '<tool_call>\n{"name": "f", "arguments": ', "schema": schema, "end": "}\n</tool_call>"}]}
    limits = GuideLimits(compile_timeout_s=3.0)
    start = time.perf_counter()
    err = asyncio.run(front_check.FRONT.verdict(spec_of(fmt), limits))
    assert isinstance(err, GuideTimeoutError), err
    assert time.perf_counter() - start < limits.compile_timeout_s + 1.0
    deadline = time.monotonic() + 1.5
    while _compile_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _compile_threads(), "the abandoned compile still runs"


def test_a_request_is_named_by_its_api_key_else_its_address():
    from tokenrails.engine_patch.lmdeploy.server.client_identity import ClientIdentityMiddleware, identity_of

    keyed = {"type": "http", "headers": [(b"authorization", b"Bearer sk-one")], "client": ("10.0.0.1", 5)}
    other_key = {"type": "http", "headers": [(b"authorization", b"Bearer sk-two")], "client": ("10.0.0.1", 6)}
    anonymous = {"type": "http", "headers": [], "client": ("10.0.0.2", 7)}
    assert identity_of(keyed) != identity_of(other_key)  # one address, two keys: two clients
    assert "sk-one" not in identity_of(keyed)  # the key itself is never kept
    assert identity_of(anonymous) == "addr:10.0.0.2"

    seen = []

    async def app(scope, receive, send):
        seen.append(CLIENT.get())

    asyncio.run(ClientIdentityMiddleware(app)(keyed, None, None))
    assert seen == [identity_of(keyed)]
