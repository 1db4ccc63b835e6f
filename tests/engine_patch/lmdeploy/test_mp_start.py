"""The api_server's engine process survives LMDeploy 0.18's start-up race (mp_start.py).

The race, reproduced with real ``multiprocessing`` objects: the engine process holds the manager
condition while it publishes its port; the server reads the port and shuts the manager down; the
engine process's release then fails (``BrokenPipeError`` / ``EOFError``) and, in stock LMDeploy,
kills the process before the model loads. The full suite hit it 3 server starts in a row on a
loaded machine (``test_draft_usage_server``, ``RPCServerDeadError``).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import subprocess
import sys

import pytest

pytest.importorskip("lmdeploy")


def _published_then_manager_gone(condition_of):
    manager = mp.Manager()
    shared = manager.dict()
    condition = condition_of(manager.Condition())
    with pytest.raises(BaseException) if condition_of is _stock else _no_error():
        with condition:
            shared["rpc_server_port"] = 12345
            condition.notify()
            manager.shutdown()  # the server read the port and left ``with mp.Manager()``


class _no_error:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _stock(condition):
    return condition


def test_stock_release_fails_once_the_manager_is_gone():
    """The failure the engine process died of (a guard that the reproduction reproduces)."""
    _published_then_manager_gone(_stock)


def test_the_engine_process_condition_survives_the_lost_release():
    from tokenrails.engine_patch.lmdeploy.boot.mp_start import PublishingCondition

    _published_then_manager_gone(PublishingCondition)


def test_a_failure_before_publishing_still_fails():
    """Only the release may lose its reply: a manager gone before the port was published is an
    error as before (the server reports the engine process's exit)."""
    from tokenrails.engine_patch.lmdeploy.boot.mp_start import PublishingCondition

    manager = mp.Manager()
    condition = PublishingCondition(manager.Condition())
    manager.shutdown()
    with pytest.raises((EOFError, OSError)):
        with condition:
            pass


def test_the_patched_entry_point_wraps_the_condition_and_keeps_its_name(upgraded):
    from lmdeploy.pytorch.engine.mp_engine.zmq_engine import ZMQMPEngine

    from tokenrails.engine_patch.lmdeploy.boot.mp_start import PublishingCondition

    target = ZMQMPEngine._mp_proc
    assert isinstance(ZMQMPEngine.__dict__["_mp_proc"], staticmethod)
    assert target.__qualname__ == "ZMQMPEngine._mp_proc" and hasattr(target, "__wrapped__")
    assert pickle.loads(pickle.dumps(target)) is target  # the spawn pickles it by reference
    from tokenrails.engine_patch.lmdeploy.boot.mp_start import patched_mp_proc

    seen = []

    probe = patched_mp_proc(lambda shared, cond, *a, **k: seen.append((shared, cond, a, k))).__func__
    probe({"d": 1}, "cond", "model", engine_config=None)
    assert isinstance(seen[0][1], PublishingCondition) and seen[0][2] == ("model",)


def test_a_spawned_engine_process_unpickles_the_patched_entry_point(upgraded):
    """The spawn resolves ``ZMQMPEngine._mp_proc`` by name in the new process: with the upgrade's
    environment flag its start-up hook has patched it by then."""
    from lmdeploy.pytorch.engine.mp_engine.zmq_engine import ZMQMPEngine

    payload = pickle.dumps(ZMQMPEngine._mp_proc)
    code = ("import pickle, sys; f = pickle.loads(sys.stdin.buffer.read()); "
            "print('patched' if hasattr(f, '__wrapped__') else 'stock')")
    env = {**os.environ, "TOKENRAILS_LMDEPLOY": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert out.stdout.decode().strip().splitlines()[-1] == "patched"
