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


def _fmt(budget: bool) -> dict:
    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}}
    if budget:
        fmt["tokenrails_budget"] = "close"
    return fmt


def _gen(fmt, n):
    from lmdeploy import GenerationConfig
    return GenerationConfig(top_k=1, max_new_tokens=n, response_format=fmt)


@pytest.fixture(scope="module")
def shortest(model_dir):
    """Tokens (EOS included) of the shortest output of the schema, from the core's table."""
    from transformers import AutoTokenizer

    from tokenrails import Vocabulary
    from tokenrails.engine_patch.lmdeploy.requests import parse_format
    from tokenrails.guided.budget import budget_table
    from tokenrails.guided.manager import GuidedDecodingManager

    mgr = GuidedDecodingManager(Vocabulary.from_huggingface(AutoTokenizer.from_pretrained(model_dir)))
    try:
        return budget_table(mgr.get_compiled(parse_format(_fmt(True))[0])).start
    finally:
        mgr.close()


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
