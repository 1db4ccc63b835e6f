"""Compiles that can be stopped: a large spec compiles in a worker process, killed at its deadline.

A backend's native compile cannot be interrupted from Python, so a thread past its deadline keeps
a core and its memory until the backend returns. A worker process can be killed: the operating
system takes back its memory at once, and a fresh worker replaces it.

* Workers are separate interpreters (``python -m tokenrails.guided.compile_worker``), not forks:
  the parent may hold JAX, CUDA or engine threads that a fork would copy in a broken state. Each
  gets the vocabulary once, at start; a replacement is started in the background when one is
  killed, so the next large compile rarely waits for an interpreter to boot.
* The result comes back in each backend's portable form (``export``/``restore``: xgrammar's JSON
  serialization, llguidance's grammar text, the fsm DFA's arrays) and is rebuilt here; errors come
  back as the typed ``GuideError`` the in-process compile would have raised.
* Workers compile at a lower CPU priority (``TOKENRAILS_COMPILE_NICE``, default 10; they boot at
  full priority): where compiles and decoding share the cores, a long compile takes the cycles
  decoding leaves, so one client's expensive spec does not slow every running request.
* A worker whose RSS stays past ``worker_max_rss_mb`` after a compile (its heap grew for a large
  spec and could not shrink) is replaced, so the workers' memory returns to its idle size.
* Only specs whose cost estimate (``compile_cost``) passes ``PROCESS_MIN_COST`` go to a worker: a
  small spec compiles in-process in well under the round trip's cost (docs/safety.md).
"""
from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Any

from .backend import CompiledGuide
from .errors import GuideError, GuideTimeoutError, InvalidGuideError
from .limits import GuideLimits
from .memory_return import rss_mb, trim_soon
from .spec import GuideSpec
from .vocabulary import Vocabulary

# The cost estimate, in spec payload bytes, from which a compile runs in a worker process. The round
# trip costs more than the compile at every size (bench/compile_cutover.py), so the bound is about
# risk: only specs this large have been seen to run past a deadline.
PROCESS_MIN_COST = 32 << 10
WORKER_MAX_RSS_MB = 512  # above an idle worker's size (interpreter, torch, the vocabulary)
PORTABLE_BACKENDS = frozenset({"auto", "xgrammar", "llguidance", "fsm"})
_HEADER = struct.Struct("!Q")


def compile_cost(spec: GuideSpec) -> int:
    """A cheap upper-bound proxy for a compile's cost: the spec's serialized size. Every backend
    walks its spec's text at least once; a small spec's worst case is bounded by the walk limits
    (``GuideLimits``)."""
    return len(spec.payload)


