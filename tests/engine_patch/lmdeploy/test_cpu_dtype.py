"""The CPU path's ``dtype='auto'``: LMDeploy's rule, with the CPU's own bfloat16 support.

LMDeploy keeps a bfloat16 model in bfloat16 only where ``is_bf16_supported(device_type)`` says so,
and says no for 'cpu'. These tests drive LMDeploy's own ``_update_torch_dtype`` with a CPU engine's
device type.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")

import importlib  # noqa: E402

cpu_enable = importlib.import_module("tokenrails.engine_patch.lmdeploy.cpu.enable")


def _resolve(config_dtype: str | None, dtype: str = "auto", device_type: str = "cpu") -> torch.dtype:
    from lmdeploy.pytorch.config import _update_torch_dtype

    cpu_enable.enable()
    hf = SimpleNamespace(torch_dtype=config_dtype, dtype=config_dtype)
    cfg = SimpleNamespace(hf_config=hf, dtype=None)
    return _update_torch_dtype(cfg, dtype, device_type=device_type).dtype


needs_bf16 = pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
                                reason="this CPU has no fast bfloat16 path")


@needs_bf16
def test_auto_keeps_a_bfloat16_model_in_bfloat16_on_a_bf16_cpu():
    assert _resolve("bfloat16") == torch.bfloat16


def test_auto_demotes_bfloat16_where_the_cpu_lacks_it(monkeypatch):
    monkeypatch.setattr(cpu_enable, "cpu_supports_bf16", lambda: False, raising=False)
    assert _resolve("bfloat16") == torch.float16


@pytest.mark.parametrize("config_dtype", ["float32", "float16", None])
def test_auto_otherwise_follows_lmdeploys_rule(config_dtype):
    expected = torch.float16  # float16 config: itself; float32 or none: LMDeploy's float16
    assert _resolve(config_dtype) == expected


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_an_explicit_dtype_wins(dtype):
    assert _resolve("float32", dtype) == getattr(torch, dtype)


def test_other_device_types_keep_lmdeploys_answer():
    from lmdeploy.pytorch import config as pt_config

    cpu_enable.enable()
    assert pt_config.is_bf16_supported("maca") is True  # a type LMDeploy lists
    assert pt_config.is_bf16_supported("unknown-device") is False


def test_bfloat16_rows_sample_exactly():
    """What ``auto`` now runs for a bfloat16 model: the CPU sampling op stays exact in bfloat16 (a
    one-hot row always gives its token; two allowed tokens, nothing else)."""
    from tokenrails.engine_patch.lmdeploy.cpu.sampling import CpuMultinomialSamplingImpl

    cpu_enable.enable()
    op = CpuMultinomialSamplingImpl()
    rows, vocab = 32, 49152
    indices = torch.stack([torch.roll(torch.arange(vocab), -r) for r in range(rows)])
    one_hot = torch.zeros(rows, vocab, dtype=torch.bfloat16)
    one_hot[:, 0] = 1
    two = torch.zeros(rows, vocab, dtype=torch.bfloat16)
    two[:, 0], two[:, 1] = 0.75, 0.25
    for step in range(40):
        seeds, offs = torch.arange(rows) + 1000 * step, torch.full((rows, ), step)
        assert torch.equal(op.forward(one_hot, seeds, offs, indices), indices[:, 0])
        out = op.forward(two, seeds, offs, indices)
        assert bool(((out == indices[:, 0]) | (out == indices[:, 1])).all())
