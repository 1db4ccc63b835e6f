"""Our own batched decode loop with a KV cache, driving the same manager + bitmask kernel as LMDeploy.

Why not only ``model.generate``: jump-forward feeds a row several tokens in one forward pass,
and rows of one batch jump by different amounts. Each step feeds every row its own list of new
tokens, left-padded to the longest; pad slots are masked in the attention mask, so they are
holes no later query attends to, and position ids count real tokens only. Rows are never
re-packed; a finished row just stops receiving real tokens.

Reasoning rows (``reasoning=``, see tokenrails/engine_patch/reasoning_settings.py): started from their
prompt; jump-forward only once the answer has begun; ``text`` is the whole output,
``answer_text`` the constrained part (validated), ``reasoning_text`` the thinking section.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch

from ...guided.budget import budget_spec
from ...guided.sequence import GuidedRow, SequenceState, StepStatus
from ...guided.errors import GuideError
from ...guided.jump_forward import JumpForward, text_encoder
from ...guided.limits import GuideLimits
from ...guided.spec import GuideSpec
from ..reasoning_settings import configs_for_rows, prompt_for_reading
from .sampling import SamplingParams, choose_tokens
from .validate import error_category, validate_output
from .vocab import logits_width, manager_for, vocabulary_for

_sessions = itertools.count()


@dataclass
class GuidedResult:
    """One row's outcome. ``finish_reason``: "stop" (EOS), "length" (budget hit), "error"."""

    text: str
    token_ids: list[int]          # generated ids (sampled and forced), without the final EOS
    finish_reason: str
    valid: bool | None            # None for an unguided row; False unless finish_reason == "stop"
    validation: str = ""          # oracle used, and why it failed
    error: str | None = None      # the GuideError message (error type first) for a failed row
    error_type: str | None = None  # its public class: InvalidGuideError, GuideLimitError, TokenRejectedError...
    spec_kind: str | None = None
    grammar_init_s: float = 0.0   # compile wait + matcher creation seen by this row
    compile_s: float = 0.0        # compile time of its guide (overlapped with prefill when prefetched)
    grammar_per_token_s: float = 0.0  # mask fill + accept time per sampled token
    jump_forward_s: float = 0.0
    forward_passes: int = 0       # decode forward passes this row took part in (prefill excluded)
    forced_tokens: int = 0        # tokens appended by jump-forward, not sampled
    answer_text: str = ""         # the constrained answer (== text without reasoning)
    reasoning_text: str = ""      # the thinking section before it (markers included), "" if none
    answer_start: int | None = 0  # index in token_ids where the answer begins (None: never began)
    budget_closed: bool | None = None  # budget="close": the rule removed a token the grammar allowed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GenerationReport:
    results: list[GuidedResult]
    wall_s: float
    prefill_s: float
    forward_passes: int           # batched forward calls, prefill included
    new_tokens: int               # tokens appended over all rows (EOS excluded)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        decode = self.wall_s - self.prefill_s
        return self.new_tokens / decode if decode > 0 else 0.0


def encode_prompts(tokenizer: Any, prompts: Sequence[str], chat: bool) -> list[list[int]]:
    """Token ids per prompt; with ``chat`` the model's chat template (generation prompt added)."""
    out = []
    for p in prompts:
        if chat:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
            out.append(list(tokenizer.encode(text, add_special_tokens=False)))
        else:
            out.append(list(tokenizer.encode(p, add_special_tokens=True)))
    if any(not ids for ids in out):
        raise ValueError("a prompt tokenized to nothing")
    return out


class _Batch:
    """Token ids, attention mask and KV cache of the whole batch (holes allowed)."""

    def __init__(self, model: Any, pad_id: int):
        from transformers import DynamicCache

        self.model = model
        self.pad_id = pad_id
        self.cache = DynamicCache(config=model.config)
        self.mask = torch.zeros((0, 0), dtype=torch.long)
        self.real = None  # real tokens per row so far (positions)
        self.calls = 0

    @torch.inference_mode()
    def feed(self, new: Sequence[Sequence[int]]) -> torch.Tensor:
        """Append each row's new tokens (left-padded within the step); last-position logits."""
        rows = len(new)
        width = max(len(t) for t in new)
        ids = torch.full((rows, width), self.pad_id, dtype=torch.long)
        step_mask = torch.zeros((rows, width), dtype=torch.long)
        for i, toks in enumerate(new):
            if toks:
                ids[i, width - len(toks):] = torch.tensor(list(toks), dtype=torch.long)
                step_mask[i, width - len(toks):] = 1
        past = self.mask.shape[1]
        self.mask = step_mask if past == 0 else torch.cat([self.mask, step_mask], dim=1)
        base = torch.zeros(rows, dtype=torch.long) if self.real is None else self.real
        positions = (base[:, None] + step_mask.cumsum(dim=1) - 1).clamp(min=0)
        self.real = base + step_mask.sum(dim=1)
        out = self.model(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=positions,
            past_key_values=self.cache,
            cache_position=torch.arange(past, past + width),
            use_cache=True,
            logits_to_keep=1,
        )
        self.calls += 1
        return out.logits[:, -1, :].float().contiguous()


