"""Guided CPU time per process (per TP rank), for bench/lmdeploy_tp.py; off unless asked for.

With ``TOKENRAILS_GUIDED_CPU_METER=<path prefix>`` in the environment (TP ranks inherit it), the
upgrade's guided entry points - vocabulary build, grammar compile, mask fill, mask apply, token accept
- count their *thread* CPU time (``time.thread_time``: a thread blocked on a lock or a peer costs
nothing), and each process writes ``<prefix>.<pid>.json``: ``{"rank", "seconds", "calls", "by"}``,
at most every 0.2 s and at exit. The numbers are per process, whichever thread did the work.
"""
from __future__ import annotations

import atexit
import json
import os
import threading
import time
from typing import Any, Callable

ENV_METER = "TOKENRAILS_GUIDED_CPU_METER"
_LOCK = threading.Lock()
_BY: dict[str, list[float]] = {}  # entry point -> [seconds, calls]
_LAST_WRITE = [0.0]
_WRITE_LOCK = threading.Lock()


_RANK: list[int | None] = [None]


def set_rank(rank: int | None) -> None:
    """This process's TP rank (told by the agent factory, tp_ranks.py); writes the report at once, so
    a rank that does no guided work still has one."""
    _RANK[0] = rank
    _write(force=True)


def snapshot() -> dict[str, Any]:
    with _LOCK:
        by = {k: {"seconds": v[0], "calls": int(v[1])} for k, v in _BY.items()}
    return {"pid": os.getpid(), "rank": _RANK[0], "seconds": sum(v["seconds"] for v in by.values()),
            "calls": sum(v["calls"] for v in by.values()), "by": by}


def _write(force: bool = False) -> None:
    prefix = os.environ.get(ENV_METER)
    if not prefix:
        return
    with _WRITE_LOCK:
        now = time.monotonic()
        if not force and now - _LAST_WRITE[0] < 0.2:
            return
        _LAST_WRITE[0] = now
        path = f"{prefix}.{os.getpid()}.json"
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(snapshot(), f)
        os.replace(tmp, path)


def _metered(name: str, fn: Callable) -> Callable:
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.thread_time() - t0
            with _LOCK:
                entry = _BY.setdefault(name, [0.0, 0])
                entry[0] += dt
                entry[1] += 1
            _write()

    timed.__wrapped__ = fn  # type: ignore[attr-defined]
    return timed


def install(patcher: Any) -> None:
    """Wrap the guided entry points (only when the meter is asked for)."""
    if not os.environ.get(ENV_METER):
        return
    from ....guided import manager as core
    from . import rank_manager as lmdeploy_manager

    for name in ("_compile", "fill_rows", "fill_and_apply", "apply_filled", "accept_tokens"):
        patcher.set(core.GuidedDecodingManager, name,
                    _metered(name, core.GuidedDecodingManager.__dict__[name]))
    patcher.set(lmdeploy_manager, "build_vocabulary",
                _metered("build_vocabulary", lmdeploy_manager.build_vocabulary))
    atexit.register(_write, True)
