"""One guided sequence: its identity, its grammar future, and its row state machine.

This is the bottom of the guided step (compare vLLM v1's per-request structured-output state): a
``SequenceState`` owns everything one sequence needs — the pending compile of its spec, the
matcher once it exists, the thinking state of a reasoning request, the constrained tokens accepted
so far — and the transitions of its row:

* ``fill``: write the row's next mask (grammar, thinking row, undecided optional thinking, or
  EOS-only for a failed row);
* ``accept``: one sampled token → OK | TERMINATED | REJECTED (fail closed) | ERROR;
* ``tentative`` / ``Lookahead``: walk draft tokens and restore the state exactly (speculative);
* ``apply_jump``: roll back and accept forced tokens through the same ``accept`` as a sampled one;
* ``finalize``: why the sequence ended and whether its output is a complete match.

Nothing here knows about sessions, caches or engines: the manager (manager.py) creates states
and keeps the session table; the batched step (batch_step.py) fills and accepts many states.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

import torch

from .backend import CompiledGuide, Matcher
from .bitmask import eos_only_row
from .errors import GuideError, GuideTimeoutError, TokenRejectedError, detached_copy
from .reasoning import ReasoningConfig, ReasoningTracker, ThinkState, open_step, tracker_for
from .vocabulary import Vocabulary
from .spec import GuideSpec

__all__ = [
    "Finalization", "GrammarFuture", "GuidedRow", "Lookahead", "RowContext", "RowStatus",
    "SequenceState", "StepStatus", "count_valid",
]


@dataclass(frozen=True)
class GuidedRow:
    """Identity and constraint of one logits row.

    ``reasoning``: the model thinks first; the constraint starts after the end marker
    (see reasoning.py). Read when the sequence's state is created.
    """

    session_id: Hashable
    seq_id: Hashable
    spec: GuideSpec
    reasoning: ReasoningConfig | None = None


class StepStatus(enum.Enum):
    OK = "ok"
    TERMINATED = "terminated"  # EOS accepted: the output is complete and valid
    REJECTED = "rejected"      # a sampled token broke the grammar: finish with an error
    ERROR = "error"            # the constraint failed (invalid, unsupported, limit, timeout)


@dataclass
class RowStatus:
    """``valid_drafts`` (speculative fill): leading drafts the grammar accepts.
    ``accepted`` (speculative accept, jump-forward): tokens consumed before a failure (all of
    them when OK)."""

    state: StepStatus
    error: GuideError | None = None
    valid_drafts: int | None = None
    accepted: int | None = None

    @property
    def failed(self) -> bool:
        return self.state in (StepStatus.REJECTED, StepStatus.ERROR)


OK = RowStatus(StepStatus.OK)
_HERE = object()  # ``SequenceState.fill``: at the sequence's own position


@dataclass(frozen=True)
class Finalization:
    """``finish_reason``: "stop" (grammar accepted EOS), "error", the engine's reason when the
    output is still a complete match, or ``f"{reason}_incomplete"`` when it is not.
    ``complete``: the output (after the thinking section) is a full match of the constraint."""

    finish_reason: str
    complete: bool
    error: GuideError | None = None
    thinking: bool = False  # still inside the thinking section when it ended


class RowContext:
    """What every row of one manager shares: the EOS ids, the per-step fill limit, and the
    manager's counters (``rejections`` is counted here)."""

    __slots__ = ("eos_ids", "eos", "max_fill_seconds", "counters")

    def __init__(self, eos_ids: Sequence[int], max_fill_seconds: float, counters: dict | None = None):
        self.eos_ids = tuple(int(e) for e in eos_ids)
        self.eos = frozenset(self.eos_ids)
        self.max_fill_seconds = max_fill_seconds
        self.counters = counters if counters is not None else {"rejections": 0}


class GrammarFuture:
    """The compile of one spec as its sequence sees it.

    ``wait()``: the compiled guide, waiting up to the request's deadline (raises its
    ``GuideError``); ``failure()``: the compile's error if it already failed, without waiting.
    The manager builds it over its compile cache; the state never sees the manager.
    """

    __slots__ = ("_wait", "_failure")

    def __init__(self, wait: Callable[[], CompiledGuide], failure: Callable[[], GuideError | None]):
        self._wait = wait
        self._failure = failure

    def wait(self) -> CompiledGuide:
        return self._wait()

    def failure(self) -> GuideError | None:
        return self._failure()


