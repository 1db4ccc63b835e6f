"""Speculative decoding on LMDeploy 0.18's real engine (CPU path), guided, stock vs upgraded.

The draft is LMDeploy's EAGLE draft for Llama with random weights (``cpu/draft.py``): its
proposals are masked by the grammar, verified by LMDeploy's rejection sampler and mostly rejected,
so every step drafts, accepts and rolls back. Greedy outputs must equal the non-speculative
engine's token for token; sampled outputs must be valid.
"""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")
jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                            "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
PATTERN = r"[a-z]{2,6}-[0-9]{2}"
CHOICES = ["red", "green", "blue"]
PROMPTS = ["Give me a person as JSON.", "Hi", "A code please.", "Pick a colour."]


def _gens(**sampling):
    from lmdeploy import GenerationConfig
    return [GenerationConfig(max_new_tokens=40, response_format={"type": "json_schema", "json_schema": {
                "name": "p", "schema": SCHEMA}}, **sampling),
            GenerationConfig(max_new_tokens=10, **sampling),
            GenerationConfig(max_new_tokens=24, response_format={"type": "regex_schema", "regex_schema": PATTERN},
                             **sampling),
            GenerationConfig(max_new_tokens=8, response_format={"type": "choice", "choice": CHOICES}, **sampling)]


@pytest.fixture(scope="module")
def draft_dir(model_dir, tmp_path_factory):
    from tokenrails.engine_patch.lmdeploy.cpu.draft import random_eagle_draft
    return str(random_eagle_draft(model_dir, tmp_path_factory.mktemp("eagle"), seed=0))


def _run(model_dir, draft_dir, *, upgraded: bool, spec: bool, gens, prompts=PROMPTS):
    from lmdeploy import pipeline
    from lmdeploy.messages import SpeculativeConfig

    from tokenrails.engine_patch.lmdeploy import activate, deactivate
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    torch.set_num_threads(1)
    if upgraded:
        activate()
    try:
        config = SpeculativeConfig(method="eagle", model=draft_dir, num_speculative_tokens=3) if spec else None
        pipe = pipeline(model_dir, backend_config=cpu_engine_config(max_batch_size=4, session_len=512),
                        speculative_config=config)
        try:
            return pipe(prompts, gen_config=gens)
        finally:
            pipe.close()
    finally:
        if upgraded:
            deactivate()


def _check_valid(outs):
    assert outs[0].finish_reason == "stop", outs[0]
    jsonschema.validate(json.loads(outs[0].text), SCHEMA)
    assert outs[1].generate_token_len > 0
    assert outs[2].finish_reason == "stop" and re.fullmatch(PATTERN, outs[2].text), outs[2]
    assert outs[3].finish_reason == "stop" and outs[3].text in CHOICES, outs[3]


def test_greedy_speculative_equals_plain_decoding_stock_and_upgraded(model_dir, draft_dir, monkeypatch):
    from tokenrails.engine_patch.lmdeploy.speculative import spec_helper as spec

    gens = _gens(top_k=1)
    plain = _run(model_dir, draft_dir, upgraded=True, spec=False, gens=gens)
    _check_valid(plain)

    drafted = []
    original = spec.RowHandle.accept_draft

    def spy(self, token):
        drafted.append(token)
        return original(self, token)

    monkeypatch.setattr(spec.RowHandle, "accept_draft", spy)
    upgraded = _run(model_dir, draft_dir, upgraded=True, spec=True, gens=gens)
    assert len(drafted) >= 10, "the speculative path did not draft guided tokens through the upgrade"
    stock = _run(model_dir, draft_dir, upgraded=False, spec=True, gens=gens)
    assert [o.text for o in upgraded] == [o.text for o in plain]
    # stock has no `choice` response_format (it ends that row empty): compare the kinds it has
    assert [o.text for o in stock[:3]] == [o.text for o in plain[:3]]
    _check_valid(upgraded)


@pytest.mark.parametrize("seed", [1, 2])
def test_sampled_speculative_outputs_are_valid(model_dir, draft_dir, seed):
    gens = _gens(temperature=1.0, top_p=1.0, top_k=0, random_seed=seed)
    gens[0].max_new_tokens = 64
    outs = _run(model_dir, draft_dir, upgraded=True, spec=True, gens=gens)
    if outs[0].finish_reason == "stop":  # sampled JSON may run out of tokens in whitespace
        jsonschema.validate(json.loads(outs[0].text), SCHEMA)
    assert outs[0].finish_reason in ("stop", "length"), outs[0]
    assert outs[2].finish_reason == "stop" and re.fullmatch(PATTERN, outs[2].text), outs[2]
    assert outs[3].finish_reason == "stop" and outs[3].text in CHOICES, outs[3]
