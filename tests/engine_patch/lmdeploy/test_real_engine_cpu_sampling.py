"""Sampling on LMDeploy's real engine on the CPU path (issue 25, point 3): ``random_seed`` makes a
sampled request reproducible, and sampled guided output stays valid."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")
jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                            "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
FMT = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}


def _sampled(pipe, seed: int, guided: bool) -> list[str]:
    from lmdeploy import GenerationConfig
    gen = GenerationConfig(do_sample=True, max_new_tokens=24, temperature=1.0, top_k=0, top_p=1.0, random_seed=seed,
                           response_format=FMT if guided else None)
    prompts = ["Give me a person as JSON.", "Tell me a story."]
    return [o.text for o in pipe(prompts, gen_config=[gen, gen])]


def test_random_seed_reproduces_sampled_outputs(pipe):
    first = _sampled(pipe, 1234, guided=False) + _sampled(pipe, 1234, guided=True)
    again = _sampled(pipe, 1234, guided=False) + _sampled(pipe, 1234, guided=True)
    assert first == again
    other = _sampled(pipe, 99, guided=False)
    assert other != first[:2]


def test_sampled_guided_rows_are_valid(pipe):
    from lmdeploy import GenerationConfig
    gens = [GenerationConfig(do_sample=True, max_new_tokens=48, temperature=1.3, top_k=0, random_seed=s, response_format=FMT)
            for s in range(4)]
    for out in pipe(["Give me a person as JSON."] * 4, gen_config=gens):
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.text), SCHEMA)
