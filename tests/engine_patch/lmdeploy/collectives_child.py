"""One rank of test_cpu_collectives.py (spawned): the shared-memory all_reduce against exact oracles."""
from __future__ import annotations

import os
import time


def rank_main(rank: int, world: int, port: int, out) -> None:
    """Put this rank's report on ``out``; a rank that fails reports its traceback (never a silent exit)."""
    try:
        _checks(rank, world, port, out)
    except BaseException:
        import traceback

        out.put({"rank": rank, "errors": [("failed", traceback.format_exc())]})
        raise


def _checks(rank: int, world: int, port: int, out) -> None:
    import torch
    import torch.distributed as dist

    from tokenrails.engine_patch.lmdeploy.cpu import collectives

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    sub = dist.new_group([0, 2])  # a group that is not the world: its own buffer and pipes
    report: dict = {"rank": rank, "errors": []}

    def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        if not torch.equal(got, want):
            report["errors"].append((name, (got - want).abs().max().item()))

    # integers in float32 add exactly: every call's result is known, a mixed-up call shows
    for i in range(300):
        if rank == 1 and i % 50 == 0:
            time.sleep(0.05)  # a late rank: the others signal their next call meanwhile
        t = torch.full((6, 576), float(i * world + rank))
        collectives.all_reduce(t)
        check(f"call {i}", t, torch.full((6, 576), float(i * world * world + sum(range(world)))))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        gen = torch.Generator().manual_seed(rank)
        x = torch.randn(5, 7, generator=gen).to(dtype)
        parts = [torch.randn(5, 7, generator=torch.Generator().manual_seed(r)).to(dtype) for r in range(world)]
        collectives.all_reduce(x)
        want = torch.stack(parts).sum(0)  # the slots in rank order: what every rank computes
        check(f"{dtype}", x, want)
        gathered = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(gathered, x)
        report.setdefault("same_on_every_rank", []).append(all(torch.equal(g, x) for g in gathered))
    wide = torch.arange(12.0).view(3, 4).t() + rank  # not contiguous
    collectives.all_reduce(wide)
    check("non-contiguous", wide, (torch.arange(12.0).view(3, 4).t() * world + sum(range(world))))
    big = torch.full((collectives.SLOT_BYTES // 4 + 1,), float(rank))  # past a slot: gloo's
    collectives.all_reduce(big)
    check("past a slot", big, torch.full_like(big, float(sum(range(world)))))
    if rank in (0, 2):
        s = torch.full((3,), float(rank + 1))
        collectives.all_reduce(s, group=sub)
        check("subgroup", s, torch.full((3,), 4.0))
    m = torch.full((4,), float(rank + 2))
    collectives.all_reduce(m, op=dist.ReduceOp.MAX)  # another op: gloo's
    check("max", m, torch.full((4,), float(world + 1)))
    report["shared"] = sorted(comm is not None for _, comm in collectives._BY_GROUP.values())
    dist.barrier()
    if rank == world - 1:  # this rank dies (as a killed one would: no clean-up) while its peers wait for it
        out.put(report)
        out.close()
        out.join_thread()
        time.sleep(1.0)  # the peers have signalled their call and wait for this rank's
        os._exit(0)
    started = time.monotonic()
    try:
        collectives.all_reduce(torch.ones(4))
        report["peer_ended"] = None
    except collectives.PeerEnded as exc:
        report["peer_ended"] = (str(exc), time.monotonic() - started)
    out.put(report)
