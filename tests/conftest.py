"""Shared fixtures: a real tokenizer (SmolLM2, committed under tests/fixtures) and its vocabulary."""
from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

torch.set_num_threads(1)

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(FIXTURES / "smollm2"))


@pytest.fixture(scope="session")
def vocab(smollm2_tokenizer):
    from tokenrails import Vocabulary

    return Vocabulary.from_huggingface(smollm2_tokenizer)
