"""GuidedLogitsProcessor and jump-forward without a model: random scores, adversarial choices.

The "model" here is a random-logits generator; the sampler always picks the *lowest-scoring
allowed* token, the worst case for a constraint. Outputs must still validate with independent
oracles (jsonschema, re.fullmatch, membership), and every failure must fail closed.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

from tokenrails import GuideSpec
from tokenrails.engine_patch.hf.decode import _jump
from tokenrails.engine_patch.transformers import GuidedLogitsProcessor, validate_output
from tokenrails.guided.jump_forward import text_encoder
from tokenrails.guided.manager import GuidedDecodingManager, GuidedRow, StepStatus
from tokenrails.guided.registry import compile_guide

SCHEMA = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "maxLength": 4},
        "level": {"enum": ["low", "high"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["code", "level", "n"],
    "additionalProperties": False,
}


def _specs():
    return [
        GuideSpec.json_schema(SCHEMA, any_whitespace=False),
        GuideSpec.regex(r"[a-c]{2}-\d{3}"),
        GuideSpec.choice(["alpha", "beta", "gamma delta"]),
        None,
    ]


def _drive(proc, vocab, steps, rows, seed, pick="worst"):
    """A fake generate(): random logits → processor → pick a token; returns sequences [rows, 1+steps]."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.zeros((rows, 1), dtype=torch.long)  # a 1-token "prompt"
    done = [False] * rows
    eos = vocab.eos_ids[0]
    for _ in range(steps):
        scores = torch.randn((rows, vocab.vocab_size), generator=gen)
        before = scores.clone()
        scores = proc(ids, scores)
        nxt = []
        for r in range(rows):
            row = scores[r]
            finite = torch.isfinite(row)
            if done[r]:
                nxt.append(eos)
                continue
            if pick == "worst":
                tok = int(torch.where(finite, row, torch.tensor(float("inf"))).argmin())
            else:
                tok = int(row.argmax())
            if proc.rows[r] is None:  # unguided rows are left bit-identical
                assert torch.equal(row, before[r])
            nxt.append(tok)
            done[r] = done[r] or tok == eos
        ids = torch.cat([ids, torch.tensor(nxt)[:, None]], dim=1)
        if all(done):
            break
    return ids


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_adversarial_rows_validate_and_unguided_row_untouched(smollm2_tokenizer, vocab, seed):
    specs = _specs()
    proc = GuidedLogitsProcessor(specs, smollm2_tokenizer, vocab=vocab)
    seqs = _drive(proc, vocab, steps=60, rows=len(specs), seed=seed)
    reports = proc.finalize(seqs)
    for i, spec in enumerate(specs[:3]):
        rep = reports[i]
        text = smollm2_tokenizer.decode(proc.generated_ids(seqs[i]), clean_up_tokenization_spaces=False)
        assert rep.status == "complete", (rep, text)
        assert rep.valid is True, (rep, text)
        if spec.kind == "json_schema":
            import jsonschema

            jsonschema.validate(json.loads(text), SCHEMA)
        elif spec.kind == "regex":
            assert re.fullmatch(spec.pattern, text), text
        else:
            assert text in spec.choices
        assert rep.tokens >= 1 and rep.grammar_per_token_s >= 0
    assert reports[3].status == "unguided" and reports[3].valid is None


def test_rejected_token_fails_closed_with_eos_only_mask(smollm2_tokenizer, vocab):
    spec = GuideSpec.regex(r"\d+")
    proc = GuidedLogitsProcessor([spec], smollm2_tokenizer, vocab=vocab)
    prompt = torch.tensor([[5]])
    proc(prompt, torch.zeros((1, vocab.vocab_size)))
    letter = smollm2_tokenizer.encode("x", add_special_tokens=False)[0]
    scores = proc(torch.tensor([[5, letter]]), torch.zeros((1, vocab.vocab_size)))
    allowed = torch.isfinite(scores[0]).nonzero().flatten().tolist()
    assert allowed == list(vocab.eos_ids)  # never unconstrained after a rejection
    rep = proc.finalize(torch.tensor([[5, letter, vocab.eos_ids[0]]]))[0]
    assert rep.status == "rejected" and rep.valid is False
    assert rep.error_type == "TokenRejectedError" and str(letter) in rep.error


