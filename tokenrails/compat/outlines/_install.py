"""Opt-in ``import outlines`` → this shim, by aliasing modules in ``sys.modules``.

``install()`` must run before the application imports outlines; ``uninstall()`` restores
whatever was there (the real outlines, or nothing).
"""
from __future__ import annotations

import importlib
import pkgutil
import sys
from types import ModuleType

_PACKAGE = __name__.rpartition(".")[0]
_saved: dict[str, ModuleType | None] | None = None


def shim_modules() -> dict[str, ModuleType]:
    """``{"outlines.x.y": tokenrails.compat.outlines.x.y}`` for every public shim module."""
    root = importlib.import_module(_PACKAGE)
    out = {"outlines": root}
    for info in pkgutil.walk_packages(root.__path__, prefix=_PACKAGE + "."):
        tail = info.name[len(_PACKAGE) + 1:]
        if any(part.startswith("_") for part in tail.split(".")) and tail != "_version":
            continue
        out["outlines." + tail] = importlib.import_module(info.name)
    return out


def install(api_version: str | None = None) -> None:
    """Make ``import outlines`` (and its submodules) resolve to the tokenrails shim.

    ``api_version`` ("0.0.46", "0.1.14", "1.3.3"...) picks the outlines release whose behaviour
    the shim follows where releases differ (``_api_version.py``: 0.0.x stops ``generate.*`` at the
    first accepting state); ``None`` keeps the current choice (default 1.3.3).
    """
    global _saved
    if api_version is not None:
        from ._api_version import set_api_version

        set_api_version(api_version)
    modules = shim_modules()
    if _saved is None:
        _saved = {name: sys.modules.get(name) for name in modules}
        _saved.update({n: m for n, m in sys.modules.items() if n == "outlines" or n.startswith("outlines.")})
    for name in [n for n in sys.modules if n == "outlines" or n.startswith("outlines.")]:
        if name not in modules:
            del sys.modules[name]  # a real outlines submodule must not mix with the shim
    sys.modules.update(modules)


def uninstall() -> None:
    """Undo ``install()``: the previous ``outlines`` modules (if any) come back."""
    global _saved
    if _saved is None:
        return
    from ._api_version import set_api_version

    set_api_version(None)
    for name in [n for n in sys.modules if n == "outlines" or n.startswith("outlines.")]:
        del sys.modules[name]
    sys.modules.update({n: m for n, m in _saved.items() if m is not None})
    _saved = None


def is_installed() -> bool:
    return sys.modules.get("outlines") is importlib.import_module(_PACKAGE)
