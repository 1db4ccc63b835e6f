"""What ``activate(...)`` configured for managers built afterwards (one process-wide record).

Kept apart from ``rank_manager.py`` so the request front (``request_parsing.py``, ``front_check.py``) reads the
same limits without importing the manager, which itself parses requests (``stock_calls.py``).
"""
from __future__ import annotations

import os
from typing import Any

from ....guided.limits import DEFAULT_LIMITS, GuideLimits
from ...reasoning_settings import parse_setting
from .inherit import ENV_BUDGET, fill_threads_from_env, limits_from_env

CONFIG: dict[str, Any] = {"backend": None, "limits": None, "fill_threads": None, "reasoning": None,
                          "budget": None}
BUDGET_VALUES = ("close", "off")


def configure(*, backend: str | None = None, limits: GuideLimits | None = None,
              fill_threads: int | None = None, reasoning: Any = None, budget: str | None = None) -> None:
    """Defaults for managers built after this call (``activate(...)`` forwards its options).

    ``reasoning`` and ``budget`` are parsed here so a bad value fails ``activate()`` at once.
    """
    CONFIG.update(backend=backend, limits=limits, fill_threads=fill_threads, reasoning=parse_setting(reasoning),
                  budget=check_budget(budget, "budget"))


def check_budget(value: Any, where: str) -> str | None:
    """``"close"``, ``"off"`` or None; anything else is refused (``ValueError``)."""
    if value is None or value in BUDGET_VALUES:
        return value
    raise ValueError(f"{where} must be \"close\" or \"off\", got {value!r}")


def budget_default() -> str | None:
    """The engine-wide budget setting: ``activate(budget=...)``, else (a child process, or the
    variable set by hand) ``$TOKENRAILS_BUDGET``; None: off. A bad variable fails loudly."""
    value = CONFIG["budget"]
    if value is None:
        value = os.environ.get(ENV_BUDGET) or None
        check_budget(value, ENV_BUDGET)
    return value


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


ENGINE_PER_CLIENT = 4  # an engine's compiles one client may run at once (its others queue behind them)


def compile_per_client() -> int:
    """``TOKENRAILS_COMPILE_PER_CLIENT``: compiles one api_server client may run at once in the
    engine (the others share the rest; compiles with no client named are not capped)."""
    raw = os.environ.get("TOKENRAILS_COMPILE_PER_CLIENT", "")
    try:
        return max(1, int(raw)) if raw.strip() else ENGINE_PER_CLIENT
    except ValueError:
        return ENGINE_PER_CLIENT


def compile_cache_dir() -> str | None:
    """Where the engine keeps compiled guides across restarts (``TOKENRAILS_COMPILE_CACHE_DIR``;
    unset: memory only)."""
    return os.environ.get("TOKENRAILS_COMPILE_CACHE_DIR") or None


def backend() -> str:
    return CONFIG["backend"] or os.environ.get("TOKENRAILS_LMDEPLOY_BACKEND", "auto")


def reasoning_default() -> Any:
    return CONFIG["reasoning"]


def pop_budget_option(argv: list[str]) -> tuple[list[str], str | None]:
    """``--budget close|off`` / ``--budget=...`` taken out of an LMDeploy command line."""
    out: list[str] = []
    value: str | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--budget":
            if i + 1 >= len(argv):
                raise SystemExit("--budget needs a value: close or off")
            value, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--budget="):
            value = arg.split("=", 1)[1]
        else:
            out.append(arg)
        i += 1
    if value is not None and value not in BUDGET_VALUES:
        raise SystemExit(f"--budget takes close or off, got {value!r}")
    return out, value
