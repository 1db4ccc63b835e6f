"""A request's draft counters and guided work on the real CPU engine add up to its output.

LMDeploy sends the next step before it reads the current one's outputs, so a row that stopped runs one
more step whose output is dropped. The counters must not count that step, whenever it ends: here a
second call runs after the first one's requests have ended (so their late steps have certainly run),
then every step emits a row's accepted drafts plus one token: prefill gives the first token, and a
row ending at EOS does not count the EOS as a completion token. Nor may that step do guided work for
the stopped row (propose, mask, accept into a matcher whose round has ended): the grammar manager's
calls are counted per request and must match the request's own steps.
"""
from __future__ import annotations

import collections
import json
import re

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")
jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.slow

from .schemas import PERSON  # noqa: E402
CAP = 6  # the unguided row stops by length; nothing is drafted for it, so it takes CAP - 1 steps
CUT = 5  # the second guided row stops by length inside its JSON


def _spy(mp: pytest.MonkeyPatch) -> dict[str, collections.Counter]:
    """Count the grammar manager's per-row work by session id: masks of a verification, accepts,
    proposals (a forced run walked, or a guess made ahead taken)."""
    from tokenrails.guided.manager import GuidedDecodingManager as M

    work = {"fills": collections.Counter(), "accepts": collections.Counter(), "proposals": collections.Counter()}

    def count(name, rows):
        for r in rows:
            if r is not None:
                work[name][r.session_id] += 1

    fill, accept, forced, guessed = M.fill_and_apply_spec, M.accept_tokens_spec, M.forced_tokens, M.guessed_run

    def fill_spy(self, logits, rows, drafts):
        count("fills", rows)
        return fill(self, logits, rows, drafts)

    def accept_spy(self, accepted, rows):
        count("accepts", rows)
        return accept(self, accepted, rows)

    def forced_spy(self, row, *a, **kw):
        count("proposals", [row])
        return forced(self, row, *a, **kw)

    def guessed_spy(self, row, guess):
        run = guessed(self, row, guess)
        count("proposals", [row] if run is not None else [])
        return run

    for name, fn in (("fill_and_apply_spec", fill_spy), ("accept_tokens_spec", accept_spy),
                     ("forced_tokens", forced_spy), ("guessed_run", guessed_spy)):
        mp.setattr(M, name, fn)
    return work


@pytest.fixture(scope="module")
def run(model_dir):
    """One engine, one batch: a guided row ending at EOS, an unguided row and a guided row cut by length."""
    from lmdeploy import GenerationConfig, pipeline

    from tokenrails.engine_patch.lmdeploy import activate, deactivate
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    from tokenrails.engine_patch.lmdeploy.speculative import draft_metrics

    torch.set_num_threads(1)
    activate(grammar_drafts=3)
    pipe = pipeline(model_dir, backend_config=cpu_engine_config(max_batch_size=3, session_len=512))
    try:
        with pytest.MonkeyPatch.context() as mp:
            work = _spy(mp)
            draft_metrics.reset()
            fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
            outs = pipe(["Give me a person as JSON.", "Tell me a story.", "Another person as JSON."],
                        gen_config=[GenerationConfig(max_new_tokens=40, top_k=1, response_format=fmt),
                                    GenerationConfig(max_new_tokens=CAP, top_k=1, ignore_eos=True),
                                    GenerationConfig(max_new_tokens=CUT, top_k=1, response_format=fmt)])
            first = sorted(draft_metrics.all_requests())
            pipe(["Hi"], gen_config=GenerationConfig(max_new_tokens=2, top_k=1))  # the late steps ran before it
            counts = draft_metrics.all_requests()
    finally:
        pipe.close()
        deactivate()
    assert len(first) == 3, first
    return outs, [counts[k] for k in first], first, work


def test_counters_leave_out_the_step_after_a_row_stopped(run):
    (guided, free, cut), (g, f, c), _, _ = run
    assert guided.finish_reason == "stop", guided
    jsonschema.validate(json.loads(guided.text), PERSON)
    assert free.finish_reason == "length" and len(free.token_ids) == CAP, free
    assert cut.finish_reason == "length" and re.match(r"\s*\{", cut.text), cut
    assert g["forced_draft_tokens"] > 0 and g["accepted_draft_tokens"] > 0, g
    assert g["verify_steps"] + g["accepted_draft_tokens"] == len(guided.token_ids), (g, len(guided.token_ids))
    assert f["draft_tokens"] == 0 and f["verify_steps"] == CAP - 1, f
    assert g["grammar_draft_steps"] == g["verify_steps"] + 1, g  # its prefill, then one per verification


def test_no_guided_work_for_a_row_after_it_stopped(run):
    """Per guided request: one mask per verification, one accept and one proposal per step (its prefill
    and each verification); nothing for the step the engine runs after the row stopped."""
    _, (g, f, c), keys, work = run
    for key, counters in ((keys[0], g), (keys[2], c)):
        steps = counters["verify_steps"]
        assert steps > 0, counters
        got = {name: work[name][key] for name in work}
        assert got == {"fills": steps, "accepts": steps + 1, "proposals": steps + 1}, (key, got, counters)
    assert not any(work[name][keys[1]] for name in work), work  # the unguided row has no guided work
