"""``GuidedDecodingManager``: compile once, one matcher per (session, sequence), clean up on end.

Lifecycle and batching live here; grammar semantics live in the backends. The manager never
knows which backend it talks to.

* Compilation runs in a thread pool, started by ``prefetch`` as soon as a request is seen so it
  overlaps the prefill forward; it is awaited with a deadline (``GuideTimeoutError``).
* A spec whose cost estimate is large compiles in a worker process that is killed at the deadline
  (``compile_processes``; compile_procs.py): its memory comes back and nothing keeps running.
* Compiled guides sit in a byte-bounded LRU; failures in a negative cache. A compile past its
  deadline is no failure of the spec: only the requests that waited for it see the timeout
  (compile_timeouts.py); the same spec sent again is compiled again.
* Matchers are keyed by (session_id, seq_id) *and* the spec key: a new spec on the same sequence
  never reuses a stale matcher.
"""
from __future__ import annotations

import collections
import functools
import threading
import time
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

import torch

from .backend import CompiledGuide, Matcher
from .batch_step import BatchedGuidedStep, FilledMask
from .bitmask import MaskBuffer, words_for
from .compile_cache import CompileCache
from .compile_pool import CompilePool
from .compile_store import CompileStore
from .compile_procs import PORTABLE_BACKENDS, PROCESS_MIN_COST, ProcessCompiler, compile_cost
from .compile_timeouts import TimeoutBook, Waiters, deadline_of, overdue_error
from .errors import GuideError, GuideLimitError, GuideTimeoutError, InvalidGuideError, detached_copy
from .forced import NOTHING, ForcedRun, forced_tokens
from .lookup import LookupIndex, continue_run
from .gc_pause import gc_paused
from .guesses import BONUS_CANDIDATES, Guess, guess_for, guesses_after
from .jump_forward import JumpForward, compute_jump_forward, text_encoder
from .limits import DEFAULT_LIMITS, GuideLimits
from .policy import DEFAULT_POLICY, GuidePolicy, check_policy
from .reasoning import ReasoningConfig
from .registry import check_guide, compile_guide, get_backend
from .sequence import (
    Finalization, GrammarFuture, GuidedRow, RowContext, RowStatus, SequenceState, StepStatus, count_valid,
)
from .speculative import (
    DraftCursor, FilledSpec, accept_tokens_spec, apply_filled_spec, fill_and_apply_spec, fill_spec, note_proposal,
)
from .spec import GuideSpec
from .vocabulary import Vocabulary

__all__ = [
    "Finalization", "GuidedDecodingManager", "GuidedRow", "JumpForward", "ReasoningConfig",
    "RowStatus", "SequenceState", "StepStatus",
]


_LOOKUP = "lookup"  # SequenceState.extra: the row's LookupIndex (prompt + output), made at its first lookup
STORE_MIN_SECONDS = 0.05  # compiles cheaper than a disk read and restore are not kept on disk


@dataclass
class _InFlight:
    future: Future
    deadline: float
    waiters: Waiters = field(default_factory=Waiters)  # held rows told of a timeout (compile_timeouts.py)
    heavy: bool = False  # in a worker process, which ends with the deadline: never joined after it


def _lookup_index(st: SequenceState, vocab: Vocabulary,
                  prompt: Callable[[], Sequence[int] | None] | bool = False) -> LookupIndex | None:
    """The sequence's lookup index, caught up with the tokens it accepted since; made at its first
    lookup when ``prompt`` asks for one (a callable gives the prompt ids), else None until then."""
    index = st.extra.get(_LOOKUP)
    if index is None:
        if not prompt:
            return None
        ids = prompt() if callable(prompt) else None
        index = st.extra[_LOOKUP] = LookupIndex(ids if ids is not None else (), vocab.token_bytes)
    index.sync(st.history)
    return index


def _serialized(method):
    """Run a manager method under its step lock (see ``GuidedDecodingManager.__init__``)."""

    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._step_lock:
            if self._ending:
                self._end_queued()
            return method(self, *args, **kwargs)

    return locked


def _unpinned(err: GuideError) -> GuideError:
    """``err`` without its traceback and chain, so the frames that parsed the client's payload are
    freed *before* anything long-lived is allocated.

    A refused large payload parses into many small objects in pymalloc arenas; a cache entry
    allocated while they lived would land in those arenas and keep each one resident after the
    payload was freed. The waiter gets the error with no traceback beyond its re-raise, which is
    all the engine reports anyway.
    """
    err.__traceback__ = None
    err.__context__ = None
    err.__cause__ = None
    err.__suppress_context__ = True
    return err