def write_frame(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def read_frame(fd: int, deadline: float | None = None) -> Any:
    """One frame from ``fd``; ``TimeoutError`` past ``deadline``, ``EOFError`` when it closed."""
    header = _read_exact(fd, _HEADER.size, deadline)
    return pickle.loads(_read_exact(fd, _HEADER.unpack(header)[0], deadline))


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    while n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class _Setup:
    """The workers' setup (vocabulary, backend, limits) in an anonymous file, written at the first
    worker's start: each worker inherits its descriptor and reads it at boot (a pipe would block
    the parent until the child has booted). The file has no name, so nothing is left behind when
    the process is killed or never closes its compiler."""

    def __init__(self, payload: Any):
        self._payload: Any = payload
        self._file: Any = None
        self._lock = threading.Lock()
        self._closed = False

    def spawn(self) -> "_Worker":
        """A worker started with the setup's descriptor (under the lock: ``close`` cannot release
        the descriptor, or its number be reused, while a worker inherits it)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the compile workers are closed")
            if self._file is None:
                self._file = tempfile.TemporaryFile(prefix="tokenrails-compile-")
                pickle.dump(self._payload(), self._file, protocol=pickle.HIGHEST_PROTOCOL)
                self._file.flush()
                self._payload = None
            return _Worker(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._file is not None:
                self._file.close()


def read_setup(fd: int) -> Any:
    """The setup ``_Setup`` wrote, read by position (workers share the descriptor's offset; a
    regular file's ``pread`` returns it whole)."""
    return pickle.loads(os.pread(fd, os.fstat(fd).st_size, 0))


class _Worker:
    def __init__(self, setup_fd: int):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tokenrails.guided.compile_worker", str(setup_fd)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True, pass_fds=(setup_fd,),
        )  # same process group: whoever stops the server's group stops its workers too
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.out = self.proc.stdin.fileno()
        self.inp = self.proc.stdout.fileno()

    def send(self, spec: GuideSpec) -> None:
        """Write ``spec`` on a thread: a large frame fills the pipe until the child (maybe still
        booting) reads it, and the caller's wait must stay bounded by the deadline."""
        def write() -> None:
            try:
                write_frame(self.out, spec)
            except OSError:  # killed meanwhile: the reader reports it
                pass
        threading.Thread(target=write, daemon=True, name="tokenrails-compile-send").start()

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass


class ProcessCompiler:
    """Worker processes compiling for one (vocabulary, backend, limits); see the module doc."""

    def __init__(self, vocab: Vocabulary, backend: str, limits: GuideLimits, *, workers: int = 2,
                 worker_max_rss_mb: float = WORKER_MAX_RSS_MB):
        self.vocab = vocab
        self.worker_max_rss_mb = worker_max_rss_mb
        self.backend = backend
        self.limits = limits
        self.workers = max(1, workers)
        self._setup = _Setup(lambda: ((tuple(vocab.token_bytes), tuple(vocab.eos_ids),
                                       tuple(sorted(vocab.special_ids)), vocab.vocab_size, vocab.name),
                                      backend, limits))
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        # Dropped without close() (LMDeploy's rank manager has no close call), the idle workers would
        # wait on their stdin for the rest of this process: subprocess keeps a Popen whose child
        # still runs alive, pipe included, so no EOF ever reaches them (two interpreters per
        # manager, ~300 MB each). They end with their compiler instead.
        self._finalizer = weakref.finalize(self, _release, os.getpid(), self._setup, self._idle, self._lock)
        self._closed = False
        self.counters = {"started": 0, "killed": 0, "compiles": 0, "recycled": 0}

    def warm(self) -> None:
        """Start the idle workers now (in the background), so the first large compile finds one."""
        with self._lock:
            missing = self.workers - len(self._idle)
        for _ in range(max(0, missing)):
            self._give_back(self._start())

    def compile(self, spec: GuideSpec, deadline: float) -> CompiledGuide:
        """``spec`` compiled in a worker by ``deadline`` (``time.monotonic()``), else the worker is
        killed and ``GuideTimeoutError`` raised; the compile's own ``GuideError`` otherwise."""
        worker = self._take()
        try:
            worker.send(spec)
            status, payload = read_frame(worker.inp, deadline)
        except TimeoutError:
            self._kill(worker)
            raise GuideTimeoutError(
                f"limit compile_timeout_s={self.limits.compile_timeout_s} exceeded: compiling the {spec.kind} "
                "constraint did not finish in time (stopped)",
                limit="compile_timeout_s", value=self.limits.compile_timeout_s) from None
        except (EOFError, OSError, pickle.UnpicklingError):
            self._kill(worker)  # killed from outside, out of memory: this request fails, typed
            raise InvalidGuideError(f"compiling the {spec.kind} constraint failed: its compile worker ended") from None
        if rss_mb(worker.proc.pid) > self.worker_max_rss_mb:  # grown for a large spec: a fresh one instead
            with self._lock:
                self.counters["recycled"] += 1
            self._kill(worker, count=False)
        else:
            self._give_back(worker)
        with self._lock:
            self.counters["compiles"] += 1
        if status == "error":
            raise payload
        guide = restore_guide(spec, payload, self.vocab, self.limits)
        del payload
        trim_soon()  # a large spec's frame (megabytes of serialized grammar) is free again
        return guide

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._finalizer()

    @property
    def idle(self) -> int:
        return len(self._idle)

    # ---- internals ------------------------------------------------------------------------
    def _start(self) -> _Worker:
        with self._lock:
            self.counters["started"] += 1
        return self._setup.spawn()

    def _take(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise RuntimeError("the compile workers are closed")
            while self._idle:
                worker = self._idle.pop()
                if worker.proc.poll() is None:
                    return worker
        return self._start()

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self.workers and worker.proc.poll() is None:
                self._idle.append(worker)
                return
        worker.kill()

    def _kill(self, worker: _Worker, *, count: bool = True) -> None:
        worker.kill()
        with self._lock:
            self.counters["killed"] += count
            closed = self._closed
        if not closed:  # the replacement boots while nobody waits for it
            threading.Thread(target=self._replace, daemon=True, name="tokenrails-compile-worker-start").start()

    def _replace(self) -> None:
        try:
            worker = self._start()
        except RuntimeError:  # closed meanwhile
            return
        self._give_back(worker)


DEFAULT_NICE = 10


def lower_priority() -> None:
    """Called by a worker once booted (its interpreter starts at full priority, so a replacement
    is ready soon even on a busy machine): ``TOKENRAILS_COMPILE_NICE`` steps below its parent."""
    raw = os.environ.get("TOKENRAILS_COMPILE_NICE", "").strip()
    try:
        nice = int(raw) if raw else DEFAULT_NICE
    except ValueError:
        nice = DEFAULT_NICE
    if nice > 0 and hasattr(os, "nice"):
        try:
            os.nice(nice)
        except OSError:
            pass


def _release(owner_pid: int, setup: _Setup, idle: list[_Worker], lock: threading.Lock) -> None:
    """Stop the idle workers and drop the setup (``close``, the compiler collected, or exit). A
    forked child's copy of the compiler releases nothing: the workers are its parent's."""
    if os.getpid() != owner_pid:
        return
    with lock:
        workers = list(idle)
        idle.clear()
    setup.close()
    for worker in workers:
        worker.kill()


def export_guide(guide: CompiledGuide) -> tuple[str, Any, float]:
    """(backend name, portable state, compile seconds) of a guide compiled in a worker."""
    from .registry import _load_class

    cls = _load_class(guide.backend)
    export = getattr(cls, "export", None)
    if export is None:
        raise GuideError(f"backend {guide.backend!r} has no portable form")
    return guide.backend, export(guide), guide.compile_s


def restore_guide(spec: GuideSpec, exported: tuple[str, Any, float], vocab: Vocabulary,
                  limits: GuideLimits) -> CompiledGuide:
    """The guide ``export_guide`` described, rebuilt against this process's ``vocab``."""
    from .registry import get_backend

    name, state, compile_s = exported
    guide = get_backend(name, vocab, limits).restore(spec, state)  # type: ignore[attr-defined]
    guide.compile_s = compile_s
    return guide
