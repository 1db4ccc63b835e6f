"""outlines' regex dialect in the shim: ``\\d`` ``\\w`` ``\\s`` are ASCII (outlines-core's reading,
Python's ``re.ASCII``), POSIX classes inside brackets and a leading ``(?i)`` are understood —
where tokenrails' own regex kind reads Python's Unicode classes. Oracle: Python ``re`` with
``re.ASCII`` (and the POSIX classes spelled out by hand)."""
from __future__ import annotations

import re

import pytest

from tokenrails.compat.outlines.fsm.guide import RegexGuide
from tokenrails.compat.outlines.fsm.states import FINAL

CASES = [
    (r"\d+", ["123", "٣٤", "1٣"]),
    (r"\w+-\s?\w", ["ab-c", "ab- c", "é-x", "a-\u00a0b"]),
    (r"(?i)yes|no", ["YES", "yEs", "No", "nö"]),
    (r"(?i)[a-c]x", ["Bx", "bX", "dx"]),
]
POSIX = [
    (r"[[:alpha:]]+[[:digit:]]", r"[A-Za-z]+[0-9]", ["abc1", "ab٣", "é1"]),
    (r"[[:xdigit:][:space:]]+", r"[0-9A-Fa-f \t\n\r\f\v]+", ["af 09", "g1"]),
]


def _accepts(guide, tok, text: str) -> bool:
    state = guide.initial_state
    for t in tok.encode(text, add_special_tokens=False):
        state = guide.get_next_state(state, t)
        if state == FINAL:
            return False
    return guide.is_final_state(state) or guide.can_terminate_state(state)


@pytest.mark.parametrize("pattern,texts", CASES)
def test_shorthands_and_case_folding_read_like_outlines(pattern, texts, smollm2_tokenizer):
    guide = RegexGuide.from_regex(pattern, smollm2_tokenizer)
    for text in texts:
        assert _accepts(guide, smollm2_tokenizer, text) == bool(re.fullmatch(pattern, text, re.ASCII)), text


@pytest.mark.parametrize("pattern,spelled,texts", POSIX)
def test_posix_classes(pattern, spelled, texts, smollm2_tokenizer):
    guide = RegexGuide.from_regex(pattern, smollm2_tokenizer)
    for text in texts:
        assert _accepts(guide, smollm2_tokenizer, text) == bool(re.fullmatch(spelled, text)), text
