"""xgrammar's native batch fill (serial and threaded matcher) equals per-row fills bit for bit."""
from __future__ import annotations

import json
import os
import random

import pytest
import torch

from tokenrails import GuideSpec, allocate_token_bitmask, compile_guide
from tokenrails.guided.backends import xgrammar_backend
from tokenrails.guided.backends.xgrammar_backend import XGrammarMatcher

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "n", "tags"]}
DOC = json.dumps({"name": "Ada L.", "n": 36, "tags": ["x", "yz"]}, separators=(", ", ": "))


def _matchers(vocab, tokenizer, count: int, seed: int) -> list[XGrammarMatcher]:
    """Matchers spread over the positions of one valid output, some terminated."""
    guide = compile_guide(GuideSpec.json_schema(SCHEMA, any_whitespace=False), vocab, backend="xgrammar")
    ids = tokenizer.encode(DOC, add_special_tokens=False) + [vocab.eos_ids[0]]
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        m = guide.matcher()
        for t in ids[: rng.randint(0, len(ids))]:
            assert m.accept_token(t)
        out.append(m)
    assert any(m.is_terminated() for m in out) and not all(m.is_terminated() for m in out)
    return out


@pytest.mark.parametrize("count,threads", [(9, 1), (70, 1), (70, 2), (70, 4)])
def test_batch_fill_equals_row_fill(vocab, smollm2_tokenizer, count, threads):
    matchers = _matchers(vocab, smollm2_tokenizer, count, seed=count + threads + 1)
    rows = list(range(count))[::-1]  # scattered: row i of the group goes to bitmask row count-1-i
    batch = allocate_token_bitmask(count, vocab.vocab_size)
    batch.fill_(0x5A5A5A5A)  # stale contents must be overwritten
    XGrammarMatcher.batch_fill(matchers, batch, rows, threads)
    single = allocate_token_bitmask(count, vocab.vocab_size)
    for m, r in zip(matchers, rows):
        m.fill_next_token_bitmask(single, r)
    assert torch.equal(batch, single)


def test_one_batch_matcher_per_thread_count():
    assert xgrammar_backend._BATCH.get(1) is xgrammar_backend._BATCH.get(1)
    if (os.cpu_count() or 1) > 1:  # thread counts are clamped to the CPUs
        assert xgrammar_backend._BATCH.get(2) is not xgrammar_backend._BATCH.get(1)