@dataclass
class SequenceState:
    """Everything kept for one (session, sequence).

    ``matcher`` is None while a reasoning sequence is still thinking and its compile is not
    needed yet (``grammar`` finishes it later), or when ``error`` is set.
    ``history``: constrained tokens accepted so far (jump-forward rolls back through it).
    """

    spec_key: str
    matcher: Matcher | None
    error: GuideError | None = None
    grammar_init_s: float = 0.0
    guided_time_s: float = 0.0
    tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    spec: GuideSpec | None = None
    tracker: ReasoningTracker | None = None
    think: ThinkState | None = None
    history: list[int] = field(default_factory=list)
    grammar: GrammarFuture | None = None
    ctx: RowContext | None = None

    # ---- reasoning --------------------------------------------------------------------------
    def start_reasoning(self, vocab: Vocabulary, config: ReasoningConfig,
                        prompt_token_ids: Sequence[int] | None = None, thinking_done: bool | None = None) -> None:
        """Think first: the row is free until the end marker (see reasoning.py). Where the
        sequence starts is read from its prompt (or ``thinking_done``); a bad config or marker
        fails the row (``error``)."""
        try:
            self.tracker = tracker_for(vocab, config)
            self.think = self.tracker.initial(prompt_token_ids, thinking_done)
        except GuideError as exc:
            self.error = exc

    # ---- the grammar future --------------------------------------------------------------
    def resolve(self) -> Matcher | None:
        """The matcher, finishing a deferred compile (waits up to its deadline); None once failed."""
        if self.matcher is not None or self.error is not None:
            return self.matcher
        assert self.grammar is not None, "a state without matcher needs its grammar future"
        start = time.perf_counter()
        try:
            self.matcher = self.grammar.wait().matcher()
        except GuideError as exc:
            self.error = exc
        self.grammar_init_s += time.perf_counter() - start
        return self.matcher

    def poll(self) -> None:
        """Without waiting: record a finished compile's failure in ``error``."""
        if self.matcher is None and self.error is None and self.grammar is not None:
            err = self.grammar.failure()
            if err is not None:
                self.error = detached_copy(err)

    # ---- where the row stands --------------------------------------------------------------
    @property
    def answering(self) -> bool:
        """The constrained answer has begun (no reasoning, or its thinking section is over)."""
        return self.think is None or self.think.done

    @property
    def thinking(self) -> bool:
        """Inside the thinking section (decided, not ended)."""
        return self.think is not None and self.think.thinking

    def batch_matcher(self) -> Matcher | None:
        """The matcher a batched fill may fill for this row (a plain grammar row), else None:
        failed, thinking and undecided rows are filled one by one by ``fill``."""
        if self.error is not None or not self.answering:
            return None
        return self.resolve()

    # ---- fill ------------------------------------------------------------------------------
    def fill(self, bitmask: torch.Tensor, j: int, think: Any = _HERE) -> None:
        """Row ``j`` of ``bitmask`` for this state (``think``: the thinking state a look-ahead
        reached, see ``Lookahead.fill``). Failed rows get EOS only."""
        if think is _HERE:
            think = self.think
        ctx = self.ctx
        assert ctx is not None
        if self.error is None and think is not None and think.opening:
            # optional thinking, undecided: the grammar's row (after the tentatively fed marker
            # prefix) OR the start marker's continuation; only the latter once the grammar refused
            matcher = self.resolve()
            if matcher is not None:
                assert self.tracker is not None
                t0 = time.perf_counter()
                if think.answer_ok:
                    matcher.fill_next_token_bitmask(bitmask, j)
                self.tracker.fill_start(think, bitmask, j, union=think.answer_ok)
                self.guided_time_s += time.perf_counter() - t0
                return
        if self.error is None and think is not None and not think.done:
            self.poll()  # fail early: a bad spec is reported while thinking
            if self.error is None:
                assert self.tracker is not None
                self.tracker.fill(think, bitmask, j)
                return
        matcher = self.resolve() if self.error is None else None
        if matcher is None:
            eos_only_row(bitmask[j], ctx.eos_ids)
            return
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask, j)
        took = time.perf_counter() - t0
        self.guided_time_s += took
        if took > ctx.max_fill_seconds:
            self.end_slow(took, bitmask[j])

    def end_slow(self, took: float, row: torch.Tensor) -> None:
        """This row's fill took ``took`` s, past ``max_fill_seconds``: it ends with
        ``GuideTimeoutError``, EOS only, so it never stalls a step again."""
        ctx = self.ctx
        assert ctx is not None
        self.error = GuideTimeoutError(
            f"one step's mask took {took:.2f} s (limit max_fill_seconds={ctx.max_fill_seconds}): the row ends",
            limit="max_fill_seconds", value=round(took, 3))
        eos_only_row(row, ctx.eos_ids)

    # ---- accept ----------------------------------------------------------------------------
    def accept(self, tok: int) -> RowStatus:
        """One sampled (or forced) token through the row's state machine."""
        if self.error is not None:
            # A failed row may only have emitted EOS (its mask allowed nothing else).
            return RowStatus(StepStatus.ERROR, self.error)
        eos = self.ctx.eos if self.ctx is not None else frozenset()
        think = self.think
        if think is not None and think.opening:
            return self._accept_opening(tok, eos)
        if think is not None and not think.done:
            assert self.tracker is not None
            nxt = self.tracker.advance(think, tok)
            if nxt is None:
                why = "while forcing the end of the thinking section" if self.tracker.forcing(think) else (
                    "while thinking (EOS before the end marker, or bytes past the end marker in the same token)")
                return self._reject(tok, why)
            self.think = nxt
            return OK
        if self.resolve() is None:
            return RowStatus(StepStatus.ERROR, self.error)
        matcher = self.matcher
        assert matcher is not None
        if matcher.is_terminated():
            if tok in eos:
                return RowStatus(StepStatus.TERMINATED)
            return self._reject(tok, "after the constraint was complete")
        t0 = time.perf_counter()
        ok = matcher.accept_token(tok)
        self.guided_time_s += time.perf_counter() - t0
        self.tokens += 1
        if not ok:
            return self._reject(tok, "by the grammar")
        self.history.append(tok)
        if tok in eos:
            return RowStatus(StepStatus.TERMINATED)
        return OK

    def _accept_opening(self, tok: int, eos: frozenset[int]) -> RowStatus:
        """Optional thinking, undecided: the start marker or the answer's first tokens."""
        matcher = self.resolve()
        if matcher is None:
            return RowStatus(StepStatus.ERROR, self.error)
        assert self.tracker is not None and self.think is not None
        t0 = time.perf_counter()
        nxt, moved = open_step(self.tracker, matcher, self.think, tok)
        self.guided_time_s += time.perf_counter() - t0
        if nxt is None:
            why = ("at the start of an optional thinking section (neither the start marker nor the "
                   "grammar allows it here)")
            return self._reject(tok, why)
        if moved > 0:
            self.history.append(tok)
            self.tokens += 1
        elif moved < 0:
            del self.history[len(self.history) + moved:]
        self.think = nxt
        if nxt.done and tok in eos:
            return RowStatus(StepStatus.TERMINATED)
        return OK

    def _reject(self, tok: int, why: str) -> RowStatus:
        if self.ctx is not None:
            self.ctx.counters["rejections"] = self.ctx.counters.get("rejections", 0) + 1
        self.error = TokenRejectedError(f"sampled token {tok} is not allowed {why}", token_id=tok)
        return RowStatus(StepStatus.REJECTED, self.error)

    def accept_many(self, tokens: Sequence[int]) -> RowStatus:
        """Accept ``tokens`` in order; stop at the first failure (``accepted`` counts the rest)."""
        status = RowStatus(StepStatus.ERROR, self.error) if self.error is not None else OK
        n = 0
        for tok in tokens:
            status = self.accept(int(tok))
            if status.failed:
                break
            n += 1
        return RowStatus(status.state, status.error, accepted=n)

    # ---- look-ahead (speculative drafts, jump-forward checks) ------------------------------
    def tentative(self, think: ThinkState | None, tok: int) -> tuple[ThinkState | None, int] | None:
        """Advance by one draft from ``think``: (new think state, matcher change) or None (not
        allowed; nothing changed). The caller undoes the matcher change (see ``Lookahead``)."""
        if think is not None and think.opening:
            assert self.tracker is not None
            matcher = self.resolve()
            if matcher is None:
                return None
            nxt, delta = open_step(self.tracker, matcher, think, tok)
            return None if nxt is None else (nxt, delta)
        if think is not None and not think.done:
            assert self.tracker is not None
            nxt = self.tracker.advance(think, tok)
            return None if nxt is None else (nxt, 0)
        matcher = self.resolve()
        if matcher is None or matcher.is_terminated():
            return None
        return (think, 1) if matcher.accept_token(tok) else None

    def forced_prefix(self) -> list[int] | None:
        """Before the answer: the tokens forced now (at the thinking cap, the rest of the end
        marker; else ``[]``); None when the answer has begun (the grammar decides)."""
        think = self.think
        if think is None or think.done:
            return None
        tracker = self.tracker
        assert tracker is not None
        ids: list[int] = []
        while not think.done and tracker.forcing(think):
            tok = tracker.forced_token(think)
            nxt = tracker.advance(think, tok)
            assert nxt is not None, "the forced marker token was refused"
            ids.append(tok)
            think = nxt
        return ids

    def apply_jump(self, rollback: int, token_ids: Sequence[int]) -> RowStatus:
        """Roll the answer back ``rollback`` tokens, then accept ``token_ids`` exactly as sampled
        tokens (same transitions, same history)."""
        if rollback > len(self.history):
            raise ValueError(f"cannot roll back {rollback} tokens: only {len(self.history)} were generated")
        if self.error is not None:
            return RowStatus(StepStatus.ERROR, self.error, accepted=0)
        if rollback and not self.answering:
            raise ValueError("cannot roll back: the answer has not started (thinking, or the optional "
                             "thinking decision is still open)")
        matcher = self.resolve()
        if matcher is None:
            return RowStatus(StepStatus.ERROR, self.error, accepted=0)
        if rollback:
            matcher.rollback(rollback)
            del self.history[len(self.history) - rollback:]
        return self.accept_many(token_ids)

    # ---- end ------------------------------------------------------------------------------
    def finalize(self, reason: str = "length") -> Finalization:
        """Why the sequence ended and whether its output is a complete match (see
        ``GuidedDecodingManager.finalize``)."""
        if self.error is not None:
            return Finalization("error", False, self.error)
        think = self.think
        if think is not None and think.opening:
            # Optional thinking, still undecided: the output is no full start marker, so it is the
            # answer — complete iff the grammar (fed alongside the partial marker) accepts it.
            ok = think.answer_ok and self.matcher is not None and self.matcher.is_accepting()
            return Finalization(reason if ok else f"{reason}_incomplete", ok, thinking=not think.answer_ok)
        if think is not None and not think.done:
            return Finalization(f"{reason}_incomplete", False, thinking=True)
        matcher = self.matcher
        if matcher is None:  # never compiled, never used
            return Finalization(f"{reason}_incomplete", False)
        if matcher.is_terminated():
            return Finalization("stop", True)
        if matcher.is_accepting():
            return Finalization(reason, True)
        return Finalization(f"{reason}_incomplete", False)

    def may_end(self) -> bool:
        """Whether the output is complete now (EOS would be a valid end): never while thinking;
        while undecided only if the grammar accepts the answer so far."""
        if self.error is not None:
            return False
        think = self.think
        if think is not None and not think.done:
            return think.opening and think.answer_ok and self.resolve() is not None \
                and self.matcher is not None and self.matcher.is_accepting()
        matcher = self.resolve()
        return matcher is not None and matcher.is_accepting()


