"""End to end on the embedded SmolLM2-135M (CPU, float32, one thread), greedy unless stated.

A mixed batch (JSON schema, regex, choice, unguided) through both ``model.generate`` +
``GuidedLogitsProcessor`` and our decode loop: guided rows complete and validate with
independent oracles; the unguided row is token-for-token what plain generation produces.
"""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
from transformers import LogitsProcessorList

from tokenrails import GuideSpec
from tokenrails.engine_patch.transformers import (
    GuidedLogitsProcessor,
    encode_prompts,
    generate_guided,
    logits_width,
)

pytestmark = pytest.mark.slow

# the demo's extraction schema: long fixed keys, an enum and bounded values
from tokenrails.cli import DEMO_SCHEMA as SCHEMA  # noqa: E402
PROMPTS = [
    "Extract the customer record as JSON: Maria Lopez, 34 years old, her account is active.",
    "What is the date of the first Moon landing? Answer in ISO format.",
    "Review: 'The battery died after two days and support never answered.' Sentiment?",
    "Write one sentence about the sea.",
]
DATE = r"\d{4}-\d{2}-\d{2}"
CHOICES = ["positive", "negative", "neutral"]
MAX_NEW = 32


def _specs():
    return [GuideSpec.json_schema(SCHEMA, any_whitespace=False), GuideSpec.regex(DATE), GuideSpec.choice(CHOICES), None]


def _check_guided_texts(texts):
    jsonschema.validate(json.loads(texts[0]), SCHEMA)
    assert re.fullmatch(DATE, texts[1]), texts[1]
    assert texts[2] in CHOICES


@pytest.fixture(scope="module")
def plain_unguided(smollm2):
    """Greedy plain generation of the unguided prompt alone: the reference for row 3."""
    ids = encode_prompts(smollm2.tokenizer, [PROMPTS[3]], chat=True)[0]
    out = smollm2.model.generate(
        input_ids=torch.tensor([ids]), attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
        max_new_tokens=MAX_NEW, do_sample=False,
    )
    new = out[0, len(ids):].tolist()
    eos = smollm2.tokenizer.eos_token_id
    return new[: new.index(eos)] if eos in new else new


def test_generate_with_processor_mixed_batch(smollm2, plain_unguided):
    model, tok = smollm2.model, smollm2.tokenizer
    enc = encode_prompts(tok, PROMPTS, chat=True)
    width = max(map(len, enc))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(e)) + e for e in enc])
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc])
    proc = GuidedLogitsProcessor(_specs(), tok, vocab_size=logits_width(model))
    out = model.generate(
        input_ids=ids, attention_mask=mask, logits_processor=LogitsProcessorList([proc]),
        max_new_tokens=MAX_NEW, do_sample=False,
    )
    reports = proc.finalize(out)
    texts = [tok.decode(proc.generated_ids(out[i]), clean_up_tokenization_spaces=False) for i in range(4)]
    assert [r.status for r in reports] == ["complete", "complete", "complete", "unguided"], (reports, texts)
    assert all(r.valid for r in reports[:3]), reports
    _check_guided_texts(texts)
    assert proc.generated_ids(out[3]) == plain_unguided
    assert proc.calls == out.shape[1] - width - 1 or proc.calls == out.shape[1] - width
    assert 0 < proc.time_s


def test_decode_loop_mixed_batch(smollm2, plain_unguided):
    rep = generate_guided(smollm2.model, smollm2.tokenizer, PROMPTS, _specs(), max_new_tokens=MAX_NEW, chat=True)
    res = rep.results
    assert [r.finish_reason for r in res[:3]] == ["stop"] * 3, res
    assert all(r.valid is True for r in res[:3]), res
    _check_guided_texts([r.text for r in res])
    assert res[3].valid is None and res[3].token_ids == plain_unguided
    assert res[0].grammar_per_token_s > 0 and res[0].compile_s > 0
    assert rep.forward_passes >= 2 and rep.new_tokens == sum(len(r.token_ids) for r in res)


