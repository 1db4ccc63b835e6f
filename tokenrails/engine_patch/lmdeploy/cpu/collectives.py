"""TP ``all_reduce`` between the CPU ranks of one host through shared memory instead of gloo.

A decode step of a TP model runs two all_reduces per layer (the row-parallel linears) on tensors
of a few KB. gloo runs each as a ring of TCP messages passed through its worker threads, which
costs each rank far more CPU than the sum itself, on every layer of every step. The CPU path's
ranks all live on one host (LMDeploy's multiprocess executor), so here each rank copies its
tensor into its slot of a shared buffer, tells every peer through a pipe of their own (one byte),
waits for one byte from each peer, and sums the slots in rank order: every rank computes the same
sum from the same bytes, so the ranks' tensors stay identical, as they do after gloo.

Two buffers alternate between calls: a rank starts call k + 2 (reusing call k's buffer) only
after every peer has signalled call k + 1, which each sends after finishing its own sum of call
k. One pipe per (sender, receiver) pair keeps a fast peer's next signal from being counted as a
slow peer's current one. Only ``SUM`` of a floating CPU tensor up to ``SLOT_BYTES``, waited for
(``async_op=False``), on a gloo group goes this way; anything else (a long prefill's tensor, an
async call, another op) is gloo's, and every rank makes the same choice since the choice depends
only on what an all_reduce's ranks share (shape, dtype, op). A group whose ranks cannot all map
the buffer (another host) keeps gloo for good, agreed at set-up. Names are unlinked once every
rank has opened them, so nothing is left behind in ``/dev/shm`` or the temp directory.

A rank whose peer died fails its call at once (``PeerEnded``) instead of waiting: each rank reads
its inbound pipes without holding a write end itself, so a dead peer's pipe reads as ended (the
kernel closes a process's files at its death, kill -9 included), and a write to a dead peer's
pipe fails. gloo would only fail the rank at its process group's timeout (30 minutes by default).
"""
from __future__ import annotations

import mmap
import os
import select
import tempfile
import threading
import time
import types
from typing import Any

import torch
import torch.distributed as dist

