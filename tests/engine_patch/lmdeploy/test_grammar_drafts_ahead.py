"""Grammar drafts' proposer beside the forward (engine_patch/lmdeploy/draft_ahead.py), real CPU engine.

Oracles: greedy outputs with the guesses on are token for token those with them off (same engine
shapes: the guess is the run the inline proposal computes), and the guesses were actually used;
every finished JSON output validates with jsonschema. A proposal that raises for one row ends that
row with an error and no other: the other rows finish and validate.
"""
from __future__ import annotations

import collections
import json
import threading

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")
jsonschema = pytest.importorskip("jsonschema")

pytestmark = pytest.mark.slow

# long key names: forced runs longer than k, so the next run is guessed beside the forward
EVENT = {"type": "object", "properties": {
    "event_identifier_code": {"type": "integer"},
    "organizing_committee_contact": {"type": "string", "maxLength": 6},
    "registration_deadline_passed": {"type": "boolean"}},
    "required": ["event_identifier_code", "organizing_committee_contact", "registration_deadline_passed"],
    "additionalProperties": False}
from .schemas import PERSON  # noqa: E402


def _fmt(schema):
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


def _generate(model_dir, prompts, formats, max_tokens=48, drafts=3, timeout=240.0):
    """Greedy outputs of one engine with grammar drafts (None when it did not answer in time)."""
    from lmdeploy import GenerationConfig, pipeline

    from tokenrails.engine_patch.lmdeploy import activate, deactivate
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config

    torch.set_num_threads(1)
    activate(grammar_drafts=drafts)
    pipe = pipeline(model_dir, backend_config=cpu_engine_config(max_batch_size=len(prompts), session_len=512))
    gens = [GenerationConfig(max_new_tokens=max_tokens, top_k=1, response_format=f) for f in formats]
    box: dict = {}

    def run():
        try:
            box["out"] = pipe(prompts, gen_config=gens)
        except Exception as exc:  # noqa: BLE001 - reported by the caller's assertion
            box["exc"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    try:
        assert "exc" not in box, box.get("exc")
        return box.get("out")
    finally:
        if not worker.is_alive():
            pipe.close()
        deactivate()


def _valid(out, schema) -> bool:
    try:
        jsonschema.validate(json.loads(out.text), schema)
    except Exception:  # noqa: BLE001
        return False
    return True


SCHEMAS = [EVENT, PERSON, EVENT]
PROMPTS = ["An event as JSON.", "Give me a person as JSON.", "Another event, JSON please."]


def _off_and_on(model_dir, monkeypatch, env: str):
    """Greedy outputs and the proposer's stats with the switch ``env`` off, then on; the outputs
    equal token for token and every finished one valid."""
    from tokenrails.engine_patch.lmdeploy.speculative import draft_ahead

    runs = {}
    for mode in ("0", "1"):
        monkeypatch.setenv(env, mode)
        draft_ahead.STATS.reset()
        runs[mode] = (_generate(model_dir, PROMPTS, [_fmt(s) for s in SCHEMAS]), draft_ahead.STATS.as_dict())
    (off, off_stats), (on, on_stats) = runs["0"], runs["1"]
    assert off is not None and on is not None
    for a, b, schema in zip(off, on, SCHEMAS):
        assert list(a.token_ids) == list(b.token_ids), (a.text, b.text)
        if b.finish_reason == "stop":
            assert _valid(b, schema), b.text
    assert any(o.finish_reason == "stop" for o in on)
    return off_stats, on_stats


def test_guessed_runs_give_the_same_greedy_outputs_and_are_used(model_dir, monkeypatch):
    from tokenrails.engine_patch.lmdeploy.speculative import draft_ahead

    off_stats, on_stats = _off_and_on(model_dir, monkeypatch, draft_ahead.ENV_AHEAD)
    assert off_stats["guessed"] == 0 and off_stats["steps"] > 0
    assert on_stats["guessed"] > 0, on_stats  # the long key names were proposed from guesses
    assert on_stats["ahead_s"] > 0


def test_verification_masks_filled_beside_the_forward_give_the_same_greedy_outputs(model_dir, monkeypatch):
    """``TOKENRAILS_SPEC_PREFILL=1`` (the GPU default) on the CPU engine: the next verification's
    masks are filled on the worker right after the proposal and applied when they still fit; the
    greedy outputs are token for token those of the masks filled at verification, and most steps
    used the masks filled ahead."""
    from tokenrails.engine_patch.lmdeploy.speculative import draft_ahead

    off_stats, on_stats = _off_and_on(model_dir, monkeypatch, draft_ahead.ENV_PREFILL)
    assert off_stats["prefilled"] == 0 and off_stats["refilled"] == 0
    assert on_stats["prefilled"] > 2 * on_stats["refilled"], on_stats


def test_a_failing_proposal_fails_its_row_only(model_dir, monkeypatch):
    from tokenrails.guided.manager import GuidedDecodingManager

    original = GuidedDecodingManager.forced_tokens
    raised = []

    def forced_tokens(self, row, *args, **kwargs):
        if "event_identifier_code" in str(row.spec.payload):  # the EVENT row only
            raised.append(row.session_id)
            raise RuntimeError("proposer broke")
        return original(self, row, *args, **kwargs)

    monkeypatch.setattr(GuidedDecodingManager, "forced_tokens", forced_tokens)
    prompts = ["Give me a person as JSON.", "An event as JSON.", "Give me a person as JSON."]
    schemas = [PERSON, EVENT, PERSON]
    outs = _generate(model_dir, prompts, [_fmt(s) for s in schemas], timeout=180.0)
    assert outs is not None, "the engine stopped answering after one row's proposal failed"
    assert raised, "the EVENT row never reached the proposal (it failed for another reason)"
    assert len(set(raised)) == 1 and len(raised) == 1  # failed once, then never proposed again
    assert outs[1].finish_reason == "error", outs[1]
    for i in (0, 2):
        assert outs[i].finish_reason == "stop" and _valid(outs[i], PERSON), outs[i].text


def test_short_steps_stay_on_the_loop_and_others_hop_once_beside_the_mask(model_dir, monkeypatch):
    """A step's guided work hops to a worker thread only when it is long (more rows than the inline
    limit, here 2 of 3): then once for the masks and once for the accept with the next proposal."""
    import asyncio

    from tokenrails.engine_patch.lmdeploy.speculative import draft_ahead, spec_helper

    hops: list[str] = []
    real = asyncio.to_thread

    async def counting(func, *args, **kwargs):
        if ".speculative." in (getattr(func, "__module__", None) or ""):
            hops.append(getattr(func, "__qualname__", "?"))
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    monkeypatch.setattr(spec_helper, "INLINE_MAX_ROWS", 2, raising=False)
    draft_ahead.STATS.reset()
    prompts = ["An event as JSON.", "Give me a person as JSON.", "Another event, JSON please."]
    schemas = [EVENT, PERSON, EVENT]
    outs = _generate(model_dir, prompts, [_fmt(s) for s in schemas], max_tokens=32)
    steps = draft_ahead.STATS.steps
    assert outs is not None and steps > 0
    for out, schema in zip(outs, schemas):
        assert out.finish_reason in ("stop", "length"), out
        if out.finish_reason == "stop":
            assert _valid(out, schema), out.text
    assert hops, "no step of three guided rows hopped (the inline limit was not applied)"
    assert len(hops) <= 2 * steps, (len(hops), steps, collections.Counter(hops))
    assert len(hops) < 2 * steps, "steps with two or fewer rows hopped too"
