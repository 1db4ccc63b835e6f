"""Issue 27: the api_server's early check under hostile requests (in-process parts).

* 27.2 the check LMDeploy calls inside ``AsyncEngine.preprocess`` never stalls the event loop
  (it compiled there, with no deadline); the ``auto`` ladder spends at most one deadline;
* 27.4 its memo keeps no payloads (errors were stored with their tracebacks);
* 27.6 non-string ``choice`` items, a ``tool_choice`` naming a missing function,
  ``tool_choice="required"`` with a ``response_format``: refused with 400 and the reason.

Each test failed on the code before issue 27's fixes (checked against the main branch).
"""
from __future__ import annotations

import asyncio
import gc
import json
import time
import tracemalloc
from types import SimpleNamespace

import pytest

from tokenrails import GuideSpec
from tokenrails.guided.backend import GuideBackend
from tokenrails.guided.limits import GuideLimits
from tokenrails.guided.registry import get_backend, register_backend, unregister_backend

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from .test_requests import _client as _router_client, _stand_in_engine  # noqa: E402


def allof_ref_chain(levels: int) -> dict:
    defs = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
            for i in range(levels)}
    defs[f"d{levels}"] = {"type": "object", "properties": {"a": {"type": "integer"}}}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def _fresh_memo():
    """Forget every verdict: the probe managers (their compile caches) are dropped."""
    from tokenrails.engine_patch.lmdeploy.server import request_parsing as req

    with req._PROBE_LOCK:
        managers = list(req._PROBES.values())
        req._PROBES.clear()
    for mgr in managers:
        mgr.close()


class _CountingBackend(GuideBackend):
    """A test backend (registered as ``front-test``) that records each compile, sleeps ``delay``
    seconds for patterns containing ``slow`` or ``shared``, then compiles with fsm."""

    name = "front-test"
    kinds = frozenset({"regex"})
    calls: list = []
    delay = 0.3

    def compile(self, spec):
        _CountingBackend.calls.append(spec.key)
        if "slow" in spec.pattern or "shared" in spec.pattern:
            time.sleep(_CountingBackend.delay)
        return get_backend("fsm", self.vocab, self.limits).compile(spec)


@pytest.fixture
def front_backend(monkeypatch):
    from tokenrails.engine_patch.lmdeploy.boot import settings

    _CountingBackend.calls = []
    _CountingBackend.delay = 0.3
    register_backend("front-test", _CountingBackend)
    monkeypatch.setattr(settings, "_ACTIVATED", settings.Settings(backend="front-test"))
    _fresh_memo()
    yield _CountingBackend
    _fresh_memo()
    unregister_backend("front-test")


async def _max_loop_gap(coro, tick: float = 0.01) -> tuple[float, object, float]:
    """Largest gap between ticks of a ticker task while ``coro`` runs on the same loop, the
    coroutine's outcome, and how long it ran."""
    gaps = [0.0]
    done = asyncio.Event()

    async def ticker():
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(tick)
            now = time.perf_counter()
            gaps.append(now - last - tick)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    start = time.perf_counter()
    try:
        result = await coro
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        result = exc
    took = time.perf_counter() - start
    done.set()
    await task
    return max(gaps), result, took


def test_preprocess_checks_formats_off_the_event_loop(upgraded):
    """The stock ``preprocess`` (patched) with a spec whose check takes seconds on the old code."""
    from lmdeploy.messages import GenerationConfig
    from lmdeploy.serve.core import async_engine
    from lmdeploy.serve.core.exceptions import RequestError

    _fresh_memo()
    # 17 levels: ~2-4 s of closing walk on the old code (on the event loop); the fix refuses it
    # on a pool thread, and the loop keeps ticking
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": allof_ref_chain(17)}}
    fake = SimpleNamespace(backend="pytorch", session_mgr=None)
    gen = GenerationConfig(response_format=fmt)

    async def main():
        return await _max_loop_gap(async_engine.AsyncEngine.preprocess(
            fake, [{"role": "user", "content": "hi"}], "not-a-session", gen_config=gen))

    gap, result, took = asyncio.run(main())
    # the walk on the loop stalls it for its whole length (2-4 s quiet): the loop's longest gap is
    # then the check's duration; off the loop, under 1 s or under half of it (a loaded machine's
    # scheduling alone crossed 0.25 s by 0.4 ms, and 1 s with the walk on a pool thread)
    assert gap < max(1.0, took / 2), f"the event loop stalled {gap:.2f} s of the check's {took:.2f} s"
    assert isinstance(result, RequestError), result
    assert "invalid response_format" in str(result)


