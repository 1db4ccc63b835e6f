"""LMDeploy 0.18's real PyTorch engine (Engine, Scheduler, model agent, sampling, logits processing,
model forward) on CPU via tokenrails.engine_patch.lmdeploy.cpu, on the embedded SmolLM2 model."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")
jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.slow

PROMPTS = ["Say hello.", "Give me a person as JSON."]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                            "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def model_dir():
    from tokenrails.models import ModelNotFoundError, resolve_model_dir
    try:
        path, _, _ = resolve_model_dir(quiet=True)
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    return str(path)


@pytest.fixture(scope="module")
def pipe(model_dir):
    torch.set_num_threads(1)
    from lmdeploy import pipeline

    from tokenrails.engine_patch.lmdeploy import activate, deactivate
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    activate()
    p = pipeline(model_dir, backend_config=cpu_engine_config(max_batch_size=4, session_len=512))
    yield p
    p.close()
    deactivate()


def test_json_schema_batched_with_unguided(pipe):
    from lmdeploy import GenerationConfig
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    gens = [GenerationConfig(max_new_tokens=8, top_k=1),
            GenerationConfig(max_new_tokens=40, top_k=1, response_format=fmt)]
    outs = pipe(PROMPTS, gen_config=gens)
    assert outs[1].finish_reason == "stop", outs[1]
    jsonschema.validate(json.loads(outs[1].text), SCHEMA)
    assert outs[0].generate_token_len > 0


def test_regex_batched_with_unguided(pipe):
    import re

    from lmdeploy import GenerationConfig
    pattern = r"[0-9]{3}-[a-z]{2}"
    gens = [GenerationConfig(max_new_tokens=12, top_k=1, response_format={"type": "regex_schema",
                                                                           "regex_schema": pattern}),
            GenerationConfig(max_new_tokens=6, top_k=1)]
    outs = pipe(["Write a code.", "Hi"], gen_config=gens)
    assert re.fullmatch(pattern, outs[0].text), outs[0].text