def _finished() -> Future:
    """A done future: what the timeout book keeps for a worker's compile (stopped at its deadline),
    so a retry starts a new compile instead of joining one that is ending."""
    done: Future = Future()
    done.set_result(None)
    return done


def _closed_error() -> GuideLimitError:
    """What a request gets once ``close()`` stopped the compile pool (the engine is shutting
    down): its own typed error, never the pool's ``RuntimeError``."""
    return GuideLimitError("the guided decoding manager is closed: no constraint can be compiled any more",
                           limit="closed")


class GuidedDecodingManager:
    """Per-engine (per-rank) owner of compiled guides and per-sequence matchers."""

    def __init__(
        self,
        vocab: Vocabulary,
        *,
        backend: str = "auto",
        limits: GuideLimits | None = None,
        policy: GuidePolicy | None = None,
        compile_workers: int = 16,
        fill_threads: int | None = None,
        parallel_fill_threshold: int = 64,
        device: str | torch.device | None = None,
        compile_processes: int = 0,
        per_client: int | None = None,
        cache_dir: str | None = None,
        warm_workers: bool = False,
    ):
        """``compile_processes``: worker processes for specs whose cost estimate passes
        ``PROCESS_MIN_COST`` (0: every compile in-process, on a thread that cannot be stopped);
        ``per_client``: compiles one client may run at once (``compile_pool.py``); ``cache_dir``:
        compiled guides also kept on disk across restarts (``compile_store.py``; None: off);
        ``warm_workers``: boot the worker processes now (in the background), so the first large
        spec does not wait for an interpreter to start (an engine's manager)."""
        self.vocab = vocab
        self.backend = backend
        self.limits = limits or DEFAULT_LIMITS
        self.policy = policy or DEFAULT_POLICY
        self._cache = CompileCache(self.limits.cache_max_entries, self.limits.cache_max_bytes)
        self._inflight: dict[str, _InFlight] = {}
        self._timeouts = TimeoutBook()
        self._lock = threading.Lock()
        # One step at a time: the batched step writes a shared host bitmask and the matchers are
        # not thread-safe, so concurrent callers (4 threads on disjoint sessions got each other's
        # masks: 680 sampled tokens then rejected) are serialized here. Re-entrant: step methods
        # call each other (jump-forward accepts through the step).
        self._step_lock = threading.RLock()
        self._store = CompileStore(cache_dir, vocab, backend, self.limits) if cache_dir else None
        self._procs = (ProcessCompiler(vocab, backend, self.limits, workers=compile_processes)
                       if compile_processes > 0 and backend in PORTABLE_BACKENDS else None)
        self._pool = CompilePool(compile_workers, self.limits.max_abandoned_compiles, per_client=per_client,
                                 max_heavy=compile_processes or None)
        if self._procs is not None and warm_workers:
            threading.Thread(target=self._procs.warm, daemon=True, name="tokenrails-compile-warm").start()
        self._seqs: dict[tuple[Hashable, Hashable], SequenceState] = {}
        self._sessions: dict[Hashable, set[Hashable]] = {}
        # sessions ended from a finalizer (``end_session_soon``), ended at the next locked call:
        # a finalizer runs wherever the GC does, possibly inside this manager, and must not wait
        self._ending: collections.deque = collections.deque()
        self.counters = dict.fromkeys(
            ("cache_hits", "cache_misses", "compiles", "compile_failures", "timeouts", "rejections"), 0
        )
        self.counters["rejections"] = 0
        self._row_ctx = RowContext(vocab.eos_ids, self.limits.max_fill_seconds, self.counters)
        self._buffer = MaskBuffer(vocab.vocab_size, device)
        self.step = BatchedGuidedStep(
            self._row_ctx, self._buffer, fill_threads=fill_threads, parallel_fill_threshold=parallel_fill_threshold,
        )

    # ---- compilation ---------------------------------------------------------------------
    def warm(self, backend: str = "xgrammar") -> None:
        """Build ``backend``'s per-vocabulary tables now if this manager may route to it, as stock
        LMDeploy builds its tokenizer info when it starts, so no request's compile deadline pays
        for them (their costs: docs/safety.md, "Wall clocks on the request path")."""
        if self.backend not in ("auto", backend):
            return
        try:
            instance = get_backend(backend, self.vocab, self.limits)  # llguidance builds its tables here
        except GuideError:
            return  # not installed
        instance.warm()

    def prefetch(self, spec: GuideSpec | None) -> None:
        """Start compiling ``spec`` in the background (no-op when cached or already running)."""
        if spec is not None:
            self._lookup(spec)

    def _lookup(self, spec: GuideSpec, *, count_hit: bool = False,
                waiter: bool = False) -> CompiledGuide | GuideError | _InFlight:
        """The cached result, the running compile, or a compile started now, in one look under
        the lock. ``_finish`` leaves the in-flight table and publishes to the cache under the same
        lock, so a finished compile is never missed between two looks.

        ``waiter``: ``spec`` is a request that will read the outcome later without waiting (a held
        row, a sequence's state): if the compile passes its deadline, or the request its own
        (``compile_timeouts.deadline_of``: time spent before reaching this manager counts), this
        request alone gets the timeout from then on. Any other request for a timed-out spec
        compiles it again, or joins its compile still running on an abandoned thread, with a
        deadline of its own.

        A refusal to start (too many abandoned compiles, or a closed pool) is returned as this
        request's error and remembered nowhere: it says nothing about the spec, and a refused
        future left in the in-flight table would refuse the spec for good."""
        with self._lock:
            hit = self._cache.get(spec.key)
            if hit is not None:
                if count_hit and isinstance(hit, CompiledGuide):
                    self.counters["cache_hits"] += 1
                return hit
            timed_out = self._timeouts.get(spec.key)
            if timed_out is not None and spec in timed_out.waiters:
                return timed_out.error
            entry = self._inflight.get(spec.key)
            if waiter and self._overdue(spec):  # this request's time is up: nothing to wait for
                running = entry.future if entry is not None else timed_out.future if timed_out is not None else None
                return self._time_up(spec, running or _finished())
            if entry is None:
                self.counters["cache_misses"] += 1
                deadline = time.monotonic() + self.limits.compile_timeout_s
                if timed_out is not None and not timed_out.future.done():
                    # still compiling on its abandoned thread: join it
                    entry = self._inflight[spec.key] = _InFlight(timed_out.future, deadline)
                else:
                    heavy = self._procs is not None and compile_cost(spec) >= PROCESS_MIN_COST
                    try:
                        future = self._pool.submit(self._compile, spec, deadline if heavy else None, heavy=heavy)
                    except GuideError as exc:  # the pool refuses while too many compiles are abandoned
                        return _unpinned(exc)
                    except RuntimeError:  # closed: the engine is shutting down
                        return _closed_error()
                    entry = self._inflight[spec.key] = _InFlight(future, deadline, heavy=heavy)
            if waiter:
                entry.waiters.add(spec)
            return entry

    def _compile(self, spec: GuideSpec, deadline: float | None = None) -> CompiledGuide:
        """In-process, or (``deadline`` given) in a worker process stopped at that deadline."""
        try:
            with gc_paused():  # the parsed payload must not trigger a full collection (gc_pause.py)
                check_policy(spec, self.policy)  # refused requests are negatively cached like bad ones
                guide = self._store.get(spec) if self._store is not None else None
                if guide is None:
                    if deadline is not None and self._procs is not None:
                        check_guide(spec, self.vocab, self.backend, limits=self.limits)  # refusals at once
                        guide = self._procs.compile(spec, deadline)
                    else:
                        guide = compile_guide(spec, self.vocab, self.backend, limits=self.limits)
                    if self._store is not None and guide.compile_s > STORE_MIN_SECONDS:
                        self._store.put(spec, guide)
        except GuideError as exc:
            err = _unpinned(exc)
        except Exception as exc:  # a backend bug must fail this request, not the engine
            err = _unpinned(InvalidGuideError(f"compiling the {spec.kind} constraint failed: {exc!r}"))
        else:
            def published(entry: _InFlight | None) -> None:
                self._cache.put(spec.key, guide)
                self._timeouts.discard(spec.key)

            self._finish(spec.key, "compiles", published)
            return guide
        # outside the except blocks: the failing frames (and the payload they parsed) are gone
        # before the cache entry is allocated — see _unpinned
        if isinstance(err, GuideTimeoutError):  # its worker was stopped: a retry compiles again
            def remembered(entry: _InFlight | None) -> None:
                self._timeouts.record(spec.key, err, _finished(), entry.waiters if entry else Waiters())
        else:
            def remembered(entry: _InFlight | None) -> None:
                self._cache.put_error(spec.key, err)
        self._finish(spec.key, "compile_failures", remembered)
        raise err

    def _count(self, counter: str) -> None:
        """Counters are bumped from compile threads, the engine's loop and its workers at once:
        under the lock, an increment is never lost."""
        with self._lock:
            self.counters[counter] += 1

    def _finish(self, key: str, counter: str, publish: Callable[[_InFlight | None], None]) -> None:
        """Count, leave the in-flight table, then publish (given the entry left) — atomically for
        ``prefetch`` and in that order for lock-free cache readers (stats never lag a hit)."""
        with self._lock:
            self.counters[counter] += 1
            publish(self._inflight.pop(key, None))

    def get_compiled(self, spec: GuideSpec, timeout: float | None = None) -> CompiledGuide:
        """The compiled guide for ``spec``, waiting for its compile up to its deadline."""
        return self._get(spec, timeout)

    def _get(self, spec: GuideSpec, timeout: float | None = None, *, waiter: bool = False) -> CompiledGuide:
        entry = self._lookup(spec, count_hit=True, waiter=waiter)
        if isinstance(entry, CompiledGuide):
            return entry
        if isinstance(entry, GuideError):
            raise detached_copy(entry)
        own = deadline_of(spec) if waiter else None
        due = entry.deadline if own is None else min(entry.deadline, own)
        wait = due - time.monotonic() if timeout is None else timeout
        try:
            return entry.future.result(timeout=max(0.0, wait))
        except FutureTimeoutError:
            if timeout is None and due < entry.deadline:  # the request's time ran out, not the compile's
                with self._lock:
                    raise detached_copy(self._time_up(spec, entry.future)) from None
            self._count("timeouts")
            self._abandon(spec.key, entry)
            raise GuideTimeoutError(
                f"limit compile_timeout_s={self.limits.compile_timeout_s} exceeded: "
                f"compiling the {spec.kind} constraint did not finish in time",
                limit="compile_timeout_s", value=self.limits.compile_timeout_s,
            ) from None
        except GuideError as exc:
            raise detached_copy(exc) from None
        except CancelledError:  # queued when the manager closed
            with self._lock:
                if self._inflight.get(spec.key) is entry:
                    del self._inflight[spec.key]
            raise _closed_error() from None

    def compile_future(self, spec: GuideSpec) -> tuple[Future, float]:
        """``spec``'s compile as a future (already done when cached, failed or refused) and its
        deadline (``time.monotonic()``), for a caller that waits its own way (an event loop); past
        the deadline it calls ``give_up``. Shares the cache, the in-flight table and the pool with
        ``get_compiled``."""
        entry = self._lookup(spec, count_hit=True)
        if isinstance(entry, _InFlight):
            return entry.future, entry.deadline
        done: Future = Future()
        if isinstance(entry, GuideError):
            done.set_exception(detached_copy(entry))
        else:
            done.set_result(entry)
        return done, time.monotonic()

    def give_up(self, spec: GuideSpec, future: Future) -> None:
        """The caller of ``compile_future`` stopped waiting at the deadline: as ``get_compiled``
        does on its timeout (the compile is abandoned; a worker process is stopped)."""
        with self._lock:
            entry = self._inflight.get(spec.key)
        self._count("timeouts")
        if entry is not None and entry.future is future:
            self._abandon(spec.key, entry)
        else:
            self._pool.abandon(future)

    def _abandon(self, key: str, entry: _InFlight) -> None:
        """Past its deadline: the compile keeps running on its own thread but takes no slot; its
        waiters fail by timeout; a new request for the spec joins the running compile (no new
        thread), and a late success is served from the cache like any other."""
        self._pool.abandon(entry.future)
        with self._lock:
            if self._inflight.get(key) is entry:
                del self._inflight[key]
            self._timeouts.record(key, GuideTimeoutError(
                f"limit compile_timeout_s={self.limits.compile_timeout_s} exceeded: compiling this "
                "constraint did not finish in time", limit="compile_timeout_s", value=self.limits.compile_timeout_s,
            ), _finished() if entry.heavy else entry.future, entry.waiters)

    def _overdue(self, spec: GuideSpec) -> bool:
        own = deadline_of(spec)
        return own is not None and time.monotonic() >= own

    def _time_up(self, spec: GuideSpec, future: Future) -> GuideTimeoutError:
        """Fail this request (``spec``, by identity) at its own deadline; under the lock. The
        compile goes on for the others waiting on it, to its own deadline."""
        waiters = Waiters()
        waiters.add(spec)
        err = overdue_error(self.limits.compile_timeout_s)
        self._timeouts.record(spec.key, err, future, waiters)
        self.counters["timeouts"] += 1
        return err

    def poll(self, spec: GuideSpec) -> bool:
        """Start ``spec``'s compile if needed and say whether a fill of it would run without
        waiting (compiled, failed, refused, or past its deadline or the request's own, which
        fails it now): an engine keeps a sequence out of its batch until this is True, so no
        step waits for a compile."""
        entry = self._lookup(spec, waiter=True)
        if not isinstance(entry, _InFlight):
            return True
        if entry.future.done() or time.monotonic() < entry.deadline:
            return entry.future.done()
        self._count("timeouts")
        self._abandon(spec.key, entry)
        return True

    def settled(self, spec: GuideSpec) -> CompiledGuide | GuideError | None:
        """``spec``'s finished result (compiled or failed, or this request's timeout), or None
        while it compiles or was never asked for; starts nothing."""
        hit = self._cache.get(spec.key)
        return hit if hit is not None else self._failure(spec)

    def adopt(self, spec: GuideSpec, guide: CompiledGuide) -> None:
        """Keep ``guide``, compiled for ``spec`` in another process (an engine whose scheduler
        compiles for its ranks), unless this manager has its own result or compile: the ranks
        then decode with one grammar and none of them compiles it again."""
        with self._lock:
            if self._cache.get(spec.key) is None and spec.key not in self._inflight:
                self._cache.put(spec.key, guide)

    def _failure(self, spec: GuideSpec) -> GuideError | None:
        hit = self._cache.get(spec.key)
        if isinstance(hit, GuideError):
            return hit
        with self._lock:
            return self._timeouts.error_for(spec.key, spec)

    def _grammar(self, spec: GuideSpec) -> GrammarFuture:
        """The state's handle on its spec's compile (this manager's cache and pool); the state
        waits as a waiter (``_lookup``): its request sees its own compile's timeout."""
        return GrammarFuture(functools.partial(self._get, spec, waiter=True),
                             functools.partial(self._failure, spec))

    # ---- sequences -----------------------------------------------------------------------
    @_serialized
    def matcher_for(self, session_id: Hashable, seq_id: Hashable, spec: GuideSpec) -> Matcher:
        """This sequence's grammar matcher for ``spec`` (created on first use; a reasoning
        sequence's thinking is its ``phase``, not the matcher's); raises its GuideError."""
        state = self._state_for(session_id, seq_id, spec)
        if state.error is None:
            try:
                return state.compiled_matcher()
            except GuideError as exc:
                state.error = exc
        raise detached_copy(state.error)

    def sequence(self, session_id: Hashable, seq_id: Hashable) -> SequenceState | None:
        """The sequence's state, if it exists, for reading (an adapter watching where a row
        stands, a test). Changing it is the step methods' job."""
        return self._seqs.get((session_id, seq_id))

    def _state_for(
        self,
        session_id: Hashable,
        seq_id: Hashable,
        spec: GuideSpec,
        reasoning: ReasoningConfig | None = None,
    ) -> SequenceState:
        """The sequence's state (created on first sight); a compile failure is stored in
        ``state.error``, not raised. ``reasoning`` is read only when the state is created."""
        state = self._seqs.get((session_id, seq_id))
        if state is not None and state.spec_key == spec.key:
            return state
        return self.begin_sequence(session_id, seq_id, spec, reasoning=reasoning)

    def _states(self, rows: Sequence[GuidedRow | None]) -> list[SequenceState | None]:
        seqs = self._seqs
        out: list[SequenceState | None] = []
        for r in rows:
            if r is None:
                out.append(None)
                continue
            st = seqs.get((r.session_id, r.seq_id))
            if st is None or st.spec_key != r.spec.key:
                st = self.begin_sequence(r.session_id, r.seq_id, r.spec, reasoning=r.reasoning,
                                         max_tokens=r.max_tokens)
            out.append(st)
        return out

    @_serialized
    def begin_sequence(
        self,
        session_id: Hashable,
        seq_id: Hashable,
        spec: GuideSpec,
        *,
        reasoning: ReasoningConfig | None = None,
        prompt_token_ids: Sequence[int] | None = None,
        thinking_done: bool | None = None,
        max_tokens: int | None = None,
    ) -> SequenceState:
        """Create (or re-create) the sequence's state before its first decoding step.

        Only needed for reasoning requests whose prompt matters: the prompt's token ids (or the
        ``thinking_done`` flag) say whether the chat template already closed the thinking section.
        Without this call a reasoning sequence starts inside the thinking section (with
        ``reasoning.optional``: undecided, the model may open it or answer directly).
        ``max_tokens``: close the output within that many tokens (``SequenceState.start_budget``:
        waits for the compile; a budget that cannot fit the shortest output fails the row now).
        """
        start = time.perf_counter()
        state = SequenceState(spec.key, None, None, spec=spec, grammar=self._grammar(spec), ctx=self._row_ctx)
        if reasoning is not None:
            state.start_reasoning(self.vocab, reasoning, prompt_token_ids, thinking_done)
        if state.error is None:
            if state.answering:
                state.resolve()  # the grammar's first row is needed now
            else:
                self._lookup(spec, waiter=True)  # the compile overlaps thinking; the matcher resolves it when needed
        if max_tokens is not None:
            state.start_budget(max_tokens, self.limits)
        state.grammar_init_s = time.perf_counter() - start
        self._seqs[(session_id, seq_id)] = state
        self._sessions.setdefault(session_id, set()).add(seq_id)
        return state

    @_serialized
    def release(self, session_id: Hashable, seq_id: Hashable) -> None:
        self._seqs.pop((session_id, seq_id), None)
        seqs = self._sessions.get(session_id)
        if seqs is not None:
            seqs.discard(seq_id)
            if not seqs:
                del self._sessions[session_id]

    @_serialized
    def end_session(self, session_id: Hashable) -> None:
        """Release every matcher of the session (call when the engine ends it)."""
        for seq_id in self._sessions.pop(session_id, ()):
            self._seqs.pop((session_id, seq_id), None)

    def end_session_soon(self, session_id: Hashable, seq_id: Hashable = None) -> None:
        """``end_session`` (or ``release`` of one ``seq_id``) at this manager's next step (or
        ``stats()``), without taking a lock now: safe from a ``weakref.finalize`` callback, and
        from an event loop while a worker's step holds the lock."""
        self._ending.append((session_id, seq_id))

    def _end_queued(self) -> None:
        while self._ending:
            session_id, seq_id = self._ending.popleft()
            seqs = self._sessions.get(session_id, set())
            for seq in (seqs if seq_id is None else {seq_id} & seqs):
                self._seqs.pop((session_id, seq), None)
            seqs.difference_update(seqs if seq_id is None else {seq_id})
            if not seqs:
                self._sessions.pop(session_id, None)

    def compiled(self, rows: Sequence[GuidedRow | None]) -> bool:
        """Whether every row's constraint has finished compiling (cached, or cached as failed):
        a fill or accept of these rows then never waits for a compile, so an engine may run it
        on its own thread instead of handing it to a worker (a thread hop per step)."""
        cache = self._cache
        return all(r is None or cache.get(r.spec.key) is not None or self._failure(r.spec) is not None for r in rows)

    # ---- the batched step (see batch_step.py) ---------------------------------------------
    @_serialized
    def fill_and_apply(self, logits: torch.Tensor, rows: Sequence[GuidedRow | None]) -> list[RowStatus | None]:
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits {tuple(logits.shape)} do not match {len(rows)} rows")
        return self.step.fill_and_apply(logits, self._states(rows))

    @_serialized
    def fill_rows(self, rows: Sequence[GuidedRow | None], buffer: torch.Tensor | None = None) -> FilledMask:
        """The step's mask without applying it (``FilledMask``): an engine can compute it while
        the model runs, then ``apply_filled`` it to the logits."""
        return self.step.fill(self._states(rows), buffer)

    @_serialized
    def apply_filled(self, logits: torch.Tensor, filled: FilledMask) -> list[RowStatus | None]:
        return self.step.apply(logits, filled)

    @_serialized
    def accept_tokens(self, token_ids: Sequence[int] | torch.Tensor, rows: Sequence[GuidedRow | None]) -> list[RowStatus | None]:
        return self.step.accept(token_ids, self._states(rows))

    @_serialized
    def may_end(self, row: GuidedRow) -> bool:
        """Whether the row's output is complete now, so EOS would end it validly (a row still
        thinking, or undecided, never is unless the grammar accepts the empty answer)."""
        return self._states([row])[0].may_end()  # type: ignore[union-attr]

    # ---- speculative decoding (see speculative.py) -----------------------------------------
    @_serialized
    def fill_and_apply_spec(
        self, logits: torch.Tensor, rows: Sequence[GuidedRow | None], drafts: Sequence[Sequence[int]]
    ) -> list[RowStatus | None]:
        """Mask the verification logits of a speculative step.

        Row ``i`` owns ``1 + len(drafts[i])`` consecutive logits rows (``B*(1+k)`` when every row
        has ``k`` drafts); logits row ``j`` of that block gets the mask after drafts ``< j``.
        Matchers are advanced tentatively and rolled back: the state is unchanged afterwards.
        """
        if len(drafts) != len(rows):
            raise ValueError(f"{len(drafts)} draft lists for {len(rows)} rows")
        return fill_and_apply_spec(self._row_ctx, self._buffer, logits, self._states(rows), drafts)

    @_serialized
    def fill_spec(self, rows: Sequence[GuidedRow | None], drafts: Sequence[Sequence[int]]) -> FilledSpec:
        """The masks ``fill_and_apply_spec`` would apply for ``drafts``, filled now, before the
        verification's logits exist (beside the forward that computes them), into rows of their
        own; ``apply_filled_spec`` applies them once the logits are there."""
        words = words_for(self.vocab.vocab_size)
        own = lambda n: torch.empty((n, words), dtype=torch.int32)  # noqa: E731 - its own rows: kept until applied
        return fill_spec(self._row_ctx, own, self._states(rows), drafts)

    @_serialized
    def apply_filled_spec(self, logits: torch.Tensor, filled: FilledSpec, rows: Sequence[GuidedRow | None],
                          drafts: Sequence[Sequence[int]]) -> list[RowStatus | None] | None:
        """Apply masks filled ahead (``fill_spec``) to the verification ``logits`` of ``rows`` and
        ``drafts`` (laid out as ``fill_and_apply_spec`` takes them); None, with nothing applied,
        when they are not the masks a fill would give now (another batch, a row advanced since,
        other drafts): the caller fills and applies afresh."""
        if len(drafts) != len(rows) or not filled.fits(self._states(rows), drafts):
            return None
        return apply_filled_spec(self._buffer, logits, filled, [len(d) for d in drafts])

    @_serialized
    def accept_tokens_spec(
        self, accepted: Sequence[Sequence[int]], rows: Sequence[GuidedRow | None]
    ) -> list[RowStatus | None]:
        """After verification: accept each row's tokens (accepted drafts + the bonus token)."""
        if len(accepted) != len(rows):
            raise ValueError(f"{len(accepted)} token lists for {len(rows)} rows")
        return accept_tokens_spec(accepted, self._states(rows))

    @_serialized
    def draft_cursor(self, row: GuidedRow | None, error: GuideError | None = None) -> DraftCursor:
        """A cursor that walks the row's sequence through an engine's drafts and rolls back
        exactly; its methods take this manager's step lock."""
        st = self._states([row])[0] if row is not None and error is None else None
        return DraftCursor(st, self._step_lock, error)

    @_serialized
    def validate_drafts(
        self, session_id: Hashable, seq_id: Hashable, spec: GuideSpec, tokens: Sequence[int],
        *, reasoning: ReasoningConfig | None = None,
    ) -> int:
        """How many leading ``tokens`` are allowed from the sequence's state (state unchanged)."""
        return count_valid(self._state_for(session_id, seq_id, spec, reasoning=reasoning), tokens)

    @_serialized
    def forced_tokens(
        self, row: GuidedRow, max_tokens: int, *, encode: Callable[[str], Sequence[int]] | None = None,
        bitmask: torch.Tensor | None = None, propose: bool = False,
        lookup: Callable[[], Sequence[int] | None] | bool = False,
    ) -> ForcedRun:
        """The tokens the row's grammar forces from where it stands (``forced.forced_tokens``;
        state unchanged): a speculative proposer's drafts. Nothing for a failed row, or one that
        has not begun its answer (a thinking section is the model's own text). ``propose``: these
        are the row's drafts, verified next with only their positions kept (``note_proposal``).
        ``lookup``: the run continues with prompt-lookup tokens the grammar allows
        (``lookup.continue_run``); a callable gives the round's prompt ids (or None), asked once,
        when the row's lookup index is made."""
        st = self._states([row])[0]
        if st is None or st.error is not None or not st.answering:
            return NOTHING
        matcher = st.resolve()
        if matcher is None:
            return NOTHING
        if lookup:
            then = functools.partial(continue_run, index=_lookup_index(st, self.vocab, lookup),
                                     max_tokens=max_tokens, encode=encode, bitmask=bitmask)
            run = forced_tokens(matcher, max_tokens, encode=encode, bitmask=bitmask, then=then)
        else:
            run = forced_tokens(matcher, max_tokens, encode=encode, bitmask=bitmask)
        if propose:
            note_proposal(st, run)
        return run

    def _existing(self, row: GuidedRow) -> SequenceState | None:
        """The row's state if it exists for the row's spec (never begins one)."""
        st = self._seqs.get((row.session_id, row.seq_id))
        return st if st is not None and st.spec_key == row.spec.key else None

    @_serialized
    def forced_after(
        self, row: GuidedRow, walk: Sequence[int], max_tokens: int, *,
        encode: Callable[[str], Sequence[int]] | None = None, bitmask: torch.Tensor | None = None,
        lookup: bool = False, candidates: int = BONUS_CANDIDATES,
    ) -> list[Guess]:
        """Guesses made ahead, for a proposer beside the forward (``guesses.guesses_after``): as if
        ``walk`` (the drafts being verified) and a likely bonus token were accepted, the drafts the
        proposer would make from there, continued with lookup tokens when ``lookup`` and the row
        has a lookup index (its first proposal, inline, makes it). State unchanged; an ended or
        unknown sequence gets none."""
        st = self._existing(row)
        if st is None or st.error is not None or not st.answering:
            return []
        index = _lookup_index(st, self.vocab) if lookup else None
        if lookup and index is None:
            return []
        return guesses_after(st, walk, max_tokens, index=index, encode=encode, bitmask=bitmask, candidates=candidates)

    @_serialized
    def guessed_run(self, row: GuidedRow, guesses: Sequence[Guess]) -> ForcedRun | None:
        """The drafts of the guess (``forced_after``) whose assumption the row accepted exactly
        since, proposed as ``forced_tokens(propose=True)`` would; None when the row went elsewhere."""
        st = self._existing(row)
        run = guess_for(st, guesses) if st is not None and st.error is None else None
        if run is not None:
            note_proposal(st, run)
        return run

    # ---- jump-forward and termination -------------------------------------------------------
    @_serialized
    def jump_forward(
        self, session_id: Hashable, seq_id: Hashable, spec: GuideSpec, tokenizer: Any = None,
        *, max_rollback: int = 4, encode: Callable[[str], Sequence[int]] | None = None,
    ) -> JumpForward:
        """The forced continuation of the sequence (see jump_forward.py for the retokenization
        rule); state unchanged. ``encode`` (plain-text tokenization) wins over ``tokenizer``."""
        if encode is None and tokenizer is not None:
            encode = text_encoder(tokenizer)
        state = self._state_for(session_id, seq_id, spec)
        return compute_jump_forward(state, self.vocab, encode, max_rollback=max_rollback)

    @_serialized
    def apply_jump_forward(
        self, session_id: Hashable, seq_id: Hashable, spec: GuideSpec, jump: JumpForward
    ) -> RowStatus:
        """Make the sequence follow a jump the engine applied: roll back, then accept its tokens
        through the same path as sampled tokens."""
        if jump.token_ids is None:
            raise ValueError("this jump has no token ids (ambiguous tokenization): only its text can be used")
        return self._state_for(session_id, seq_id, spec).apply_jump(jump.rollback_tokens, jump.token_ids)

    @_serialized
    def finalize(self, session_id: Hashable, seq_id: Hashable, reason: str = "length") -> Finalization:
        """Why the sequence ended and whether its output is a complete match.

        ``reason`` is the engine's own reason when it stopped the sequence without EOS
        ("length", "abort", "stop_string"...): returned as is when the output is nevertheless a
        complete match, as ``f"{reason}_incomplete"`` otherwise. "stop" means the grammar accepted
        EOS; "error" means the constraint failed or a token was rejected.
        """
        state = self._seqs.get((session_id, seq_id))
        if state is None:
            raise KeyError(f"no guided sequence ({session_id!r}, {seq_id!r})")
        return state.finalize(reason)

    def finish_reason(self, session_id: Hashable, seq_id: Hashable, reason: str = "length") -> str:
        return self.finalize(session_id, seq_id, reason).finish_reason

    # ---- observability ---------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        if self._ending:
            with self._step_lock:
                self._end_queued()
        return {
            "active_matchers": len(self._seqs),
            "active_sessions": len(self._sessions),
            "cache_entries": self._cache.entries,
            "cache_bytes": self._cache.bytes,
            "compiles_in_flight": len(self._inflight),
            **self.counters,
        }

    def request_metrics(self, session_id: Hashable, seq_id: Hashable) -> dict[str, float]:
        state = self._seqs.get((session_id, seq_id))
        if state is None:
            return {}
        per_token = state.guided_time_s / state.tokens if state.tokens else 0.0
        out = {"grammar_init_s": state.grammar_init_s, "grammar_per_token_s": per_token, "tokens": state.tokens}
        if state.budget is not None:
            out["budget_closed"] = state.budget.closed
        return out

    def close(self) -> None:
        """Stop the compile pool (queued compiles are cancelled; running ones end on daemon threads)
        and the compile workers."""
        self._pool.close()
        if self._procs is not None:
            self._procs.close()
