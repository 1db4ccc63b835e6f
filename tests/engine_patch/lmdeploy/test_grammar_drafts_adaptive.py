"""Adaptive grammar drafts (engine_patch/lmdeploy/adaptive_drafts.py): each row verifies only its forced run.

Counted from the engine's own inputs (the target forward's per-row query lengths), never timed:
a decode step verifies ``1 + L_i`` positions for row ``i`` where ``L_i`` is the forced run the
proposer found for it; a step where nothing is forced is a plain one-position decode; an unguided
row in a drafts engine costs no extra position. Plus the tensor helpers against small oracles.
"""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lmdeploy")

from .schemas import PERSON  # noqa: E402


# ---- helpers against oracles -------------------------------------------------------------------
def test_pack_rows_keeps_next_token_and_real_drafts_only():
    from tokenrails.engine_patch.lmdeploy.speculative.adaptive_drafts import PAD, pack_rows, row_lengths

    nxt = torch.tensor([7, 8, 9])
    drafts = torch.tensor([[1, 2, PAD], [PAD, PAD, PAD], [3, 4, 5]])
    ids, q = pack_rows(nxt, drafts)
    assert ids.tolist() == [[7, 1, 2, 8, 9, 3, 4, 5]]
    assert q.tolist() == [3, 1, 4]
    assert row_lengths(drafts).tolist() == [2, 0, 3]
    ids, q = pack_rows(nxt, drafts[:, :0])  # k = 0 columns: a plain decode
    assert ids.tolist() == [[7, 8, 9]] and q.tolist() == [1, 1, 1]


def test_pad_logits_repeats_each_rows_last_real_position():
    from tokenrails.engine_patch.lmdeploy.speculative.adaptive_drafts import pad_logits

    q = torch.tensor([2, 1, 3])
    logits = torch.arange(6, dtype=torch.float32)[:, None].repeat(1, 4)  # position p has value p
    out = pad_logits(logits, q, 3).reshape(3, 3, 4)[..., 0]
    assert out.tolist() == [[0, 1, 1], [2, 2, 2], [3, 4, 5]]


def test_cut_after_keeps_a_prefix_of_each_rows_sample():
    from tokenrails.engine_patch.lmdeploy.speculative.adaptive_drafts import cut_after

    out = torch.tensor([[10, 11, 12], [20, -1, -1], [30, 31, 32]])
    rejected = torch.tensor([0, 2, 0])
    cut, rej, last = cut_after(out, rejected, torch.tensor([2, 3, 3]))
    assert cut.tolist() == [[10, 11, -1], [20, -1, -1], [30, 31, 32]]
    assert rej.tolist() == [1, 2, 0] and last.tolist() == [11, 20, 32]


def test_greedy_cut_equals_lmdeploys_sampler_on_the_padded_block():
    """The cutting sampler's greedy path (argmax only at real positions) gives what LMDeploy's own
    rejection sampler gives on the whole padded block, cut per row: bfloat16 logits with ties."""
    from types import SimpleNamespace

    from lmdeploy.pytorch.spec_decode.reject_sampler import RejectionSampler

    from tokenrails.engine_patch.lmdeploy.speculative.adaptive_drafts import (_CuttingSampler, cut_after,
                                                                              greedy_targets, pad_logits)

    from lmdeploy.pytorch.backends.default.op_backend import DefaultOpsBackend
    from lmdeploy.pytorch.backends.rejection_sampling import RejectionSamplingBuildSpec

    gen = torch.Generator().manual_seed(0)
    sampler = RejectionSampler.__new__(RejectionSampler)  # the CPU path's: the default backend's op
    torch.nn.Module.__init__(sampler)
    sampler._impl = DefaultOpsBackend.build_op(RejectionSamplingBuildSpec())
    q = torch.tensor([3, 1, 5, 2, 1])  # 1 + each row's forced run
    width, vocab = 5, 4000
    ragged = torch.randint(0, 4, (int(q.sum()), vocab), generator=gen).to(torch.bfloat16)  # many ties
    logits = pad_logits(ragged, q, width).reshape(len(q), width, vocab)
    assert torch.equal(greedy_targets(logits, q), logits.argmax(-1))
    for trial in range(3):
        drafts = logits.argmax(-1)[:, :-1].clone()  # drafts the target agrees with ...
        flip = torch.rand(drafts.shape, generator=gen) < 0.3 * trial
        drafts[flip] = (drafts[flip] + 1) % vocab  # ... and some it rejects
        inputs = SimpleNamespace(max_top_k=1, batch_size=len(q) * width)
        ours = _CuttingSampler(sampler, q)(logits, drafts, inputs)
        theirs = cut_after(*sampler(logits, drafts, inputs)[:2], q)
        for a, b in zip(ours, theirs):
            assert torch.equal(a, b)


