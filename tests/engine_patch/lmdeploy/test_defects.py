"""Each known defect of LMDeploy 0.18's guided decoding, reproduced on stock and fixed by the upgrade.

Every test runs twice (``mode``): against stock LMDeploy it asserts the defect is present, with
the upgrade it asserts the defect is gone. Outputs are checked against oracles (``re.fullmatch``,
``json.loads`` + ``jsonschema``), with adversarial logits that push grammar-breaking tokens.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
from types import SimpleNamespace

import jsonschema
import pytest
import torch

from . import harness

EOS = 2  # SmolLM2 <|im_end|>


def _text(tok, ids):
    return tok.decode([i for i in ids if i != EOS])


def _breakers(tok):
    """Tokens an unconstrained model loves here: EOS, braces, quotes, letters, a special id."""
    return [EOS, 0, 107, 109, 18, 81, 82, 83, 369, 25276]


# ---- 1. chunked prefill: a token is sampled on each non-last chunk and must not be accepted ----
class _Crit:
    def step(self, next_token_ids, stop_words, inputs=None, extra_inputs=None):
        n = next_token_ids.numel()
        return torch.zeros(n, dtype=torch.bool), torch.full((n,), -1), self


class FakeAgent:
    """Just enough of ``BaseModelAgent`` to run its real sampling post-processing on CPU."""

    def __init__(self, mgr):
        import contextlib

        self.rank = 0
        self.guided_decoding_manager = mgr
        self.misc_config = SimpleNamespace(logprobs_mode=None)
        self.dist_ctx = None
        null = contextlib.nullcontext

        async def _fwd(inputs, extra_inputs, sampling_inputs):
            return extra_inputs

        self.spec_agent = SimpleNamespace(is_enabled=lambda: False, async_model_forward=_fwd,
                                          post_broadcast=lambda *a, **k: null())
        self.agent_strategy = SimpleNamespace(post_sampling=lambda i, l, n, e: (n, e),
                                              make_extra_outputs=lambda e: None)
        self._broadcast_next_token = lambda *a, **k: null()

    async def async_sampling_logits(self, *args):
        from lmdeploy.pytorch.engine.model_agent.agent import BaseModelAgent

        return await BaseModelAgent.async_sampling_logits(self, *args)

    async def postprocess(self, logits, inputs, sampling_inputs):
        from lmdeploy.pytorch.engine.model_agent.agent import BaseModelAgent

        return await BaseModelAgent._step_postprocess_with_output(
            self, logits, logits, inputs, sampling_inputs, _Crit(), None, False)


def _inputs(is_chunk, is_last_chunk, is_decoding=False):
    return SimpleNamespace(is_chunk=is_chunk, is_last_chunk=is_last_chunk, is_first_chunk=not is_decoding,
                           is_dummy=False, is_decoding=is_decoding)


def test_chunked_prefill_does_not_advance_matcher(mode, smollm2_tokenizer, vocab):
    tok = smollm2_tokenizer
    pattern = "ab|ba"
    rf = {"type": "regex_schema", "regex_schema": pattern}
    mgr = harness.make_manager(tok, vocab.vocab_size)
    strat = harness.strategy()
    seq = harness.FakeSeq(1, harness.gen_config(rf))
    agent = FakeAgent(mgr)
    fav = harness.adversarial_logits(vocab.vocab_size, [81, 369, 82, EOS], seed=1)

    async def run():
        # three prefill chunks: the first two are not last; their tokens are thrown away
        for last in (False, False, True):
            si = strat.make_sampling_inputs([seq])
            out = await agent.postprocess(fav(1), _inputs(True, last), si)
            if last:
                seq.generated.append(int(out[4][0]))
        for _ in range(6):
            if seq.generated[-1] == EOS:
                break
            si = strat.make_sampling_inputs([seq])
            out = await agent.postprocess(fav(1), _inputs(False, False, True), si)
            seq.generated.append(int(out[4][0]))

    asyncio.run(run())
    text = _text(tok, seq.generated)
    if mode == "stock":
        assert re.fullmatch(pattern, text) is None, f"stock unexpectedly produced a valid {text!r}"
    else:
        assert re.fullmatch(pattern, text), text
        assert seq.generated[-1] == EOS


# ---- 2. second round on the same session must get a fresh matcher ---------------------------
@pytest.mark.parametrize("same_format", [True, False])
def test_second_round_is_constrained(mode, same_format, smollm2_tokenizer, vocab):
    tok = smollm2_tokenizer
    mgr = harness.make_manager(tok, vocab.vocab_size)
    strat = harness.strategy()
    r1 = {"type": "regex_schema", "regex_schema": "(yes|no)"}
    r2 = r1 if same_format else {"type": "regex_schema", "regex_schema": "[0-9]{2}"}
    seq = harness.FakeSeq(7, harness.gen_config(r1))
    fav = harness.adversarial_logits(vocab.vocab_size, _breakers(tok), seed=2)
    harness.decode(strat, mgr, [seq], fav, {EOS})
    assert re.fullmatch("(yes|no)", _text(tok, seq.generated))
    seq.new_round(harness.gen_config(r2))
    harness.decode(strat, mgr, [seq], fav, {EOS}, max_steps=8)
    pattern = r2["regex_schema"]
    text = _text(tok, seq.generated)
    if mode == "stock":
        assert re.fullmatch(pattern, text) is None
    else:
        assert re.fullmatch(pattern, text), text
        assert mgr.stats()["active_matchers"] == 1  # round one's matcher was released


# ---- 3. dLLM strategy: session_ctx not repeated with the formats -----------------------------
def test_dllm_guided_rows(mode, smollm2_tokenizer, vocab):
    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor
    from lmdeploy.pytorch.strategies.dllm.sampling import DLLMSamplingStrategy

    mgr = harness.make_manager(smollm2_tokenizer, vocab.vocab_size)
    strat = DLLMSamplingStrategy(0, dllm_block_length=4)
    seq = harness.FakeSeq(3, harness.gen_config({"type": "json_object"}))
    si = strat.make_sampling_inputs([seq])
    if mode == "stock":
        with pytest.raises(IndexError):
            FusedLogitsProcessor(si, guided_decoding_manager=mgr)
        return
    from tokenrails import UnsupportedGuideError

    proc = FusedLogitsProcessor(si, guided_decoding_manager=mgr)
    scores, _ = asyncio.run(proc(torch.randn(4, vocab.vocab_size)))
    assert sorted(proc.tokenrails_step.errors) == [0, 1, 2, 3]
    assert all(isinstance(e, UnsupportedGuideError) for e in proc.tokenrails_step.errors.values())
    assert (proc.sampling(scores) == EOS).all()  # fail closed: nothing but EOS


def test_dllm_errors_finish_their_own_sequence(upgraded, cpu_lmdeploy, smollm2_tokenizer, vocab):
    """A dLLM block spans ``block`` logits rows of one sequence: the guided sequence's error stops
    that sequence, never the next one in the batch (whose index equals a block position)."""
    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor
    from lmdeploy.pytorch.strategies.dllm.sampling import DLLMSamplingStrategy

    from tokenrails import UnsupportedGuideError
    from tokenrails.engine_patch.lmdeploy.step import agent as agent_patch
    from tokenrails.engine_patch.lmdeploy.step import lmdeploy_step as step_patch

    mgr = harness.make_manager(smollm2_tokenizer, vocab.vocab_size)
    seqs = [harness.FakeSeq(40, harness.gen_config({"type": "json_object"})), harness.FakeSeq(41, harness.gen_config())]
    si = DLLMSamplingStrategy(0, dllm_block_length=4).make_sampling_inputs(seqs)
    batched = SimpleNamespace(stopped=torch.zeros(len(seqs), dtype=torch.bool))

    async def postprocess(self, inputs, sampling_inputs):
        proc = FusedLogitsProcessor(sampling_inputs, guided_decoding_manager=self.guided_decoding_manager)
        await proc(torch.randn(8, vocab.vocab_size))
        return (batched,)

    agent = SimpleNamespace(guided_decoding_manager=mgr)
    asyncio.run(step_patch.patched_postprocess(postprocess)(agent, _inputs(False, False, True), si))
    errors = getattr(batched, agent_patch.ERRORS_ATTR)
    assert sorted(errors) == [0], errors  # sequence 0 (the guided one) only
    assert errors[0][0] == UnsupportedGuideError.__name__
    assert batched.stopped.tolist() == [True, False]


# ---- 4. a rejected token must finish the sequence with an error ------------------------------
def test_rejected_token_is_reported(mode, smollm2_tokenizer, vocab):
    mgr = harness.make_manager(smollm2_tokenizer, vocab.vocab_size)
    strat = harness.strategy()
    seq = harness.FakeSeq(4, harness.gen_config({"type": "regex_schema", "regex_schema": "[0-9]+"}))
    agent = FakeAgent(mgr)

    class Forced:
        """Sampling that returns a grammar-illegal token (as a buggy/all -inf row would)."""

    async def run():
        si = strat.make_sampling_inputs([seq])
        from lmdeploy.pytorch.engine import logits_process as lp

        orig = lp.FusedLogitsProcessor.sampling
        lp.FusedLogitsProcessor.sampling = lambda self, logits: torch.tensor([81])  # 'a'
        try:
            return await agent.postprocess(torch.randn(1, vocab.vocab_size), _inputs(False, False, True), si)
        finally:
            lp.FusedLogitsProcessor.sampling = orig

    out = asyncio.run(run())
    batched = out[-1]
    errors = getattr(batched, "tokenrails_errors", None)
    if mode == "stock":
        assert errors is None and not bool(batched.stopped[0])  # silently continues
    else:
        assert list(errors) == [0] and errors[0][0] == "TokenRejectedError"
        assert bool(batched.stopped[0])
        # survives the executor's conversions
        assert getattr(batched.to_cpu(), "tokenrails_errors") == errors


def test_engine_loop_turns_errors_into_error_responses(upgraded):
    from lmdeploy.messages import ResponseType
    from tokenrails.engine_patch.lmdeploy.step.agent import patched_make_infer_outputs

    resp = SimpleNamespace(type=ResponseType.SUCCESS, is_done=False, err_msg="")
    out = SimpleNamespace(finish=True, resp=resp)
    running = [SimpleNamespace(session_id=11)]
    batched = SimpleNamespace(tokenrails_errors={0: ("UnsupportedGuideError", "nope")})

    def original(self, batched_outputs, running, model_inputs, delta):
        return {11: out}

    wrapped = patched_make_infer_outputs(original)
    wrapped(None, batched, running=running, model_inputs=None, delta=None)
    assert out.finish is False and resp.is_done and resp.type == ResponseType.NOT_SUPPORTED
    resp.type = ResponseType.SUCCESS
    batched.tokenrails_errors = {0: ("TokenRejectedError", "x")}
    wrapped(None, batched, running=running, model_inputs=None, delta=None)
    assert resp.type == ResponseType.INTERNAL_ENGINE_ERROR


# ---- 5. bad words / stop words / processors must not leave only illegal tokens ---------------
def test_bad_words_cannot_break_the_grammar(mode, smollm2_tokenizer, vocab):
    tok = smollm2_tokenizer
    from tokenrails import GuideSpec, compile_guide
    from tokenrails.kernels import allocate_token_bitmask

    pattern = "ab"
    m = compile_guide(GuideSpec.regex(pattern), vocab, "xgrammar").matcher()
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    m.fill_next_token_bitmask(bm, 0)
    bits = torch.tensor([(int(bm[0, t // 32]) >> (t % 32)) & 1 for t in range(vocab.vocab_size)])
    legal = torch.nonzero(bits).flatten().tolist()
    assert 81 in legal and 369 in legal
    mgr = harness.make_manager(tok, vocab.vocab_size)
    seq = harness.FakeSeq(5, harness.gen_config({"type": "regex_schema", "regex_schema": pattern},
                                                 bad_token_ids=legal))
    toks, proc = asyncio.run(harness.step(harness.strategy(), mgr, [seq], torch.randn(1, vocab.vocab_size)))
    if mode == "stock":
        assert toks[0] not in legal and toks[0] != EOS  # an illegal token came out
    else:
        assert toks[0] == EOS and 0 in proc.tokenrails_step.errors  # fail closed, reported


def test_empty_row_repair_on_inference_tensors(upgraded, cpu_lmdeploy, smollm2_tokenizer, vocab):
    """The engine samples under ``torch.inference_mode()``: its logits are inference tensors, and the
    guided step runs in a worker thread, which does not inherit inference mode. The EOS-only repair
    of an emptied row must still work there (found on the real engine: it raised and stopped the engine)."""
    mgr = harness.make_manager(smollm2_tokenizer, vocab.vocab_size)
    seq = harness.FakeSeq(8, harness.gen_config({"type": "regex_schema", "regex_schema": "ab"},
                                                 bad_token_ids=[81, 369]))
    with torch.inference_mode():
        logits = torch.randn(1, vocab.vocab_size)
        toks, proc = asyncio.run(harness.step(harness.strategy(), mgr, [seq], logits))
    assert logits.is_inference()
    assert toks[0] == EOS and 0 in proc.tokenrails_step.errors


def test_min_new_tokens_stop_word_vs_complete_grammar(mode, smollm2_tokenizer, vocab):
    tok = smollm2_tokenizer
    mgr = harness.make_manager(tok, vocab.vocab_size)
    seq = harness.FakeSeq(6, harness.gen_config({"type": "regex_schema", "regex_schema": "ab"},
                                                 stop_token_ids=[EOS], min_new_tokens=10))
    fav = harness.adversarial_logits(vocab.vocab_size, [369], seed=3)
    out = harness.decode(harness.strategy(), mgr, [seq], fav, {EOS}, max_steps=4)[0]
    if mode == "stock":
        assert EOS not in out and out[1:] and out[1] not in (EOS,)  # EOS banned: garbage after "ab"
    else:
        assert out == [369, EOS]  # the grammar is complete: it ends


# ---- 6. compile cache bounded; compilation off the event loop --------------------------------
def test_compile_cache_is_bounded(mode, smollm2_tokenizer, vocab):
    import tokenrails.engine_patch.lmdeploy as patch
    from tokenrails import GuideLimits

    if mode == "tokenrails":
        patch.activate(backend="xgrammar", limits=GuideLimits(cache_max_entries=3))
    mgr = harness.make_manager(smollm2_tokenizer, vocab.vocab_size)
    strat = harness.strategy()
    sizes = []
    for i in range(8):
        schema = {"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}
        seq = harness.FakeSeq(100 + i, harness.gen_config({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}))
        asyncio.run(harness.step(strat, mgr, [seq], torch.randn(1, vocab.vocab_size)))
        if mode == "stock":
            sizes.append(mgr.compiler.get_cache_size_bytes())
        else:
            sizes.append(mgr.stats()["cache_entries"])
    if mode == "stock":
        assert sizes == sorted(sizes) and sizes[-1] > sizes[2] > 0  # grows with every new schema
        assert len(mgr.processors) == 8
    else:
        assert max(sizes) <= 3 and sizes[-1] == 3


def test_compile_does_not_block_event_loop(mode, smollm2_tokenizer, vocab, monkeypatch):
    """Counted, not timed: the event loop's ticks while the (delayed) compile runs; stock compiles
    on the loop, which then ticks not once (a loaded machine gave the rest of the step extra ticks,
    which a bound on the whole step's ticks counted)."""
    delay = 0.4
    clock = {"ticks": 0}
    during: list[int] = []  # loop ticks while each compile ran

    def delayed(orig):
        def slow(*a, **k):
            before = clock["ticks"]
            time.sleep(delay)
            during.append(clock["ticks"] - before)
            return orig(*a, **k)
        return slow

    if mode == "stock":
        from lmdeploy.pytorch.engine import guided_process as gp

        monkeypatch.setattr(gp, "compile_response_format", delayed(gp.compile_response_format))
    else:
        from tokenrails.guided import manager as core

        monkeypatch.setattr(core, "compile_guide", delayed(core.compile_guide))
    mgr = harness.make_manager(smollm2_tokenizer, vocab.vocab_size)
    if hasattr(mgr, "core"):
        mgr.core()  # vocabulary built: measure compilation only
    seq = harness.FakeSeq(9, harness.gen_config({"type": "regex_schema", "regex_schema": "x[0-9]{3}"}))

    async def run():
        done = False

        async def ticker():
            while not done:
                clock["ticks"] += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        toks, _ = await harness.step(harness.strategy(), mgr, [seq], torch.randn(1, vocab.vocab_size))
        done = True
        await task
        return toks

    toks = asyncio.run(run())
    assert toks == [smollm2_tokenizer.convert_tokens_to_ids("x")]
    assert during, "the compile did not run"
    if mode == "stock":
        assert during == [0], during  # the loop was frozen for the whole compile
    else:
        assert max(during) >= 3, during  # the loop kept ticking while it compiled


# ---- sanity: guided output valid under adversarial logits, batch of mixed rows ---------------
def test_mixed_batch_outputs_match_oracles(upgraded, cpu_lmdeploy, smollm2_tokenizer, vocab):
    tok = smollm2_tokenizer
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string", "maxLength": 4}},
              "required": ["n", "s"], "additionalProperties": False}
    mgr = harness.make_manager(tok, vocab.vocab_size)
    seqs = [
        harness.FakeSeq(20, harness.gen_config({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})),
        harness.FakeSeq(21, harness.gen_config({"type": "regex_schema", "regex_schema": "[a-c]{2,4}!"})),
        harness.FakeSeq(22, harness.gen_config({"type": "choice", "choice": ["red", "green", "blue"]})),
        harness.FakeSeq(23, harness.gen_config(None)),
    ]
    fav = harness.adversarial_logits(vocab.vocab_size, _breakers(tok), seed=4)
    blank = [i for i, b in enumerate(vocab.token_bytes) if b and not b.strip()]

    def logits(batch):  # adversarial, but whitespace (legal forever in JSON) is not favoured
        x = fav(batch)
        x[:, blank] -= 100.0
        return x

    outs = harness.decode(harness.strategy(), mgr, seqs[:3], logits, {EOS}, max_steps=48)
    doc = json.loads(_text(tok, outs[0]))
    jsonschema.validate(doc, schema)
    assert re.fullmatch("[a-c]{2,4}!", _text(tok, outs[1]))
    assert _text(tok, outs[2]) in ("red", "green", "blue")
    # the unguided row is left bit-identical
    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor

    seqs[1].generated = []
    seqs[3] = harness.FakeSeq(23, harness.gen_config(None, temperature=1.0))
    seqs[1].sampling_param.temperature = 1.0
    si = harness.strategy().make_sampling_inputs([seqs[3], seqs[1]])
    x = torch.randn(2, vocab.vocab_size)
    proc = FusedLogitsProcessor(si, guided_decoding_manager=mgr)
    y, _ = asyncio.run(proc(x.clone()))
    assert torch.equal(y[0], x[0]) and not torch.equal(y[1], x[1])


def test_sessions_are_released(upgraded, cpu_lmdeploy, smollm2_tokenizer, vocab):
    mgr = harness.make_manager(smollm2_tokenizer, vocab.vocab_size)
    strat = harness.strategy()
    rf = {"type": "regex_schema", "regex_schema": "[0-9]{3}"}
    seqs = [harness.FakeSeq(sid, harness.gen_config(rf)) for sid in range(200, 230)]
    asyncio.run(harness.step(strat, mgr, seqs, torch.randn(len(seqs), vocab.vocab_size)))
    assert mgr.stats()["active_matchers"] == 30
    for s in seqs:
        strat.on_session_end(s.session_id)  # what Scheduler.end_session calls
    asyncio.run(harness.step(strat, mgr, [harness.FakeSeq(999, harness.gen_config(None))],
                             torch.randn(1, vocab.vocab_size)))
    st = mgr.stats()
    assert st["active_matchers"] == 0 and st["tracked_rounds"] == 0
