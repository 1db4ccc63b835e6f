"""``FairHandlePool`` alone (no engine): who gets LMDeploy's request handles, and when."""
from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("lmdeploy")

from tokenrails.engine_patch.lmdeploy.server import handle_pool as hp  # noqa: E402


class _Instance:
    async def async_stream_infer(self, *args, **kwargs):
        for token in range(2):
            await asyncio.sleep(0)
            yield token


class _Engine:
    def create_instance(self):
        return _Instance()


class _Session:
    pass


def _session(client: str, deadline: float | None, key: str | None = None) -> _Session:
    session = _Session()
    hp.mark(session, client, None if deadline is None else (deadline, key or f"spec{time.monotonic_ns()}"))
    return session


async def _take(pool: hp.FairHandlePool, session: _Session):
    hp._SESSION.set(session)
    return await pool.get()


def test_a_clients_new_specs_hold_only_its_share_and_queue_behind_its_own(monkeypatch):
    monkeypatch.setenv("TOKENRAILS_HANDLES_PER_CLIENT", "2")

    async def run():
        pool = hp.FairHandlePool(_Engine(), 4)
        due = time.time() + 30
        a = [await _take(pool, _session("A", due, key)) for key in ("one", "two")]
        a3 = asyncio.ensure_future(_take(pool, _session("A", due)))
        await asyncio.sleep(0.05)
        assert not a3.done()  # A's share is taken: its third new spec waits behind its own
        b = await asyncio.wait_for(_take(pool, _session("B", due)), 1)  # another client: at once
        same = await asyncio.wait_for(_take(pool, _session("A", due, "one")), 1)  # a batch of one new spec passes
        pool.put(same)
        plain = await asyncio.wait_for(_take(pool, _session("A", None)), 1)  # a known spec: never capped
        assert pool.num_dispatched == 4
        assert [t async for t in a[0].async_stream_infer(0)] == [0, 1]  # its first output: A's share frees
        pool.put(plain)  # ... and the freed handle goes to A's waiting request
        got = await asyncio.wait_for(a3, 1)
        for held in (a[0], a[1], b, got):
            pool.put(held)
        assert pool.num_dispatched == 0 and not pool._pending

    asyncio.run(run())


def test_a_request_waiting_for_its_share_fails_at_its_deadline():
    async def run():
        pool = hp.FairHandlePool(_Engine(), 2)  # a share of 1
        held = await _take(pool, _session("A", time.time() + 30))
        t0 = time.monotonic()
        with pytest.raises(Exception, match="compile_timeout_s"):
            await _take(pool, _session("A", time.time() + 0.3))
        assert time.monotonic() - t0 < 2.0
        pool.put(held)
        assert pool.num_dispatched == 0 and not pool._queues

    asyncio.run(run())


def test_a_pipeline_is_one_caller_and_never_held_back(monkeypatch):
    monkeypatch.setenv("TOKENRAILS_HANDLES_PER_CLIENT", "1")

    async def run():
        pool = hp.FairHandlePool(_Engine(), 4)
        held = [await asyncio.wait_for(_take(pool, _session(hp.LOCAL, time.time() + 30)), 1) for _ in range(4)]
        assert pool.num_dispatched == 4 and not pool._pending
        for h in held:
            pool.put(h)

    asyncio.run(run())
