"""Tool schemas with string ``minLength``/``maxLength`` (pydantic's ``Field(max_length=..)``,
``constr``) inside xgrammar structural tags: compiled, and every call's arguments validate.

xgrammar 0.2.8 lowers such a string to a counted repeat of ``[^"\\\\\\r\\n]`` (raw control
characters admitted: invalid JSON); the backend narrows that one rule to raw JSON characters.
Oracles: jsonschema on the arguments a hostile sampler produces, and the matcher's acceptance of
hand-written calls.
"""
from __future__ import annotations

import json
from typing import Annotated, Optional

import jsonschema
import pytest
import torch
import xgrammar as xgr
from pydantic import BaseModel, Field, StringConstraints, constr

from tokenrails import (
    GuideSpec,
    UnsupportedGuideError,
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    compile_guide,
)

from .helpers import decode_text


class Address(BaseModel):
    street: str = Field(min_length=3, max_length=20)
    zip_code: constr(min_length=5, max_length=5)


class CreateUser(BaseModel):
    name: str = Field(min_length=2, max_length=12)
    bio: Optional[str] = Field(default=None, max_length=8)
    tags: list[Annotated[str, StringConstraints(min_length=1, max_length=4)]] = Field(max_length=2)
    address: Address


SCHEMA = CreateUser.model_json_schema()
TOOLS = [{"type": "function", "function": {"name": "create_user", "parameters": SCHEMA}}]
FORMATS = ["llama", "qwen_3", "kimi", "harmony", "deepseek_r1"]  # JSON-argument formats LMDeploy's parsers use
NAMED = {"type": "function", "function": {"name": "create_user"}}


def _tag(fmt: str, choice) -> dict:
    return xgr.get_model_structural_tag(fmt, TOOLS, tool_choice=choice, reasoning=False).model_dump(mode="json")


