"""The embedded SmolLM2-135M model, loaded once per test session (CPU, float32, one thread)."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def smollm2():
    from tokenrails.models import load_model

    torch.set_num_threads(1)
    return load_model(quiet=True)
