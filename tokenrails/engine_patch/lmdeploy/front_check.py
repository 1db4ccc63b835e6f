"""The api_server's early check of a ``response_format``, kept off the server's event loop.

LMDeploy calls ``ensure_response_format_compilable`` synchronously inside the coroutine
``AsyncEngine.preprocess``, i.e. on the event loop every client shares. Whatever that check does
stalls every request and every ``/v1/models`` ping for as long as it runs (a 2 KB ``allOf``/
``$ref`` chain stopped the server indefinitely; a 240 KB grammar of long literals, 11-48 s).
So the work is split:

* on the loop, only cheap bounded work: a memo lookup, and parsing a small format into a
  ``GuideSpec`` (``INLINE_PARSE_NODES``: 10-900 µs for the MaskBench/BFCL schemas). A larger one
  (0.1 s for a 1 MB format) parses on the loop's default executor. Small formats must not hop: every
  ``await`` that really yields lets the engine loop start a prefill with the requests that arrived
  so far, and LMDeploy's scheduler then decodes that partial batch to the end before it admits the
  rest (a batch of 32 ran as 17 then 15 rows: half the occupancy, issue 25 point 4);
* everything that can take time (schema walks, the probe compile, its first mask) runs on a
  ``CompilePool`` thread under the same ``GuideLimits`` the engine's manager compiles with
  (``compile_timeout_s``, ``max_abandoned_compiles``, every walk budget); the coroutine awaits it
  with that deadline. Concurrent requests for one spec share one compile (in-flight futures by
  spec key); the verdict (``None`` or the typed error, detached from its traceback) is memoized.
* a budget request (``tokenrails_budget``) whose shortest output cannot fit its ``max_tokens`` is
  refused here too (budget_front.py: counted on the model's own vocabulary);
* the verdict is handed to LMDeploy's own synchronous call through a context variable of the
  request's task (``requests.FRONT_VERDICT``), so the stock ``preprocess`` raises it with its own
  clean-up (session removed, metrics counted) and never compiles on the loop.

The engine runs in another process (``ZMQMPEngine``): a refused spec never reaches it; an
accepted one is compiled there once against the real vocabulary (the front end compiled it
against a 257-token probe vocabulary, a small fraction of that cost).

``checked_prepare`` adds the request-level checks of the chat endpoint: a ``tool_choice`` naming a
function not in ``tools``, ``tool_choice="required"`` with a ``response_format`` (LMDeploy would
silently replace the format) and too many tools are refused with HTTP 400 and the reason, for the
PyTorch engine only: a TurboMind engine gets stock's request path unchanged (engines.py).
"""
from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import Future
from typing import Any, Callable

from ...guided.compile_pool import CompilePool
from ...guided.errors import (GuideError, GuideLimitError, GuideTimeoutError, InvalidGuideError, UnsupportedGuideError,
                              detached_copy)
from ...guided.limits import DEFAULT_LIMITS, GuideLimits
from . import budget_front, request_fields
from . import requests as req
from .engines import ENGINE_BACKEND, stock_check_for_turbomind
from .settings import configured_limits as front_limits

FRONT_WORKERS = 2  # probe compiles at once (the server has a few cores; a hostile flood queues)
INLINE_PARSE_NODES = 4_000  # JSON nodes + characters/64 up to which a format is parsed on the loop


def to_request_error(exc: GuideError) -> Exception:
    """LMDeploy's ``RequestError`` (HTTP 400, message kept) for a ``GuideError``."""
    from lmdeploy.serve.core.exceptions import ErrorCode, RequestError

    code = ErrorCode.UNSUPPORTED_FEATURE if isinstance(exc, UnsupportedGuideError) else ErrorCode.INVALID_REQUEST
    if isinstance(exc, GuideLimitError) and exc.limit == "max_tokens":
        return RequestError(code, f"max_tokens too small for the response_format: {exc}")
    return RequestError(code, f"invalid response_format: {exc}")


def ensure_response_format_compilable(response_format: Any) -> None:
    """Drop-in for ``lmdeploy._guided_decoding.ensure_response_format_compilable``: tokenrails'
    check for the PyTorch engine, stock LMDeploy's for TurboMind (see engines.py)."""
    if ENGINE_BACKEND.get() == "turbomind":
        stock_check_for_turbomind(response_format)
        return
    try:
        verdict = req.FRONT_VERDICT.get()
        if verdict is not None and verdict[0] == id(response_format):  # checked off the loop already
            if verdict[1] is not None:
                raise detached_copy(verdict[1])
            return
        spec = req.spec_of(response_format)  # also checks the tokenrails_reasoning value
        if spec is not None:
            req.validate_spec(spec, front_limits())
    except GuideError as exc:
        raise to_request_error(exc) from None  # the chain would pin the parsed spec