def _begins(tag) -> list[str]:
    """The literal text right before the tool's JSON schema: a tag's begin, or the constant
    before it in a sequence (kimi's ``<|tool_call_argument_begin|>``)."""
    out, stack = [], [tag]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            content = node.get("content")
            if isinstance(content, dict) and content.get("type") == "json_schema":
                out.append(node["begin"])
            elements = node.get("elements") if node.get("type") == "sequence" else None
            for before, here in zip(elements or [], (elements or [])[1:]):
                if before.get("type") == "const_string" and here.get("type") == "json_schema":
                    out.append(before["value"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


def _calls(text: str, ended: bool, begins: list[str]) -> list:
    """Every arguments object written after a begin string (as the tool parsers read them); one
    cut off by the step budget (no EOS yet) is skipped."""
    found = []
    for begin in begins:
        start = text.find(begin)
        while start != -1:
            try:
                value, _ = json.JSONDecoder().raw_decode(text[start + len(begin):])
                found.append(value)
            except json.JSONDecodeError:
                assert not ended, f"a finished output holds broken JSON: {text[start:start + 200]!r}"
            start = text.find(begin, start + 1)
    return found


def _triggers(tag) -> list[str]:
    out, stack = [], [tag]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            out += node.get("triggers", []) if node.get("type") == "triggered_tags" else []
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


def _hostile_bias(vocab) -> torch.Tensor:
    """Favour what breaks JSON strings: backslashes, quotes, control bytes; and long tokens."""
    bias = torch.zeros(vocab.vocab_size)
    for i, raw in enumerate(vocab.token_bytes[: vocab.vocab_size]):
        if not raw or not raw.strip():  # whitespace between JSON tokens never ends: not favoured
            bias[i] = -3.0
        elif b"\\" in raw or b'"' in raw or any(b < 0x20 for b in raw):
            bias[i] = 3.0 + 0.1 * min(len(raw), 10)
    return bias


def _drive(matcher, vocab, seed: int, prefix_ids: list[int], steps: int = 400) -> tuple[str, bool]:
    for t in prefix_ids:
        assert matcher.accept_token(t)
    gen = torch.Generator().manual_seed(seed)
    bias = _hostile_bias(vocab)
    bitmask = allocate_token_bitmask(1, vocab.vocab_size)
    out = list(prefix_ids)
    for _ in range(steps):
        logits = (torch.randn(vocab.vocab_size, generator=gen) + bias).unsqueeze(0)
        matcher.fill_next_token_bitmask(bitmask, 0)
        apply_token_bitmask_inplace(logits, bitmask)
        assert torch.isfinite(logits).any(), "grammar left no token allowed"
        tok = int(logits[0].argmax())
        assert matcher.accept_token(tok)
        if tok in vocab.eos_ids:
            return decode_text(vocab, out), True
        out.append(tok)
    return decode_text(vocab, out), False


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("choice", ["required", "named", "auto"])
def test_length_bounded_tool_arguments_validate(vocab, smollm2_tokenizer, fmt, choice):
    tag = _tag(fmt, NAMED if choice == "named" else choice)
    guide = compile_guide(GuideSpec.structural_tag(tag), vocab, backend="auto")
    begins = _begins(tag)
    prefix: list[int] = []
    if choice == "auto":  # free text until the model opens a call: open one at once
        prefix = smollm2_tokenizer.encode((_triggers(tag) or begins)[0], add_special_tokens=False)
    calls = []
    for seed in range(2):
        calls += _calls(*_drive(guide.matcher(), vocab, seed, prefix), begins)
    assert calls, "no call was written"
    for args in calls:
        jsonschema.validate(args, SCHEMA)


GOOD = [
    {"name": "Al", "tags": [], "address": {"street": "Main", "zip_code": "12345"}},
    {"name": "Añ 😀 z", "bio": "é\u2028\U0001F600", "tags": ["a b"], "address": {"street": "1 Q St", "zip_code": "1234 "}},
    {"name": "\U0001F600\U0001F600", "tags": ["😀"], "address": {"street": "abc", "zip_code": "  \u00a0  "}},
]
BAD = [
    {"name": "A", "tags": [], "address": {"street": "Main", "zip_code": "12345"}},  # minLength 2
    {"name": "Al", "bio": "123456789", "tags": [], "address": {"street": "Main", "zip_code": "12345"}},
    {"name": "Al", "tags": ["abcde"], "address": {"street": "Main", "zip_code": "12345"}},
    {"name": "Al", "tags": [], "address": {"street": "Main", "zip_code": "1234"}},
    {"name": "\U0001F600", "tags": [], "address": {"street": "Main", "zip_code": "12345"}},  # one character
]


def _accepts(guide, vocab, tok, text: str) -> bool:
    m = guide.matcher()
    return all(m.accept_token(t) for t in tok.encode(text, add_special_tokens=False)) and \
        m.accept_token(next(iter(vocab.eos_ids)))


def test_matcher_accepts_exactly_the_valid_calls(vocab, smollm2_tokenizer):
    """llama3's envelope, one call: lengths counted in code points as jsonschema counts them
    (an emoji once), raw control characters (invalid JSON) never admitted."""
    tag = _tag("llama", NAMED)
    guide = compile_guide(GuideSpec.structural_tag(tag), vocab, backend="auto")
    begin = _begins(tag)[0]
    for args in GOOD:
        jsonschema.validate(args, SCHEMA)
        text = begin + json.dumps(args, ensure_ascii=False) + "}"
        assert _accepts(guide, vocab, smollm2_tokenizer, text), text
    for args in BAD:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(args, SCHEMA)
        assert not _accepts(guide, vocab, smollm2_tokenizer, begin + json.dumps(args, ensure_ascii=False) + "}")
    for raw in ("A\tB", "A\x01B", "A\x1fB"):
        text = begin + '{"name": "' + raw + '", "tags": [], "address": {"street": "Main", "zip_code": "12345"}}}'
        assert not _accepts(guide, vocab, smollm2_tokenizer, text), repr(raw)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"maxLength": 3}}},  # no type: xgrammar admits any value
    {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3, "pattern": "^a|bcde$"}}},
])
def test_lengths_xgrammar_would_drop_stay_refused(vocab, schema):
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    tag = xgr.get_model_structural_tag("llama", tools, tool_choice="required").model_dump(mode="json")
    with pytest.raises(UnsupportedGuideError):
        compile_guide(GuideSpec.structural_tag(tag), vocab, backend="auto")


class Zip(BaseModel):
    zip_code: constr(pattern=r"^\d{5}$", min_length=5, max_length=5)
    plate: constr(pattern=r"^[A-Z]{2}-[0-9]{3,4}$", max_length=8)


def test_a_pattern_that_implies_the_lengths_is_served(vocab, smollm2_tokenizer):
    """pydantic's ``constr(pattern=..., min_length=.., max_length=..)`` where every match of the
    anchored pattern is within the bounds: xgrammar dropping the length drops nothing, served;
    calls validate under the hostile sampler."""
    schema = Zip.model_json_schema()
    tools = [{"type": "function", "function": {"name": "register", "parameters": schema}}]
    tag = xgr.get_model_structural_tag("llama", tools, tool_choice="required").model_dump(mode="json")
    guide = compile_guide(GuideSpec.structural_tag(tag), vocab, backend="auto")
    calls = []
    for seed in range(2):
        calls += _calls(*_drive(guide.matcher(), vocab, seed, []), _begins(tag))
    assert calls
    for args in calls:
        jsonschema.validate(args, schema)
