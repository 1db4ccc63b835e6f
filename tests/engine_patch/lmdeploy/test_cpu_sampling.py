"""The CPU device path's sampling and config checks (issue 25, point 3).

LMDeploy's ``dtype='auto'`` runs float16 on the CPU path, where ``torch.multinomial`` draws
zero-probability indices (tokens the grammar's mask forbids); ``random_seed`` was ignored there; and
skipping the whole ``EngineChecker`` (it wants CUDA or deeplink) also skipped its config checks.
"""
from __future__ import annotations

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")


def _cpu_op():
    from lmdeploy.pytorch.backends.selector import get_backend
    from lmdeploy.pytorch.nn.multinomial_sampling import _MULTINOMIAL_SAMPLING_SPEC

    from tokenrails.engine_patch.lmdeploy.cpu import enable
    enable()
    return get_backend('cpu').build_op(_MULTINOMIAL_SAMPLING_SPEC)


def test_float16_one_hot_rows_never_draw_a_zero_probability_token():
    """64 one-hot float16 rows of SmolLM2's vocabulary width, 150 draws each: stock CPU sampling
    returns another index ~8 times in 6,400 draws (P(none in 9,600) < 1e-5)."""
    op = _cpu_op()
    rows, vocab = 64, 49152
    # the engine passes scores sorted descending with their token ids: put the one allowed token
    # at a different id per row
    indices = torch.stack([torch.roll(torch.arange(vocab), -r) for r in range(rows)])
    scores = torch.zeros(rows, vocab, dtype=torch.float16)
    scores[:, 0] = 1
    seeds = torch.arange(rows, dtype=torch.long)
    wrong = 0
    for step in range(150):
        out = op.forward(scores, seeds + step * 1000, torch.full((rows, ), step), indices)
        wrong += int((out != indices[:, 0]).sum())
    assert wrong == 0


def test_float16_sparse_rows_draw_only_allowed_tokens_and_follow_the_distribution():
    """Two allowed tokens at 3:1 among zeros: only those two come out, in about that ratio."""
    op = _cpu_op()
    rows, vocab = 32, 4096
    scores = torch.zeros(rows, vocab, dtype=torch.float16)
    scores[:, 0], scores[:, 1] = 0.75, 0.25
    indices = torch.arange(vocab).expand(rows, vocab)
    counts = torch.zeros(vocab, dtype=torch.long)
    for step in range(200):
        out = op.forward(scores, torch.arange(rows) + 7, torch.full((rows, ), step), indices)
        counts += torch.bincount(out, minlength=vocab)
    assert int(counts[2:].sum()) == 0
    share = counts[0].item() / counts.sum().item()
    assert 0.72 < share < 0.78, share


def test_same_seed_and_offset_same_draw_different_offset_moves_on():
    op = _cpu_op()
    rows, vocab = 8, 1000
    scores = torch.softmax(torch.randn(rows, vocab), -1).sort(-1, descending=True).values
    indices = torch.arange(vocab).expand(rows, vocab)
    seeds = torch.full((rows, ), 1234)
    offs = torch.arange(rows)
    a = op.forward(scores, seeds, offs, indices)
    b = op.forward(scores, seeds, offs, indices)
    assert torch.equal(a, b)
    draws = {tuple(op.forward(scores, seeds, offs + k, indices).tolist()) for k in range(1, 6)}
    assert len(draws) > 1


def test_hf_adapter_samples_float16_logits_exactly():
    """The transformers adapter's sampler on float16 logits with one unmasked token."""
    from tokenrails.engine_patch.hf.sampling import SamplingParams, choose_tokens

    params = SamplingParams(do_sample=True, temperature=1.0, seed=0)
    gen = params.generator()
    logits = torch.full((64, 49152), float("-inf"), dtype=torch.float16)
    logits[:, 5] = 0.0
    wrong = 0
    for _ in range(150):
        wrong += int((choose_tokens(logits, params, gen) != 5).sum())
    assert wrong == 0


# ---- the engine checker: skip only what needs CUDA --------------------------------------------
def _check(model_dir, **cfg):
    from lmdeploy.pytorch.engine.engine_checker import EngineChecker

    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    EngineChecker(model_path=model_dir, engine_config=cpu_engine_config(**cfg)).handle()


def test_engine_checker_rejects_too_few_blocks_on_cpu(model_dir):
    with pytest.raises(SystemExit):
        _check(model_dir, num_gpu_blocks=8)


def test_engine_checker_rejects_nonpositive_batch_on_cpu(model_dir):
    with pytest.raises(SystemExit):
        _check(model_dir, max_batch_size=0)


def test_engine_checker_accepts_a_valid_cpu_config(model_dir):
    _check(model_dir, num_gpu_blocks=16)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_greedy_sampling_on_cpu_picks_argmax_ids(dtype):
    """The CPU path's greedy branch (``max`` instead of CPU half ``argmax``, which has no fast
    kernel) returns ``argmax``'s ids: rows full of ties, a NaN row, an all ``-inf`` row."""
    from types import SimpleNamespace

    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor

    from tokenrails.engine_patch.lmdeploy.cpu import enable
    enable()
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 3, (16, 49152), generator=gen).to(getattr(torch, dtype))  # many ties per row
    logits[3, 100] = float("nan")
    logits[5] = float("-inf")
    proc = FusedLogitsProcessor.__new__(FusedLogitsProcessor)
    proc.sampling_inputs = SimpleNamespace(max_top_k=1)
    assert torch.equal(proc.sampling(logits), logits.argmax(-1))
    assert torch.equal(proc.sampling(logits.float()), logits.float().argmax(-1))  # float32: LMDeploy's own