def test_failed_spec_row_gets_eos_only_and_typed_error(smollm2_tokenizer, vocab):
    bad = GuideSpec.regex("(unclosed")
    proc = GuidedLogitsProcessor([bad, GuideSpec.regex("[ab]+")], smollm2_tokenizer, vocab=vocab)
    scores = proc(torch.tensor([[5], [5]]), torch.zeros((2, vocab.vocab_size)))
    assert torch.isfinite(scores[0]).nonzero().flatten().tolist() == list(vocab.eos_ids)
    assert torch.isfinite(scores[1]).sum() > 1
    reps = proc.finalize(torch.tensor([[5, vocab.eos_ids[0]], [5, vocab.eos_ids[0]]]))
    assert reps[0].status == "error" and reps[0].valid is False
    assert reps[0].error_type == "InvalidGuideError" and "(unclosed" in reps[0].error
    assert reps[1].status == "rejected"  # EOS before any [ab]: incomplete → rejected by the grammar


def test_reordered_rows_raise_beam_search_unsupported(smollm2_tokenizer, vocab):
    proc = GuidedLogitsProcessor([GuideSpec.regex("[ab]+"), None], smollm2_tokenizer, vocab=vocab)
    a = smollm2_tokenizer.encode("a", add_special_tokens=False)[0]
    proc(torch.tensor([[5], [6]]), torch.zeros((2, vocab.vocab_size)))
    with pytest.raises(RuntimeError, match="beam search"):
        proc(torch.tensor([[6, a], [5, a]]), torch.zeros((2, vocab.vocab_size)))
    with pytest.raises(ValueError, match="beam search"):
        GuidedLogitsProcessor([None], smollm2_tokenizer, vocab=vocab)(
            torch.tensor([[5], [6]]), torch.zeros((2, vocab.vocab_size))
        )


def test_wrong_logits_width_is_refused(smollm2_tokenizer, vocab):
    proc = GuidedLogitsProcessor([GuideSpec.regex("a")], smollm2_tokenizer, vocab=vocab)
    with pytest.raises(ValueError, match="wide"):
        proc(torch.tensor([[5]]), torch.zeros((1, vocab.vocab_size + 64)))


def test_num_return_sequences_expands_rows(smollm2_tokenizer, vocab):
    specs = [GuideSpec.choice(["yes", "no"]), None]
    proc = GuidedLogitsProcessor(specs, smollm2_tokenizer, vocab=vocab, num_return_sequences=2)
    assert [r is None for r in proc.rows] == [False, False, True, True]
    seqs = _drive(proc, vocab, steps=8, rows=4, seed=3, pick="best")
    reps = proc.finalize(seqs)
    assert [r.status for r in reps] == ["complete", "complete", "unguided", "unguided"]


# ---- jump-forward planning ------------------------------------------------------------
LONG_KEYS = {
    "type": "object",
    "properties": {
        "customer_identification_number": {"type": "integer"},
        "preferred_contact_channel": {"enum": ["electronic_mail", "telephone_call"]},
    },
    "required": ["customer_identification_number", "preferred_contact_channel"],
    "additionalProperties": False,
}


def _accepted_bytes(vocab, ids):
    return b"".join(vocab.token_bytes[i] for i in ids)


def _jump_setup(vocab, tokenizer, spec, first_text):
    mgr = GuidedDecodingManager(vocab, backend="xgrammar", compile_workers=1)
    row = GuidedRow("j", 0, spec)
    tok = tokenizer.encode(first_text, add_special_tokens=False)
    assert len(tok) == 1
    assert mgr.accept_tokens(tok, [row])[0].state is StepStatus.OK
    return mgr, row, tok[0]


@pytest.mark.parametrize("first", ['{"', "{"])
def test_loop_jump_feeds_only_accepted_retokenized_forced_text(smollm2_tokenizer, vocab, first):
    """The decode loop's jump (the core rule, max_rollback=1): the sampled token and the forced
    text retokenized, last token held back, applied through the sequence (history exact)."""
    spec = GuideSpec.json_schema(LONG_KEYS, any_whitespace=False)
    mgr, row, tok = _jump_setup(vocab, smollm2_tokenizer, spec, first)
    forced = mgr.matcher_for("j", 0, spec).find_jump_forward_string()
    assert forced.startswith('"customer_identification_number": ' if first == "{" else "customer_identification")
    plan = _jump(mgr, "j", 0, spec, text_encoder(smollm2_tokenizer), tok, budget=100)
    assert plan is not None and len(plan) >= 2
    full = vocab.token_bytes[tok] + forced.encode()
    got = _accepted_bytes(vocab, plan)
    assert full.startswith(got) and len(got) < len(full)  # the last token is held back
    assert mgr.sequence("j", 0).history == plan  # the sequence followed the jump exactly
    assert mgr.matcher_for("j", 0, spec).find_jump_forward_string().encode() == full[len(got):]
    assert plan == smollm2_tokenizer.encode(full.decode(), add_special_tokens=False)[: len(plan)]


