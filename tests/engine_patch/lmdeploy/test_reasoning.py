"""Reasoning ("thinking") rows through LMDeploy's real strategy → FusedLogitsProcessor → accept.

Vocabularies: ``think_tokenizer`` (SmolLM2 + added ``<think>``/``</think>``, like qwen3) for
"auto"; SmolLM2 itself has no markers (the "nothing changes" case) and gets explicit markers
from its own tokens (``<issue_start>``/``<issue_closed>`` by id, ``<think>``/``</think>`` as text).
Logits are scripted: a wanted token far on top, EOS and grammar breakers next (adversarial);
greedy picks the best allowed token, so every mask decision is visible in the output.
"""
from __future__ import annotations

import asyncio
import json
import re

import pytest
import torch

from . import harness

REGEX = r"[0-9]{3}-[a-z]{2}"
RF = {"type": "regex_schema", "regex_schema": REGEX}
EOS = 2


def _mgr(tok, vocab):
    from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager

    return LMDeployGuidedManager(tok, vocab.vocab_size, vocab=vocab)


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def _run(mgr, seqs, scripts, vocab_size, steps=24, seed=0, favored=(EOS, 25276, 33)):
    """Greedy decode; ``scripts[k][step]`` (if any) is row k's wanted token at that step.

    Returns (generated per seq, masked scores per step).
    """
    strat = harness.strategy()
    gen = torch.Generator().manual_seed(seed)
    seen = []

    async def run():
        live = list(seqs)
        for step in range(steps):
            if not live:
                return
            logits = torch.randn(len(live), vocab_size, generator=gen)
            logits[:, list(favored)] += 50.0
            for b, s in enumerate(live):
                want = scripts[seqs.index(s)]
                n = len(s.generated)
                if n < len(want) and want[n] is not None:
                    logits[b, want[n]] += 100.0
            toks, _ = await harness.step(strat, mgr, live, logits)
            seen.append(logits.clone())
            for s, t in zip(live, toks):
                s.generated.append(int(t))
            live = [s for s in live if s.generated[-1] != EOS]

    asyncio.run(run())
    return [s.generated for s in seqs], seen


def _answer_ok(tok, ids):
    assert ids and ids[-1] == EOS, ids
    text = tok.decode(ids[:-1])
    assert re.fullmatch(REGEX, text), text


@pytest.fixture
def lm(cpu_lmdeploy, upgraded, monkeypatch):
    monkeypatch.delenv("TOKENRAILS_REASONING", raising=False)
    return upgraded


def test_auto_model_thinks_then_answers(lm, think_tokenizer, think_vocab):
    tok = think_tokenizer
    T, E = tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")
    think = _ids(tok, "hello world")
    prompt = _ids(tok, "user: give me a code\nassistant:")
    seq = harness.FakeSeq(1, harness.gen_config(RF), prompt_ids=prompt)
    # step 0 <think>; thinking text (EOS pushed hardest at step 2: must stay impossible); </think>
    script = [T, *think, EOS, E]
    mgr = _mgr(tok, think_vocab)
    (out,), seen = _run(mgr, [seq], [script], think_vocab.vocab_size)
    assert out[0] == T and out[1:1 + len(think)] == think
    k = 1 + len(think)
    assert out[k] != EOS and EOS not in out[:-1]
    end = out.index(E)
    _answer_ok(tok, out[end + 1:])
    # the first row: the grammar's first tokens OR <think>; letters (grammar-illegal) excluded
    first = torch.isfinite(seen[0][0])
    assert first[T] and first[_ids(tok, "1")[0]] and not first[_ids(tok, "abc")[0]] and not first[EOS]
    assert not torch.isfinite(seen[1 + len(think)][0][EOS])  # thinking: EOS never allowed


def test_auto_model_answers_directly(lm, think_tokenizer, think_vocab):
    tok = think_tokenizer
    seq = harness.FakeSeq(2, harness.gen_config(RF), prompt_ids=_ids(tok, "q:"))
    (out,), _ = _run(_mgr(tok, think_vocab), [seq], [[]], think_vocab.vocab_size, seed=3)
    _answer_ok(tok, out)