# ---- the real engine: positions per step counted from the target forward's inputs --------------
pytest_slow = pytest.mark.slow


class _Recorder:
    """Per decode forward: each row's query length; per proposal: each row's forced-run length."""

    def __init__(self, monkeypatch):
        from lmdeploy.pytorch.engine.model_agent import agent as agent_mod

        from tokenrails.engine_patch.lmdeploy.speculative import grammar_drafts

        self.forwards: list[list[int]] = []
        self.proposals: list[list[int]] = []
        self.events: list[tuple[str, list[int]]] = []
        original_forward = agent_mod.BaseModelAgent.async_forward
        original_plan = grammar_drafts.plan_drafts

        async def async_forward(agent, inputs, *args, **kwargs):
            if inputs.is_decoding and not inputs.is_dummy:
                q = [int(x) for x in inputs.seq_length.tolist()]
                assert inputs.input_ids.numel() == sum(q)
                self.events.append(("forward", q))
            return await original_forward(agent, inputs, *args, **kwargs)

        def plan_drafts(*args, **kwargs):
            drafts, counts, singles = original_plan(*args, **kwargs)
            self.events.append(("propose", list(counts)))
            return drafts, counts, singles

        monkeypatch.setattr(agent_mod.BaseModelAgent, "async_forward", async_forward)
        monkeypatch.setattr(grammar_drafts, "plan_drafts", plan_drafts)

    def decode_lengths(self) -> list[list[int]]:
        return [q for kind, q in self.events if kind == "forward"]

    def pairs(self) -> list[tuple[list[int], list[int]]]:
        """(proposed run lengths, next decode forward's query lengths - 1), where the batch
        did not change in between (same number of rows)."""
        out = []
        for (k1, a), (k2, b) in zip(self.events, self.events[1:]):
            if k1 == "propose" and k2 == "forward" and len(a) == len(b):
                out.append((a, [x - 1 for x in b]))
        return out


@pytest.fixture(scope="module")
def drafts_pipe(model_dir):
    """One engine with grammar drafts (k=4) for the module: the recorder patches LMDeploy's classes
    per test, so each test counts its own forwards."""
    from lmdeploy import pipeline

    from tokenrails.engine_patch.lmdeploy import activate, deactivate
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    torch.set_num_threads(1)
    activate(grammar_drafts=4)
    pipe = pipeline(model_dir, backend_config=cpu_engine_config(max_batch_size=4, session_len=512))
    yield pipe
    pipe.close()
    deactivate()


def _run(pipe, prompts, formats, max_tokens=40):
    from lmdeploy import GenerationConfig

    gens = [GenerationConfig(max_new_tokens=max_tokens, top_k=1, response_format=f) for f in formats]
    return pipe(prompts, gen_config=gens)


@pytest_slow
def test_positions_per_step_equal_forced_runs_and_unguided_rows_cost_one(drafts_pipe, monkeypatch):
    from tokenrails import GuideSpec

    rec = _Recorder(monkeypatch)
    spec = GuideSpec.json_schema(json.dumps(PERSON), any_whitespace=False)
    outs = _run(drafts_pipe, ["Give me a person as JSON.", "Hi"], [spec, None])
    assert outs[0].finish_reason == "stop" and outs[1].generate_token_len > 1, outs
    lengths = rec.decode_lengths()
    assert lengths, rec.events
    # every decode forward verifies exactly the forced runs proposed for its rows
    pairs = rec.pairs()
    assert len(pairs) >= 5, rec.events
    for proposed, verified in pairs:
        assert proposed == verified, (proposed, verified, rec.events)
    # while both run, one row (the unguided "Hi"; LMDeploy picks the order) never costs a second
    # position, and the other (guided) one does: rows of one step verify different numbers of
    # positions (per row, not the longest run for all)
    both = [q for q in lengths if len(q) == 2]
    assert both, lengths
    guided = 0 if any(q[0] > 1 for q in both) else 1
    assert any(q[guided] > 1 for q in both) and all(q[1 - guided] == 1 for q in both), lengths
    # and a step where nothing is forced is a plain one-position decode
    assert any(all(x == 1 for x in q) for q in lengths), lengths
    assert max(max(q) for q in lengths) <= 1 + 4, lengths


@pytest_slow
def test_unguided_request_in_a_drafts_engine_runs_plain_decodes(drafts_pipe, monkeypatch):
    rec = _Recorder(monkeypatch)
    outs = _run(drafts_pipe, ["Tell me a story."], [None], max_tokens=12)
    assert outs[0].generate_token_len == 12, outs
    lengths = rec.decode_lengths()
    # (LMDeploy may run one decode step past the length cap before it sees the stop)
    assert len(lengths) >= 11 and all(q == [1] for q in lengths), lengths
