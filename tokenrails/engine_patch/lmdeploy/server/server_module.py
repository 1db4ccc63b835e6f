"""Patches of LMDeploy's api_server module, applied whenever that module gets imported.

The upgrade is often active before the api_server module exists: the start-up hook activates it as
soon as LMDeploy's serving core is imported, which ``import lmdeploy`` already does, so
``tokenrails lmdeploy serve api_server`` and every ``TOKENRAILS_LMDEPLOY=1`` process activate
first and import the server afterwards. Importing the server inside ``activate()`` instead would
cost every pipeline user about a second of fastapi/uvicorn imports. So the server's patches (the
request-body limits, the ``max_tokens`` cut notice) are applied now when the module is loaded, or
by a one-shot import finder the moment its code has run, before anything can call into it.
"""
from __future__ import annotations

import sys
import threading
from importlib.abc import MetaPathFinder
from types import ModuleType
from typing import Any, Callable, Sequence

from .._patching import Patcher

API_SERVER = "lmdeploy.serve.openai.api_server"


class _AfterLoad(MetaPathFinder):
    """Finds nothing itself: it lets the other finders find ``name`` and runs ``apply`` on the module
    right after the module's own code, once."""

    def __init__(self, name: str, apply: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.apply = apply
        self._lock = threading.Lock()
        self._armed = True

    def cancel(self) -> bool:
        """Disarm; True when this call disarmed it (the patches were not applied yet)."""
        with self._lock:
            armed, self._armed = self._armed, False
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        return armed

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname != self.name or not self._armed:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run_module = getattr(loader, "exec_module", None)
        if run_module is None:
            return spec

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            if self.cancel():
                self.apply(module)

        loader.exec_module = exec_module  # this spec's own loader instance
        return spec


def when_server_loaded(p: Patcher, apply: Callable[[ModuleType], None]) -> None:
    """``apply(api_server_module)`` now if the module is loaded, else when it is; ``p.undo()``
    disarms a pending one (the patches ``apply`` makes through ``p`` are undone with the rest)."""
    module = sys.modules.get(API_SERVER)
    if module is not None:
        apply(module)
        return
    finder = _AfterLoad(API_SERVER, apply)
    sys.meta_path.insert(0, finder)
    p.on_undo(finder.cancel)