class Lookahead:
    """Walks one sequence through draft tokens tentatively (thinking section included) and
    restores its matcher exactly on exit: no matcher copies.

    ``advanced``: tokens accepted on top of the lowest point reached; ``dropped``: tokens of the
    sequence's own history rolled back below its real state (an undecided optional-thinking row
    whose drafts complete the start marker), re-accepted on exit.
    """

    def __init__(self, st: SequenceState):
        self.st = st
        self.think = st.think
        self.advanced = 0
        self.dropped = 0

    def __enter__(self) -> "Lookahead":
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        """Put the sequence's matcher back where it was (idempotent)."""
        if not (self.advanced or self.dropped):
            return
        matcher = self.st.matcher
        assert matcher is not None
        if self.advanced:
            matcher.rollback(self.advanced)
        hist = self.st.history
        for t in hist[len(hist) - self.dropped:] if self.dropped else ():
            ok = matcher.accept_token(t)
            assert ok, "re-accepting the sequence's own tokens failed"
        self.advanced = self.dropped = 0
        self.think = self.st.think

    def advance(self, tok: int) -> bool:
        """Take one draft; False (state unchanged) when it is not allowed."""
        moved = self.st.tentative(self.think, tok)
        if moved is None:
            return False
        self.think, delta = moved
        if delta >= 0:
            self.advanced += delta
        else:
            undo = min(-delta, self.advanced)
            self.advanced -= undo
            self.dropped += -delta - undo
        return True

    def fill(self, bitmask: torch.Tensor, j: int) -> None:
        """Row ``j``: the sequence's mask after the drafts walked so far."""
        self.st.fill(bitmask, j, self.think)

    def terminated(self) -> bool:
        """Only EOS may follow the walked tokens (never while thinking or undecided)."""
        if self.st.error is not None:
            return True
        if self.think is not None and not self.think.done:
            return False
        matcher = self.st.resolve()
        return matcher is None or matcher.is_terminated()


def count_valid(st: SequenceState, tokens: Sequence[int]) -> int:
    """Leading ``tokens`` allowed from ``st`` (thinking included); the state is left unchanged."""
    if st.error is not None:
        return 0
    if st.answering:
        matcher = st.resolve()
        return 0 if matcher is None else matcher.validate_tokens([int(t) for t in tokens])
    n = 0
    with Lookahead(st) as walk:
        for tok in tokens:
            if not walk.advance(int(tok)):
                break
            n += 1
    return n
