"""Optional C kernels: which are built, and the switch that turns them off.

``tokenrails._apply_native`` (the CPU bitmask apply), ``tokenrails._fsm_native`` (the FSM
backend's token-trie walk) and ``tokenrails._dfa_native`` (its regex-to-DFA construction) are compiled at install time when a C compiler is present; every caller
keeps a numpy path for when they are not. ``TOKENRAILS_NATIVE=0`` forces the numpy paths (read on
every :func:`load`, so tests can compare both in one process).
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Optional

from ._env import env_lookup

NATIVE_ENV = "TOKENRAILS_NATIVE"
MODULES = ("apply", "fsm", "dfa")
_LOADED: dict[str, Optional[ModuleType]] = {}
_switch = env_lookup(NATIVE_ENV)  # read on every load(): the CPU apply asks once per decoding step


def enabled() -> bool:
    """False when ``TOKENRAILS_NATIVE`` is set to 0/false/off."""
    value = _switch()
    return value is None or value.strip().lower() not in ("0", "false", "off", "no")


def load(name: str) -> Optional[ModuleType]:
    """The native module ``tokenrails._<name>_native``, or None if disabled or not built."""
    if not enabled():
        return None
    if name not in _LOADED:
        try:
            _LOADED[name] = importlib.import_module(f"tokenrails._{name}_native")
        except ImportError:
            _LOADED[name] = None
    return _LOADED[name]


def status() -> dict[str, bool]:
    """Which native modules are active right now (for ``tokenrails check`` and bug reports)."""
    return {name: load(name) is not None for name in MODULES}