def test_loop_jump_none_leaves_the_sequence_unchanged(smollm2_tokenizer, vocab):
    spec = GuideSpec.json_schema(LONG_KEYS, any_whitespace=False)
    mgr, row, first = _jump_setup(vocab, smollm2_tokenizer, spec, '{"')
    before = mgr.matcher_for("j", 0, spec).find_jump_forward_string()
    assert _jump(mgr, "j", 0, spec, text_encoder(smollm2_tokenizer), first, budget=1) is None  # no budget
    assert mgr.matcher_for("j", 0, spec).find_jump_forward_string() == before

    def disagreeing_encoder(text):  # a tokenizer whose ids do not spell the text → must not jump
        return [first] * 5

    assert _jump(mgr, "j", 0, spec, disagreeing_encoder, first, budget=100) is None
    assert mgr.matcher_for("j", 0, spec).find_jump_forward_string() == before
    assert mgr.sequence("j", 0).history == [first]
    choice = GuideSpec.choice(["yes", "no"])
    y = smollm2_tokenizer.encode("y", add_special_tokens=False)[0]
    if mgr.accept_tokens([y], [GuidedRow("c", 0, choice)])[0].state is StepStatus.OK:
        plan = _jump(mgr, "c", 0, choice, text_encoder(smollm2_tokenizer), y, budget=100)
        # "y" + forced "es": retokenized; kept whole because it ends the output (only EOS follows)
        assert plan is None or _accepted_bytes(vocab, plan) == b"yes"
        assert mgr.sequence("c", 0).history == (plan or [y])


def test_validate_output_oracles():
    s = GuideSpec.json_schema(SCHEMA)
    assert validate_output(s, '{"code":"ab","level":"low","n":3}', True).valid
    bad = validate_output(s, '{"code":"abcdef","level":"low","n":3}', True)
    assert not bad.valid and bad.method == "jsonschema"
    assert not validate_output(s, '{"code":', True).valid
    assert validate_output(GuideSpec.regex(r"\d+"), "123", True).valid
    assert not validate_output(GuideSpec.regex(r"\d+"), "12a", True).valid
    assert not validate_output(GuideSpec.choice(["a", "b"]), "c", True).valid
    assert validate_output(GuideSpec.grammar('root ::= "x"'), "x", True).method == "matcher"
    assert validate_output(GuideSpec.regex(r"\d+"), "123", True).method == "fsm DFA"


def test_validate_output_never_backtracks_on_a_client_pattern():
    """``(a+)+b`` against an output cut before its ``b``: Python's ``re.fullmatch`` takes about
    2^n steps (n = 40: hours) holding the GIL; the DFA answers in linear time."""
    import threading
    import time

    spec = GuideSpec.regex(r"(a+)+b")
    text = "a" * 40
    result = {}
    worker = threading.Thread(target=lambda: result.update(v=validate_output(spec, text, False)), daemon=True)
    t0 = time.monotonic()
    worker.start()
    worker.join(timeout=30)  # wide: a DFA build on a loaded 2-core machine, not a speed claim
    assert not worker.is_alive(), "validation backtracked"
    assert result["v"].method == "fsm DFA" and not result["v"].valid
    assert time.monotonic() - t0 < 30


def test_a_large_spec_past_its_deadline_stops_compiling(vocab):
    """transformers' manager: a 36 KB grammar (6,000 ``[^\\n]`` classes, seconds to minutes of
    xgrammar) past its deadline fails the call and nothing keeps compiling it. In-process the
    compile cannot be stopped: it ran on for minutes after ``generate`` had failed it."""
    import time

    from tokenrails.engine_patch.hf import vocab as hf_vocab
    from tokenrails.guided.errors import GuideTimeoutError
    from tokenrails.guided.limits import GuideLimits

    limits = GuideLimits(compile_timeout_s=4.0, max_abandoned_compiles=7)  # (a key of its own)
    mgr = hf_vocab.manager_for(vocab, "xgrammar", limits)
    try:
        with pytest.raises(GuideTimeoutError):
            mgr.get_compiled(GuideSpec.grammar("root ::= " + " ".join(["[^\\n]"] * 6000)))
        deadline = time.monotonic() + 5.0
        while (mgr._pool.running or mgr._pool.abandoned) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mgr._pool.running == 0 and mgr._pool.abandoned == 0, "the compile past its deadline still runs"
    finally:
        mgr.close()
        with hf_vocab._lock:
            hf_vocab._MANAGERS.pop((vocab.fingerprint, "xgrammar", hash(limits)), None)
