"""The 0.x API's regex dialect reads a pattern as interegular (what outlines 0.0.x / 0.1.x parsed
regexes with) does: same language, checked on strings against interegular's own automaton.

The byte-level token comparison against outlines 0.0.46 / 0.1.14 themselves is
test_outlines_0x_class_token_sets.py (slow: it fetches them); this one needs only interegular,
a test dependency, and runs in the fast suite.
"""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

interegular = pytest.importorskip("interegular")

from tokenrails.compat.outlines import set_api_version  # noqa: E402
from tokenrails.compat.outlines.regex_dialect import outlines_dialect  # noqa: E402

PATTERNS = [r"\d", r"\w", r"\s", r"\D", r"\W", r"\S", r"\d{3}-\d{2}-\d{4}", r"[\d]", r"[\w-]+", r"[\s,]",
            r"[^\d]", r"[^\w\s]", r"[\D]", r"[\W]x", r"[\S]", r".", r"[^a]", r"(?i)\w+", r"(?i)[a-z\d]{2}",
            r"(?i)k", r"(?i)é[^b]", r"(?i)[ä-ö]", r"\S+@\S+", r"[^\D5]"]
# characters where ASCII and Unicode classes disagree, case partners, and plain ones
ALPHABET = "09a_kK-,.@ \t\n\x0b\x1c\x85\xa0\u2028\u0660\uff19é\u00c9\u212a\u017f\u03c3\u03a3\u00df\U0001fbf8x5b"


@pytest.fixture(autouse=True)
def zero_x_api():
    set_api_version("0.1.14")
    yield
    set_api_version(None)


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=ALPHABET, max_size=4))
def test_dialect_language_is_interegulars(pattern, text):
    fsm = _fsm(pattern)
    assert bool(re.fullmatch(outlines_dialect(pattern), text)) == fsm.accepts(text), (pattern, text)


_FSMS: dict = {}


def _fsm(pattern: str):
    if pattern not in _FSMS:
        _FSMS[pattern] = interegular.parse_pattern(pattern).to_fsm()
    return _FSMS[pattern]


def test_classes_are_ascii_and_fold_is_lower_upper():
    assert outlines_dialect(r"\d") == "[0-9]"
    assert re.fullmatch(outlines_dialect(r"\w+"), "ab_Z9") and not re.fullmatch(outlines_dialect(r"\w"), "é")
    assert not re.fullmatch(outlines_dialect(r"\s"), "\xa0") and re.fullmatch(outlines_dialect(r"\S"), "\xa0")
    assert not re.fullmatch(outlines_dialect("(?i)k"), "\u212a")  # interegular: no Unicode case folding
    assert re.fullmatch(outlines_dialect("(?i)\u212a"), "k")  # the Kelvin sign's lower() is k
