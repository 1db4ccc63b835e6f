"""outlines 0.0.x's stopping rule, reproduced under its API version (issue 28): 0.0.46's
``SequenceGenerator`` ended as soon as every sequence's guide was in a final state (an accepting
state of the regex's byte automaton — ``RegexGuide.final_states = fsm.finals | {-1}`` — checked by
``is_generation_finished`` after each token), so ``generate.format(model, int)`` returns after
one digit on SmolLM2, whose digits are single tokens. 0.1.x and 1.x stop at EOS or the cap, and
stay the default. On main the shim always used the EOS rule: under 0.0.46 SmolLM2 wrote digits
until the cap, and these tests fail.
"""
from __future__ import annotations

import re

import pytest
import torch

from tokenrails.compat import outlines
from tokenrails.compat.outlines.fsm.types import INTEGER

pytestmark = pytest.mark.slow  # runs SmolLM2 on CPU

PROMPT = "How many legs does a spider have? Answer with a number: "


@pytest.fixture(scope="module")
def model():
    from tokenrails.demo_model import load_model

    torch.set_num_threads(1)
    loaded = load_model(quiet=True)
    return outlines.models.Transformers(loaded.model, loaded.tokenizer)


@pytest.fixture
def api_0046():
    outlines.set_api_version("0.0.46")
    yield
    outlines.set_api_version(None)


def _ends_at_first_accepting_state(tokenizer, text: str, pattern: str) -> bool:
    """``text`` is in the language and none of its token prefixes is (the oracle: ``re``)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if re.fullmatch(pattern, text) is None:
        return False
    return all(re.fullmatch(pattern, tokenizer.decode(ids[:k])) is None for k in range(1, len(ids)))


def test_format_int_returns_at_the_first_accepting_state(model, api_0046):
    tokenizer = model.hf_tokenizer
    value = outlines.generate.format(model, int, sampler=outlines.samplers.greedy())(PROMPT, max_tokens=24)
    assert isinstance(value, int)
    assert _ends_at_first_accepting_state(tokenizer, str(value), INTEGER), value


def test_regex_batch_and_stream_stop_like_0046(model, api_0046):
    tokenizer = model.hf_tokenizer
    pattern = r"[0-9]+(\.[0-9]+)?"
    generator = outlines.generate.regex(model, pattern, sampler=outlines.samplers.greedy())
    texts = generator([PROMPT, "Pi is about "], max_tokens=24)
    assert all(_ends_at_first_accepting_state(tokenizer, t, pattern) for t in texts), texts
    streamed = "".join(generator.stream(PROMPT, max_tokens=24))
    assert streamed == texts[0]


def test_json_ends_with_its_closing_brace(model, api_0046):
    """A JSON object's regex first accepts at its closing brace: the 0.0.x rule ends there too."""
    schema = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'
    value = outlines.generate.json(model, schema, sampler=outlines.samplers.greedy())(PROMPT, max_tokens=40)
    assert isinstance(value, dict) and isinstance(value["n"], int)


def test_later_versions_keep_stopping_at_eos_or_the_cap(model):
    """0.1.x / 1.x (the default): the digits go on past the first accepting state."""
    assert outlines.api_version() == "1.3.3"
    text = outlines.generate.regex(model, r"[0-9]+", sampler=outlines.samplers.greedy())(PROMPT, max_tokens=6)
    assert re.fullmatch(r"[0-9]+", text) and len(text) > 1, text


def test_install_selects_the_version():
    outlines.install(api_version="0.0.46")
    try:
        assert outlines.api_version() == "0.0.46"
    finally:
        outlines.uninstall()
    assert outlines.api_version() == "1.3.3"
    with pytest.raises(ValueError):
        outlines.set_api_version("zero")


def test_0046_loop_refuses_transformers_arguments(model, api_0046):
    """outlines 0.0.46's generators take (prompts, max_tokens, stop_at, rng): a transformers
    argument is an error, never dropped silently."""
    generator = outlines.generate.regex(model, r"[0-9]+", sampler=outlines.samplers.greedy())
    with pytest.raises(TypeError, match="repetition_penalty"):
        generator(PROMPT, max_tokens=4, repetition_penalty=1.2)
    with pytest.raises(TypeError, match="repetition_penalty"):
        list(generator.stream(PROMPT, max_tokens=4, repetition_penalty=1.2))
