"""Bugs of the old per-step path (issue 23), each with a test that failed before the redesign.

1. The transformers decode loop jumped forward on the raw matcher: the sequence's recorded
   history then missed the forced tokens (history and matcher disagreed).
2. LMDeploy's speculative handles read the manager's sequence state outside its step lock.
3. A guided LMDeploy row without the strategy's entry was keyed ``(seq_id, 0)``: on a session's
   second round it bound the first round's (finished) matcher.
6. ``GuidedLogitsProcessor`` compared and cloned the whole ``[B, L]`` history every step.
"""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from tokenrails import GuideSpec
from tokenrails.guided.errors import GuideError
from tokenrails.guided.manager import GuidedDecodingManager, GuidedRow, StepStatus


# ---- 1 ------------------------------------------------------------------------------------------
LONG_KEYS = {
    "type": "object",
    "properties": {
        "customer_identification_number": {"type": "integer"},
        "preferred_contact_channel": {"enum": ["email", "phone"]},
    },
    "required": ["customer_identification_number", "preferred_contact_channel"],
    "additionalProperties": False,
}


@pytest.mark.slow
def test_decode_loop_jump_keeps_the_sequence_history_exact(smollm2):
    from tokenrails.engine_patch.transformers import generate_guided, logits_width, vocabulary_for

    vocab = vocabulary_for(smollm2.tokenizer, logits_width(smollm2.model))
    seen: dict = {}

    class Watching(GuidedDecodingManager):
        def end_session(self, session_id):
            for (sid, seq), st in list(self._seqs.items()):
                if sid == session_id:
                    seen[seq] = list(st.history)
            super().end_session(session_id)

    mgr = Watching(vocab, backend="xgrammar", fill_threads=1)
    spec = GuideSpec.json_schema(LONG_KEYS, any_whitespace=False)
    res = generate_guided(smollm2.model, smollm2.tokenizer, ["Customer 4521 prefers phone. JSON:"], [spec],
                          max_new_tokens=64, chat=True, jump_forward=True, manager=mgr).results[0]
    assert res.finish_reason == "stop" and res.valid and res.forced_tokens > 0
    # every generated token went through the sequence (the final EOS too)
    assert seen[0] == res.token_ids + [seen[0][-1]] and seen[0][-1] in vocab.eos_ids


# ---- 2 ------------------------------------------------------------------------------------------
def test_speculative_handles_wait_for_the_step_lock(smollm2_tokenizer, vocab):
    from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager
    from tokenrails.engine_patch.lmdeploy.speculative.spec_helper import RowHandle, SpecState

    owner = LMDeployGuidedManager(smollm2_tokenizer, vocab.vocab_size, vocab=vocab)
    mgr = owner.core()
    row = GuidedRow("s", (1, 0), GuideSpec.regex("(ab)+"))
    mgr.fill_and_apply(torch.zeros(1, vocab.vocab_size), [row])  # the state exists
    handle = RowHandle(SpecState(owner), row, None).fork()
    bitmask = torch.zeros((1, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
    for call in (handle.is_terminated, lambda: handle.fill(bitmask, 0), lambda: handle.accept_draft(0)):
        done = threading.Event()
        held, release = threading.Event(), threading.Event()

        def hold():
            with mgr._step_lock:  # a step of another thread is running
                held.set()
                release.wait(5)

        holder = threading.Thread(target=hold)
        holder.start()
        held.wait(5)
        worker = threading.Thread(target=lambda c=call: (c(), done.set()))
        worker.start()
        time.sleep(0.2)
        blocked = not done.is_set()
        release.set()
        holder.join(5)
        worker.join(5)
        assert blocked, "a speculative handle touched the sequence while a step held the lock"
        assert done.is_set()
    handle.rollback()


# ---- 3 ------------------------------------------------------------------------------------------
def _inputs_without_entry(fmt):
    return SimpleNamespace(session_ctx=[{"session_id": 7, "seq_id": 3}], response_formats=[fmt], batch_size=1)


def _rows(si):
    from tokenrails.engine_patch.lmdeploy.step.lmdeploy_step import rows_from_inputs

    return rows_from_inputs(si)


def test_fallback_row_never_binds_the_previous_rounds_matcher(vocab):
    mgr = GuidedDecodingManager(vocab, backend="xgrammar", compile_workers=1)
    fmt = {"type": "regex_schema", "regex_schema": "a"}
    a = vocab.token_bytes.index(b"a")
    fresh = torch.zeros(1, vocab.vocab_size)
    mgr.fill_and_apply(fresh, [GuidedRow("ref", 0, GuideSpec.regex("a"))])
    # round 1 (rows without the strategy's entry): "a" then EOS, the matcher is finished
    for tok in (a, vocab.eos_ids[0]):
        (row,) = _rows(_inputs_without_entry(fmt))
        if isinstance(row, GuideError):
            break  # failed closed: no identity to bind
        mgr.fill_and_apply(torch.zeros(1, vocab.vocab_size), [row])
        mgr.accept_tokens([tok], [row])
    # round 2 of the same session and sequence, same constraint
    (row,) = _rows(_inputs_without_entry(fmt))
    if isinstance(row, GuideError):
        return  # refused for this request only: never constrained by another round's state
    logits = torch.zeros(1, vocab.vocab_size)
    (status,) = mgr.fill_and_apply(logits, [row])
    assert status.state is StepStatus.OK
    assert torch.equal(torch.isfinite(logits), torch.isfinite(fresh)), "round 2 got round 1's finished matcher"


# ---- 6 ------------------------------------------------------------------------------------------
class _HistoryWork(torch.overrides.TorchFunctionMode):
    """Counts elements of int64 [B, >1] tensors produced by torch calls (the history's copies and
    comparisons; scores are float, masks int32)."""

    def __init__(self, rows: int):
        super().__init__()
        self.rows = rows
        self.elements = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dtype == torch.int64 and out.dim() == 2 \
                and out.shape[0] == self.rows and out.shape[1] > 1:
            self.elements += out.numel()
        return out


def test_processor_history_check_is_linear_in_steps(vocab):
    from tokenrails.engine_patch.transformers import GuidedLogitsProcessor

    rows, prompt, steps = 2, 8, 400
    proc = GuidedLogitsProcessor([GuideSpec.regex("[ab]+"), None], vocab=vocab, reasoning="off")
    a = vocab.token_bytes.index(b"a")
    ids = torch.full((rows, prompt), a, dtype=torch.long)
    proc(ids, torch.zeros(rows, vocab.vocab_size))  # first call: compile, prompt (not counted)
    ids = torch.cat([ids, torch.full((rows, 1), a, dtype=torch.long)], dim=1)
    work = _HistoryWork(rows)
    with work:
        for _ in range(steps):
            proc(ids, torch.zeros(rows, vocab.vocab_size))
            ids = torch.cat([ids, torch.full((rows, 1), a, dtype=torch.long)], dim=1)
    # torch.cat builds each step's input (O(L) per step, the caller's cost): allow a few times
    # that, never the O(L^2) of copying the whole history per step
    caller = sum(rows * (prompt + k + 1) for k in range(steps))
    assert work.elements <= 3 * caller, (work.elements, caller)