def generate_guided(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    specs: Sequence[GuideSpec | None],
    max_new_tokens: int = 64,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    jump_forward: bool = True,
    chat: bool = False,
    backend: str = "auto",
    limits: GuideLimits | None = None,
    manager: Any = None,
    reasoning: Any = None,
    budget: str | None = None,
) -> GenerationReport:
    """Generate for a batch in which each row has its own spec (or None = unconstrained).

    A row whose spec fails, or whose token is rejected, ends with finish_reason "error" and the
    typed error's message; it is never continued unconstrained. ``reasoning``: one setting for
    every row or a list (None: ``$TOKENRAILS_REASONING``, else "auto").
    ``budget="close"``: every guided row's output is closed within ``max_new_tokens`` (thinking
    and EOS included; tokenrails/guided/budget.py): exact on DFA constraints, which it needs
    (``UnsupportedGuideError`` here for grammars and structural tags; a schema the fsm backend
    cannot lower fails its row). A row whose shortest output cannot fit fails before its first
    token with ``GuideLimitError`` (limit "max_tokens").
    """
    if len(prompts) != len(specs):
        raise ValueError(f"{len(prompts)} prompts but {len(specs)} specs")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    specs, row_budget = budget_rows(specs, budget, max_new_tokens)
    t_start = time.perf_counter()
    vocab = vocabulary_for(tokenizer, logits_width(model))
    mgr = manager or manager_for(vocab, backend, limits)
    for spec in specs:
        mgr.prefetch(spec)  # compiles overlap tokenization and the prefill forward
    params = SamplingParams(do_sample, temperature, top_k, top_p, seed)
    gen = params.generator()
    encode = text_encoder(tokenizer)
    session = f"hf-decode-{next(_sessions)}"
    n = len(prompts)
    configs = configs_for_rows(reasoning, n, vocab)
    rows = [GuidedRow(session, i, s, reasoning=c, max_tokens=row_budget) if s is not None else None
            for i, (s, c) in enumerate(zip(specs, configs))]
    answers: dict[int, SequenceState] = {}  # reasoning rows (their phase knows where the answer begins)
    eos = set(vocab.eos_ids)
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos.update([gen_eos] if isinstance(gen_eos, int) else list(gen_eos or []))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else vocab.eos_ids[0]

    out_ids: list[list[int]] = [[] for _ in range(n)]
    finish: list[str | None] = [None] * n
    errors: list[GuideError | None] = [None] * n
    passes = [0] * n
    forced = [0] * n
    jump_s = [0.0] * n
    batch = _Batch(model, pad_id)
    try:
        prompt_ids = encode_prompts(tokenizer, prompts, chat)
        for i, row in enumerate(rows):
            if row is not None and row.reasoning is not None:
                answers[i] = mgr.begin_sequence(
                    session, i, row.spec, reasoning=row.reasoning,
                    prompt_token_ids=prompt_for_reading(prompt_ids[i], row.reasoning), max_tokens=row.max_tokens)
        logits = batch.feed(prompt_ids)
        prefill_s = time.perf_counter() - t_start
        while True:
            active = [i for i in range(n) if finish[i] is None]
            if not active:
                break
            step_rows = [rows[i] if finish[i] is None else None for i in range(n)]
            statuses = mgr.fill_and_apply(logits, step_rows)
            tokens = choose_tokens(logits, params, gen).tolist()
            answering = [i not in answers or answers[i].answer_start() is not None  # before this token
                         for i in range(n)]
            accepted = mgr.accept_tokens(tokens, step_rows)
            feed: list[list[int]] = [[] for _ in range(n)]
            for i in active:
                tok = int(tokens[i])
                status = accepted[i] if rows[i] is not None else None
                pre = statuses[i]
                if pre is not None and pre.state is StepStatus.ERROR:
                    finish[i], errors[i] = "error", pre.error
                    continue
                if status is not None and status.state in (StepStatus.REJECTED, StepStatus.ERROR):
                    finish[i], errors[i] = "error", status.error
                    continue
                if (status is not None and status.state is StepStatus.TERMINATED) or (
                    rows[i] is None and tok in eos
                ):
                    finish[i] = "stop"
                    continue
                new = [tok]
                budget = max_new_tokens - len(out_ids[i])
                if jump_forward and rows[i] is not None and answering[i]:
                    t0 = time.perf_counter()
                    plan = _jump(mgr, session, i, rows[i].spec, encode, tok, budget)
                    jump_s[i] += time.perf_counter() - t0
                    if plan is not None:
                        new = plan
                        forced[i] += len(plan) - 1
                out_ids[i].extend(new)
                if len(out_ids[i]) >= max_new_tokens:
                    finish[i] = "length"
                    continue
                feed[i] = new
                passes[i] += 1
            if any(feed):
                logits = batch.feed(feed)
        results = _results(tokenizer, mgr, session, rows, out_ids, finish, errors, passes, forced, jump_s,
                           answers)
    finally:
        mgr.end_session(session)
    wall = time.perf_counter() - t_start
    return GenerationReport(
        results, wall, prefill_s, batch.calls, sum(len(o) for o in out_ids),
        extra={"manager": mgr.stats()},
    )