SLOT_BYTES = 1 << 20  # per rank and buffer; a larger tensor (a long prefill's) goes through gloo
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_LOCK = threading.Lock()
_BY_GROUP: dict[int, tuple[Any, "ShmAllReduce | None"]] = {}  # id(group) -> (group, communicator)


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class ShmAllReduce:
    """One group's shared buffer and pipes; built collectively by every rank of the group (``_build``)."""

    def __init__(self, rank: int, world: int, base: str) -> None:
        self.rank, self.world = rank, world
        self._base = base
        self._inbox: dict[int, int] = {}
        self._outbox: dict[int, int] = {}
        self._map: mmap.mmap | None = None
        self._parity = 0
        self._views: dict[torch.dtype, torch.Tensor] = {}

    def _pipe(self, src: int, dst: int) -> str:
        return f"{self._base}-{src}-{dst}"

    def create(self) -> None:
        """First step: this rank's inbound pipes (read end only, non-blocking: a peer's later open
        for writing never blocks, and the pipe reads as ended once that peer is gone); rank 0
        creates the buffer."""
        for src in range(self.world):
            if src != self.rank:
                os.mkfifo(self._pipe(src, self.rank), 0o600)
                self._inbox[src] = os.open(self._pipe(src, self.rank), os.O_RDONLY | os.O_NONBLOCK)
        if self.rank == 0:
            fd = os.open(self._base, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                # the pages reserved now: a full /dev/shm (a container's is often 64 MB) fails the
                # set-up here, and the group keeps gloo, instead of a SIGBUS at a later write
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(fd, 0, 2 * self.world * SLOT_BYTES)
                else:
                    os.ftruncate(fd, 2 * self.world * SLOT_BYTES)
            finally:
                os.close(fd)

    def attach(self) -> None:
        """Second step, once every rank has created its part: map the buffer, open the peers' pipes."""
        fd = os.open(self._base, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, 2 * self.world * SLOT_BYTES)
        finally:
            os.close(fd)
        raw = torch.frombuffer(self._map, dtype=torch.uint8).view(2, self.world, SLOT_BYTES)
        self._views = {dtype: raw.view(dtype) for dtype in _FLOATS}
        for dst in range(self.world):
            if dst != self.rank:
                self._outbox[dst] = os.open(self._pipe(self.rank, dst), os.O_WRONLY)

    def unlink(self) -> None:
        """Last step, once every rank has attached: the names go, the open files stay."""
        for src in range(self.world):
            if src != self.rank:
                _remove(self._pipe(src, self.rank))
        if self.rank == 0:
            _remove(self._base)

    def close(self) -> None:
        for fd in [*self._inbox.values(), *self._outbox.values()]:
            os.close(fd)
        self._inbox.clear()
        self._outbox.clear()
        self._views.clear()
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a tensor still views it; the mapping goes with the process
                pass

    def __call__(self, tensor: torch.Tensor) -> None:
        """``tensor`` := the sum of every rank's ``tensor`` (in place)."""
        n = tensor.numel()
        slots = self._views[tensor.dtype][self._parity][:, :n]
        self._parity ^= 1
        slots[self.rank].copy_(tensor.reshape(-1))
        for peer, fd in self._outbox.items():
            try:
                os.write(fd, b"\0")
            except BrokenPipeError:
                raise PeerEnded(f"TP rank {peer} ended: this rank's all_reduce cannot complete") from None
        for peer, fd in self._inbox.items():
            _wait_signal(peer, fd)
        if tensor.is_contiguous():
            torch.sum(slots, 0, out=tensor.view(-1))
        else:
            tensor.copy_(slots.sum(0).view(tensor.shape))


class PeerEnded(RuntimeError):
    """A peer rank of a shared-memory all_reduce ended mid-run (its process died)."""


def _wait_signal(peer: int, fd: int) -> None:
    """One byte from ``peer``'s pipe: read at once when it is there, else wait for data or for the
    pipe's end (every writer gone: the peer died)."""
    while True:
        try:
            if os.read(fd, 1):
                return
        except BlockingIOError:
            waiter = select.poll()  # not select(): a busy process's descriptors pass 1024
            waiter.register(fd, select.POLLIN)
            waiter.poll()
            continue
        raise PeerEnded(f"TP rank {peer} ended: this rank's all_reduce cannot complete")


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _agree(ok: bool, group: Any) -> bool:
    """Whether every rank of ``group`` is ``ok`` (a gloo all_reduce: also a barrier)."""
    flag = torch.tensor([0 if ok else 1], dtype=torch.int32)
    dist.all_reduce(flag, group=group)
    return int(flag.item()) == 0


def _build(group: Any) -> ShmAllReduce | None:
    """Every rank of ``group`` runs this at its first eligible all_reduce, in the same order."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if world < 2:
        return None
    name = [f"{_shm_dir()}/tokenrails-allreduce-{os.getpid()}-{time.monotonic_ns()}"]
    dist.broadcast_object_list(name, src=dist.get_global_rank(group, 0), group=group)
    comm = ShmAllReduce(rank, world, name[0])
    ok = True
    try:
        comm.create()
    except OSError:
        ok = False
    if _agree(ok, group):
        try:
            comm.attach()
        except OSError:
            ok = False
        ok = _agree(ok, group)
    comm.unlink()
    if not ok:
        comm.close()
        return None
    return comm


def _communicator(group: Any) -> ShmAllReduce | None:
    key = id(group)
    entry = _BY_GROUP.get(key)
    if entry is not None and entry[0] is group:
        return entry[1]
    with _LOCK:
        comm = _build(group) if dist.get_backend(group) == "gloo" else None
        _BY_GROUP[key] = (group, comm)
    return comm


def all_reduce(tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None, async_op: bool = False):
    """``torch.distributed.all_reduce``, through shared memory where the module doc says."""
    if (async_op or op != dist.ReduceOp.SUM or tensor.device.type != "cpu" or tensor.dtype not in _FLOATS
            or tensor.numel() * tensor.element_size() > SLOT_BYTES):
        return dist.all_reduce(tensor, op, group, async_op)
    comm = _communicator(dist.group.WORLD if group is None else group)
    if comm is None:
        return dist.all_reduce(tensor, op, group, async_op)
    comm(tensor)
    return None


class DistProxy(types.ModuleType):
    """``torch.distributed`` with ``all_reduce`` above; every other name is the real one."""

    def __init__(self) -> None:
        super().__init__("torch.distributed")
        self.all_reduce = all_reduce

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)


PROXY = DistProxy()


# LMDeploy's modules whose forward all_reduces through their global ``dist``
REBOUND = ("lmdeploy.pytorch.distributed", "lmdeploy.pytorch.backends.default.linear",
           "lmdeploy.pytorch.backends.default.embedding", "lmdeploy.pytorch.nn.linear.base")


def install() -> None:
    """In a CPU TP rank: those modules' ``dist`` becomes the proxy (idempotent)."""
    import importlib

    for name in REBOUND:
        module = importlib.import_module(name)
        if getattr(module, "dist", None) is dist:
            module.dist = PROXY
