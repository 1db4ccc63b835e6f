"""TP > 1 on the CPU path: LMDeploy's executor ring must not deadlock with gloo collectives
(cpu/distributed.py). Three real ranks (spawned processes, gloo over 127.0.0.1) and LMDeploy's own
``Notifier``/``SharedBuffer``, driven into the interleaving the real engine hit at TP = 3: one rank reads
the 32nd ring message (a ring wrap: every party meets at a barrier) before its forward task has joined
an ``all_reduce`` that the other ranks are already blocked in."""
from __future__ import annotations

import os
import queue
import threading
import time

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")

from . import tp_ring_child  # noqa: E402

WORLD = 3
BLOB = 3 * (1 << 20) + 17  # a message of 4 ring blocks, read across the ring's wrap


@pytest.fixture(autouse=True)
def _rank_environment(monkeypatch):
    """The ranks start with the environment a real TP rank has under ``cpu.enable()`` (the CPU flag and
    the start-up hook, so the CPU path is enabled when LMDeploy is imported), whatever ran before in
    this process: the ring is proved in the configuration the engine runs, independent of test order."""
    from tokenrails.engine_patch.lmdeploy.boot import inherit

    monkeypatch.setenv(inherit.ENV_CPU, "1")
    if not inherit._HOOK.pth_installed():
        entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if str(inherit.SITECUSTOMIZE_DIR) not in entries:
            monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(inherit.SITECUSTOMIZE_DIR)] + entries))


def _run_ring(notifier_cls, timeout: float) -> list | None:
    """Drive three ranks (once all are up) through one ring wrap; their reports, or None if they did not
    all finish within ``timeout`` seconds."""
    import torch.multiprocessing as mp
    from lmdeploy.pytorch.engine.executor.dist_utils import find_available_port
    from lmdeploy.pytorch.engine.executor.mp_executor import NUM_SHARED_BLOCK, SharedBuffer

    ctx = mp.get_context("spawn")
    notifier = notifier_cls(WORLD, ctx)
    buf = SharedBuffer(-1, notifier=notifier)
    out = ctx.Queue()
    port = find_available_port()
    procs = [ctx.Process(target=tp_ring_child.rank_main, daemon=True,
                         args=(r, WORLD, port, notifier, buf.name(), WORLD - 1, out)) for r in range(WORLD)]
    for p in procs:
        p.start()

    def sender() -> None:  # the executor's side; its barrier wait is synchronous, as in LMDeploy
        buf.send("forward")
        time.sleep(0.5)  # ranks 0 and 1 are now blocked in all_reduce; the last rank sleeps
        for _ in range(NUM_SHARED_BLOCK - 5):
            buf.send("noop")
        buf.send(b"x" * BLOB)  # blocks 28..31 and the ring's barrier
        buf.send("stop")

    reports = []
    try:
        # imports + process group: a bound on start-up only (what is tested starts after it);
        # three ranks importing LMDeploy beside engines on a loaded 2-core machine took over 180 s
        ready = sorted(out.get(timeout=900) for _ in range(WORLD))
        assert ready == [("ready", r) for r in range(WORLD)]
        threading.Thread(target=sender, daemon=True).start()
        deadline = time.monotonic() + timeout
        while len(reports) < WORLD:
            try:
                reports.append(out.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                return None
        return sorted(reports)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(10)
        # not notifier.close(): a rank terminated inside Barrier.wait may hold the barrier's lock
        buf.shm.unlink()  # (not close(): a deadlocked sender thread still holds a view of it)


def test_cpu_notifier_lets_gloo_ranks_through_a_ring_wrap():
    from tokenrails.engine_patch.lmdeploy.cpu.distributed import cpu_notifier_class

    reports = _run_ring(cpu_notifier_class(), timeout=180)  # waited in full only when it deadlocks
    assert reports == [(r, [WORLD], [BLOB]) for r in range(WORLD)]


@pytest.mark.slow
def test_stock_notifier_deadlocks_in_the_same_interleaving():
    """The cause, pinned: LMDeploy's ``Notifier`` waits for the wrap's barrier on the loop's thread,
    so the late rank never joins the all_reduce its peers block in (the fix above is needed)."""
    from lmdeploy.pytorch.engine.executor.mp_executor import Notifier

    from tokenrails.engine_patch.lmdeploy.cpu import distributed
    assert _run_ring(distributed._ORIGINALS.get("Notifier", Notifier), timeout=10) is None
