"""The per-rank guided manager LMDeploy's model agent holds (``agent.guided_decoding_manager``).

Same constructor as LMDeploy's ``GuidedDecodingManager(tokenizer, vocab_size)`` so the agent
builds it unchanged. Building the ``Vocabulary`` takes seconds for a 150k vocabulary, so it runs
in a background thread started at construction: engines that never see a guided request pay
nothing, and the first guided step waits (off the event loop) only if the build is still running.

Rows are identified per *round*: ``seq_key = (seq_id, output_start_pos)``. LMDeploy keeps the
same ``(session_id, seq_id)`` across rounds of an interactive session; keying by round means a
new round always starts a fresh matcher, and the previous round's matcher is released.

Reasoning: ``prepare_row`` resolves a row's reasoning setting (the request's, else the engine
default: ``activate(reasoning=...)``, else ``$TOKENRAILS_REASONING``, else "auto") against the
vocabulary, and at the first sight of a round with a reasoning config starts its state from the
round's prompt (``begin_sequence(..., prompt_token_ids=...)``). The prepared row is kept for the
round (``_begun``): later steps reuse it without a call.
"""
from __future__ import annotations

import contextvars
import logging
import threading
import weakref
from collections import OrderedDict
from types import MappingProxyType
from typing import Any, Callable, Hashable, Mapping, NamedTuple

from ....guided.compile_procs import restore_guide
from ....guided.sequence import GuidedRow
from ....guided.errors import GuideError, InvalidGuideError
from ....guided.limits import GuideLimits
from ....guided.native_threads import start_native_thread
from ....guided.reasoning import tracker_for
from ...reasoning_settings import default_setting, prompt_for_reading, resolve
from ..boot import settings
from .lmdeploy_step import LMDeployStep
from .stock_calls import StockCalls
from ..tokenizer_vocab import build_vocabulary

logger = logging.getLogger("tokenrails.lmdeploy")

_LIVE: "weakref.WeakSet[LMDeployGuidedManager]" = weakref.WeakSet()  # this process's sampling ranks
#: per-request metrics beside the core's (speculative/draft_metrics registers its counters here)
METRICS_SOURCES: list[Callable[[Hashable], dict]] = []

MAX_FAILED = 4096  # failed rounds remembered (their sessions' ends drop them sooner)
#: set while a TP / Ray worker builds its model agent (tp_ranks.py): that rank decodes with the guides
#: the engine process compiled (engine_grammars.py), so its compile workers boot only if a compile
#: does land here, instead of two interpreters booted and left idle with every engine
GUIDES_FROM_ENGINE: contextvars.ContextVar[bool] = contextvars.ContextVar("tokenrails_guides_from_engine",
                                                                         default=False)


class RankView(NamedTuple):
    """What an engine step reads of its rank's manager, without a call (a steady step makes none):
    the round books as read-only mappings (the manager writes them under its lock; a dict read is
    atomic) and the core manager once its vocabulary is built (None while building or failed:
    ``core()`` then waits or raises)."""

    rounds: Mapping[tuple[Hashable, Hashable], Hashable]  # (session, seq_id) -> the round's seq_key
    begun: Mapping[tuple[Hashable, Hashable], GuidedRow]  # (session, seq_key) -> the prepared row
    failed: Mapping[tuple[Hashable, Hashable], GuideError]  # (session, seq_key) -> why it failed
    core: Any = None


