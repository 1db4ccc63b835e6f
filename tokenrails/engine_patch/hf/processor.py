"""``GuidedLogitsProcessor``: per-row constraints inside ``model.generate(...)``.

Each call first accepts the token generated since the previous call (``input_ids[:, -1]``; the
first call sees only the prompt), then fills the guided rows' bitmasks and applies them to the
scores in place with one kernel call (unguided rows are left bit-identical).

Unsupported: beam search and any other strategy that reorders rows between steps (each row's
matcher follows one sequence). The processor checks that every row's history only grows and
raises otherwise. ``num_return_sequences=k`` with sampling is supported: pass the same ``k``.

Reasoning (``reasoning=``, default ``$TOKENRAILS_REASONING`` else "auto"; see
tokenrails/engine_patch/reasoning_settings.py): a row with a reasoning config is started from its prompt
on the first call (template-opened or closed thinking sections are honoured); its thinking text is
free, the constraint starts after the end marker, and ``finalize`` validates only the answer.

The processor's matchers live in its manager until ``finalize`` (or ``close()``, or the end of a
``with`` block) ends its session; a processor dropped without either ends it when collected.

``budget="close"`` with ``max_new_tokens=`` (generate's value): each row's output is closed within
that many tokens (tokenrails/guided/budget.py); ``RowReport.budget_closed`` says whether it had to.
"""
from __future__ import annotations

import itertools
import time
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ...guided.sequence import GuidedRow, StepStatus
from ...guided.errors import GuideError
from ...guided.limits import GuideLimits
from ...guided.spec import GuideSpec
from ...guided.vocabulary import Vocabulary
from ..reasoning_settings import configs_for_rows, prompt_for_reading
from .decode import budget_rows
from .validate import error_category, validate_output
from .vocab import manager_for, vocabulary_for

try:  # the base class only matters to transformers' isinstance checks
    from transformers import LogitsProcessor as _Base
except ImportError:  # pragma: no cover
    _Base = object

_sessions = itertools.count()


@dataclass
class RowReport:
    """One row's constraint outcome after ``finalize``.

    ``status``: "unguided", "complete" (EOS accepted), "incomplete" (generation stopped before the
    constraint was complete — e.g. max_new_tokens), "rejected" or "error" (with ``error``).
    """

    status: str
    error: str | None = None
    error_type: str | None = None  # public class: InvalidGuideError, GuideLimitError, TokenRejectedError...
    valid: bool | None = None
    validation: str = ""
    answer_start: int | None = None  # generated-token index where the constrained answer begins
    grammar_init_s: float = 0.0
    grammar_per_token_s: float = 0.0
    tokens: int = 0
    budget_closed: bool | None = None  # budget="close": the rule removed a token the grammar allowed