class FrontCheck:
    """Off-loop, deadline-bounded, de-duplicated verdicts for specs (see the module docstring)."""

    def __init__(self, workers: int = FRONT_WORKERS) -> None:
        self._workers = workers
        self._pool: CompilePool | None = None
        self._lock = threading.Lock()
        self._inflight: dict[str, Future] = {}
        # one asyncio view of each in-flight check per event loop: its waiters all wake in the same
        # turn of the loop, so a batch's requests for a new format reach the engine together (one
        # wrapper per waiter woke them over several turns, and the engine prefilled part of the batch)
        self._views: dict[tuple[str, int], asyncio.Future] = {}

    def _get_pool(self, limits: GuideLimits) -> CompilePool:
        with self._lock:
            if self._pool is None:
                self._pool = CompilePool(self._workers, limits.max_abandoned_compiles, name="tokenrails-front-check")
            return self._pool

    async def verdict(self, spec: Any, limits: GuideLimits) -> GuideError | None:
        """The typed error compiling ``spec`` raises (detached), or None; never blocks the loop."""
        pending = self._pending_view(spec.key)
        if pending is not None:  # wake with the requests already waiting, even if the memo has it now
            return await self._await(pending, None, spec, limits)
        seen, err = req.memo_get(spec.key)
        if seen:
            return err
        pool = self._get_pool(limits)
        with self._lock:
            future = self._inflight.get(spec.key)
            new = future is None
            if new:
                try:
                    future = pool.submit(_probe, spec, limits)
                except GuideLimitError as exc:  # too many abandoned compiles: refuse, do not memo
                    return detached_copy(exc)
                self._inflight[spec.key] = future
        if new:  # outside the lock: a finished future runs the callback here, and it takes the lock
            future.add_done_callback(functools.partial(self._done, spec.key))
        return await self._await(self._view(spec.key, future), future, spec, limits)

    async def _await(self, view: asyncio.Future, future: Future | None, spec: Any,
                     limits: GuideLimits) -> GuideError | None:
        """``view``'s verdict within the compile deadline; past it the check (``future``, if this
        waiter owns one) is abandoned and the request refused with the typed error."""
        try:
            return await asyncio.wait_for(asyncio.shield(view), timeout=limits.compile_timeout_s)
        except asyncio.TimeoutError:
            if future is not None:
                self._get_pool(limits).abandon(future)
            err = GuideTimeoutError(
                f"limit compile_timeout_s={limits.compile_timeout_s} exceeded: checking this constraint "
                "did not finish in time", limit="compile_timeout_s", value=limits.compile_timeout_s)
            req.memo_put(spec.key, err)
            return err

    def _pending_view(self, key: str) -> asyncio.Future | None:
        """This loop's not yet finished view of a check of ``key``, if requests are waiting on one."""
        loop = asyncio.get_running_loop()
        with self._lock:
            view = self._views.get((key, id(loop)))
        if view is None or view.done() or view.get_loop() is not loop:
            return None
        return view

    def _view(self, key: str, future: Future) -> asyncio.Future:
        """This loop's one asyncio future of ``future`` (made by its first waiter)."""
        loop = asyncio.get_running_loop()
        slot = (key, id(loop))
        with self._lock:
            view = self._views.get(slot)
            if view is None or view.get_loop() is not loop:
                view = asyncio.wrap_future(future, loop=loop)
                self._views[slot] = view
                view.add_done_callback(functools.partial(self._forget_view, slot))
            return view

    def _forget_view(self, slot: tuple[str, int], view: asyncio.Future) -> None:
        with self._lock:
            if self._views.get(slot) is view:
                del self._views[slot]

    def _done(self, key: str, future: Future) -> None:
        with self._lock:
            if self._inflight.get(key) is future:
                del self._inflight[key]


def _probe(spec: Any, limits: GuideLimits) -> GuideError | None:
    """Runs on a pool thread: ``validate_spec``'s verdict as a value (memoized there)."""
    try:
        req.validate_spec(spec, limits)
    except GuideError as exc:
        return detached_copy(exc)
    except Exception as exc:  # noqa: BLE001 - a backend bug refuses the request, never unconstrained
        return InvalidGuideError(f"the {spec.kind} constraint cannot be checked: {exc!r}"[:2000])
    return None


FRONT = FrontCheck()


def _gen_config_of(args: tuple, kwargs: dict) -> Any:
    if "gen_config" in kwargs:
        return kwargs["gen_config"]
    return args[2] if len(args) > 2 else None  # preprocess(messages, session_id, gen_config, ...)


def _parse(fmt: Any) -> Any:
    """The format's ``GuideSpec`` or None (a bad one: LMDeploy's own call reports it, with its
    clean-up)."""
    try:
        return req.spec_of(fmt)
    except GuideError:
        return None
    except Exception:  # noqa: BLE001 - same: reported by the synchronous check
        return None


