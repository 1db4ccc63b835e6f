"""The start-up hook is one standalone file: it owns the environment names, imports nothing of
tokenrails, and the package uses the copy the process runs (issue 23: the start-up circle)."""
from __future__ import annotations

import ast
import sys

from tokenrails.engine_patch.lmdeploy.boot import hook_file as _hook_file, inherit


def test_the_hook_imports_nothing_of_tokenrails_at_load():
    tree = ast.parse(_hook_file.HOOK_PATH.read_text(encoding="utf-8"))
    top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top_level for a in n.names] + [n.module or "" for n in top_level if isinstance(n, ast.ImportFrom)]
    assert names and not any(name.startswith("tokenrails") or name.startswith(".") for name in names)
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))


def test_one_copy_and_the_names_come_from_it():
    hook = _hook_file.startup_hook()
    assert hook is sys.modules[_hook_file.HOOK_MODULE] is _hook_file.startup_hook()
    assert hook.MODULE_NAME == _hook_file.HOOK_MODULE
    assert (inherit.ENV_FLAG, inherit.ENV_CPU) == (hook.ENV_FLAG, hook.ENV_CPU)
    import tokenrails.engine_patch.lmdeploy as package

    assert package.ENV_FLAG == hook.ENV_FLAG


def test_the_pth_line_is_written_from_the_names():
    hook = _hook_file.startup_hook()
    assert repr(hook.ENV_FLAG) in hook.PTH_LINE and repr(hook.ENV_CPU) in hook.PTH_LINE
    assert repr(hook.MODULE_NAME) in hook.PTH_LINE
    assert (inherit.SITECUSTOMIZE_DIR / "sitecustomize.py").read_text().count(
        repr(hook.MODULE_NAME).replace("'", '"')) >= 1
