"""The CPU path runs LMDeploy's default rotary embedding eagerly (cpu/enable.py): its
``torch.compile`` costs every engine process and TP rank a dynamo trace and an inductor build."""
from __future__ import annotations

import importlib

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")
eval_frame = pytest.importorskip("torch._dynamo.eval_frame")


def test_a_cpu_rotary_forward_never_enters_dynamo(monkeypatch):
    importlib.import_module("tokenrails.engine_patch.lmdeploy.cpu.enable").enable()
    from lmdeploy.pytorch.backends.default import rotary_embedding as rotary

    if not hasattr(eval_frame, "_callback_from_stance"):
        pytest.skip("this torch's dynamo entry point is not the one watched here")
    entered: list = []
    real = eval_frame._callback_from_stance
    monkeypatch.setattr(eval_frame, "_callback_from_stance", lambda cb: entered.append(cb) or real(cb))
    position_ids, inv_freq = torch.arange(7)[None], 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    cos, sin = rotary._rotary_embedding_fwd(position_ids, inv_freq, 1.0, dtype=torch.float32, device_type="cpu")
    assert entered == []
    freqs = position_ids[0, :, None].float() * inv_freq[None]  # the oracle: cos/sin of position x frequency
    assert torch.allclose(cos[0], torch.cat([freqs, freqs], -1).cos())
    assert torch.allclose(sin[0], torch.cat([freqs, freqs], -1).sin())