def budget_rows(specs: Sequence[GuideSpec | None], budget: str | None,
                max_new_tokens: int | None) -> tuple[list[GuideSpec | None], int | None]:
    """The specs and per-row ``max_tokens`` for a ``budget`` setting (None or "close")."""
    if budget is None:
        return list(specs), None
    if budget != "close":
        raise ValueError(f"budget must be None or 'close', got {budget!r}")
    if max_new_tokens is None or max_new_tokens < 1:
        raise ValueError("budget='close' needs max_new_tokens >= 1")
    return [budget_spec(s) if s is not None else None for s in specs], int(max_new_tokens)


def _jump(mgr: Any, session: Any, seq: int, spec: GuideSpec, encode: Any, sampled: int, budget: int) -> list[int] | None:
    """Tokens to feed instead of ``sampled`` (already accepted, not yet seen by the model), or None.

    The core's jump-forward rule (guided/jump_forward.py) with ``max_rollback=1``: only
    ``sampled`` may be re-tokenized together with the forced text. The jump is applied through
    the manager (same accept path as a sampled token), so the sequence's history is exact.
    ``budget`` caps how many tokens may be returned.
    """
    jf = mgr.jump_forward(session, seq, spec, encode=encode, max_rollback=1)
    if not jf.token_ids:
        return None
    keep = [] if jf.rollback_tokens else [sampled]
    ids = tuple(jf.token_ids[: budget - len(keep)])
    if not ids:
        return None
    status = mgr.apply_jump_forward(session, seq, spec, JumpForward(jf.text, ids, jf.rollback_tokens))
    if status.failed:  # cannot happen: the rule checked the tokens from this very state
        raise RuntimeError(f"the sequence refused its own jump-forward: {status.error}")
    return keep + list(ids)


def _results(tokenizer, mgr, session, rows, out_ids, finish, errors, passes, forced, jump_s,
             answers) -> list[GuidedResult]:
    results = []

    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    for i, row in enumerate(rows):
        text = decode(out_ids[i])
        start = answers[i].answer_start() if i in answers else 0
        answer = text if start == 0 else decode(out_ids[i][start:]) if start is not None else ""
        thinking = "" if start == 0 else decode(out_ids[i][:start] if start is not None else out_ids[i])
        res = GuidedResult(
            text=text, token_ids=out_ids[i], finish_reason=str(finish[i]), valid=None,
            forward_passes=passes[i], forced_tokens=forced[i], jump_forward_s=jump_s[i],
            answer_text=answer, reasoning_text=thinking, answer_start=start,
        )
        if row is not None:
            res.spec_kind = row.spec.kind
            metrics = mgr.request_metrics(session, i)
            res.grammar_init_s = float(metrics.get("grammar_init_s", 0.0))
            res.grammar_per_token_s = float(metrics.get("grammar_per_token_s", 0.0))
            if "budget_closed" in metrics:
                res.budget_closed = bool(metrics["budget_closed"])
            if errors[i] is None:
                try:
                    res.compile_s = float(mgr.get_compiled(row.spec).compile_s)
                except GuideError:  # evicted and failing now: the row itself already succeeded
                    res.compile_s = float("nan")
            if errors[i] is not None:
                res.error = f"{type(errors[i]).__name__}: {errors[i]}"
                res.error_type = error_category(errors[i])
                res.valid, res.validation = False, "error"
            elif finish[i] != "stop":
                res.valid, res.validation = False, "incomplete: max_new_tokens reached"
            else:
                verdict = validate_output(row.spec, answer, matcher_complete=True)
                res.valid = verdict.valid
                res.validation = verdict.method + (f": {verdict.reason}" if verdict.reason else "")
        results.append(res)
    return results