LONG_KEYS = {
    "type": "object",
    "properties": {
        "customer_identification_number": {"type": "integer", "minimum": 0, "maximum": 99999},
        "preferred_contact_channel": {"enum": ["electronic_mail_message", "telephone_call_in_office_hours"]},
        "subscription_renewal_status": {"enum": ["renewed_automatically", "cancelled_by_customer"]},
    },
    "required": ["customer_identification_number", "preferred_contact_channel", "subscription_renewal_status"],
    "additionalProperties": False,
}


def test_jump_forward_saves_forward_passes_and_both_validate(smollm2):
    prompt = ["Customer 4521 wants phone calls and cancelled the subscription. Give the record as JSON."]
    spec = [GuideSpec.json_schema(LONG_KEYS, any_whitespace=False)]
    runs = {
        jf: generate_guided(smollm2.model, smollm2.tokenizer, prompt, spec, max_new_tokens=96,
                            chat=True, jump_forward=jf).results[0]
        for jf in (True, False)
    }
    for jf, r in runs.items():
        assert r.finish_reason == "stop" and r.valid is True, (jf, r)
        jsonschema.validate(json.loads(r.text), LONG_KEYS)
    on, off = runs[True], runs[False]
    assert off.forced_tokens == 0
    assert on.forced_tokens > 0
    assert on.forward_passes <= 0.7 * off.forward_passes, (on.forward_passes, off.forward_passes)


def test_seeded_sampling_is_reproducible_and_valid(smollm2):
    kwargs = dict(max_new_tokens=MAX_NEW, chat=True, do_sample=True, temperature=0.9, top_p=0.95, seed=11)
    specs = _specs()[:3]
    a = generate_guided(smollm2.model, smollm2.tokenizer, PROMPTS[:3], specs, **kwargs).results
    b = generate_guided(smollm2.model, smollm2.tokenizer, PROMPTS[:3], specs, **kwargs).results
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    for r in a:
        assert r.finish_reason in ("stop", "length")
        assert r.valid is (r.finish_reason == "stop"), r  # "length" is never reported valid


def test_failed_spec_row_errors_alone(smollm2):
    specs = [GuideSpec.regex("(unclosed"), GuideSpec.choice(CHOICES)]
    res = generate_guided(smollm2.model, smollm2.tokenizer, PROMPTS[1:3], specs, max_new_tokens=8, chat=True).results
    assert res[0].finish_reason == "error" and res[0].valid is False and res[0].token_ids == []
    assert res[0].error_type == "InvalidGuideError" and "(unclosed" in res[0].error
    assert res[1].finish_reason == "stop" and res[1].text in CHOICES


def test_length_cut_is_never_valid(smollm2):
    res = generate_guided(smollm2.model, smollm2.tokenizer, PROMPTS[:1], _specs()[:1], max_new_tokens=4, chat=True).results[0]
    assert res.finish_reason == "length" and res.valid is False and len(res.token_ids) == 4


def test_embedded_tokenizer_matches_reference(smollm2, smollm2_tokenizer):
    """The GGUF tokenizer fix: same vocabulary, same ids, EOS <|im_end|>=2, same chat template."""
    tok = smollm2.tokenizer
    assert tok.get_vocab() == smollm2_tokenizer.get_vocab()
    assert tok.eos_token_id == 2 == smollm2_tokenizer.eos_token_id
    for text in ['{"a": [1, 2.5e-3]}', "  héllo\n\tworld 漢字 <|im_end|>"]:
        assert tok.encode(text) == smollm2_tokenizer.encode(text)
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        smollm2_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def test_model_cache_is_reused(smollm2):
    from tokenrails.demo_model import ModelNotFoundError, resolve_model_dir

    path, source, converted = resolve_model_dir(None, quiet=True)
    assert not converted and str(path) == smollm2.path and source.endswith(".gguf")
    assert (path / "model.safetensors").is_file()
    with pytest.raises(ModelNotFoundError):
        resolve_model_dir("/nonexistent/model.bin", quiet=True)