class LMDeployGuidedManager(StockCalls):
    """Wraps ``tokenrails.GuidedDecodingManager`` behind LMDeploy's constructor and clean-up calls."""

    is_tokenrails = True

    def __init__(self, tokenizer: Any, vocab_size: int | None, *, vocab: Any = None,
                 backend: str | None = None, limits: GuideLimits | None = None):
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._backend = backend or settings.backend()
        self._limits = limits or settings.manager_limits()
        self._mgr = None
        self._error: GuideError | None = None
        self._ready = threading.Event()
        # The round books below are written by the event loop (clean-up calls) and by the worker
        # threads that prepare rows: each read-modify-write and each walk is under ``_books``.
        # It is never held across a call into the core manager (its step lock, a compile wait).
        self._books = threading.Lock()
        self._rounds: dict[tuple[Hashable, Hashable], Hashable] = {}
        # (session, seq_key) -> the round's prepared row; the step reads the books through
        # ``view``, so a steady step makes no call here (lmdeploy_step.py)
        self._begun: dict[tuple[Hashable, Hashable], GuidedRow] = {}
        # rounds that failed: LMDeploy stops a failed row a step late, and every filler and
        # proposer must see it failed then (lmdeploy_step.py), never fill or propose it again
        self._failed: "OrderedDict[tuple[Hashable, Hashable], GuideError]" = OrderedDict()
        # rounds' prompt ids, seen with the round's first row, until the grammar proposer indexes
        # them for lookup drafts (``take_prompt``) or the round ends
        self._prompts: dict[tuple[Hashable, Hashable], Any] = {}
        self.view = RankView(MappingProxyType(self._rounds), MappingProxyType(self._begun),
                             MappingProxyType(self._failed))
        self._reasoning_default = default_setting(settings.reasoning_default())  # fixed per manager
        self._reasoning_memo: dict[Any, Any] = {}
        self.step: LMDeployStep | None = None  # the engine step running now (lmdeploy_step.py)
        self.stopped: tuple[Any, frozenset[int]] = (None, frozenset())  # (session_ctx, rows): stopped_rows.py
        self.warming: threading.Thread | None = None  # building per-vocabulary tables (_warm)
        self._warm_workers = not GUIDES_FROM_ENGINE.get()
        _LIVE.add(self)
        if vocab is not None:
            self._build(vocab)
        else:
            start_native_thread(self._build, name="tokenrails-vocab")

    def _build(self, vocab: Any = None) -> None:
        try:
            from ....guided.manager import GuidedDecodingManager

            vocab = vocab if vocab is not None else build_vocabulary(self._tokenizer, self._vocab_size)
            kwargs: dict[str, Any] = {"backend": self._backend, "limits": self._limits,
                                      "compile_processes": settings.compile_processes(),
                                      "cache_dir": settings.compile_cache_dir(), "warm_workers": self._warm_workers,
                                      "per_client": settings.compile_per_client()}
            fill_threads = settings.manager_fill_threads()
            if fill_threads:
                kwargs["fill_threads"] = fill_threads
            self._mgr = GuidedDecodingManager(vocab, **kwargs)
            self.view = self.view._replace(core=self._mgr)
            self.warming = start_native_thread(self._warm, name="tokenrails-warm")
        except GuideError as exc:
            self._error = exc
        except Exception as exc:  # an unreadable tokenizer fails guided requests, not the engine
            logger.warning("tokenrails: cannot build the guided vocabulary: %r", exc)
            self._error = InvalidGuideError(f"guided decoding is unavailable for this tokenizer: {exc!r}")
        finally:
            self._ready.set()

    # ---- access ----------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def core(self, wait: bool = True):
        """The ``GuidedDecodingManager`` (None when not ready and ``wait`` is False); raises its error."""
        if wait:
            self._ready.wait()
        elif not self._ready.is_set():
            return None
        if self._error is not None:
            raise self._error
        return self._mgr

    @property
    def vocab(self):
        return self.core().vocab

    @property
    def vocab_size(self) -> int:
        return self.core().vocab.vocab_size

    def prefetch(self, specs) -> None:
        """Start compiles now (never blocks; skipped while the vocabulary is still being built)."""
        mgr = self.core(wait=False) if self._error is None else None
        if mgr is None:
            return
        for spec in specs:
            mgr.prefetch(spec)

    def adopt(self, rows) -> None:
        """Keep the guides the engine process compiled for these rows (``row.guide``;
        engine_grammars.py) instead of compiling them here (never blocks; a guide that does not
        restore is compiled here as without one)."""
        mgr = self.core(wait=False) if self._error is None else None
        for row in rows if mgr is not None else ():
            exported = getattr(row, "guide", None)
            if exported is not None and mgr.settled(row.spec) is None:
                try:
                    mgr.adopt(row.spec, restore_guide(row.spec, exported, mgr.vocab, mgr.limits))
                except Exception as exc:  # noqa: BLE001
                    logger.warning("tokenrails: the engine's compiled guide does not restore here: %r", exc)

    def poll(self, spec: Any) -> bool:
        """Whether a step could fill ``spec`` now without waiting (its compile is started here):
        False while the vocabulary is still being built or the compile runs (waiting_rows.py)."""
        if self._error is not None:
            return True  # every row fails closed at once
        mgr = self.core(wait=False)
        return mgr is not None and mgr.poll(spec)

    def note_round(self, session_id: Hashable, seq_key: tuple) -> None:
        """Release the previous round's matcher when a sequence starts a new round (at the core's
        next locked call: a step's fill may hold its lock now)."""
        ident = (session_id, seq_key[0])
        with self._books:
            prev = self._rounds.get(ident)
            if prev == seq_key:
                return
            self._rounds[ident] = seq_key
            if prev is not None:
                self._begun.pop((session_id, prev), None)
                self._failed.pop((session_id, prev), None)
                self._prompts.pop((session_id, prev), None)
        if prev is not None and self._mgr is not None:
            self._mgr.end_session_soon(session_id, prev)

    # ---- reasoning -------------------------------------------------------------------------
    def _warm(self) -> None:
        """Per-vocabulary tables built on a thread of their own when the manager is, as stock
        LMDeploy builds its tokenizer info when it starts, so no request's compile deadline and no
        decoding step pays for them: xgrammar's first (every tool call and most formats compile
        there), the engine default's thinking-gate tables (``ReasoningTracker.warm``; requests
        with their own markers share them when their config is the same; a step would otherwise
        build them), then llguidance's (``auto`` sends it a schema the first time one is seen,
        and what xgrammar cannot serve exactly)."""
        self._warm_backend("xgrammar")
        try:
            cfg = self.reasoning_config()
        except GuideError:
            cfg = None  # markers this vocabulary lacks: such requests fail closed, nothing to build
        if cfg is not None:
            tracker_for(self._mgr.vocab, cfg).warm()
        self._warm_backend("llguidance")

    def _warm_backend(self, name: str) -> None:
        try:
            self._mgr.warm(name)
        except Exception as exc:  # noqa: BLE001 - best effort: the first compile builds (and reports) it
            logger.warning("tokenrails: building %s's tables ahead failed: %r", name, exc)

    def reasoning_config(self, setting: Any = None):
        """The ``ReasoningConfig`` (or None) for a request's setting (None: the engine default)."""
        setting = setting or self._reasoning_default
        with self._books:
            hit = self._reasoning_memo.get(setting, self)
        if hit is self:
            hit = resolve(setting, self.core().vocab)  # raises for markers the vocabulary lacks
            with self._books:
                if len(self._reasoning_memo) >= 256:
                    self._reasoning_memo.clear()
                self._reasoning_memo[setting] = hit
        return hit

    def prepare_row(self, row: Any) -> Any:
        """A plain ``GuidedRow`` with its reasoning resolved (or the ``GuideError`` that fails it).

        The first time a round with a reasoning config is seen, its state is started from the
        round's prompt. Rows without a config take exactly the path they took before.
        """
        if not isinstance(row, GuidedRow) or type(row) is GuidedRow:
            return row
        mgr = self.core()
        try:
            cfg = self.reasoning_config(getattr(row, "setting", None))
        except GuideError as exc:
            return exc
        key = (row.session_id, row.seq_id)
        with self._books:
            hit = self._begun.get(key)
        if hit is not None and hit.spec.key == row.spec.key:
            return hit
        prompt = getattr(row, "prompt", None)
        if cfg is not None:
            ids = prompt_for_reading(prompt, cfg) if prompt is not None else None
            mgr.begin_sequence(row.session_id, row.seq_id, row.spec, reasoning=cfg, prompt_token_ids=ids,
                               max_tokens=row.max_tokens)
        prepared = GuidedRow(row.session_id, row.seq_id, row.spec, reasoning=cfg, max_tokens=row.max_tokens)
        with self._books:
            self._begun[key] = prepared
            if prompt is not None and settings.lookup_drafts():
                self._prompts[key] = prompt
        return prepared

    def take_prompt(self, key: tuple[Hashable, Hashable]) -> Any:
        """The round's prompt ids (once: the caller indexes them), None when not seen."""
        with self._books:
            return self._prompts.pop(key, None)

    def prepare_rows(self, rows: list[Any]) -> list[Any]:
        return [self.prepare_row(r) for r in rows]

    def fail_rounds(self, errors: dict[tuple[Hashable, Hashable], GuideError]) -> None:
        """Remember failed rounds by (session, seq_key), the first error of each (bounded)."""
        with self._books:
            for key, err in errors.items():
                self._failed.setdefault(key, err)
            while len(self._failed) > MAX_FAILED:
                self._failed.popitem(last=False)

    # ---- LMDeploy's clean-up calls ---------------------------------------------------------
    def end_session(self, session_id: Hashable) -> None:
        with self._books:
            for book in (self._rounds, self._begun, self._failed, self._prompts):
                for ident in [k for k in book if k[0] == session_id]:
                    del book[ident]
        if self._mgr is not None:
            self._mgr.end_session_soon(session_id)  # the event loop never waits for a step's lock

    remove_processor = end_session  # LMDeploy's name

    @staticmethod
    def is_terminated(processor: Any) -> bool:
        """LMDeploy's spec agent asks this of the handles ``GuidedSpecHelper`` returns."""
        return processor.is_terminated()

    def clear(self) -> None:
        """Drop every matcher (LMDeploy calls this on sleep/reset)."""
        with self._books:
            sessions = {k[0] for k in self._rounds}
            self._rounds.clear()
            self._begun.clear()
            self._failed.clear()
            self._prompts.clear()
        if self._mgr is not None:
            for session_id in sessions:
                self._mgr.end_session_soon(session_id)

    def stats(self) -> dict[str, int]:
        mgr = self.core(wait=False) if self._error is None else None
        out = dict(mgr.stats()) if mgr is not None else {}
        out["tracked_rounds"] = len(self._rounds)
        return out

    def request_metrics(self, session_id: Hashable, seq_id: Hashable | None = None) -> dict[str, float]:
        """A request's guided metrics (the core's, when ``seq_id`` names a live sequence) and its
        speculative-decoding counters (draft_metrics.py: drafted, accepted, forced, verify steps)."""
        mgr = self.core(wait=False) if self._error is None else None
        out: dict[str, float] = dict(mgr.request_metrics(session_id, seq_id)) if mgr is not None and seq_id is not None else {}
        for source in METRICS_SOURCES:
            out.update(source(session_id))
        return out
