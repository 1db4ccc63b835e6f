"""A request's draft counters on the real CPU engine add up to its output (draft_metrics.py).

LMDeploy sends the next step before it reads the current one's outputs, so a row that stopped runs one
more step whose output is dropped. The counters must not count that step, whenever it ends: here a
second call runs after the first one's requests have ended (so their late steps have certainly run),
then every step emits a row's accepted drafts plus one token: prefill gives the first token, and a
row ending at EOS does not count the EOS as a completion token.
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")
jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.slow

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
CAP = 6  # the unguided row stops by length; nothing is drafted for it, so it takes CAP - 1 steps


def test_counters_leave_out_the_step_after_a_row_stopped(model_dir):
    from lmdeploy import GenerationConfig, pipeline

    from tokenrails.engine_patch.lmdeploy import activate, deactivate
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    from tokenrails.engine_patch.lmdeploy.speculative import draft_metrics

    torch.set_num_threads(1)
    activate(grammar_drafts=3)
    pipe = pipeline(model_dir, backend_config=cpu_engine_config(max_batch_size=2, session_len=512))
    try:
        draft_metrics.reset()
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
        guided, free = pipe(["Give me a person as JSON.", "Tell me a story."],
                            gen_config=[GenerationConfig(max_new_tokens=40, top_k=1, response_format=fmt),
                                        GenerationConfig(max_new_tokens=CAP, top_k=1, ignore_eos=True)])
        first = sorted(draft_metrics.all_requests())
        pipe(["Hi"], gen_config=GenerationConfig(max_new_tokens=2, top_k=1))  # the late steps ran before it
        counts = draft_metrics.all_requests()
    finally:
        pipe.close()
        deactivate()
    assert guided.finish_reason == "stop", guided
    jsonschema.validate(json.loads(guided.text), PERSON)
    assert free.finish_reason == "length" and len(free.token_ids) == CAP, free
    assert len(first) == 2, first
    g, f = counts[first[0]], counts[first[1]]
    assert g["forced_draft_tokens"] > 0 and g["accepted_draft_tokens"] > 0, g
    assert g["verify_steps"] + g["accepted_draft_tokens"] == len(guided.token_ids), (g, len(guided.token_ids))
    assert f["draft_tokens"] == 0 and f["verify_steps"] == CAP - 1, f
    assert g["grammar_draft_steps"] == g["verify_steps"] + 1, g  # its prefill, then one per verification
