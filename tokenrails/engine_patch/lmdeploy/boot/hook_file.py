"""The start-up hook (``startup.py``) as this process runs it: one copy, loaded by file path.

The hook must load before ``tokenrails`` itself can be imported (a ``.pth`` line, a
``sitecustomize``), so it is a standalone file, and it owns the environment names it reads. The
package needs those names and the ``.pth`` helpers too; importing ``startup`` as a package module
would give a second copy of the file beside the one the interpreter started with, and an import
circle (the hook starts the modules that would import it). ``startup_hook()`` returns the copy
already in ``sys.modules`` under the hook's own name, or loads the file once under that name.
"""
from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType

HOOK_PATH = Path(__file__).parent.parent / "startup.py"
HOOK_MODULE = "_tokenrails_lmdeploy_startup"  # = startup.MODULE_NAME (checked by the tests)
_LOCK = threading.Lock()


def startup_hook() -> ModuleType:
    """The start-up hook module of this process (loaded on first use, by path)."""
    module = sys.modules.get(HOOK_MODULE)
    if module is not None:
        return module
    with _LOCK:
        module = sys.modules.get(HOOK_MODULE)
        if module is None:
            spec = importlib.util.spec_from_file_location(HOOK_MODULE, HOOK_PATH)
            module = importlib.util.module_from_spec(spec)
            sys.modules[HOOK_MODULE] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(HOOK_MODULE, None)
                raise
        return module
