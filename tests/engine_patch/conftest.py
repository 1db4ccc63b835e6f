"""The embedded SmolLM2-135M model, loaded once per test session (CPU, float32, one thread)."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def smollm2():
    from tokenrails.demo_model import load_model

    torch.set_num_threads(1)
    return load_model(quiet=True)


@pytest.fixture(scope="session")
def think_tokenizer():
    """SmolLM2's tokenizer plus added ``<think>``/``</think>`` tokens (like qwen3's: added, not
    special). SmolLM2 itself has no markers: its own vocabulary is the "no markers" case."""
    from pathlib import Path

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(Path(__file__).resolve().parents[1] / "fixtures" / "smollm2"))
    tok.add_tokens(["<think>", "</think>"], special_tokens=False)
    return tok


@pytest.fixture(scope="session")
def think_vocab(think_tokenizer):
    from tokenrails import Vocabulary

    return Vocabulary.from_huggingface(think_tokenizer)