def test_prompt_prefilled_start_marker(lm, think_tokenizer, think_vocab):
    """A template that opens <think> itself: the first generated token is already thinking."""
    tok = think_tokenizer
    T, E = tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")
    prompt = _ids(tok, "q:") + [T] + _ids(tok, "\n")
    letters = _ids(tok, "abc")
    seq = harness.FakeSeq(3, harness.gen_config(RF), prompt_ids=prompt)
    (out,), seen = _run(_mgr(tok, think_vocab), [seq], [[*letters, E]], think_vocab.vocab_size)
    assert out[: len(letters)] == letters and out[len(letters)] == E
    _answer_ok(tok, out[len(letters) + 1:])
    assert not torch.isfinite(seen[0][0][EOS])


def _masks(mgr, tok, vocab, rf, prompt, seed=7):
    seq = harness.FakeSeq(4, harness.gen_config(rf), prompt_ids=prompt)
    (out,), seen = _run(mgr, [seq], [[]], vocab.vocab_size, seed=seed)
    return out, seen


def _same(a, b):
    assert a[0] == b[0]
    assert len(a[1]) == len(b[1]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


def test_closed_empty_block_constrained_from_first_token(lm, think_tokenizer, think_vocab, monkeypatch):
    """qwen3 enable_thinking=False: ``<think>\\n\\n</think>\\n\\n`` → masks exactly as reasoning off."""
    tok = think_tokenizer
    T = tok.convert_tokens_to_ids("<think>")
    prompt = _ids(tok, "q:") + _ids(tok, "<think>\n\n</think>\n\n")
    auto = _masks(_mgr(tok, think_vocab), tok, think_vocab, RF, prompt)
    _answer_ok(tok, auto[0])
    assert not torch.isfinite(auto[1][0][0][T])
    monkeypatch.setenv("TOKENRAILS_REASONING", "off")
    _same(auto, _masks(_mgr(tok, think_vocab), tok, think_vocab, RF, prompt))


def test_no_markers_masks_identical_to_reasoning_off(lm, smollm2_tokenizer, vocab, monkeypatch):
    """SmolLM2 has no <think> token: "auto" resolves to nothing and every mask is bit-identical."""
    from tokenrails.engine_patch.reasoning_settings import AUTO, resolve

    assert resolve(AUTO, vocab) is None
    tok = smollm2_tokenizer
    prompt = _ids(tok, "q: <think>\n\n")  # the text, not a marker token
    runs = []
    for env in (None, "off"):
        if env:
            monkeypatch.setenv("TOKENRAILS_REASONING", env)
        runs.append(_masks(_mgr(tok, vocab), tok, vocab, {**RF, "tokenrails_reasoning": "auto"}, prompt))
        runs.append(_masks(_mgr(tok, vocab), tok, vocab, RF, prompt))
    _answer_ok(tok, runs[0][0])
    for other in runs[1:]:
        _same(runs[0], other)


def test_per_request_off_switch(lm, think_tokenizer, think_vocab, monkeypatch):
    tok = think_tokenizer
    T = tok.convert_tokens_to_ids("<think>")
    prompt = _ids(tok, "q:")
    off = {**RF, "tokenrails_reasoning": "off"}
    seq = harness.FakeSeq(5, harness.gen_config(off), prompt_ids=prompt)
    (out,), seen = _run(_mgr(tok, think_vocab), [seq], [[T]], think_vocab.vocab_size, seed=11)
    assert T not in out and not torch.isfinite(seen[0][0][T])
    _answer_ok(tok, out)
    monkeypatch.setenv("TOKENRAILS_REASONING", "off")  # same as turning it off engine-wide
    seq2 = harness.FakeSeq(5, harness.gen_config(RF), prompt_ids=prompt)
    _same((out, seen), (lambda r: (r[0][0], r[1]))(_run(_mgr(tok, think_vocab), [seq2], [[T]],
                                                          think_vocab.vocab_size, seed=11)))


@pytest.mark.parametrize("setting", ["<issue_start>,<issue_closed>", "<think>,</think>"])
def test_per_request_explicit_markers(lm, smollm2_tokenizer, vocab, setting):
    """Markers from SmolLM2's own tokens (by id) or as text: the row starts inside the section
    (not optional), thinks freely without EOS, and is constrained after the end marker."""
    tok = smollm2_tokenizer
    end = setting.split(",")[1]
    end_ids = [tok.convert_tokens_to_ids(end)] if end.startswith("<issue") else _ids(tok, end)
    letters = _ids(tok, "abc hello")
    rf = {**RF, "tokenrails_reasoning": setting}
    seq = harness.FakeSeq(6, harness.gen_config(rf), prompt_ids=_ids(tok, "q:"))
    (out,), seen = _run(_mgr(tok, vocab), [seq], [[*letters, EOS, *end_ids]], vocab.vocab_size)
    k = len(letters)  # step k wanted EOS: masked, so something else came
    assert out[:k] == letters and out[k] != EOS and out[k + 1:k + 1 + len(end_ids)] == end_ids, out
    _answer_ok(tok, out[k + 1 + len(end_ids):])


def test_rounds_read_their_own_prompt(lm, think_tokenizer, think_vocab):
    """Round 1 thinks; round 2 on the same session closes the section in its prompt."""
    tok = think_tokenizer
    T, E = tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")
    mgr = _mgr(tok, think_vocab)
    seq = harness.FakeSeq(7, harness.gen_config(RF), prompt_ids=_ids(tok, "q:"))
    (out1,), _ = _run(mgr, [seq], [[T, *_ids(tok, "hmm"), E]], think_vocab.vocab_size)
    _answer_ok(tok, out1[out1.index(E) + 1:])
    seq.new_round(harness.gen_config(RF), prompt_ids=_ids(tok, "again:<think>\n\n</think>\n\n"))
    (out2,), seen = _run(mgr, [seq], [[T]], think_vocab.vocab_size, seed=2)
    assert T not in out2 and not torch.isfinite(seen[0][0][T])
    _answer_ok(tok, out2)
    assert mgr.stats()["active_matchers"] == 1  # round 1's state was released


def test_nonlast_chunk_does_not_start_the_sequence(lm, think_tokenizer, think_vocab):
    """Chunked prefill: the non-last chunk's step does nothing; the last chunk reads the prompt."""
    tok = think_tokenizer
    T, E = tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")
    mgr = _mgr(tok, think_vocab)
    seq = harness.FakeSeq(8, harness.gen_config(RF), prompt_ids=_ids(tok, "q:") + [T])

    from tokenrails.engine_patch.lmdeploy.step import lmdeploy_step as step

    async def chunk():
        real = step.LMDeployStep
        step.LMDeployStep = lambda owner, si, **kw: real(owner, si, skip_guided=True)  # a non-last chunk
        try:
            logits = torch.zeros(1, think_vocab.vocab_size)
            logits[0, EOS] = 9.0
            await harness.step(harness.strategy(), mgr, [seq], logits)  # token thrown away
        finally:
            step.LMDeployStep = real

    asyncio.run(chunk())
    assert mgr.stats()["active_matchers"] == 0
    letters = _ids(tok, "xyz")
    (out,), _ = _run(mgr, [seq], [[*letters, E]], think_vocab.vocab_size)
    assert out[:len(letters)] == letters
    _answer_ok(tok, out[len(letters) + 1:])


def test_bad_setting_refused_early_and_in_engine(lm, smollm2_tokenizer, vocab):
    from lmdeploy.serve.core import async_engine
    from lmdeploy.serve.core.exceptions import RequestError

    bad = {**RF, "tokenrails_reasoning": "only-one-marker"}
    with pytest.raises(RequestError) as info:
        async_engine.ensure_response_format_compilable(bad)
    assert info.value.status_code == 400 and "reasoning" in info.value.message
    async_engine.ensure_response_format_compilable(json.dumps({**RF, "tokenrails_reasoning": "off"}))
    seq = harness.FakeSeq(9, harness.gen_config(bad), prompt_ids=_ids(smollm2_tokenizer, "q:"))

    async def one():
        logits = torch.randn(1, vocab.vocab_size)
        return await harness.step(harness.strategy(), _mgr(smollm2_tokenizer, vocab), [seq], logits)

    toks, proc = asyncio.run(one())
    assert toks == [EOS] and "reasoning" in str(proc.tokenrails_step.errors[0])


def test_activate_option_and_env_syntax_checked(lm, monkeypatch, think_tokenizer, think_vocab):
    import tokenrails.engine_patch.lmdeploy as patch
    from tokenrails.guided.errors import InvalidGuideError

    from tokenrails.engine_patch.lmdeploy.boot import settings

    with pytest.raises(InvalidGuideError):
        patch.activate(reasoning="a,b,c")
    before = settings.activated()
    patch.activate(reasoning="off")
    try:
        assert _mgr(think_tokenizer, think_vocab).reasoning_config() is None
    finally:
        settings._ACTIVATED = before  # the fixture's options, without "off" (not monkeypatch: it
        # would put "off" back after the fixture's deactivate())
    monkeypatch.setenv("TOKENRAILS_REASONING", "<think>,</think>,max=3")
    cfg = _mgr(think_tokenizer, think_vocab).reasoning_config()
    assert cfg.match == "ids" and cfg.max_thinking_tokens == 3 and not cfg.optional


def test_spec_decode_cursor_follows_thinking(lm, think_tokenizer, think_vocab):
    """Draft cursors mask and read drafts like real tokens (thinking, end marker, answer), and
    roll back exactly; verification then accepts the same tokens for real."""
    from lmdeploy.pytorch.spec_decode.guided_spec_helper import GuidedSpecHelper

    tok = think_tokenizer
    T, E = tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")
    mgr = _mgr(tok, think_vocab)
    helper = GuidedSpecHelper(mgr)
    V = think_vocab.vocab_size
    seq = harness.FakeSeq(10, harness.gen_config(RF), prompt_ids=_ids(tok, "q:") + [T])
    si = harness.strategy().make_sampling_inputs([seq])
    letter, digit = _ids(tok, "abc")[0], _ids(tok, "1")[0]

    async def run():
        procs = helper.get_processors(si.session_ctx, si.response_formats)
        cur = {0: procs[0].fork()}
        finite = []
        for draft in (letter, E, digit):
            bm = await helper.prepare_bitmask(torch.zeros(1, V), cur)
            row = torch.zeros(1, V)
            helper.apply_bitmask(row, bm)
            finite.append(torch.isfinite(row[0]))
            await helper.accept_draft_tokens(torch.tensor([[draft]]), cur)
        target = torch.zeros(1, 4, V)
        drafts = torch.tensor([[letter, E, digit]])
        await helper.apply_serial_bitmask(target, procs, drafts, 3)
        out = torch.tensor([[letter, E, digit, digit]])
        await helper.accept_rejection_sampled_tokens(procs, torch.tensor([0]), out, torch.tensor([digit]), 3)
        return finite, target

    finite, target = asyncio.run(run())
    # draft side: thinking row (letters yes, EOS no), thinking row again, then the grammar's row
    assert finite[0][letter] and not finite[0][EOS] and finite[1][E]
    assert finite[2][digit] and not finite[2][letter] and not finite[2][T]
    # target side, position by position, the same decisions
    assert torch.isfinite(target[0, 0, letter]) and not torch.isfinite(target[0, 0, EOS])
    assert torch.isfinite(target[0, 2, digit]) and not torch.isfinite(target[0, 2, letter])
    st = mgr.core().sequence(10, (seq.seq_id, seq.output_start_pos))
    assert st.phase.think.done and st.phase.answer == [digit, digit]


def _spec(rf):
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import spec_of

    return spec_of(rf)


def test_http_request_key_reaches_engine(lm):
    from .test_requests import _client, _post
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import parse_format

    r = _post(_client(), {**RF, "tokenrails_reasoning": "off"})
    message = r.json()["message"]
    assert message.startswith("REACHED "), message
    spec, setting = parse_format(json.loads(message.split("REACHED ", 1)[1]))
    assert spec.pattern == REGEX and setting.kind == "off"
    bad = _post(_client(), {**RF, "tokenrails_reasoning": "x"})
    assert bad.status_code == 400 and "REACHED" not in bad.text
