"""How many times one LMDeploy decode step enters tokenrails' modules per guided row.

Counted with a profiler on the real patched path (the strategy's sampling inputs, the agent's step
wrapper, the forward wrapper, LMDeploy's ``FusedLogitsProcessor`` with its guided call and accept,
the post-processing): a call counts when it enters one of the step's modules (the LMDeploy adapter's,
and the core manager and sequence) from another module; calls within a module, and the grammar work
below the sequence (batch step, backends, kernels), do not. Steady decode steps of one compiled row
on CPU logits; the list is docs/architecture.md's.
"""
from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from types import SimpleNamespace

import torch

from . import harness

EOS = 2
MAX_ENTRIES = 11
FORMATS = [{"type": "regex_schema", "regex_schema": "[a-c]{40}"},
           {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "items": {"type": "integer"}}}}]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__import__("tokenrails").__file__)))


STEP_MODULES = ("tokenrails.engine_patch.lmdeploy.", "tokenrails.guided.manager", "tokenrails.guided.sequence")
DEVICE_PORT = "tokenrails.engine_patch.lmdeploy.cpu."  # LMDeploy's device calls once a CPU engine ran: not guided work


def _module(code) -> str | None:
    path = os.path.abspath(code.co_filename)
    if not path.startswith(os.path.join(ROOT, "tokenrails") + os.sep):
        return None
    return os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")


def _in_step(module: str | None) -> bool:
    return module is not None and module.startswith(STEP_MODULES) and not module.startswith(DEVICE_PORT)


def one_step_entries(mgr, seqs, vocab_size: int) -> Counter:
    """Module entries of one engine step over ``seqs`` (each key: 'caller -> callee.function')."""
    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor

    from tokenrails.engine_patch.lmdeploy.step import lmdeploy_step as step_patch

    strat = harness.strategy()
    inputs = SimpleNamespace(is_chunk=False, is_last_chunk=False, is_dummy=False, is_decoding=True)
    logits = torch.randn(len(seqs), vocab_size)

    async def forward(self, inputs):
        return None

    async def postprocess(self, inputs, sampling_inputs):
        proc = FusedLogitsProcessor(sampling_inputs, guided_decoding_manager=self.guided_decoding_manager)
        scores, _ = await proc(logits)
        toks = proc.sampling(scores)
        await proc.accept_guided_tokens(toks)
        return (toks, None)

    agent = SimpleNamespace(guided_decoding_manager=mgr, spec_agent=None, device="cpu")
    agent._async_model_forward = forward.__get__(agent)
    agent._step_postprocess_with_output = step_patch.patched_postprocess(postprocess).__get__(agent)

    async def async_step(self, inputs, sampling_inputs=None):
        await self._async_model_forward(inputs)
        return await self._step_postprocess_with_output(inputs, sampling_inputs)

    seen: Counter = Counter()

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = _module(frame.f_code)
        if not _in_step(callee):
            return
        back = frame.f_back
        caller = _module(back.f_code) if back is not None else None
        if caller != callee:
            seen[f"{caller or 'lmdeploy'} -> {callee}.{frame.f_code.co_name}"] += 1

    step = step_patch.patched_async_step(async_step)

    async def run():
        sys.setprofile(profile)
        try:
            si = strat.make_sampling_inputs(seqs)
            toks, _ = await step(agent, inputs, sampling_inputs=si)
        finally:
            sys.setprofile(None)
        for s, t in zip(seqs, toks.tolist()):
            s.generated.append(int(t))

    asyncio.run(run())
    return seen


def test_module_entries_per_guided_row_per_step(upgraded, cpu_lmdeploy, smollm2_tokenizer, vocab):
    mgr = harness.make_manager(smollm2_tokenizer, vocab.vocab_size)
    mgr.core()
    per_row = []
    for batch in (1,):
        seqs = [harness.FakeSeq(900 + 10 * batch + i, harness.gen_config(FORMATS[i % 2])) for i in range(batch)]
        for _ in range(3):  # compile, first fill, then steady steps
            one_step_entries(mgr, seqs, vocab.vocab_size)
        seen = one_step_entries(mgr, seqs, vocab.vocab_size)
        per_row.append(sum(seen.values()) / batch)
        print(f"batch {batch}: {sum(seen.values())} entries")
        for k, n in sorted(seen.items()):
            print(f"  {n:3d}  {k}")
    assert per_row[0] <= MAX_ENTRIES, per_row
