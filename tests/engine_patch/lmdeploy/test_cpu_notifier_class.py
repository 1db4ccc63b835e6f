"""One ``CpuNotifier`` class per process (cpu/distributed.py), however LMDeploy gets imported.

A TP rank can resolve ``CpuNotifier`` (unpickling its ring's notifier) before it has imported LMDeploy.
With the CPU flag set, that import fires the start-up hook, whose ``enable()`` -> ``install()`` builds the
class from inside the first ``cpu_notifier_class()`` call. A second class built after that left the
patched ``SharedBuffer.receive_async`` bound to a class the rank's notifier was not an instance of: the
rank read multi-block messages with LMDeploy's loop-blocking barrier waits (the gloo deadlock of
test_cpu_tp_ring.py, seen when that test ran after ``cpu.enable()`` in the same pytest process)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("lmdeploy")

_CHILD = r"""
import json, sys
from tokenrails.engine_patch.lmdeploy.cpu import distributed as d
assert "lmdeploy" not in sys.modules
cls = getattr(d, "CpuNotifier")  # what unpickling a rank's notifier does, before any LMDeploy import
from lmdeploy.pytorch.engine.executor import mp_executor
receive = mp_executor.SharedBuffer.receive_async
print(json.dumps({
    "classes": len(d._CpuNotifierMixin.__subclasses__()),
    "same": cls is d.cpu_notifier_class() and cls is d.CpuNotifier,
    "installed": getattr(receive, "__wrapped__", None) is not None,
}))
"""


def test_cpu_notifier_resolved_before_lmdeploy_import_is_the_one_install_serves():
    import tokenrails
    from tokenrails.engine_patch.lmdeploy.boot import inherit

    root = os.path.dirname(os.path.dirname(os.path.abspath(tokenrails.__file__)))  # this checkout
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env[inherit.ENV_CPU] = "1"  # a rank under cpu.enable(): the hook enables the CPU path at import
    env["PYTHONPATH"] = os.pathsep.join([str(inherit.SITECUSTOMIZE_DIR), root, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"classes": 1, "same": True, "installed": True}
