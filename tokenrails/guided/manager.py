"""``GuidedDecodingManager``: compile once, one matcher per (session, sequence), clean up on end.

Lifecycle and batching live here; grammar semantics live in the backends. The manager never
knows which backend it talks to.

* Compilation runs in a thread pool, started by ``prefetch`` as soon as a request is seen so it
  overlaps the prefill forward; it is awaited with a deadline (``GuideTimeoutError``).
* Compiled guides sit in a byte-bounded LRU; failures in a negative cache.
* Matchers are keyed by (session_id, seq_id) *and* the spec key: a new spec on the same sequence
  never reuses a stale matcher.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

import torch

from .backend import CompiledGuide, Matcher
from .batch_step import BatchedGuidedStep, GuidedRow, RowStatus, StepStatus
from .compile_cache import CompileCache
from .errors import GuideError, GuideTimeoutError, InvalidGuideError
from .limits import DEFAULT_LIMITS, GuideLimits
from .registry import compile_guide
from .spec import GuideSpec
from .vocabulary import Vocabulary

__all__ = ["GuidedDecodingManager", "GuidedRow", "RowStatus", "StepStatus", "SequenceState"]


@dataclass
class SequenceState:
    """Everything the manager keeps for one (session, sequence)."""

    spec_key: str
    matcher: Matcher | None
    error: GuideError | None = None
    grammar_init_s: float = 0.0
    guided_time_s: float = 0.0
    tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class _InFlight:
    future: Future
    deadline: float


class GuidedDecodingManager:
    """Per-engine (per-rank) owner of compiled guides and per-sequence matchers."""

    def __init__(
        self,
        vocab: Vocabulary,
        *,
        backend: str = "auto",
        limits: GuideLimits | None = None,
        compile_workers: int = 2,
        fill_threads: int = 2,
        parallel_fill_threshold: int = 16,
        device: str | torch.device | None = None,
    ):
        self.vocab = vocab
        self.backend = backend
        self.limits = limits or DEFAULT_LIMITS
        self._cache = CompileCache(self.limits.cache_max_entries, self.limits.cache_max_bytes)
        self._inflight: dict[str, _InFlight] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max(1, compile_workers), thread_name_prefix="tokenrails-compile")
        self._seqs: dict[tuple[Hashable, Hashable], SequenceState] = {}
        self._sessions: dict[Hashable, set[Hashable]] = {}
        self.counters = dict.fromkeys(
            ("cache_hits", "cache_misses", "compiles", "compile_failures", "timeouts", "rejections"), 0
        )
        self.step = BatchedGuidedStep(
            self, fill_threads=fill_threads, parallel_fill_threshold=parallel_fill_threshold, device=device
        )

    # ---- compilation ---------------------------------------------------------------------
    def prefetch(self, spec: GuideSpec | None) -> None:
        """Start compiling ``spec`` in the background (no-op when cached or already running)."""
        if spec is None:
            return
        with self._lock:
            if spec.key in self._inflight or self._cache.get(spec.key) is not None:
                return
            self.counters["cache_misses"] += 1
            deadline = time.monotonic() + self.limits.compile_timeout_s
            future = self._pool.submit(self._compile, spec)
            self._inflight[spec.key] = _InFlight(future, deadline)

    def _compile(self, spec: GuideSpec) -> CompiledGuide:
        try:
            guide = compile_guide(spec, self.vocab, self.backend, limits=self.limits)
        except GuideError as exc:
            self._cache.put_error(spec.key, exc)
            with self._lock:
                self.counters["compile_failures"] += 1
                self._inflight.pop(spec.key, None)
            raise
        except Exception as exc:  # a backend bug must fail this request, not the engine
            err = InvalidGuideError(f"compiling the {spec.kind} constraint failed: {exc!r}")
            self._cache.put_error(spec.key, err)
            with self._lock:
                self.counters["compile_failures"] += 1
                self._inflight.pop(spec.key, None)
            raise err from exc
        self._cache.put(spec.key, guide)
        with self._lock:
            self.counters["compiles"] += 1
            self._inflight.pop(spec.key, None)
        return guide

    def get_compiled(self, spec: GuideSpec, timeout: float | None = None) -> CompiledGuide:
        """The compiled guide for ``spec``, waiting for its compile up to its deadline."""
        hit = self._cache.get(spec.key)
        if isinstance(hit, CompiledGuide):
            self.counters["cache_hits"] += 1
            return hit
        if isinstance(hit, GuideError):
            raise _same_error(hit)
        self.prefetch(spec)
        with self._lock:
            entry = self._inflight.get(spec.key)
        if entry is None:  # finished between the two looks
            return self.get_compiled(spec, timeout)
        wait = entry.deadline - time.monotonic() if timeout is None else timeout
        try:
            return entry.future.result(timeout=max(0.0, wait))
        except FutureTimeoutError:
            self.counters["timeouts"] += 1
            raise GuideTimeoutError(
                f"limit compile_timeout_s={self.limits.compile_timeout_s} exceeded: "
                f"compiling the {spec.kind} constraint did not finish in time",
                limit="compile_timeout_s", value=self.limits.compile_timeout_s,
            ) from None
        except GuideError as exc:
            raise _same_error(exc) from None

    # ---- sequences -----------------------------------------------------------------------
    def matcher_for(self, session_id: Hashable, seq_id: Hashable, spec: GuideSpec) -> Matcher:
        """This sequence's matcher for ``spec`` (created on first use); raises its GuideError."""
        state = self.state_for(session_id, seq_id, spec)
        if state.error is not None:
            raise _same_error(state.error)
        assert state.matcher is not None
        return state.matcher

    def state_for(self, session_id: Hashable, seq_id: Hashable, spec: GuideSpec) -> SequenceState:
        """The sequence's state; a compile failure is stored in ``state.error``, not raised."""
        key = (session_id, seq_id)
        state = self._seqs.get(key)
        if state is not None and state.spec_key == spec.key:
            return state
        start = time.perf_counter()
        try:
            matcher: Matcher | None = self.get_compiled(spec).matcher()
            error = None
        except GuideError as exc:
            matcher, error = None, exc
        state = SequenceState(spec.key, matcher, error, grammar_init_s=time.perf_counter() - start)
        self._seqs[key] = state
        self._sessions.setdefault(session_id, set()).add(seq_id)
        return state

    def release(self, session_id: Hashable, seq_id: Hashable) -> None:
        self._seqs.pop((session_id, seq_id), None)
        seqs = self._sessions.get(session_id)
        if seqs is not None:
            seqs.discard(seq_id)
            if not seqs:
                del self._sessions[session_id]

    def end_session(self, session_id: Hashable) -> None:
        """Release every matcher of the session (call when the engine ends it)."""
        for seq_id in self._sessions.pop(session_id, ()):
            self._seqs.pop((session_id, seq_id), None)

    # ---- the batched step (see batch_step.py) ---------------------------------------------
    def fill_and_apply(self, logits: torch.Tensor, rows: Sequence[GuidedRow | None]) -> list[RowStatus | None]:
        return self.step.fill_and_apply(logits, rows)

    def accept_tokens(self, token_ids: Sequence[int] | torch.Tensor, rows: Sequence[GuidedRow | None]) -> list[RowStatus | None]:
        return self.step.accept_tokens(token_ids, rows)

    # ---- observability ---------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
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
        return {"grammar_init_s": state.grammar_init_s, "grammar_per_token_s": per_token, "tokens": state.tokens}

    def close(self) -> None:
        """Stop the compile pool (pending compiles are cancelled)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.step.close()


def _same_error(err: GuideError) -> GuideError:
    """A fresh instance of the same error type (exceptions carry tracebacks; don't share them)."""
    fresh = Exception.__new__(type(err))
    fresh.__dict__.update(err.__dict__)
    fresh.args = err.args
    return fresh
