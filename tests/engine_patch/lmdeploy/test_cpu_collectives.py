"""The CPU TP ranks' all_reduce through shared memory (cpu/collectives.py): three gloo ranks
(spawned, torch only) sum through it and get exactly the oracle's result on every call, in
rank order on every rank, with a late rank, in every float dtype, for a non-contiguous tensor
and a subgroup; a rank whose peer died fails its next call at once; what it does not take (past a slot, another op) still sums through gloo. Nothing
is left behind in the shared-memory directory. The real engine at TP = 3 runs on it:
test_real_engine_tp.py (TP = 3 equals TP = 1 token for token)."""
from __future__ import annotations

import glob

import pytest

torch = pytest.importorskip("torch")

from . import collectives_child  # noqa: E402

WORLD = 3


def test_shared_memory_all_reduce_sums_exactly_on_every_rank():
    import torch.multiprocessing as mp

    from tokenrails.engine_patch.lmdeploy.cpu import collectives
    from tokenrails.engine_patch.lmdeploy.cpu.collectives import _shm_dir

    before = set(glob.glob(f"{_shm_dir()}/tokenrails-allreduce-*"))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=collectives_child.rank_main, args=(r, WORLD, port, out), daemon=True)
             for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        reports = sorted((out.get(timeout=300) for _ in procs), key=lambda r: r["rank"])
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.terminate()
    for report in reports:
        assert report["errors"] == [], report
        assert all(report["same_on_every_rank"]), report
    # the world's communicator on every rank, the subgroup's on its two members
    assert [r["shared"] for r in reports] == [[True, True], [True], [True, True]], reports
    # the last rank then died: its peers' next all_reduce failed at once instead of waiting for it
    for report in reports[:-1]:
        message, seconds = report["peer_ended"]
        assert f"TP rank {WORLD - 1} ended" in message and seconds < 30, report
    assert set(glob.glob(f"{_shm_dir()}/tokenrails-allreduce-*")) <= before
    assert collectives.SLOT_BYTES >= 1 << 20
