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


# ---- the step LMDeploy runs after a row stopped (its output dropped) does no guided work for it ---
def test_no_guided_work_for_a_row_after_it_stopped(pipe, monkeypatch):
    """LMDeploy sends a step before it reads the previous one's outputs, so a row that ended runs
    one more step. Per guided request: one mask and one accept per step it really ran (its prefill,
    then one per token after the first; a row ending at EOS also ran the step that sampled the EOS,
    which its token_ids leave out)."""
    import collections
    import re

    from lmdeploy import GenerationConfig

    from tokenrails.guided.manager import GuidedDecodingManager as M

    work = {"fills": collections.Counter(), "accepts": collections.Counter()}

    def spy(name, fn):
        def counted(self, first, rows):  # (logits | token ids, rows)
            work[name].update(r.session_id for r in rows if r is not None)
            return fn(self, first, rows)
        return counted

    monkeypatch.setattr(M, "fill_and_apply", spy("fills", M.fill_and_apply))  # 2 CPU rows: never overlapped
    monkeypatch.setattr(M, "accept_tokens", spy("accepts", M.accept_tokens))
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    cut = 5  # the second guided row stops by length inside its JSON
    outs = pipe(["Give me a person as JSON.", "Another person as JSON."],
                gen_config=[GenerationConfig(max_new_tokens=40, top_k=1, response_format=fmt),
                            GenerationConfig(max_new_tokens=cut, top_k=1, response_format=fmt)])
    pipe(["Hi"], gen_config=GenerationConfig(max_new_tokens=2, top_k=1))  # the late steps ran before it
    done, cutoff = outs
    assert done.finish_reason == "stop", done
    jsonschema.validate(json.loads(done.text), SCHEMA)
    assert cutoff.finish_reason == "length" and len(cutoff.token_ids) == cut and re.match(r"\s*\{", cutoff.text)
    sessions = sorted(set(work["fills"]) | set(work["accepts"]))
    assert len(sessions) == 2, work
    got = {s: {name: work[name][s] for name in work} for s in sessions}
    want = {s: {"fills": steps, "accepts": steps} for s, steps in zip(sessions, (len(done.token_ids) + 1, cut))}
    assert got == want
