"""``activate(...)`` reaches every process LMDeploy starts, with all its settings.

The api_server runs the engine in a spawned process, TP > 1 starts workers, and the model agent
(where the guided manager lives) runs there; a patch made in the parent is lost in them. So
``activate`` also writes its settings into ``os.environ`` (inherited by every child, Ray's
local workers included), makes sure children run the start-up hook (the installed ``.pth``; in an
editable or hook-less install, the ``_sitecustomize`` directory prepended to ``PYTHONPATH``), and
the child's hook-driven ``activate()`` reads them back. ``deactivate`` restores the environment.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from ...._env import SETTINGS
from ....guided.limits import GuideLimits
from .hook_file import startup_hook

_HOOK = startup_hook()  # owns the names its children read: the upgrade flag and the CPU device
ENV_FLAG = _HOOK.ENV_FLAG
ENV_CPU = _HOOK.ENV_CPU  # children enable the CPU device path (cpu/enable.py)
ENV_BACKEND = "TOKENRAILS_LMDEPLOY_BACKEND"
ENV_LIMITS = "TOKENRAILS_LMDEPLOY_LIMITS"
ENV_REASONING = "TOKENRAILS_REASONING"
ENV_TOOL_CALLS = "TOKENRAILS_TOOL_CALLS"
ENV_FILL_THREADS = "TOKENRAILS_LMDEPLOY_FILL_THREADS"
ENV_BUDGET = "TOKENRAILS_BUDGET"
SITECUSTOMIZE_DIR = Path(__file__).with_name("_sitecustomize")

_SAVED: dict[str, str | None] = {}  # variable -> value before the first export (None: unset)


def export(*, backend: str | None, limits: GuideLimits | None, reasoning: Any,
           tool_calls: bool | None = None, fill_threads: int | None = None, budget: str | None = None) -> None:
    """Write the flag and the given settings for children; remember what was there before."""
    _set(ENV_FLAG, "1")
    if budget is not None:
        _set(ENV_BUDGET, budget)
    if fill_threads is not None:
        _set(ENV_FILL_THREADS, str(int(fill_threads)))
    if tool_calls is not None:
        _set(ENV_TOOL_CALLS, "1" if tool_calls else "0")
    if backend is not None:
        _set(ENV_BACKEND, backend)
    if limits is not None:
        _set(ENV_LIMITS, json.dumps(dataclasses.asdict(limits)))
    if isinstance(reasoning, str):  # a ReasoningConfig object stays in this process (token ids
        _set(ENV_REASONING, reasoning)  # need the vocabulary); give the setting as text to share it
    _hook_for_children(persistent=False)


def export_cpu() -> None:
    """The CPU device path for every child (TP workers, the api_server's engine process), for as
    long as this process lives: ``deactivate`` turns the upgrade off, not the device."""
    os.environ[ENV_CPU] = "1"
    _SAVED.pop(ENV_CPU, None)
    _hook_for_children(persistent=True)


def _hook_for_children(*, persistent: bool) -> None:
    """Children run the start-up hook: the installed ``.pth``, else ``_sitecustomize`` on PYTHONPATH."""
    if _HOOK.pth_installed():
        return
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(SITECUSTOMIZE_DIR) not in entries:
        value = os.pathsep.join([str(SITECUSTOMIZE_DIR)] + entries)
        if persistent:
            os.environ["PYTHONPATH"] = value
        else:
            _set("PYTHONPATH", value)
    if persistent and "PYTHONPATH" in _SAVED:  # restore() must not take the hook away
        saved = [p for p in (_SAVED["PYTHONPATH"] or "").split(os.pathsep) if p]
        if str(SITECUSTOMIZE_DIR) not in saved:
            _SAVED["PYTHONPATH"] = os.pathsep.join([str(SITECUSTOMIZE_DIR)] + saved)


def child_env() -> dict[str, str]:
    """The variables a child needs to come up upgraded with this process's settings: for Ray
    workers, whose environment is the cluster's (a cluster started before ``activate`` — or on
    another node — never saw ours), passed in their ``runtime_env``."""
    names = (ENV_FLAG, ENV_BACKEND, ENV_LIMITS, ENV_REASONING, ENV_TOOL_CALLS, ENV_CPU, ENV_FILL_THREADS, ENV_BUDGET,
             *SETTINGS, "PYTHONPATH")  # SETTINGS: every other switch the code reads (grammar drafts, overlap...)
    return {n: os.environ[n] for n in names if n in os.environ}


def patched_update_runtime_envs(original):
    """LMDeploy's ``_update_runtime_envs`` (what every Ray worker of the engine starts with),
    plus ``child_env()``."""

    def _update_runtime_envs(runtime_env: dict):
        runtime_env = original(runtime_env)
        runtime_env.setdefault("env_vars", {}).update(child_env())
        return runtime_env

    _update_runtime_envs.__wrapped__ = original
    return _update_runtime_envs


def restore() -> None:
    """Put back every variable ``export`` changed."""
    for name, value in _SAVED.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _SAVED.clear()


def limits_from_env() -> GuideLimits | None:
    """The parent's ``GuideLimits`` (None when it set none); a malformed value fails loudly."""
    text = os.environ.get(ENV_LIMITS)
    if not text:
        return None
    try:
        return GuideLimits(**json.loads(text))
    except (TypeError, ValueError) as exc:
        raise RuntimeError(f"tokenrails: {ENV_LIMITS} is not a GuideLimits: {exc}") from exc


def fill_threads_from_env() -> int | None:
    """The parent's ``activate(fill_threads=N)`` (None when it set none); malformed fails loudly."""
    text = os.environ.get(ENV_FILL_THREADS)
    if not text:
        return None
    try:
        value = int(text)
    except ValueError as exc:
        raise RuntimeError(f"tokenrails: {ENV_FILL_THREADS} is not an integer: {text!r}") from exc
    return value if value > 0 else None


def _set(name: str, value: str) -> None:
    _SAVED.setdefault(name, os.environ.get(name))
    os.environ[name] = value