def parses_inline(fmt: Any, budget: int | None = None) -> bool:
    """Whether ``fmt`` is small enough to parse on the event loop: a walk that stops as soon as the
    budget (containers + scalars + characters/64) is spent, so a hostile 1 MB format costs the walk
    ``budget`` steps, not its size."""
    budget = INLINE_PARSE_NODES if budget is None else budget
    stack = [fmt]
    while stack:
        node = stack.pop()
        budget -= 1
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
        elif isinstance(node, (str, bytes)):
            budget -= len(node) // 64
        elif not isinstance(node, (int, float, bool, type(None))):
            return False  # a model class or other object: its parse may be dear, keep it off the loop
        if budget < 0:
            return False
    return True


def checked_preprocess(original: Callable) -> Callable:
    """``AsyncEngine.preprocess`` whose format check ran off the loop before LMDeploy's own call."""

    @functools.wraps(original)
    async def preprocess(self: Any, *args: Any, **kwargs: Any):
        gen_config = _gen_config_of(args, kwargs)
        fmt = getattr(gen_config, "response_format", None)
        token = None
        if fmt is not None and getattr(self, "backend", None) != "turbomind":
            # parsing is bounded (size limit) but a 1 MB format is ~0.1 s of json: off the loop;
            # a small one parses here, so a batch's requests reach the engine together
            if parses_inline(fmt):
                spec = _parse(fmt)
            else:
                spec = await asyncio.get_running_loop().run_in_executor(None, _parse, fmt)
            if spec is not None:
                err = await FRONT.verdict(spec, front_limits())
                if err is None:  # a budget whose shortest output cannot fit: refused before generation
                    err = await budget_front.refusal(self, spec, getattr(gen_config, "max_new_tokens", None),
                                                     front_limits())
                token = req.FRONT_VERDICT.set((id(fmt), err))
        try:
            return await original(self, *args, **kwargs)
        finally:
            if token is not None:
                req.FRONT_VERDICT.reset(token)

    return preprocess


# ---- request-level checks of the chat endpoint (tools, tool_choice) --------------------------
def request_problems(request: Any, limits: GuideLimits) -> str | None:
    """Why a chat request must be refused (HTTP 400), or None: never run it unconstrained or with
    a silently replaced constraint."""
    tools = getattr(request, "tools", None) or []
    choice = getattr(request, "tool_choice", None)
    fmt = getattr(request, "response_format", None)
    if len(tools) > limits.max_any_of and choice != "none":
        return (f"limit max_any_of={limits.max_any_of} exceeded: {len(tools)} tools (each is an alternative "
                "of the tool-call constraint)")
    if choice == "required" and fmt is not None and getattr(fmt, "type", None) not in (None, "text"):
        return ('tool_choice="required" and a response_format cannot both be enforced (one constraint per '
                "request); send one of them")
    function = getattr(choice, "function", None)
    if function is not None:
        name = getattr(function, "name", None)
        names = [getattr(getattr(t, "function", None), "name", None) for t in tools]
        if name not in names:
            return f"tool_choice names the function {str(name)[:200]!r}, which is not in tools"
    return None


def checked_prepare(original: Callable) -> Callable:
    """``ChatRunner.prepare`` refusing what ``request_problems`` finds (before any session exists)."""

    @functools.wraps(original)
    async def prepare(cls: Any, server_context: Any, request: Any, *args: Any, **kwargs: Any):
        backend = getattr(getattr(server_context, "async_engine", None), "backend", None)
        request = request_fields.fold(request)  # vLLM's guided_* fields: one response_format
        request = request_fields.with_body_budget(request)  # the body's tokenrails_budget, on the format too
        # TurboMind runs stock's request path: its own compiler, none of the upgrade's refusals
        problem = None if backend == "turbomind" else request_problems(request, front_limits())
        if problem is not None:
            from lmdeploy.serve.core.exceptions import ErrorCode, RequestError

            raise RequestError(ErrorCode.INVALID_REQUEST, problem)
        # the response parser is built here, before ``preprocess``: it must know the engine too
        token = ENGINE_BACKEND.set(backend) if isinstance(backend, str) else None
        try:
            return await original(server_context, request, *args, **kwargs)
        finally:
            if token is not None:
                ENGINE_BACKEND.reset(token)

    return prepare


def patch_chat_runner(p: Any) -> None:
    """Wrap ``ChatRunner.prepare`` (LMDeploy's chat endpoint; absent in other versions: no-op)."""
    import importlib

    try:
        cr = importlib.import_module("lmdeploy.serve.core.chat_runner")
    except ImportError:  # no server extras: no chat endpoint to check
        return
    runner = getattr(cr, "ChatRunner", None)
    if runner is None or "prepare" not in runner.__dict__:
        return
    p.set(runner, "prepare", classmethod(checked_prepare(runner.prepare)))