class GuidedLogitsProcessor(_Base):
    """Constrain each row of a ``generate`` batch by its own ``GuideSpec`` (or None)."""

    def __init__(
        self,
        specs: Sequence[GuideSpec | None],
        tokenizer: Any = None,
        *,
        vocab: Vocabulary | None = None,
        vocab_size: int | None = None,
        manager: Any = None,
        backend: str = "auto",
        limits: GuideLimits | None = None,
        num_return_sequences: int = 1,
        reasoning: Any = None,
        budget: str | None = None,
        max_new_tokens: int | None = None,
    ):
        if vocab is None:
            if manager is not None:
                vocab = manager.vocab
            elif tokenizer is not None:
                vocab = vocabulary_for(tokenizer, vocab_size)
            else:
                raise ValueError("GuidedLogitsProcessor needs a tokenizer, a vocab or a manager")
        self.vocab = vocab
        self.tokenizer = tokenizer
        self.manager = manager or manager_for(vocab, backend, limits)
        if num_return_sequences < 1:
            raise ValueError("num_return_sequences must be >= 1")
        # budget="close": outputs closed within max_new_tokens (pass generate's own value)
        specs, row_budget = budget_rows(specs, budget, max_new_tokens)
        # generate() repeats each prompt num_return_sequences times, consecutively.
        self.specs = [s for s in specs for _ in range(num_return_sequences)]
        self.session = f"hf-processor-{next(_sessions)}"
        per_prompt = reasoning if isinstance(reasoning, (list, tuple)) else [reasoning] * len(specs)
        if len(per_prompt) != len(specs):
            raise ValueError(f"{len(per_prompt)} reasoning settings for {len(specs)} specs")
        configs = configs_for_rows([r for r in per_prompt for _ in range(num_return_sequences)],
                                   len(self.specs), vocab)
        self.rows = [GuidedRow(self.session, i, s, reasoning=c, max_tokens=row_budget) if s is not None else None
                     for i, (s, c) in enumerate(zip(self.specs, configs))]
        self.answers: dict[int, Any] = {}  # the reasoning rows' sequence states
        self._done: list[str | None] = [None] * len(self.rows)  # "complete" | "rejected" | "error"
        self._errors: list[GuideError | None] = [None] * len(self.rows)
        # the history seen so far, as its length and last column: enough to tell a grown history
        # from a reordered or rewritten one at O(B) per step (a full [B, L] copy was O(L^2))
        self._prev_len: int | None = None
        self._prev_last: torch.Tensor | None = None
        self._prompt_len = 0
        self.time_s = 0.0  # wall time spent inside __call__ (accept + fill + kernel), for overhead reports
        self.calls = 0
        # generate() may raise, or finalize() never be called: the session (its matchers) ends
        # when the processor is collected, queued so the collector never waits on the manager
        end_soon = getattr(self.manager, "end_session_soon", None) or self.manager.end_session
        self._closer = weakref.finalize(self, end_soon, self.session)
        for s in specs:
            self.manager.prefetch(s)  # compile while generate() runs the prefill

    # ---- the transformers hook ----------------------------------------------------------
    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        try:
            return self._step(input_ids, scores)
        finally:
            self.time_s += time.perf_counter() - t0
            self.calls += 1

    def _step(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[0] != len(self.rows):
            raise ValueError(
                f"GuidedLogitsProcessor got {input_ids.shape[0]} rows but has {len(self.rows)} specs: "
                "beam search is not supported; for num_return_sequences=k pass num_return_sequences=k"
            )
        if scores.shape[-1] != self.vocab.vocab_size:
            raise ValueError(
                f"scores are {scores.shape[-1]} wide but the vocabulary has vocab_size={self.vocab.vocab_size}; "
                "build it with the model's logits width (vocab_size=...)"
            )
        if self._prev_len is None:
            self._prompt_len = input_ids.shape[1]
            self._begin(input_ids)
        else:
            self._check_history(input_ids)
            self._accept(input_ids[:, -1].tolist())
        self._prev_len = input_ids.shape[1]
        self._prev_last = input_ids[:, -1].clone()
        statuses = self.manager.fill_and_apply(scores, self.rows)
        for i, st in enumerate(statuses):
            if st is not None and st.state is StepStatus.ERROR and self._done[i] is None:
                self._done[i], self._errors[i] = "error", st.error
        return scores

    def _begin(self, input_ids: torch.Tensor) -> None:
        """Reasoning rows: read each row's prompt (left padding is harmless: no marker)."""
        for i, row in enumerate(self.rows):
            if row is not None and row.reasoning is not None:
                ids = prompt_for_reading(input_ids[i].tolist(), row.reasoning)
                self.answers[i] = self.manager.begin_sequence(self.session, i, row.spec, reasoning=row.reasoning,
                                                              prompt_token_ids=ids, max_tokens=row.max_tokens)

    def _check_history(self, input_ids: torch.Tensor) -> None:
        last = self._prev_last
        assert last is not None
        if input_ids.shape[1] != self._prev_len + 1 or not torch.equal(input_ids[:, -2], last):
            raise RuntimeError(
                "GuidedLogitsProcessor: rows were reordered or rewritten between steps "
                "(beam search, or the processor reused for a second generate call); "
                "use one processor per generate call and no beam search"
            )

    def _accept(self, tokens: Sequence[int]) -> None:
        step_rows = [r if self._done[i] is None else None for i, r in enumerate(self.rows)]
        statuses = self.manager.accept_tokens(tokens, step_rows)
        for i, st in enumerate(statuses):
            if st is None:
                continue
            if st.state is StepStatus.TERMINATED:
                self._done[i] = "complete"
            elif st.state is StepStatus.REJECTED:
                self._done[i], self._errors[i] = "rejected", st.error
            elif st.state is StepStatus.ERROR:
                self._done[i], self._errors[i] = "error", st.error

    # ---- after generation ---------------------------------------------------------------
    def finalize(self, sequences: torch.Tensor) -> list[RowReport]:
        """Accept the tokens generate() produced after the last call, then report every row.

        ``sequences`` is ``generate(...)``'s output (prompt included). Call once, after generate.
        """
        if sequences.shape[0] != len(self.rows):
            raise ValueError(f"{sequences.shape[0]} sequences for {len(self.rows)} rows")
        seen = self._prev_len if self._prev_len is not None else sequences.shape[1]
        for pos in range(seen, sequences.shape[1]):
            if all(d is not None or r is None for d, r in zip(self._done, self.rows)):
                break
            self._accept(sequences[:, pos].tolist())
        reports = [self._report(i, sequences[i]) for i in range(len(self.rows))]
        self.close()
        return reports

    def close(self) -> None:
        """End the processor's session now (``finalize`` does; ``with`` does on exit, also when
        generate raised). Without it the session ends when the processor is collected."""
        if self._closer.detach() is not None:
            self.manager.end_session(self.session)

    def __enter__(self) -> "GuidedLogitsProcessor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generated_ids(self, sequence: torch.Tensor) -> list[int]:
        """This row's new tokens up to (not including) its first EOS."""
        ids = sequence[self._prompt_len:].tolist()
        eos = set(self.vocab.eos_ids)
        for k, t in enumerate(ids):
            if t in eos:
                return ids[:k]
        return ids

    def _report(self, i: int, sequence: torch.Tensor) -> RowReport:
        row = self.rows[i]
        if row is None:
            return RowReport("unguided")
        m = self.manager.request_metrics(self.session, i)
        rep = RowReport(
            self._done[i] or "incomplete",
            grammar_init_s=float(m.get("grammar_init_s", 0.0)),
            grammar_per_token_s=float(m.get("grammar_per_token_s", 0.0)),
            tokens=int(m.get("tokens", 0)),
            answer_start=self.answers[i].answer_start() if i in self.answers else 0,
            budget_closed=m["budget_closed"] if "budget_closed" in m else None,
        )
        if self._errors[i] is not None:
            rep.error = f"{type(self._errors[i]).__name__}: {self._errors[i]}"
            rep.error_type = error_category(self._errors[i])
            rep.valid, rep.validation = False, "error"
        elif rep.status != "complete":
            rep.valid, rep.validation = False, "incomplete: generation stopped before the constraint was complete"
        elif self.tokenizer is not None:
            text = self.tokenizer.decode(
                self.generated_ids(sequence)[rep.answer_start or 0:], skip_special_tokens=False,
                clean_up_tokenization_spaces=False,
            )
            verdict = validate_output(row.spec, text, matcher_complete=True)
            rep.valid = verdict.valid
            rep.validation = verdict.method + (f": {verdict.reason}" if verdict.reason else "")
        else:
            rep.valid, rep.validation = True, "matcher"
        return rep
