"""Every-process activation: a ``.pth`` start-up hook plus a lazy import hook.

LMDeploy's api_server runs the engine in a spawned process and TP workers are separate
processes; a patch made only in the parent is lost there. With ``TOKENRAILS_LMDEPLOY=1`` in the
environment (inherited by every child), the ``.pth`` line below loads *this file by path* (no
``tokenrails``/``torch`` import) and installs a ``sys.meta_path`` finder. The finder only watches
``lmdeploy`` modules; once an import statement that loaded LMDeploy's engine or serving core
returns (the outermost LMDeploy import finished, so no package is half-initialized), it calls
``tokenrails.engine_patch.lmdeploy.activate()``. Processes that never import LMDeploy pay one
environment lookup. This file must stay importable without importing ``tokenrails``.

This file owns the names of the variables it reads (``ENV_FLAG``, ``ENV_CPU``); the ``.pth`` line
is written from them. It is a script loaded by file path, never imported as part of the package by
tokenrails code: the package reaches it through ``hook_file.startup_hook()``, which returns the
copy this process already runs (one copy, one finder), so the modules this hook starts do not
import it back. It starts the package (``activate``) and the CPU device port, so it stands above
both, beside the other entry points (``lmdeploy_cli``, ``proxy_serve``).
"""
from __future__ import annotations

import os
import sys
import sysconfig
import threading
from importlib.abc import MetaPathFinder

ENV_FLAG = "TOKENRAILS_LMDEPLOY"
ENV_CPU = "TOKENRAILS_LMDEPLOY_CPU"  # set by cpu.enable(): children register the CPU device too
PTH_NAME = "tokenrails_lmdeploy.pth"
MODULE_NAME = "_tokenrails_lmdeploy_startup"  # sys.modules name of the one loaded copy
TRIGGERS = frozenset({
    "lmdeploy.pytorch.engine",              # engine process, pipeline(...)
    "lmdeploy.pytorch.engine.model_agent",  # TP / DP worker processes
    "lmdeploy.serve.core.async_engine",     # api_server front end (request validation)
})

# One line, executed by ``site`` at interpreter start-up (``.pth`` lines starting with "import").
PTH_LINE = (
    "import os; any(os.environ.get(k, '0').lower() not in ('', '0', 'false', 'no') "
    f"for k in ({ENV_FLAG!r}, {ENV_CPU!r})) and "
    "__import__('importlib.util').util.find_spec('tokenrails') is not None and exec("
    "\"import importlib.util as u, os.path as p, sys\\n"
    "s = u.find_spec('tokenrails')\\n"
    f"f = u.spec_from_file_location({MODULE_NAME!r}, "
    "p.join(s.submodule_search_locations[0], 'engine_patch', 'lmdeploy', 'startup.py'))\\n"
    "m = u.module_from_spec(f); sys.modules[f.name] = m; f.loader.exec_module(m); m.install()\")\n"
)


def _truthy(environ: dict | None, name: str) -> bool:
    value = (environ if environ is not None else os.environ).get(name, "0")
    return value.strip().lower() not in ("", "0", "false", "no")


def enabled(environ: dict | None = None) -> bool:
    """The upgrade is on for this process (inherited ``activate``)."""
    return _truthy(environ, ENV_FLAG)


def hook_wanted(environ: dict | None = None) -> bool:
    """Something must happen once LMDeploy is imported: the upgrade, the CPU device, or both."""
    return enabled(environ) or _truthy(environ, ENV_CPU)


def _on_lmdeploy_imported() -> None:
    import importlib

    if _truthy(None, ENV_CPU):
        importlib.import_module("tokenrails.engine_patch.lmdeploy.cpu").enable()
    if enabled():
        importlib.import_module("tokenrails.engine_patch.lmdeploy").activate()


class _LoaderProxy:
    """Wraps an LMDeploy module's loader to see when the outermost LMDeploy import finishes."""

    def __init__(self, loader, finder: "LMDeployImportHook"):
        self._loader = loader
        self._finder = finder

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        f = self._finder
        f.depth_enter()
        try:
            self._loader.exec_module(module)
        finally:
            if module.__name__ in TRIGGERS:
                f.triggered = True
            if f.depth_leave() == 0 and f.triggered:
                f.fire()


class LMDeployImportHook(MetaPathFinder):
    """``sys.meta_path`` entry; inert for every module outside ``lmdeploy``."""

    def __init__(self) -> None:
        self.triggered = False
        self.fired = False
        self._local = threading.local()
        self._busy = threading.local()

    def depth_enter(self) -> None:
        self._local.depth = getattr(self._local, "depth", 0) + 1

    def depth_leave(self) -> int:
        self._local.depth = getattr(self._local, "depth", 1) - 1
        return self._local.depth

    def find_spec(self, fullname, path=None, target=None):
        if not (fullname == "lmdeploy" or fullname.startswith("lmdeploy.")) or self.fired:
            return None
        if getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.on = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _LoaderProxy(spec.loader, self)
        return spec

    def fire(self) -> None:
        if self.fired:
            return
        self.fired = True
        _remove_hook()
        _on_lmdeploy_imported()


_HOOK: LMDeployImportHook | None = None


def _remove_hook() -> None:
    if _HOOK is not None and _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)


def install() -> None:
    """Activate now if LMDeploy's engine is already imported, else on its first import."""
    global _HOOK
    if not hook_wanted():
        return
    if any(name in sys.modules for name in TRIGGERS):
        _on_lmdeploy_imported()
        return
    if _HOOK is None:
        _HOOK = LMDeployImportHook()
        sys.meta_path.insert(0, _HOOK)


def site_dir() -> str:
    return sysconfig.get_paths()["purelib"]


def install_pth(directory: str | None = None, name: str = PTH_NAME) -> str:
    """Write the ``.pth`` hook into ``directory`` (default: this interpreter's site-packages)."""
    path = os.path.join(directory or site_dir(), name)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(PTH_LINE)
    return path


def uninstall_pth(directory: str | None = None, name: str = PTH_NAME) -> bool:
    path = os.path.join(directory or site_dir(), name)
    if os.path.exists(path):
        os.remove(path)
        return True
    return False


def pth_installed(directory: str | None = None, name: str = PTH_NAME) -> bool:
    path = os.path.join(directory or site_dir(), name)
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read() == PTH_LINE
    except OSError:
        return False
