"""Verification shapes for grammar drafts (engine_patch/lmdeploy/draft_shapes.py).

On CUDA every row of a drafts step must reach the attention with the same query length (LMDeploy's
FA3 speculative path and Triton paged decode assume it, and its CUDA graphs are keyed by it), so
rows are padded to one bucketed width; the CPU path keeps ragged rows. Checked here: the padding
helpers against small oracles, the per-device choice, and on the real CPU engine that the padded
path feeds uniform, bucketed shapes to the target forward and keeps exactly the tokens the ragged
path keeps (greedy).
"""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lmdeploy")

from .schemas import PERSON  # noqa: E402
ENV_SHAPE = "TOKENRAILS_GRAMMAR_DRAFTS_FIXED"
TOOL = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}


# ---- helpers against oracles -------------------------------------------------------------------
def test_pad_rows_keeps_real_positions_and_fills_with_the_rows_next_token():
    from tokenrails.engine_patch.lmdeploy.speculative.draft_shapes import pad_rows

    ids = torch.tensor([[7, 1, 2, 8, 9, 3, 4, 5]])  # rows of 3, 1 and 4 positions
    q = torch.tensor([3, 1, 4])
    out, qq = pad_rows(ids, q, 3)
    assert out.tolist() == [[7, 1, 2, 7, 8, 8, 8, 8, 9, 3, 4, 5]]
    assert qq.tolist() == [4, 4, 4]
    with pytest.raises(ValueError):
        pad_rows(ids, q, 2)  # a row longer than the width is refused, never truncated


def test_buckets_hold_the_longest_run_and_are_few():
    from tokenrails.engine_patch.lmdeploy.speculative.draft_shapes import BUCKETS, FIXED, bucket_width, widths

    assert widths(4) == [0, 1, 2, 4] and widths(8) == [0, 1, 2, 4, 8] and widths(5) == [0, 1, 2, 4, 5]
    for k in (1, 2, 3, 4, 6, 8):
        for longest in range(k + 1):
            w = bucket_width(longest, k, BUCKETS)
            assert longest <= w <= k and w in widths(k)
            assert bucket_width(longest, k, FIXED) == k


def test_mode_is_chosen_per_device_unless_set(monkeypatch):
    from tokenrails.engine_patch.lmdeploy.speculative import draft_shapes as ds

    monkeypatch.delenv(ds.ENV_SHAPE, raising=False)
    req = ds.requested_mode()
    assert ds.mode_for(req, torch.device("cpu")) == ds.RAGGED
    assert ds.mode_for(req, torch.device("cuda")) == ds.BUCKETS
    for value, mode in (("0", ds.RAGGED), ("1", ds.FIXED), ("buckets", ds.BUCKETS)):
        monkeypatch.setenv(ds.ENV_SHAPE, value)
        assert ds.mode_for(ds.requested_mode(), torch.device("cuda")) == mode
        assert ds.mode_for(ds.requested_mode(), torch.device("cpu")) == mode
    monkeypatch.setenv(ds.ENV_SHAPE, "sometimes")
    with pytest.raises(ValueError, match="TOKENRAILS_GRAMMAR_DRAFTS_FIXED"):
        ds.requested_mode()


# ---- the real engine ----------------------------------------------------------------------------
def _run(model_dir, monkeypatch, shape: str | None, drafts: int = 4):
    """Greedy outputs of one batch and the per-row query lengths of every decode forward."""
    from lmdeploy import GenerationConfig, pipeline
    from lmdeploy.pytorch.engine.model_agent import agent as agent_mod

    from tokenrails import GuideSpec
    from tokenrails.engine_patch.lmdeploy import activate, deactivate
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config

    if shape is None:
        monkeypatch.delenv(ENV_SHAPE, raising=False)
    else:
        monkeypatch.setenv(ENV_SHAPE, shape)
    forwards: list[list[int]] = []
    original = agent_mod.BaseModelAgent.async_forward

    async def async_forward(agent, inputs, *args, **kwargs):
        if inputs.is_decoding and not inputs.is_dummy:
            q = [int(x) for x in inputs.seq_length.tolist()]
            assert inputs.input_ids.numel() == sum(q) and int(inputs.max_q_seqlen) == max(q)
            forwards.append(q)
        return await original(agent, inputs, *args, **kwargs)

    monkeypatch.setattr(agent_mod.BaseModelAgent, "async_forward", async_forward)
    torch.set_num_threads(1)
    activate(grammar_drafts=drafts)
    pipe = pipeline(model_dir, backend_config=cpu_engine_config(max_batch_size=4, session_len=512))
    try:
        formats = [GuideSpec.json_schema(json.dumps(PERSON), any_whitespace=False),
                   GuideSpec.json_schema(json.dumps(TOOL), any_whitespace=False), None]
        prompts = ["Give me a person as JSON.", "Weather request as JSON:", "Hi"]
        gens = [GenerationConfig(max_new_tokens=n, top_k=1, response_format=f)
                for n, f in zip((40, 40, 24), formats)]
        outs = pipe(prompts, gen_config=gens)
    finally:
        pipe.close()
        deactivate()
        monkeypatch.setattr(agent_mod.BaseModelAgent, "async_forward", original)
    return outs, forwards


@pytest.mark.slow
def test_padded_bucketed_shapes_keep_the_ragged_paths_tokens(model_dir, monkeypatch):
    from jsonschema import validate

    ragged, ragged_fwd = _run(model_dir, monkeypatch, None)  # the CPU path's own choice
    padded, padded_fwd = _run(model_dir, monkeypatch, "buckets")
    # the ragged path really was ragged (rows of one step with different query lengths) ...
    assert any(len(set(q)) > 1 for q in ragged_fwd), ragged_fwd
    # ... and the padded one gave every row of every decode step one length from the buckets
    assert padded_fwd and all(len(set(q)) == 1 and q[0] - 1 in (0, 1, 2, 4) for q in padded_fwd), padded_fwd
    assert any(q[0] > 1 for q in padded_fwd) and any(q[0] == 1 for q in padded_fwd), padded_fwd
    # same tokens kept, row for row (greedy)
    for a, b in zip(ragged, padded):
        assert a.token_ids == b.token_ids, (a.text, b.text)
    for out, schema in zip(padded[:2], (PERSON, TOOL)):
        assert out.finish_reason == "stop", out
        validate(json.loads(out.text), schema)
    assert padded[2].generate_token_len > 1
