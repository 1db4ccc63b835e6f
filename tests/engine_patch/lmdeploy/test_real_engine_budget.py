"""``response_format["tokenrails_budget"] = "close"`` on LMDeploy 0.18's real PyTorch engine (CPU
path, embedded SmolLM2, greedy), one engine for the module.

With ``max_new_tokens`` below what the model's JSON needs, plain guided decoding returns a broken
prefix (``finish_reason`` "length"); with the budget key the output closes within the limit,
parses and validates (``jsonschema``); when the plain output fits, the tokens are the same. A
budget below the shortest output, or a constraint that is not a DFA, fails that request only.
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")
jsonschema = pytest.importorskip("jsonschema")

from ..budget_cases import PROMPT, SCHEMA  # noqa: E402

pytestmark = pytest.mark.slow

from .schemas import PERSON  # noqa: E402
PERSON_PROMPT = "Give me a person as JSON."


def _fmt(budget: bool) -> dict:
    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}}
    if budget:
        fmt["tokenrails_budget"] = "close"
    return fmt


def _gen(fmt, n):
    from lmdeploy import GenerationConfig
    return GenerationConfig(top_k=1, max_new_tokens=n, response_format=fmt)


def test_budget_closes_json_within_max_new_tokens(pipe, shortest):
    full = pipe([PROMPT], gen_config=[_gen(_fmt(True), 96)])[0]
    assert full.finish_reason == "stop", full
    jsonschema.validate(json.loads(full.text), SCHEMA)
    tight = len(full.token_ids) - 3
    assert tight >= shortest
    plain = pipe([PROMPT], gen_config=[_gen(_fmt(False), tight)])[0]
    assert plain.finish_reason == "length"  # a broken prefix without the budget
    for n in (shortest, tight):
        closed = pipe([PROMPT], gen_config=[_gen(_fmt(True), n)])[0]
        assert closed.finish_reason == "stop", (n, closed)
        jsonschema.validate(json.loads(closed.text), SCHEMA)
        assert len(closed.token_ids) <= n


def test_budget_refusals_fail_only_their_request(pipe, shortest):
    grammar = {"type": "grammar", "grammar": 'root ::= "a"', "tokenrails_budget": "close"}
    bad, small, ok = pipe([PROMPT, PROMPT, PROMPT], gen_config=[
        _gen(grammar, 8), _gen(_fmt(True), shortest - 1), _gen(_fmt(True), 96)])
    assert bad.finish_reason == "error" and bad.text == "", bad
    assert small.finish_reason == "error" and small.text == "", small
    assert ok.finish_reason == "stop"
    jsonschema.validate(json.loads(ok.text), SCHEMA)


def test_response_reports_budget_closed(pipe, shortest):
    """``Response.budget_closed``: true exactly when the rule removed a token the grammar allowed;
    absent on a request that did not ask for the rule."""
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import parse_format

    person = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    fsm_only = parse_format(person)[0].with_routing("fsm", fallback=False)  # the budget's backend, no budget
    fits, tight, plain = pipe([PERSON_PROMPT, PROMPT, PERSON_PROMPT], gen_config=[
        _gen({**person, "tokenrails_budget": "close"}, 64), _gen(_fmt(True), shortest + 2), _gen(fsm_only, 64)])
    assert plain.finish_reason == "stop", plain  # the plain output fits in 64 tokens
    assert fits.finish_reason == "stop" and fits.budget_closed is False, fits
    assert fits.token_ids == plain.token_ids  # identity: the rule never touched a fitting output
    assert getattr(plain, "budget_closed", None) is None
    assert tight.finish_reason == "stop" and tight.budget_closed is True, tight
    jsonschema.validate(json.loads(tight.text), SCHEMA)


def test_too_small_is_refused_before_generation_with_the_count(pipe, shortest):
    small, ok = pipe([PROMPT, PROMPT], gen_config=[_gen(_fmt(True), shortest - 1), _gen(_fmt(True), 96)])
    assert small.finish_reason == "error" and small.generate_token_len == 0 and small.text == "", small
    assert f"max_tokens={shortest - 1} is too small" in small.error_message, small.error_message
    assert f"needs {shortest} tokens" in small.error_message, small.error_message
    assert ok.finish_reason == "stop"


def test_thinking_counts_against_the_budget(pipe, tokenizer, shortest):
    """Thinking tokens spend the same budget: the end marker is forced while the answer still
    fits, and the answer after it validates."""
    fmt = {**_fmt(True), "tokenrails_reasoning": "<think>,</think>"}
    n = shortest + 12
    out = pipe([PROMPT], gen_config=[_gen(fmt, n)])[0]
    assert out.finish_reason == "stop", out
    assert len(out.token_ids) <= n
    text = tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert "</think>" in text, text
    jsonschema.validate(json.loads(text.split("</think>", 1)[1]), SCHEMA)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model_dir)
