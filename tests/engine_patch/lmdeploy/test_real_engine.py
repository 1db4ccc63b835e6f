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


# ---- the mask fill overlapped with the forward (overlap.py): used on every guided decode step,
# drops nothing, changes no output; and a regression the real engine found ----------------------
def _run(pipe):
    from lmdeploy import GenerationConfig
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    gens = [GenerationConfig(max_new_tokens=40, top_k=1, response_format=fmt),
            GenerationConfig(max_new_tokens=8, top_k=1),
            GenerationConfig(max_new_tokens=24, top_k=1,
                             response_format={"type": "regex_schema", "regex_schema": r"[a-z]{2,6}-[0-9]{2}"})]
    return pipe(["Give me a person as JSON.", "Hi", "A code please."], gen_config=gens)


def test_overlapped_fill_is_used_and_changes_nothing(pipe, monkeypatch):
    import re

    from tokenrails.engine_patch.lmdeploy.step import overlap

    monkeypatch.setenv("TOKENRAILS_OVERLAP", "0")
    overlap.STATS.reset()
    serial = _run(pipe)
    assert overlap.STATS.steps == 0

    monkeypatch.setenv("TOKENRAILS_OVERLAP", "1")
    overlap.STATS.reset()
    small = _run(pipe)  # a CPU agent does not overlap 2 guided rows: they are filled inline
    assert overlap.STATS.steps == 0 and overlap.STATS.inline >= 10, overlap.STATS

    monkeypatch.setattr(overlap, "CPU_MIN_ROWS", 1)  # the path of GPU agents and large CPU batches
    overlap.STATS.reset()
    overlapped = _run(pipe)
    assert overlap.STATS.steps >= 10, overlap.STATS  # every guided decode step
    assert overlap.STATS.dropped == 0
    assert overlap.STATS.inline >= 10, overlap.STATS  # 3 rows: the apply skips the thread hop
    assert [o.text for o in overlapped] == [o.text for o in serial] == [o.text for o in small]
    assert json.loads(overlapped[0].text)["age"] is not None
    assert re.fullmatch(r"[a-z]{2,6}-[0-9]{2}", overlapped[2].text)


def test_min_new_tokens_past_a_finished_grammar_ends_that_row_and_the_engine_lives(pipe):
    """Regression, found on the real engine: with ``min_new_tokens`` banning EOS after the
    grammar completed, the row's EOS repair wrote the engine's inference tensor from a worker
    thread outside inference mode; the RuntimeError stopped the engine loop, failing every
    request. The row now ends with its complete output and the batch goes on."""
    import re

    from lmdeploy import GenerationConfig
    pattern = r"[a-z]{2}"
    gens = [GenerationConfig(max_new_tokens=12, min_new_tokens=8, top_k=1,
                             response_format={"type": "regex_schema", "regex_schema": pattern}),
            GenerationConfig(max_new_tokens=6, top_k=1)]
    outs = pipe(["Two letters.", "Hi"], gen_config=gens)
    assert [o.finish_reason for o in outs] != ["error", "error"], outs
    assert outs[0].finish_reason == "stop" and re.fullmatch(pattern, outs[0].text), outs[0]
    assert outs[1].finish_reason in ("stop", "length") and outs[1].generate_token_len > 0
    again = pipe(["Hi"], gen_config=[GenerationConfig(max_new_tokens=4, top_k=1)])
    assert again[0].generate_token_len > 0  # the engine is still serving
