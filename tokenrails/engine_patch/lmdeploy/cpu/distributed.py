"""TP > 1 on the CPU path: keep every rank's asyncio loop free of waits that a collective can starve.

LMDeploy 0.18's multiprocess executor drives each TP rank through a shared-memory ring
(``mp_executor.Notifier`` + ``SharedBuffer``): every ``NUM_SHARED_BLOCK`` (32) messages the sender
and all ranks meet at a ``multiprocessing.Barrier``, which a rank waits for *synchronously on its
event-loop thread*, the thread that also issues the forward's collectives. With NCCL a collective
only enqueues work and returns; with gloo it blocks until every rank has joined, so a rank waiting
at the barrier and ranks waiting in its ``all_reduce`` (or ``broadcast_next_token``) deadlock.
On the CPU path a rank waits for the ring's barrier (and for continuation blocks of a long
message) in a thread instead, so its loop goes on running the forward; the only waits left on a
loop thread are collectives, which every rank issues in the same order, so they complete. The GPU
paths keep LMDeploy's ``Notifier``: the executor builds a :class:`CpuNotifier` only when
``device_type == 'cpu'``. docs/lmdeploy.md ("Tensor parallel") has the stacks of the deadlock.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any

_ORIGINALS: dict[str, Any] = {}


def _notifier_base() -> type:
    from lmdeploy.pytorch.engine.executor import mp_executor
    return _ORIGINALS.get("Notifier", mp_executor.Notifier)


class _CpuNotifierMixin:
    """Barrier waits of the shared-memory ring off the event-loop thread (same order, same parties)."""

    events: list
    bar: Any
    _event_id: int

    def _last_block(self) -> bool:
        from lmdeploy.pytorch.engine.executor.mp_executor import NUM_SHARED_BLOCK
        return self._event_id == NUM_SHARED_BLOCK - 1

    def _meet_and_clear(self) -> None:
        """Sender's side of a ring wrap: everyone has read the 32 blocks; clear them; meet again."""
        self.bar.wait()
        for event in self.events:
            event.clear()
        self.bar.wait()

    def _meet_twice(self) -> None:
        """Receiver's side of a ring wrap."""
        self.bar.wait()
        self.bar.wait()

    async def set_async(self) -> None:
        loop = asyncio.get_running_loop()
        self.events[self._event_id].set()
        if self._last_block():
            await loop.run_in_executor(None, self._meet_and_clear)
        self._update_event_id()  # type: ignore[attr-defined]

    @asynccontextmanager
    async def wait_async(self):
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.events[self._event_id].wait)
        yield
        if self._last_block():
            await loop.run_in_executor(None, self._meet_twice)
        self._update_event_id()  # type: ignore[attr-defined]


_CPU_NOTIFIER: type | None = None


def cpu_notifier_class() -> type:
    """``CpuNotifier``: LMDeploy's ``Notifier`` with the ring's waits off the loop (built lazily so that
    importing this module does not import LMDeploy)."""
    global _CPU_NOTIFIER
    if _CPU_NOTIFIER is None:
        # Resolve the base first: its import of LMDeploy can fire the start-up hook (a rank with
        # TOKENRAILS_LMDEPLOY_CPU set that unpickles a notifier before importing LMDeploy), whose
        # enable() -> install() re-enters here and builds the class. Building a second one after it
        # returned left install()'s receive_async bound to a class the ranks' notifiers were not
        # instances of, so they read long messages with LMDeploy's loop-blocking waits (deadlock).
        base = _notifier_base()
    if _CPU_NOTIFIER is None:
        _CPU_NOTIFIER = type("CpuNotifier", (_CpuNotifierMixin, base),
                             {"__module__": __name__, "__qualname__": "CpuNotifier",
                              "__doc__": _CpuNotifierMixin.__doc__})
        globals()["CpuNotifier"] = _CPU_NOTIFIER  # pickled by reference into the ranks
    return _CPU_NOTIFIER


def __getattr__(name: str) -> Any:
    if name == "CpuNotifier":  # unpickling in a rank resolves the class through this
        return cpu_notifier_class()
    raise AttributeError(name)


async def _receive_rest_async(buf: Any, dumped: bytes, is_receiver: bool, remain: int) -> Any:
    """``SharedBuffer._receive_step1`` for a message longer than one block, with each block's wait
    (and a ring wrap's barrier) awaited instead of blocking the loop."""
    import pickle

    from lmdeploy.pytorch.engine.executor.mp_executor import HEAD_SIZE, SHARED_BLOCK_SIZE
    while remain > 0:
        async with buf.notifier.wait_async():
            with buf.acquire_buf() as block:
                size = min(remain, SHARED_BLOCK_SIZE)
                remain -= size
                if is_receiver:
                    dumped += block[HEAD_SIZE:HEAD_SIZE + size]
    return pickle.loads(dumped) if is_receiver else None


def install() -> None:
    """Patch LMDeploy's MP executor for CPU ranks (idempotent; :func:`uninstall` reverts)."""
    if _ORIGINALS:
        return
    from lmdeploy.pytorch.engine.executor import mp_executor

    original_init = mp_executor.MPExecutor.__init__
    original_receive = mp_executor.SharedBuffer.receive_async
    _ORIGINALS.update(Notifier=mp_executor.Notifier, init=original_init, receive_async=original_receive)
    cpu_notifier = cpu_notifier_class()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """On ``device_type='cpu'`` the ring's notifiers (built in here) are ``CpuNotifier``s."""
        if kwargs.get("device_type") != "cpu":
            return original_init(self, *args, **kwargs)
        mp_executor.Notifier = cpu_notifier
        try:
            return original_init(self, *args, **kwargs)
        finally:
            mp_executor.Notifier = _ORIGINALS["Notifier"]

    async def receive_async(self):
        if not isinstance(self.notifier, _CpuNotifierMixin):  # any CpuNotifier, not one class object
            return await original_receive(self)
        async with self.notifier.wait_async():
            dumped, is_receiver, remain = self._receive_step0()
        return await _receive_rest_async(self, dumped, is_receiver, remain)

    __init__.__wrapped__ = original_init  # type: ignore[attr-defined]
    receive_async.__wrapped__ = original_receive  # type: ignore[attr-defined]
    mp_executor.MPExecutor.__init__ = __init__
    mp_executor.SharedBuffer.receive_async = receive_async


def uninstall() -> None:
    """Restore LMDeploy's executor (CpuNotifiers already built keep working)."""
    if not _ORIGINALS:
        return
    from lmdeploy.pytorch.engine.executor import mp_executor
    mp_executor.MPExecutor.__init__ = _ORIGINALS["init"]
    mp_executor.SharedBuffer.receive_async = _ORIGINALS["receive_async"]
    _ORIGINALS.clear()
