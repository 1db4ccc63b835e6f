"""A string's ``pattern`` with ``minLength``/``maxLength`` inside a tool schema: folded into one
pattern xgrammar enforces (``guided/pattern_lengths.py``), served where it was a 400, and every
string the folded pattern admits satisfies the original keywords (jsonschema, Python ``re``)."""
from __future__ import annotations

import random

import jsonschema
import pytest
import xgrammar as xgr
from pydantic import BaseModel, Field

from tokenrails import GuideSpec, UnsupportedGuideError, compile_guide
from tokenrails.guided.pattern_lengths import bounded_pattern, fold_lengths
from tokenrails.testing import walk

from .helpers import decode_text
from .test_tool_string_lengths import _begins, _calls, _drive

CASES = [  # (pattern, minLength, maxLength): what pydantic's Field(pattern=..., min/max_length=...) writes
    (r"^[a-z0-9_]+$", 3, 16),
    (r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$", 0, 64),
    (r"^\d{3}-\d+$", 6, 9),
    (r"^[A-Z][a-z]*( [A-Z][a-z]*)?$", 0, 12),  # a variable group: not a chain, stays None
    (r"^(ab|cd)x+$", 4, 5),
    (r"^a+b*c?$", 2, 4),
]


@pytest.mark.parametrize("pattern,lo,hi", CASES)
def test_every_string_of_the_folded_pattern_keeps_the_original_keywords(vocab, pattern, lo, hi):
    folded = bounded_pattern(pattern, lo, hi)
    if pattern.startswith("^[A-Z][a-z]*("):
        assert folded is None
        return
    assert folded is not None
    schema = {"type": "string", "pattern": pattern, "minLength": lo, "maxLength": hi}
    guide = compile_guide(GuideSpec.regex(folded[1:-1]), vocab, backend="fsm")
    rng = random.Random(0)
    texts = [walk(guide, vocab, lambda ids: decode_text(vocab, ids), rng, adversarial=(i % 4 == 0), max_tokens=80)
             for i in range(40)]
    texts = [t for t in texts if t is not None]
    assert texts
    for text in texts:
        jsonschema.validate(text, schema)


def test_impossible_or_unanchored_bounds_are_not_folded():
    assert bounded_pattern(r"^[a-z]{5}$", 0, 3) is None  # no string fits
    assert bounded_pattern(r"[a-z]+", 1, 3) is None  # unanchored: search semantics, left alone
    assert bounded_pattern(r"^a{2,3}b$", 6, 9) is None  # too short for minLength
    assert fold_lengths({"type": "string", "pattern": "^a+$", "maxLength": 3}) == {"type": "string", "pattern": "^[a]{1,3}$"}


class CreateUser(BaseModel):
    username: str = Field(min_length=3, max_length=16, pattern=r"^[a-z0-9_]+$")
    email: str = Field(max_length=64, pattern=r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$")


@pytest.mark.parametrize("fmt,choice", [("llama", "required"), ("qwen_3", {"type": "function",
                                                                             "function": {"name": "create_user"}})])
def test_tool_with_pattern_and_lengths_is_served_and_validates(vocab, fmt, choice):
    """Refused on the previous commit ("a string with both pattern and min/maxLength")."""
    schema = CreateUser.model_json_schema()
    tools = [{"type": "function", "function": {"name": "create_user", "parameters": schema}}]
    tag = xgr.get_model_structural_tag(fmt, tools, tool_choice=choice, reasoning=False).model_dump(mode="json")
    guide = compile_guide(GuideSpec.structural_tag(tag), vocab, backend="auto")
    calls = []
    for seed in range(3):
        calls += _calls(*_drive(guide.matcher(), vocab, seed, []), _begins(tag))
    assert calls
    for args in calls:
        jsonschema.validate(args, schema)


def test_a_pattern_the_fold_cannot_read_stays_refused(vocab):
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3,
                                                     "pattern": "^[A-Z][a-z]*( [A-Z][a-z]*)?$"}}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    tag = xgr.get_model_structural_tag("llama", tools, tool_choice="required").model_dump(mode="json")
    with pytest.raises(UnsupportedGuideError):
        compile_guide(GuideSpec.structural_tag(tag), vocab, backend="auto")
