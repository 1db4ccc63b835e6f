"""Drive LMDeploy 0.18's real guided pieces on CPU (strategy → FusedLogitsProcessor → accept).

Only the CUDA-only calls are stubbed (``_wait_stream_once``'s stream query, the Triton
multinomial op → LMDeploy's own default implementation). Sequences are light stand-ins exposing
exactly what ``ARSamplingStrategy.make_sampling_inputs`` reads.
"""
from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

import torch

_SEQ_IDS = itertools.count(1000)


@dataclass
class FakeSeq:
    session_id: int
    gen_config: Any
    prompt_len: int = 8
    seq_id: int = field(default_factory=lambda: next(_SEQ_IDS))
    generated: list[int] = field(default_factory=list)
    output_start_pos: int = 8
    prompt_ids: list[int] | None = None  # the prompt's token ids (default: prompt_len ones)

    def __post_init__(self) -> None:
        from lmdeploy.pytorch.messages import SamplingParam

        if self.prompt_ids is not None:
            self.prompt_len = len(self.prompt_ids)
        else:
            self.prompt_ids = [1] * self.prompt_len
        self.session = SimpleNamespace(session_id=self.session_id)
        self.sampling_param = SamplingParam.from_gen_config(self.gen_config)
        self.output_start_pos = self.prompt_len

    @property
    def num_new_tokens(self) -> int:
        return len(self.generated)

    @property
    def num_valid_ids(self) -> int:
        return self.prompt_len + len(self.generated)

    @property
    def valid_ids(self):
        import numpy as np

        return np.array(list(self.prompt_ids) + self.generated, dtype=np.int64)

    @property
    def generated_ids(self):
        import numpy as np

        return np.array(self.generated, dtype=np.int64)

    def new_round(self, gen_config: Any, prompt_len: int = 4, prompt_ids: list[int] | None = None) -> None:
        """A second message on the same session: same seq_id, history grows, counters reset."""
        from lmdeploy.pytorch.messages import SamplingParam

        new = list(prompt_ids) if prompt_ids is not None else [1] * prompt_len
        self.prompt_ids = list(self.prompt_ids) + self.generated + new
        self.prompt_len = len(self.prompt_ids)
        self.generated = []
        self.output_start_pos = self.prompt_len
        self.gen_config = gen_config
        self.sampling_param = SamplingParam.from_gen_config(gen_config)


def gen_config(response_format: Any = None, **kw: Any):
    from lmdeploy.messages import GenerationConfig

    kw.setdefault("top_k", 1)
    kw.setdefault("max_new_tokens", 64)
    return GenerationConfig(response_format=response_format, **kw)


def stub_cuda(monkeypatch) -> None:
    """The two CUDA-only calls on the guided path, replaced by CPU equivalents."""
    from lmdeploy.pytorch.backends.default.multinomial_sampling import DefaultMultinomialSamplingImpl
    from lmdeploy.pytorch.engine import logits_process as lp

    async def _wait_stream_once(self):
        await asyncio.sleep(0)

    monkeypatch.setattr(lp.FusedLogitsProcessor, "_wait_stream_once", _wait_stream_once)
    impl = DefaultMultinomialSamplingImpl()
    monkeypatch.setattr(lp, "_multinomial_sampling", lambda s, seeds, offs, idx=None: impl.forward(s, seeds, offs, idx))


def make_manager(tokenizer: Any, vocab_size: int):
    """Whatever the agent would build: LMDeploy's manager, or ours when the patch is active."""
    from lmdeploy.pytorch.engine.model_agent import agent

    return agent.GuidedDecodingManager(tokenizer, vocab_size)


def unhurried_limits():
    """The default limits without the compile's wall-clock deadline, for tests of what a mask
    allows: on a loaded machine (CI, load 17-40 on 2 cores) a first compile on a large vocabulary
    can take many seconds, which fails the row by design for a reason such a test does not check.
    (``max_fill_seconds`` bounds a fill's CPU time, which load does not stretch.)"""
    from tokenrails.guided.limits import GuideLimits

    return GuideLimits(compile_timeout_s=600.0)


def strategy(pad_token_id: int = 0):
    from lmdeploy.pytorch.strategies.ar.sampling import ARSamplingStrategy

    return ARSamplingStrategy(pad_token_id)


async def step(strat: Any, mgr: Any, seqs: list[FakeSeq], logits: torch.Tensor, *, skip_accept: bool = False):
    """One engine step as ``BaseModelAgent.async_sampling_logits`` runs it; returns (tokens, processor)."""
    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor

    si = strat.make_sampling_inputs(seqs)
    proc = FusedLogitsProcessor(si, logprobs_mode=None, guided_decoding_manager=mgr)
    scores, _ = await proc(logits)
    tokens = proc.sampling(scores)
    if not skip_accept:
        await proc.accept_guided_tokens(tokens)
    return tokens.tolist(), proc


def decode(strat: Any, mgr: Any, seqs: list[FakeSeq], logits_fn: Callable[[int], torch.Tensor],
           eos_ids: set[int], max_steps: int = 64) -> list[list[int]]:
    """Greedy decode until every sequence emitted EOS (or ``max_steps``)."""

    async def run() -> None:
        live = list(seqs)
        for _ in range(max_steps):
            if not live:
                return
            toks, _ = await step(strat, mgr, live, logits_fn(len(live)))
            for s, t in zip(live, toks):
                s.generated.append(int(t))
            live = [s for s in live if s.generated[-1] not in eos_ids]

    asyncio.run(run())
    return [s.generated for s in seqs]


def offer(strat: Any, mgr: Any, seq: FakeSeq, wants: list[int], vocab_size: int,
          noise: torch.Generator | None = None) -> list[int]:
    """Put each of ``wants`` far on top of the logits (zeros, or random ones drawn from ``noise``),
    one step each, until the engine emits another token (the grammar refused it): the tokens emitted."""

    async def run() -> None:
        for want in wants:
            logits = torch.zeros(1, vocab_size) if noise is None else torch.randn(1, vocab_size, generator=noise)
            logits[0, want] += 100.0
            (t, ), _ = await step(strat, mgr, [seq], logits)
            seq.generated.append(int(t))
            if int(t) != want:
                return

    asyncio.run(run())
    return seq.generated


def adversarial_logits(vocab_size: int, favored: list[int], seed: int = 0) -> Callable[[int], torch.Tensor]:
    """Random logits with ``favored`` ids (grammar breakers, EOS) far on top: masks must hold."""
    gen = torch.Generator().manual_seed(seed)

    def fn(batch: int) -> torch.Tensor:
        x = torch.randn(batch, vocab_size, generator=gen)
        if favored:
            x[:, favored] += 50.0
        return x

    return fn
