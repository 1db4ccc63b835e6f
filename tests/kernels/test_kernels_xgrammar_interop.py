"""Masks filled by xgrammar's GrammarMatcher, applied by us, equal xgrammar's own apply."""
from __future__ import annotations

import json
import string

import numpy as np
import pytest
import torch

xgr = pytest.importorskip("xgrammar")

from tokenrails.kernels import (  # noqa: E402
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    apply_token_bitmask_inplace_triton,
)

from .cases import DTYPES, bits_equal, make_logits  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "n": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["name", "n", "ok"],
}
DOCUMENT = '{"name": "ab c", "n": 42, "ok": true}'


def small_vocab() -> list:
    """Printable ASCII single characters plus a few merges, then an end token; 99 + 7 + 1 tokens."""
    chars = [c for c in string.printable if c not in "\x0b\x0c"]
    merges = ['{"', '":', ' "', "tr", "ue", "42", '"}']
    return chars + merges + ["</s>"]


def matcher_masks(info, compiled, token_ids: list, rows: int) -> torch.Tensor:
    """Walk ``token_ids`` through ``rows`` matchers started at staggered offsets; one mask per row."""
    bitmask = allocate_token_bitmask(rows, info.vocab_size)
    for row in range(rows):
        matcher = xgr.GrammarMatcher(compiled)
        for token in token_ids[: row * 3 % max(len(token_ids), 1)]:
            assert matcher.accept_token(token)
        matcher.fill_next_token_bitmask(bitmask, row)
    return bitmask


@pytest.fixture(scope="module")
def small_grammar():
    vocab = small_vocab()
    info = xgr.TokenizerInfo(vocab, vocab_size=len(vocab) + 5, stop_token_ids=[len(vocab) - 1])
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    index = {tok: i for i, tok in enumerate(vocab)}
    token_ids = [index[c] for c in DOCUMENT]
    return info, compiled, token_ids


@pytest.mark.parametrize("dtype", DTYPES)
def test_small_vocab_matches_xgrammar_apply(small_grammar, dtype):
    info, compiled, token_ids = small_grammar
    bitmask = matcher_masks(info, compiled, token_ids, rows=8)
    rng = np.random.default_rng(0)
    logits = make_logits(rng, 8, info.vocab_size, dtype)
    theirs, ours, triton_out = logits.clone(), logits.clone(), logits.clone()
    guided = [6, 1, 3, 4]
    xgr.apply_token_bitmask_inplace(theirs, bitmask, indices=guided, backend="cpu")
    apply_token_bitmask_inplace(ours, bitmask[guided], indices=guided)  # compact rows
    apply_token_bitmask_inplace_triton(triton_out, bitmask[guided], indices=guided)
    assert bits_equal(ours, theirs)
    assert bits_equal(triton_out, theirs)


def test_logits_wider_than_vocab(small_grammar):
    info, compiled, token_ids = small_grammar
    bitmask = matcher_masks(info, compiled, token_ids, rows=3)
    logits = make_logits(np.random.default_rng(1), 3, info.vocab_size + 64, torch.float32)
    theirs, ours = logits.clone(), logits.clone()
    xgr.apply_token_bitmask_inplace(theirs, bitmask, vocab_size=info.vocab_size, backend="cpu")
    apply_token_bitmask_inplace(ours, bitmask, vocab_size=info.vocab_size)
    vocab = info.vocab_size
    assert bits_equal(ours[:, :vocab], theirs[:, :vocab])
    assert bool(torch.isneginf(ours[:, vocab:]).all())  # xgrammar leaves these; we mask them


def test_real_tokenizer_masks(smollm2_tokenizer):
    info = xgr.TokenizerInfo.from_huggingface(smollm2_tokenizer)
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    token_ids = smollm2_tokenizer.encode(DOCUMENT, add_special_tokens=False)
    bitmask = matcher_masks(info, compiled, token_ids, rows=6)
    logits = make_logits(np.random.default_rng(2), 9, info.vocab_size, torch.bfloat16)
    guided = torch.tensor([8, 0, 2, 5, 7, 3], dtype=torch.int64)
    theirs, ours = logits.clone(), logits.clone()
    full = torch.full((9, bitmask.shape[1]), -1, dtype=torch.int32)
    full[guided] = bitmask  # xgrammar's indices pick the same row of logits and bitmask
    xgr.apply_token_bitmask_inplace(theirs, full, indices=guided.tolist(), backend="cpu")
    apply_token_bitmask_inplace(ours, bitmask, indices=guided)
    assert bits_equal(ours, theirs)