def test_concurrent_requests_for_one_spec_share_one_check(upgraded, front_backend):
    from tokenrails.engine_patch.lmdeploy.server import front_check

    spec = GuideSpec.regex("[0-9]{3}-shared")
    checker = front_check.FrontCheck()

    async def main():
        return await asyncio.gather(*(checker.verdict(spec, GuideLimits()) for _ in range(5)))

    assert asyncio.run(main()) == [None] * 5
    assert front_backend.calls == [spec.key]


def test_front_check_has_the_compile_deadline(upgraded, front_backend):
    from tokenrails.engine_patch.lmdeploy.server import front_check
    from tokenrails.guided.errors import GuideTimeoutError

    front_backend.delay = 3
    checker = front_check.FrontCheck()
    spec = GuideSpec.regex("[0-9]{3}-slow")
    start = time.perf_counter()
    err = asyncio.run(checker.verdict(spec, GuideLimits(compile_timeout_s=0.5)))
    assert isinstance(err, GuideTimeoutError)
    assert time.perf_counter() - start < 2.5


def test_auto_ladder_spends_at_most_one_deadline():
    """fsm gave up only at the full deadline before the fallback (which compiles in 0.04 s)."""
    import tokenrails as tr
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import _probe_vocab

    pattern = "[\u0000-\uffff]{0,9}" * 300
    limits = GuideLimits(compile_timeout_s=4.0, max_repeat_total=10_000)  # (the default refuses it)
    start = time.perf_counter()
    tr.compile_guide(GuideSpec.regex(pattern), _probe_vocab(), "auto", limits=limits)
    assert time.perf_counter() - start < limits.compile_timeout_s


REFUSED_SPECS = 60  # tracemalloc makes each ~0.1 s; 60 x 300 KB is still 4.5 MB of slack over noise


def test_memo_of_refused_specs_keeps_no_payload(upgraded):
    from lmdeploy.serve.core import async_engine
    from lmdeploy.serve.core.exceptions import RequestError

    _fresh_memo()
    ensure = async_engine.ensure_response_format_compilable

    def refused(i):  # ~150 KB, over max_enum_values
        enum = [f"value-{i}-{j}-" + "x" * 8 for j in range(12_000)]
        return {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": enum}}}

    for i in range(3):  # warm-up (imports, backends)
        with pytest.raises(RequestError):
            ensure(refused(-1 - i))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(REFUSED_SPECS):
            with pytest.raises(RequestError) as info:
                ensure(refused(i))
            assert "max_enum_values" in str(info.value)
            del info
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # a memo that kept the payloads would hold >= REFUSED_SPECS x its JSON text (~300 KB each); a
    # quarter of that leaves room for what other threads of the process allocate meanwhile
    payloads = REFUSED_SPECS * len(json.dumps(refused(0)))
    assert grown < payloads // 4, (f"{grown / 2**20:.1f} MB retained after {REFUSED_SPECS} refused "
                                   f"{payloads / REFUSED_SPECS / 1e3:.0f} KB specs")


@pytest.mark.parametrize("choices", [[1, {"a": 1}, None], ["ok", 2], ["ok", None]])
def test_non_string_choices_are_refused(upgraded, choices):
    from lmdeploy.serve.core import async_engine
    from lmdeploy.serve.core.exceptions import RequestError

    with pytest.raises(RequestError) as info:
        async_engine.ensure_response_format_compilable({"type": "choice", "choice": choices})
    assert "not a string" in str(info.value)


# ---- the chat endpoint over HTTP (LMDeploy's router over a stand-in engine) --------------------
def _client():
    """LMDeploy's router over the stand-in engine of test_requests.py (kept as ``_client.engine``)."""
    _client.engine = _stand_in_engine()
    return _router_client(_client.engine)


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _chat(client, **extra):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    return client.post("/v1/chat/completions", json=body)


