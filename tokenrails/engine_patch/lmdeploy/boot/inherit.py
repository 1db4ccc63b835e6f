"""``activate(...)`` reaches every process LMDeploy starts, with all its settings.

The api_server runs the engine in a spawned process, TP > 1 starts workers, and the model agent
(where the guided manager lives) runs there; a patch made in the parent is lost in them. So
``activate`` exports its settings record (settings.py) into ``os.environ`` (inherited by every
child, Ray's local workers included), makes sure children run the start-up hook (the installed
``.pth``; in an editable or hook-less install, the ``_sitecustomize`` directory prepended to
``PYTHONPATH``), and the child reads the same record back from its environment.
``deactivate`` restores the environment.
"""
from __future__ import annotations

import os
from pathlib import Path

from ...._env import SETTINGS
from . import settings
from .hook_file import startup_hook

_HOOK = startup_hook()  # owns the names its children read: the upgrade flag and the CPU device
ENV_FLAG = _HOOK.ENV_FLAG
ENV_CPU = _HOOK.ENV_CPU  # children enable the CPU device path (cpu/enable.py)
SITECUSTOMIZE_DIR = Path(__file__).with_name("_sitecustomize")

_SAVED: dict[str, str | None] = {}  # variable -> value before the first export (None: unset)


def export(record: settings.Settings) -> None:
    """Write the flag and the record's settings for children; remember what was there before."""
    _set(ENV_FLAG, "1")
    for name, value in record.environment().items():
        _set(name, value)
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
    names = (ENV_FLAG, ENV_CPU, *SETTINGS, "PYTHONPATH")  # SETTINGS: the record's and every other switch
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


def _set(name: str, value: str) -> None:
    _SAVED.setdefault(name, os.environ.get(name))
    os.environ[name] = value

