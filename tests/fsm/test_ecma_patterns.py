"""Schema ``pattern`` shorthand classes mean what ECMA-262 says, on every backend.

Before: ``^\\d+$`` accepted "٣" (Arabic-Indic three) on fsm; ``\\S`` accepted U+FEFF on llguidance
and U+00A0 on xgrammar; ``\\s`` accepted U+0085 on llguidance. The truth table below is ECMA-262's
definition (``\\d`` = [0-9], ``\\w`` = [A-Za-z0-9_], ``\\s`` = WhiteSpace and LineTerminator), written
out by hand. The fsm backend may refuse a class that admits a quote or a control character
(outlines inserts patterns into JSON strings unescaped), and xgrammar a positive one (it admits
them raw): a typed refusal, never a wrong accept.
"""
from __future__ import annotations

import json

import pytest

import tokenrails as tr
from tokenrails.guided.errors import UnsupportedGuideError
from tokenrails.guided.ecma_patterns import ecma_shorthands

ECMA_SPACE = set("\t\n\x0b\x0c\r \u00a0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff") | {chr(c) for c in range(0x2000, 0x200B)}
SAMPLES = ["0", "9", "a", "Z", "_", "-", "٣", "߀", "é", "ß", "Ж", " ", "\t", "\u00a0", "\u2003", "\ufeff", "\x1c", "\u0085"]
ECMA = {
    r"\d": lambda c: c in "0123456789",
    r"\w": lambda c: c.isascii() and (c.isalnum() or c == "_"),
    r"\s": lambda c: c in ECMA_SPACE,
}


def accepts(guide, tokenizer, vocab, value: str) -> bool:
    matcher = guide.matcher()
    text = json.dumps(value, ensure_ascii=False)
    return all(matcher.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False)) and \
        matcher.accept_token(vocab.eos_ids[0])


@pytest.mark.parametrize("backend", ["fsm", "llguidance", "xgrammar", "auto"])
@pytest.mark.parametrize("shorthand", sorted(ECMA))
@pytest.mark.parametrize("negated", [False, True])
def test_shorthand_classes_are_ecmas(smollm2_tokenizer, vocab, backend, shorthand, negated):
    token = shorthand.upper() if negated else shorthand
    for pattern in (f"^{token}$", f"^[{shorthand}]$" if not negated else f"^[^{shorthand}]$"):
        try:
            guide = tr.compile_guide(tr.GuideSpec.json_schema({"type": "string", "pattern": pattern}), vocab, backend)
        except UnsupportedGuideError:
            if backend == "fsm" and (negated or shorthand == r"\s"):
                continue  # the class holds '"', '\\' or control characters: refused, as documented
            if backend == "xgrammar" and not negated and shorthand == r"\s":
                continue  # ECMA's \s names \t \n \r, which xgrammar would put in the JSON string raw
            raise
        for c in SAMPLES:
            if c in ('"', "\\") or (ord(c) < 0x20):
                continue  # not a raw JSON string character
            expected = ECMA[shorthand](c) != negated
            assert accepts(guide, smollm2_tokenizer, vocab, c) == expected, (backend, pattern, c)


def test_rewrite_keeps_everything_else():
    assert ecma_shorthands(r"^\d{3}-\w+$") == r"^[0-9]{3}-[A-Za-z0-9_]+$"
    assert ecma_shorthands(r"[\d.]") == r"[0-9.]"
    assert ecma_shorthands(r"\\d\.\[") == r"\\d\.\["  # escaped backslash, escaped dot and bracket
    spelled = ecma_shorthands(r"[\s\S]")  # a negated shorthand in a class: its complement spelled out
    assert spelled.startswith("[") and "\\u0000-" in spelled and "\\U0010ffff" in spelled
    assert ecma_shorthands(r"\D") == "[^0-9]"  # outside a class it stays a negated class