def _prepare(**fields):
    """LMDeploy's ``ChatRunner.prepare`` (patched) for a request; the stand-in engine reports what
    reached it."""
    from lmdeploy.serve.core.chat_runner import ChatRunner
    from lmdeploy.serve.openai.protocol import ChatCompletionRequest
    from lmdeploy.serve.parsers import ResponseParserManager

    if not hasattr(_client, "engine"):
        _client()
    client_ctx = SimpleNamespace(async_engine=_client.engine, response_parser_cls=ResponseParserManager.get("default"),
                                 default_gen_config={}, engine_config=SimpleNamespace(adapters=None),
                                 create_session=lambda sid: SimpleNamespace(session_id=sid),
                                 session_manager=SimpleNamespace(has=lambda sid: False))
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)
    return asyncio.run(ChatRunner.prepare(client_ctx, request))


def test_tool_choice_naming_a_missing_function_is_refused(upgraded):
    from lmdeploy.serve.core.exceptions import RequestError

    with pytest.raises(RequestError) as info:
        _prepare(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "nope" in str(info.value) and "not in tools" in str(info.value)


def test_required_tool_choice_with_a_response_format_is_refused(upgraded):
    from lmdeploy.serve.core.exceptions import RequestError

    with pytest.raises(RequestError) as info:
        _prepare(tools=[TOOL], tool_choice="required",
                 response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}})
    assert "response_format" in str(info.value) and "REACHED" not in str(info.value)


def test_many_tools_are_refused_up_front(upgraded):
    from lmdeploy.serve.core.exceptions import RequestError

    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}
             for i in range(3000)]
    with pytest.raises(RequestError) as info:
        _prepare(tools=tools, tool_choice="auto")
    assert "3000 tools" in str(info.value)


def test_non_string_choices_over_http_are_400(upgraded):
    r = _chat(_client(), response_format={"type": "choice", "choice": [1, {"a": 1}, None]})
    assert r.status_code == 400 and "not a string" in r.json()["message"], r.text


def test_valid_tool_requests_still_reach_the_engine(upgraded):
    from lmdeploy.serve.core.exceptions import RequestError

    _client()
    with pytest.raises(RequestError) as info:
        _prepare(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert "REACHED" in str(info.value)


def test_a_check_that_finishes_before_its_callback_is_added_does_not_deadlock(upgraded, monkeypatch, front_backend):
    """Found by the real-server attack test: a refusal that finished on the pool thread before
    ``add_done_callback`` ran the callback inline, under the lock it takes (the loop froze)."""
    from tokenrails.engine_patch.lmdeploy.server import front_check
    from tokenrails.guided.manager import GuidedDecodingManager

    checker = front_check.FrontCheck()
    real_future = GuidedDecodingManager.compile_future

    def future_and_finish(self, spec):
        future, deadline = real_future(self, spec)
        future.result(timeout=5)  # done before the caller adds its callback
        return future, deadline

    monkeypatch.setattr(GuidedDecodingManager, "compile_future", future_and_finish)
    spec = GuideSpec.regex("[0-9]{3}-instant")

    async def main():
        return await asyncio.wait_for(checker.verdict(spec, GuideLimits()), timeout=5)

    holder: dict = {}
    import threading

    thread = threading.Thread(target=lambda: holder.setdefault("v", asyncio.run(main())), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the front check deadlocked"
    assert holder["v"] is None


def _loop_turns_during_preprocess(fmt) -> int:
    """How many times other tasks ran while the patched ``preprocess`` reached LMDeploy's own call
    (the stock call itself is replaced by a probe, so only the upgrade's front check is counted)."""
    from lmdeploy.messages import GenerationConfig

    from tokenrails.engine_patch.lmdeploy.server import front_check

    turns = [0]
    at_call: list[int] = []

    async def stock_preprocess(self, *args, **kwargs):
        at_call.append(turns[0])
        return "reached"

    patched = front_check.checked_preprocess(stock_preprocess)
    fake = SimpleNamespace(backend="pytorch", session_mgr=None)
    gen = GenerationConfig(response_format=fmt)

    async def main():
        done = asyncio.Event()

        async def neighbour():  # another request, or the engine loop, waiting for its turn
            while not done.is_set():
                turns[0] += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(neighbour())
        await asyncio.sleep(0)
        start = turns[0]
        assert await patched(fake, [{"role": "user", "content": "hi"}], "s", gen_config=gen) == "reached"
        done.set()
        await task
        return at_call[0] - start

    return asyncio.run(main())


def test_a_small_known_format_reaches_the_engine_without_yielding(upgraded):
    """Issue 25 point 4: every real yield in ``preprocess`` lets the engine loop start a prefill
    with the requests that arrived so far, and LMDeploy's scheduler then decodes that partial batch
    for up to ``prefill_interval`` (16) steps before it admits the rest: a warm batch of 32 ran as
    17 + 15 rows. A small format already checked must go straight through (on main it hopped to
    the executor for parsing: one or more turns)."""
    _fresh_memo()
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name"]}}}
    _loop_turns_during_preprocess(fmt)  # first sight: the verdict compiles on a pool thread
    assert _loop_turns_during_preprocess(fmt) == 0


def test_a_large_format_is_still_parsed_off_the_loop(upgraded):
    """The inline parse is bounded: a format past ``INLINE_PARSE_NODES`` (here ~1 MB of
    properties) still parses on the executor, so the loop keeps turning."""
    from tokenrails.engine_patch.lmdeploy.server import front_check

    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 200}
                                            for i in range(5_000)}}
    assert not front_check.parses_inline(big)
    assert front_check.parses_inline({"type": "object", "properties": {"a": {"type": "integer"}}})
    assert not front_check.parses_inline("x" * (64 * front_check.INLINE_PARSE_NODES + 64))
    _fresh_memo()
    fmt = {"type": "json_schema", "json_schema": {"name": "big", "schema": big}}
    assert _loop_turns_during_preprocess(fmt) > 0


