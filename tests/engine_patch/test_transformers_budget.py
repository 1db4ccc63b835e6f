"""``budget="close"`` in the transformers adapter, on the embedded SmolLM2-135M (CPU, one thread).

With ``max_new_tokens`` below what the model's output needs, plain guided decoding stops with a
broken prefix; with the budget the output closes in time and validates (``jsonschema``). When the plain output fits, the budget
changes nothing: the same tokens, greedy and seeded sampling.
"""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from transformers import LogitsProcessorList

from tokenrails import GuideSpec
from tokenrails.engine_patch.transformers import GuidedLogitsProcessor, encode_prompts, generate_guided
from tokenrails.guided.budget import budget_spec, budget_table
from tokenrails.guided.manager import GuidedDecodingManager

from .budget_cases import PROMPT as PROMPT_TEXT, SCHEMA

pytestmark = pytest.mark.slow

PROMPT = [PROMPT_TEXT]
DATE_PROMPT = ["What is the date of the first Moon landing? Answer in ISO format."]
DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"  # (\\d would admit other scripts' digits: multi-token paths)


def _fsm(spec: GuideSpec) -> GuideSpec:
    """Plain guided decoding on the backend the budget rule uses (the same language)."""
    return spec.with_routing("fsm", fallback=False)


def _shortest(smollm2, spec) -> int:
    from tokenrails.engine_patch.transformers import logits_width, manager_for, vocabulary_for

    mgr = manager_for(vocabulary_for(smollm2.tokenizer, logits_width(smollm2.model)), "auto", None)
    return budget_table(mgr.get_compiled(budget_spec(spec))).start


def test_identity_when_the_plain_output_fits(smollm2):
    spec = GuideSpec.regex(DATE)
    for kwargs in ({}, {"do_sample": True, "temperature": 1.3, "seed": 5}):
        plain = generate_guided(smollm2.model, smollm2.tokenizer, DATE_PROMPT, [_fsm(spec)], max_new_tokens=24,
                                chat=True, **kwargs).results[0]
        assert plain.finish_reason == "stop"
        budget = len(plain.token_ids) + 1  # exactly enough for the plain output and its EOS
        closed = generate_guided(smollm2.model, smollm2.tokenizer, DATE_PROMPT, [spec], max_new_tokens=budget,
                                 chat=True, budget="close", **kwargs).results[0]
        assert closed.token_ids == plain.token_ids and closed.finish_reason == "stop"
        assert closed.budget_closed is False and closed.valid


def test_the_budget_closes_what_plain_decoding_leaves_broken(smollm2):
    spec = GuideSpec.json_schema(SCHEMA, any_whitespace=False)
    full = generate_guided(smollm2.model, smollm2.tokenizer, PROMPT, [_fsm(spec)], max_new_tokens=64,
                           chat=True).results[0]
    assert full.finish_reason == "stop"
    shortest = _shortest(smollm2, spec)
    length = len(full.token_ids) + 1  # tokens the plain output needs, EOS included
    assert shortest < length - 3
    tight = length - 3
    plain = generate_guided(smollm2.model, smollm2.tokenizer, PROMPT, [_fsm(spec)], max_new_tokens=tight,
                            chat=True).results[0]
    assert plain.finish_reason == "length" and plain.valid is False  # a broken prefix
    for n in sorted({shortest, shortest + 2, tight, length - 1}):
        res = generate_guided(smollm2.model, smollm2.tokenizer, PROMPT, [spec], max_new_tokens=n, chat=True,
                              budget="close").results[0]
        assert res.finish_reason == "stop" and res.valid, (n, res)
        assert len(res.token_ids) + 1 <= n
        jsonschema.validate(json.loads(res.text), SCHEMA)
        assert res.budget_closed is True
    refused = generate_guided(smollm2.model, smollm2.tokenizer, PROMPT, [spec], max_new_tokens=shortest - 1,
                              chat=True, budget="close").results[0]
    assert refused.finish_reason == "error" and refused.error_type == "GuideLimitError"
    assert f"needs {shortest} tokens" in refused.error and refused.token_ids == []


def test_logits_processor_closes_within_max_new_tokens(smollm2):
    spec = GuideSpec.json_schema(SCHEMA, any_whitespace=False)
    ids = encode_prompts(smollm2.tokenizer, PROMPT, chat=True)[0]
    n = _shortest(smollm2, spec) + 6
    proc = GuidedLogitsProcessor([spec], smollm2.tokenizer, vocab_size=smollm2.model.config.vocab_size,
                                 budget="close", max_new_tokens=n)
    out = smollm2.model.generate(
        input_ids=torch.tensor([ids]), attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
        max_new_tokens=n, do_sample=False, logits_processor=LogitsProcessorList([proc]),
    )
    report = proc.finalize(out)[0]
    assert report.status == "complete" and report.valid, report
    assert report.budget_closed is True
    text = smollm2.tokenizer.decode(proc.generated_ids(out[0]), skip_special_tokens=False)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_budget_needs_max_new_tokens_and_a_dfa_constraint(smollm2):
    with pytest.raises(ValueError, match="max_new_tokens"):
        GuidedLogitsProcessor([GuideSpec.regex("a+")], smollm2.tokenizer, budget="close")
    from tokenrails.guided.errors import UnsupportedGuideError

    with pytest.raises(UnsupportedGuideError, match="budget"):
        generate_guided(smollm2.model, smollm2.tokenizer, DATE_PROMPT, [GuideSpec.grammar('root ::= "a"')],
                        max_new_tokens=4, budget="close")
