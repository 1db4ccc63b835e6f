"""``activate()`` patches LMDeploy once per process, however often and from wherever it is called.

A spawned TP rank or api_server engine process re-imports the user's script: a module-level
``activate()`` then runs while the start-up hook (``TOKENRAILS_LMDEPLOY=1``, inherited) fires from
inside it, and a second apply would wrap every wrapper (``tp_ranks``' lock taken twice: a hang).
Each case runs in a fresh interpreter with the hook installed the way children get it
(``_sitecustomize`` on ``PYTHONPATH``) and reports the wrapper layers of LMDeploy's patch points.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tokenrails.engine_patch.lmdeploy._patching import DoublePatchError, Patcher, is_patched

REPO = Path(__file__).resolve().parents[3]
SITECUSTOMIZE = REPO / "tokenrails" / "engine_patch" / "lmdeploy" / "boot" / "_sitecustomize"


def _wrap(original):
    def wrapper(*args):
        return "patched " + original(*args)

    wrapper.__wrapped__ = original
    return wrapper


def test_patcher_refuses_an_attribute_it_already_patched():
    mod = types.ModuleType("fake_lmdeploy_module")
    mod.f = lambda: "stock"

    class Owner:
        def g(self):
            return "stock"

    first = Patcher()
    first.set(mod, "f", _wrap(mod.f))
    first.set(Owner, "g", _wrap(Owner.g))
    assert is_patched(mod, "f") and is_patched(Owner, "g")
    with pytest.raises(DoublePatchError):  # the same wrapper again, same patcher
        first.set(mod, "f", _wrap(mod.f))
    for name, owner in (("f", mod), ("g", Owner)):  # any other patcher (another apply, another copy)
        with pytest.raises(DoublePatchError):
            Patcher().set(owner, name, lambda *a: "twice")
    assert mod.f() == "patched stock" and Owner().g() == "patched stock"
    first.set(mod, "f", lambda: "a different wrapper stacks within one apply")

    class Sub(Owner):  # a subclass of a patched class is its own owner
        pass

    assert not is_patched(Sub, "g")
    first.undo()
    assert mod.f() == "stock" and Owner().g() == "stock"
    assert not is_patched(mod, "f") and not is_patched(Owner, "g")
    second = Patcher()
    second.set(mod, "f", _wrap(mod.f))  # after undo: patchable again
    assert mod.f() == "patched stock"
    second.undo()


def test_patcher_marks_an_owner_without_attributes():
    pytest.importorskip("lmdeploy")

    class Slotted:
        __slots__ = ("annotation",)

    owner = Slotted()
    owner.annotation = int
    p = Patcher()
    p.set(owner, "annotation", str)
    with pytest.raises(DoublePatchError):
        Patcher().set(owner, "annotation", float)
    p.undo()
    assert owner.annotation is int and not is_patched(owner, "annotation")


def _run(code: str, **env_extra: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(SITECUSTOMIZE), str(REPO)]), **env_extra)
    for name in ("TOKENRAILS_LMDEPLOY", "TOKENRAILS_LMDEPLOY_CPU"):
        if name not in env_extra:
            env.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")][-1]
    return json.loads(line[len("REPORT "):])


REPORT = ("import json; from tests.engine_patch.lmdeploy import patch_layers; "
          "print('REPORT ' + json.dumps(patch_layers.report()))")


def _assert_once(rep: dict) -> None:
    assert rep["active"]
    assert rep["doubled_records"] == [], rep
    doubled = {k: n for k, n in rep["layers"].items() if n > 1}
    assert not doubled, f"patched more than once: {doubled}"
    assert rep["layers"]["lmdeploy.pytorch.engine.executor.base_worker:.build_model_agent"] == 1


@pytest.mark.slow
def test_module_level_activate_in_a_child_with_the_hook():
    """What a spawned rank does: the hook is armed, the script calls activate() before importing
    LMDeploy, the hook fires from inside activate's own imports."""
    pytest.importorskip("lmdeploy")
    rep = _run("from tokenrails.engine_patch.lmdeploy import activate\nactivate()\nactivate()\n" + REPORT,
               TOKENRAILS_LMDEPLOY="1")
    _assert_once(rep)


@pytest.mark.slow
def test_cpu_device_and_upgrade_from_the_hook_and_explicitly():
    """The CPU device registered explicitly while the hook (upgrade + device) fires inside it."""
    pytest.importorskip("lmdeploy")
    rep = _run("from tokenrails.engine_patch.lmdeploy import cpu, activate\ncpu.enable()\nactivate()\n"
               "cpu.enable()\n" + REPORT, TOKENRAILS_LMDEPLOY="1", TOKENRAILS_LMDEPLOY_CPU="1")
    _assert_once(rep)
    assert rep["layers"]["lmdeploy.pytorch.engine.model_agent.agent:BaseModelAgent.__init__"] == 1
    assert rep["layers"]["lmdeploy.pytorch.backends.selector:._get_backend"] == 1


@pytest.mark.slow
def test_a_second_copy_of_the_package_does_not_patch_again():
    """Another copy of the activate module (loaded by another path/name) finds LMDeploy marked."""
    pytest.importorskip("lmdeploy")
    code = (
        "import importlib.util, sys\n"
        "import tokenrails.engine_patch.lmdeploy as first\n"
        "first.activate()\n"
        "spec = importlib.util.spec_from_file_location('tokenrails.engine_patch.lmdeploy', first.__file__,\n"
        "    submodule_search_locations=list(first.__path__))\n"
        "copy = importlib.util.module_from_spec(spec); spec.loader.exec_module(copy)\n"
        "assert copy is not first\n"
        "copy.activate()\n"
        "from tokenrails.engine_patch.lmdeploy._patching import DoublePatchError\n"
        "assert copy.is_active() and len(copy._PATCHER) == 0, len(copy._PATCHER)\n"
        "from lmdeploy.pytorch.engine.executor import base_worker\n"
        "refused = False\n"
        "try:\n"
        "    copy._apply(copy._PATCHER)\n"
        "except DoublePatchError:\n"
        "    refused = True\n"
        "copy._PATCHER.undo()\n"
        "assert refused, 'a second apply went through'\n" + REPORT)
    rep = _run(code)
    _assert_once(rep)


@pytest.mark.slow
def test_the_hook_firing_inside_activate_keeps_its_options():
    """The nested (hook) call used to re-run ``configure()`` with no options, dropping the caller's
    (a ``ReasoningConfig`` object, which is not exported to the environment, was lost)."""
    pytest.importorskip("lmdeploy")
    code = ("from tokenrails.engine_patch.lmdeploy import activate\nfrom tokenrails.engine_patch.lmdeploy.boot import settings\n"
            "activate(backend='fsm', reasoning='off', fill_threads=3)\n"
            "import json; print('REPORT ' + json.dumps({k: getattr(settings.activated(), k) is not None for k in\n"
            "    ('backend', 'reasoning', 'fill_threads')}))\n")
    assert _run(code, TOKENRAILS_LMDEPLOY="1") == {"backend": True, "reasoning": True, "fill_threads": True}
