"""Dispatch: device routing and the TOKENRAILS_KERNEL override."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tokenrails.kernels import apply_token_bitmask_inplace, apply_token_bitmask_inplace_reference, dispatch

from .cases import bits_equal, make_bitmask, make_logits


@pytest.fixture
def spies(monkeypatch):
    """Record which implementation the dispatcher calls."""
    calls = []
    monkeypatch.setattr(dispatch, "apply_checked_cpu", lambda args: calls.append("cpu"))
    monkeypatch.setattr(dispatch, "_reference", lambda args: calls.append("reference"))

    class FakeTriton:
        @staticmethod
        def launch_checked_triton(args):
            calls.append("triton")

    monkeypatch.setattr(dispatch, "_triton", lambda: FakeTriton)
    return calls


def call(indices=None):
    apply_token_bitmask_inplace(torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int32), indices)


def test_cpu_tensors_use_the_cpu_kernel(spies, monkeypatch):
    monkeypatch.delenv(dispatch.KERNEL_ENV, raising=False)
    call()
    assert spies == ["cpu"]


@pytest.mark.parametrize("name", ["reference", "cpu", "triton", " Triton "])
def test_env_var_forces_an_implementation(spies, monkeypatch, name):
    monkeypatch.setenv(dispatch.KERNEL_ENV, name)
    call()
    assert spies == [name.strip().lower()]


def test_unknown_env_value_is_an_error(monkeypatch):
    monkeypatch.setenv(dispatch.KERNEL_ENV, "cuda")
    with pytest.raises(ValueError, match="TOKENRAILS_KERNEL"):
        call()


def test_validation_happens_before_dispatch(spies, monkeypatch):
    monkeypatch.setenv(dispatch.KERNEL_ENV, "triton")
    with pytest.raises(ValueError):
        call([0, 9])
    assert spies == []


@pytest.mark.parametrize("name", ["reference", "cpu", "triton"])
def test_each_forced_implementation_is_correct(monkeypatch, name):
    pytest.importorskip("triton") if name == "triton" else None
    monkeypatch.setenv(dispatch.KERNEL_ENV, name)
    rng = np.random.default_rng(2)
    logits = make_logits(rng, 3, 200, torch.float32)
    bitmask = make_bitmask(rng, ["random", "few_allowed"], 7)
    expected = logits.clone()
    apply_token_bitmask_inplace_reference(expected, bitmask, [2, 0], 199)
    apply_token_bitmask_inplace(logits, bitmask, [2, 0], 199)
    assert bits_equal(logits, expected)
