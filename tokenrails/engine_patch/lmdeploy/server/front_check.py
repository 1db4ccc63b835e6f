"""The api_server's early check of a ``response_format``, kept off the server's event loop.

LMDeploy calls ``ensure_response_format_compilable`` synchronously inside the coroutine
``AsyncEngine.preprocess``, on the event loop every client shares: whatever it does stalls every
request. So the work is split (docs/safety.md, "The api_server's front end"):

* on the loop, only cheap bounded work: a memo lookup, and parsing a small format
  (``INLINE_PARSE_NODES``); a larger one parses on the loop's default executor. Small formats
  must not hop: an ``await`` that yields lets the engine start a prefill with a partial batch;
* everything that can take time (schema walks, the probe compile, its first mask) runs in the
  core manager of ``request_parsing.probe_manager`` (the engine's backend setting and limits, the
  probe vocabulary, one compile cache, a pool shared fairly between clients); concurrent requests
  for one spec share one compile, and verdicts are that manager's cache entries;
* a budget request whose shortest output cannot fit its ``max_tokens`` is refused here too
  (budget_front.py);
* the request's compile deadline starts at its arrival (``client_identity.ARRIVED``): the
  engine's managers get what is left of it, so the front check and the engine together never
  wait past one ``compile_timeout_s``;
* the verdict reaches LMDeploy's own synchronous call through a context variable
  (``request_parsing.FRONT_VERDICT``), so the stock ``preprocess`` raises it with its own clean-up.

``checked_prepare`` adds the chat endpoint's request-level checks (a ``tool_choice`` naming a
missing function, ``tool_choice="required"`` with a ``response_format``, too many tools: HTTP 400),
for the PyTorch engine only: a TurboMind engine gets stock's request path (engines.py).
"""
from __future__ import annotations

import asyncio
import functools
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