def _resume_turns(checker, spec, arrive=None) -> list[int]:
    """The loop turn (counted by a neighbour task) at which each of 32 requests checking ``spec``
    resumed; ``arrive(i)``, if given, is awaited by request ``i`` before it sends its check."""
    turns = [0]
    resumed: list[int] = []

    async def main():
        done = asyncio.Event()

        async def neighbour():
            while not done.is_set():
                turns[0] += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(neighbour())

        async def request(i: int):
            if arrive is not None:
                await arrive(i)
            assert await checker.verdict(spec, GuideLimits()) is None
            resumed.append(turns[0])

        await asyncio.gather(*(request(i) for i in range(32)))
        done.set()
        await task

    asyncio.run(main())
    assert len(resumed) == 32
    return resumed


def test_requests_waiting_on_one_new_format_resume_together(upgraded):
    """Issue 25 point 4, the first call with a new format: 32 requests waiting on its check must
    resume in the same turn of the loop, else the first few reach the engine alone, it prefills
    them, and the rest wait up to 16 decode steps. On main each waiter had its own wrapper of the
    check, and the ones arriving after the (fast) check finished took the memo without waiting:
    about a third of trials resumed over two turns."""
    from tokenrails.engine_patch.lmdeploy.server import front_check

    spreads = []
    for trial in range(20):
        _fresh_memo()
        resumed = _resume_turns(front_check.FrontCheck(), GuideSpec.regex(f"[0-9]{{3}}-together-{trial}"))
        spreads.append(len(set(resumed)))
    assert spreads == [1] * 20, spreads


def test_requests_arriving_after_the_build_stored_its_manager_still_resume_together(upgraded, monkeypatch):
    """The probe manager's build thread stores the manager a turn or more before the loop hears the
    build finished. A request arriving in that gap used to find the manager, check its (fast)
    format and resume before the requests still waiting on the build: CI saw one trial in 20 of the
    test above resume over two turns. Here the gap is held open on purpose: half the requests
    arrive only after the manager is stored, and all 16 + 16 must resume in one turn."""
    import threading

    from tokenrails.engine_patch.lmdeploy.server import front_check
    from tokenrails.engine_patch.lmdeploy.server import request_parsing as req

    _fresh_memo()
    stored = threading.Event()
    real = req.probe_manager

    def slow_to_report(*args, **kwargs):
        mgr = real(*args, **kwargs)  # stored in the memo here
        stored.set()
        time.sleep(1.0)  # the loop hears of the build this much later (wide: CI machines are loaded)
        return mgr

    async def half_late(i: int) -> None:
        while i >= 16 and not stored.is_set():
            await asyncio.sleep(0.001)

    monkeypatch.setattr(req, "probe_manager", slow_to_report)
    resumed = _resume_turns(front_check.FrontCheck(), GuideSpec.regex("[0-9]{3}-stored-early"), half_late)
    assert len(set(resumed)) == 1, sorted(resumed)
