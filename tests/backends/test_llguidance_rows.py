"""Issue 27.3: objects with many optional properties on llguidance.

llguidance's parser rows grow ~4 items per optional property; at its default row bound (2,000)
a schema of more than ~500 optional properties compiled, gave a first mask allowing ``{``, and
accepting ``{`` then failed ("max is 2000"): ``TokenRejectedError``, HTTP 500, after the request
was accepted. The row bound now follows ``GuideLimits.max_object_properties`` (what the limits
admit, llguidance can parse), and objects that grow past it by merging ``allOf`` parts are refused
at compile time. Failed on the code before the fix (600 and 2,000 properties).
"""
from __future__ import annotations

import json

import jsonschema
import pytest

import tokenrails as tr
from tokenrails.guided.errors import GuideLimitError
from tokenrails.kernels import allocate_token_bitmask
from tokenrails.kernels.reference import unpack_bitmask


def optional_props(n: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


def walk(guide, vocab, tokenizer, text: str) -> None:
    """Feed ``text``'s tokens, each checked against the mask before it is accepted."""
    matcher = guide.matcher()
    row = allocate_token_bitmask(1, vocab.vocab_size)
    for tid in tokenizer.encode(text, add_special_tokens=False):
        matcher.fill_next_token_bitmask(row, 0)
        assert unpack_bitmask(row, vocab.vocab_size, vocab.vocab_size)[0, tid], f"token {tid} masked in {text!r}"
        assert matcher.accept_token(tid), f"token {tid} rejected in {text!r}"
    matcher.fill_next_token_bitmask(row, 0)
    assert any(unpack_bitmask(row, vocab.vocab_size, vocab.vocab_size)[0, e] for e in vocab.eos_ids)


@pytest.mark.parametrize("backend", ["llguidance", "auto"])
@pytest.mark.parametrize("n", [600, 2000])
def test_many_optional_properties_are_generated_not_refused_midway(vocab, smollm2_tokenizer, backend, n):
    schema = optional_props(n)
    guide = tr.compile_guide(tr.GuideSpec.json_schema(schema), vocab, backend)
    text = json.dumps({f"p{n // 2}": 1, f"p{n - 1}": 2})
    jsonschema.validate(json.loads(text), schema)
    walk(guide, vocab, smollm2_tokenizer, text)


def test_objects_merged_past_the_limit_are_refused_at_compile(vocab):
    limits = tr.GuideLimits(max_object_properties=300)
    parts = [{"properties": {f"a{i}_{k}": {"type": "integer"} for i in range(200)}} for k in range(2)]
    spec = tr.GuideSpec.json_schema({"type": "object", "allOf": parts})
    with pytest.raises(GuideLimitError) as info:
        tr.compile_guide(spec, vocab, "llguidance", limits=limits)
    assert info.value.limit == "max_object_properties"