from ....guided.errors import (
    GuideError,
    GuideLimitError,
    GuideTimeoutError,
    InvalidGuideError,
    UnsupportedGuideError,
    detached_copy,
)
from ....guided.clients import LOCAL, current_client
from ....guided.limits import GuideLimits
from . import budget_front, handle_pool, request_fields
from .client_identity import ARRIVED
from . import request_parsing as req
from .engines import ENGINE_BACKEND, stock_check_for_turbomind
from ..boot.settings import configured_limits as front_limits

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

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # one asyncio view of each in-flight check per event loop: its waiters all wake in the same
        # turn of the loop, so a batch's requests for a new format reach the engine together (one
        # wrapper per waiter woke them over several turns, and the engine prefilled part of the batch)
        self._views: dict[tuple[tuple[str, int], int], tuple[asyncio.Future, Future, float]] = {}
        self._builds: dict[tuple[Any, ...], asyncio.Future] = {}

    async def verdict(self, spec: Any, limits: GuideLimits) -> GuideError | None:
        """The typed error compiling ``spec`` raises (detached), or None; never blocks the loop."""
        outcome = await self.compiled(spec, limits)
        return outcome if isinstance(outcome, GuideError) else None

    async def compiled(self, spec: Any, limits: GuideLimits, tokenizer: Any = None) -> Any:
        """``spec`` compiled by the front's manager (the probe vocabulary, or ``tokenizer``'s), or
        its typed error (detached); never blocks the loop."""
        mgr = await self._manager(limits, tokenizer)
        view_key = (spec.key, id(mgr))
        pending = self._pending_view(view_key)  # wake with the requests already waiting on it
        if pending is not None:
            view, future, deadline = pending
        else:
            future, deadline = mgr.compile_future(spec)  # the manager's cache, in-flight table, fair pool
            if future.done():
                return _outcome(future)
            view = self._view(view_key, future, deadline)
        try:
            await asyncio.wait_for(asyncio.shield(view), timeout=max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            mgr.give_up(spec, future)  # a worker process compiling it is stopped now
            return GuideTimeoutError(
                f"limit compile_timeout_s={limits.compile_timeout_s} exceeded: checking this constraint "
                "did not finish in time", limit="compile_timeout_s", value=limits.compile_timeout_s)
        except Exception:  # noqa: BLE001 - the compile's own error, read from the future below
            pass
        return _outcome(future)

    async def _manager(self, limits: GuideLimits, tokenizer: Any = None) -> Any:
        """The probe manager for these settings. The first check builds it off the loop; requests
        arriving meanwhile await that same build even when its thread has already stored the
        manager (the loop hears of it a turn later), so every request of the build resumes in one
        turn instead of the late ones overtaking the early ones."""
        from ..boot.settings import backend

        loop = asyncio.get_running_loop()
        slot = (backend(), limits, id(tokenizer), id(loop))
        with self._lock:
            build = self._builds.get(slot)
            if build is None or build.get_loop() is not loop:
                mgr = req.built_probe_manager(limits, tokenizer=tokenizer)
                if mgr is not None:
                    return mgr
                build = self._builds[slot] = loop.run_in_executor(
                    None, functools.partial(req.probe_manager, limits, tokenizer=tokenizer))
                build.add_done_callback(lambda done: self._builds.pop(slot, None))
        return await build

    def _pending_view(self, key: tuple[str, int]) -> tuple[asyncio.Future, Future, float] | None:
        """This loop's not yet finished view of a check of ``key`` (spec key, manager), if requests
        are waiting on one."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._views.get((key, id(loop)))
        if entry is None or entry[0].done() or entry[0].get_loop() is not loop:
            return None
        return entry

    def _view(self, key: tuple[str, int], future: Future, deadline: float) -> asyncio.Future:
        """This loop's one asyncio future of ``future`` (made by its first waiter)."""
        loop = asyncio.get_running_loop()
        slot = (key, id(loop))
        with self._lock:
            entry = self._views.get(slot)
            if entry is None or entry[1] is not future or entry[0].get_loop() is not loop:
                view = asyncio.wrap_future(future, loop=loop)
                self._views[slot] = (view, future, deadline)
                view.add_done_callback(functools.partial(self._forget_view, slot))
                return view
            return entry[0]

    def _forget_view(self, slot: tuple[tuple[str, int], int], view: asyncio.Future) -> None:
        with self._lock:
            entry = self._views.get(slot)
            if entry is not None and entry[0] is view:
                del self._views[slot]


def _outcome(future: Future) -> Any:
    """A finished compile's guide, or its typed error detached from its traceback."""
    exc = future.exception()
    if exc is None:
        return future.result()
    if isinstance(exc, GuideError):
        return detached_copy(exc)
    return InvalidGuideError(f"the constraint cannot be checked: {exc!r}"[:2000])


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
        start = ARRIVED.get() or time.time()  # the request's one compile deadline counts from its arrival
        gen_config = _gen_config_of(args, kwargs)
        fmt = getattr(gen_config, "response_format", None)
        token = None
        pending = None  # (deadline, key) while the request's spec is not compiled yet (handle_pool.py)
        if fmt is not None and getattr(self, "backend", None) != "turbomind":
            due = start + front_limits().compile_timeout_s
            # a large format parses off the loop; a small one here, so a batch's requests reach
            # the engine together
            if parses_inline(fmt):
                spec = _parse(fmt)
            else:
                spec = await asyncio.get_running_loop().run_in_executor(None, _parse, fmt)
            if spec is not None:
                probe = req.built_probe_manager(front_limits())
                if probe is None or probe.settled(spec) is None:
                    pending = (due, spec.key)
                err = await FRONT.verdict(spec, front_limits())
                if err is None:  # a budget whose shortest output cannot fit: refused before generation
                    err = await budget_front.refusal(FRONT.compiled, self, spec,
                                                     getattr(gen_config, "max_new_tokens", None), front_limits())
                token = req.FRONT_VERDICT.set((id(fmt), err))
                client = current_client()
                if client != LOCAL:  # the engine's compile pool is fair between the server's clients
                    req.with_client(fmt, client)
                if err is None:  # the engine's wait is what is left of it, not a second full deadline
                    req.with_request_deadline(fmt, due)
        try:
            prepared = await original(self, *args, **kwargs)
        finally:
            if token is not None:
                req.FRONT_VERDICT.reset(token)
        if getattr(self, "backend", None) != "turbomind":  # the share of handles it is counted in
            handle_pool.mark(getattr(prepared, "session", None), current_client(), pending)
        return prepared

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
