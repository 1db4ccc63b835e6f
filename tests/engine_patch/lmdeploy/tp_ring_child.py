"""One TP rank of LMDeploy's multiprocess executor, reduced to what deadlocks on gloo: the executor's
shared-memory ring (LMDeploy's own ``SharedBuffer``) read on the rank's asyncio loop, and a forward
task whose collective (a gloo ``all_reduce``) blocks that loop's thread. Runs in spawned children."""
from __future__ import annotations

import asyncio


def rank_main(rank: int, world: int, port: int, rings: list, late_rank: int, out) -> None:
    """``rings``: (notifier, buffer name) pairs, driven one after another (a ring that deadlocks
    is the last this rank runs)."""
    import torch
    import torch.distributed as dist
    from lmdeploy.pytorch.engine.executor.mp_executor import SharedBuffer

    from tokenrails.engine_patch.lmdeploy.cpu import distributed

    distributed.install()  # what cpu.enable() does in every rank (multi-block reads off the loop)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    bufs = [SharedBuffer(rank, notifier=notifier, name=name) for notifier, name in rings]
    out.put(("ready", rank))
    for buf in bufs:
        _ring(rank, buf, late_rank, out)
    dist.destroy_process_group()


def _ring(rank: int, buf, late_rank: int, out) -> None:
    import torch
    import torch.distributed as dist

    sums: list[int] = []
    blobs: list[int] = []

    async def forward() -> None:
        if rank == late_rank:
            await asyncio.sleep(1.0)  # this rank's forward starts after it has read the whole ring
        t = torch.ones(1)
        dist.all_reduce(t)  # gloo: the loop's thread waits here until every rank has joined
        sums.append(int(t.item()))

    async def main() -> None:
        tasks = []
        while True:
            cmd = await buf.receive_async()
            if cmd == "forward":
                tasks.append(asyncio.get_running_loop().create_task(forward()))
            elif isinstance(cmd, bytes):
                blobs.append(len(cmd))
            elif cmd == "stop":
                break
        await asyncio.gather(*tasks)

    asyncio.run(main())
    out.put((rank, sums, blobs))
