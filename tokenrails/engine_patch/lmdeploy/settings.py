"""What ``activate(...)`` configured for managers built afterwards (one process-wide record).

Kept apart from ``manager.py`` so the request front (``requests.py``, ``front_check.py``) reads the
same limits without importing the manager, which itself parses requests (``stock_calls.py``).
"""
from __future__ import annotations

import os
from typing import Any

from ...guided.limits import DEFAULT_LIMITS, GuideLimits
from ..reasoning import parse_setting
from .inherit import fill_threads_from_env, limits_from_env

CONFIG: dict[str, Any] = {"backend": None, "limits": None, "fill_threads": None, "reasoning": None}


def configure(*, backend: str | None = None, limits: GuideLimits | None = None,
              fill_threads: int | None = None, reasoning: Any = None) -> None:
    """Defaults for managers built after this call (``activate(...)`` forwards its options).

    ``reasoning`` is parsed here so a bad value fails ``activate()`` at once.
    """
    CONFIG.update(backend=backend, limits=limits, fill_threads=fill_threads, reasoning=parse_setting(reasoning))


def configured_limits() -> GuideLimits:
    """The limits the engine's manager compiles with (``activate(limits=...)`` or the parent's
    environment): the api_server's front-end check judges requests by the same bounds."""
    return manager_limits() or DEFAULT_LIMITS


def manager_limits() -> GuideLimits | None:
    """``activate(limits=...)``, else (a child process) the parent's; None: the manager's defaults."""
    return CONFIG["limits"] or limits_from_env()


def manager_fill_threads() -> int | None:
    return CONFIG["fill_threads"] or fill_threads_from_env()  # a child process: the parent's


FRONT_WORKERS = 2  # the api_server's probe compiles at once (a few cores; a hostile flood queues)
COMPILE_PROCESSES = 2  # default worker processes per manager for large compiles (compile_procs.py)


def compile_processes() -> int:
    """Worker processes for large compiles (``TOKENRAILS_COMPILE_PROCESSES``; 0: in-process,
    where a compile past its deadline cannot be stopped)."""
    raw = os.environ.get("TOKENRAILS_COMPILE_PROCESSES", "")
    try:
        return max(0, int(raw)) if raw.strip() else COMPILE_PROCESSES
    except ValueError:
        return COMPILE_PROCESSES


def compile_cache_dir() -> str | None:
    """Where the engine keeps compiled guides across restarts (``TOKENRAILS_COMPILE_CACHE_DIR``;
    unset: memory only)."""
    return os.environ.get("TOKENRAILS_COMPILE_CACHE_DIR") or None


def backend() -> str:
    return CONFIG["backend"] or os.environ.get("TOKENRAILS_LMDEPLOY_BACKEND", "auto")


def reasoning_default() -> Any:
    return CONFIG["reasoning"]
