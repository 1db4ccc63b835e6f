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


@pytest.fixture(scope="module")
def _rank_environment():
    """The ranks start with the environment a real TP rank has under ``cpu.enable()`` (the CPU flag and
    the start-up hook, so the CPU path is enabled when LMDeploy is imported), whatever ran before in
    this process: the ring is proved in the configuration the engine runs, independent of test order."""
    from tokenrails.engine_patch.lmdeploy.boot import inherit

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(inherit.ENV_CPU, "1")
        if not inherit._HOOK.pth_installed():
            entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            if str(inherit.SITECUSTOMIZE_DIR) not in entries:
                mp.setenv("PYTHONPATH", os.pathsep.join([str(inherit.SITECUSTOMIZE_DIR)] + entries))
        yield


class _Ranks:
    """Three ranks (spawned once for the module) and the rings they read one after another: LMDeploy's
    ``Notifier`` made into ``CpuNotifier`` first, then LMDeploy's own (the ranks stay in it if it deadlocks)."""

    def __init__(self) -> None:
        import torch.multiprocessing as mp
        from lmdeploy.pytorch.engine.executor.dist_utils import find_available_port
        from lmdeploy.pytorch.engine.executor.mp_executor import Notifier, SharedBuffer

        from tokenrails.engine_patch.lmdeploy.cpu import distributed

        ctx = mp.get_context("spawn")
        notifiers = [distributed.cpu_notifier_class()(WORLD, ctx),
                     distributed._ORIGINALS.get("Notifier", Notifier)(WORLD, ctx)]
        self.bufs = [SharedBuffer(-1, notifier=n) for n in notifiers]
        self.out = ctx.Queue()
        port = find_available_port()
        rings = [(n, b.name()) for n, b in zip(notifiers, self.bufs)]
        self.procs = [ctx.Process(target=tp_ring_child.rank_main, daemon=True,
                                  args=(r, WORLD, port, rings, WORLD - 1, self.out)) for r in range(WORLD)]
        for p in self.procs:
            p.start()
        self.results: dict[int, list | None] = {}
        # imports + process group: a bound on start-up only (what is tested starts after it);
        # three ranks importing LMDeploy beside engines on a loaded 2-core machine took over 180 s
        ready = sorted(self.out.get(timeout=900) for _ in range(WORLD))
        assert ready == [("ready", r) for r in range(WORLD)]

    def run(self, ring: int, timeout: float) -> list | None:
        """Drive the ranks through ring ``ring`` (the earlier ones first) and one wrap of it; their
        reports, or None if they did not all finish within ``timeout`` seconds."""
        for earlier in range(ring):
            if earlier not in self.results:
                self.run(earlier, 180)
        if ring not in self.results:
            self.results[ring] = self._drive(self.bufs[ring], timeout)
        return self.results[ring]

    def _drive(self, buf, timeout: float) -> list | None:
        from lmdeploy.pytorch.engine.executor.mp_executor import NUM_SHARED_BLOCK

        def sender() -> None:  # the executor's side; its barrier wait is synchronous, as in LMDeploy
            buf.send("forward")
            time.sleep(0.5)  # ranks 0 and 1 are now blocked in all_reduce; the last rank sleeps
            for _ in range(NUM_SHARED_BLOCK - 5):
                buf.send("noop")
            buf.send(b"x" * BLOB)  # blocks 28..31 and the ring's barrier
            buf.send("stop")

        threading.Thread(target=sender, daemon=True).start()
        reports = []
        deadline = time.monotonic() + timeout
        while len(reports) < WORLD:
            try:
                reports.append(self.out.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                return None
        return sorted(reports)

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.join(10)
        for buf in self.bufs:
            # not notifier.close(): a rank terminated inside Barrier.wait may hold the barrier's lock
            buf.shm.unlink()  # (not close(): a deadlocked sender thread still holds a view of it)


@pytest.fixture(scope="module")
def ranks(_rank_environment):
    r = _Ranks()
    try:
        yield r
    finally:
        r.close()


def test_cpu_notifier_lets_gloo_ranks_through_a_ring_wrap(ranks):
    reports = ranks.run(0, timeout=180)  # waited in full only when it deadlocks
    assert reports == [(r, [WORLD], [BLOB]) for r in range(WORLD)]


@pytest.mark.slow
def test_stock_notifier_deadlocks_in_the_same_interleaving(ranks):
    """The cause, pinned: LMDeploy's ``Notifier`` waits for the wrap's barrier on the loop's thread,
    so the late rank never joins the all_reduce its peers block in (the fix above is needed). The
    same ranks, after they went through the ring above, so they start it as fresh ones would."""
    assert ranks.run(1, timeout=10) is None
