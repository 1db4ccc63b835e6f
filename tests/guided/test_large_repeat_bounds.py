"""String bounds above 1,000 (pydantic ``Field(max_length=1200)``, ``Regex("a.{0,1200}")``), which
real outlines and llguidance serve: served, exact at the bound, and fast where routed.

Oracles: jsonschema / re.fullmatch on texts exactly at and one past the bound, fed to the matcher.
"""
from __future__ import annotations

import json
import re
import time

import jsonschema
import pytest
from pydantic import BaseModel, Field

from tokenrails import GuideLimitError, GuideSpec, Vocabulary, compile_guide
from tokenrails.guided.limits import GuideLimits


class Note(BaseModel):
    text: str = Field(max_length=1200)


def _accepts(guide, vocab, tok, text: str) -> bool:
    m = guide.matcher()
    return all(m.accept_token(t) for t in tok.encode(text, add_special_tokens=False)) and \
        m.accept_token(next(iter(vocab.eos_ids)))


def _valid(value, schema) -> bool:
    try:
        jsonschema.validate(value, schema)
        return True
    except jsonschema.ValidationError:
        return False


@pytest.mark.parametrize("backend", ["auto", "llguidance", "fsm"])
def test_pydantic_max_length_1200_is_served_and_exact(vocab, smollm2_tokenizer, backend):
    schema = Note.model_json_schema()
    guide = compile_guide(GuideSpec.json_schema(schema), vocab, backend=backend)
    for n in (1200, 1201):
        value = {"text": "ab " * (n // 3) + "x" * (n % 3)}
        assert _accepts(guide, vocab, smollm2_tokenizer, json.dumps(value)) == _valid(value, schema), n


@pytest.mark.parametrize("backend", ["auto", "llguidance", "fsm"])
@pytest.mark.parametrize("kind", ["regex", "pattern"])
def test_regex_bound_1200_is_served_and_exact(vocab, smollm2_tokenizer, backend, kind):
    pattern = "a.{0,1200}"
    spec = GuideSpec.regex(pattern) if kind == "regex" else \
        GuideSpec.json_schema({"type": "string", "pattern": f"^{pattern}$"})
    guide = compile_guide(spec, vocab, backend=backend)
    for n in (1200, 1201):
        body = "a" + "yz" * (n // 2) + "w" * (n % 2)
        expected = re.fullmatch(pattern, body) is not None
        text = body if kind == "regex" else json.dumps(body)
        assert _accepts(guide, vocab, smollm2_tokenizer, text) == expected, n


@pytest.mark.parametrize("spec", [
    GuideSpec.regex("a.{0,10000}"),
    GuideSpec.json_schema({"type": "object", "properties": {"s": {"type": "string", "maxLength": 10_000}}}),
    GuideSpec.json_schema({"type": "string", "pattern": "^[a-z ]{0,10000}$"}),
], ids=["regex", "maxLength", "pattern"])
def test_bound_10000_compiles_well_under_a_second(vocab, spec):
    compile_guide(GuideSpec.regex("[ab]"), vocab, backend="llguidance")  # the backend's one-off set-up
    start = time.perf_counter()
    compile_guide(spec, vocab, backend="auto")
    assert time.perf_counter() - start < 1.0  # measured 0.01 s on llguidance (docs/safety.md)


def test_xgrammar_keeps_its_own_bound_and_the_limits_stay_configurable(vocab):
    with pytest.raises(GuideLimitError) as err:
        compile_guide(GuideSpec.regex("a.{0,1200}"), vocab, backend="xgrammar")
    assert err.value.limit == "xgrammar_max_repeat"
    with pytest.raises(GuideLimitError) as err:
        compile_guide(GuideSpec.regex("a.{0,1200}"), vocab, limits=GuideLimits(max_repeat=1000))
    assert err.value.limit == "max_repeat"


_HUGE = "9" * 5000  # past Python's 4,300-digit int-from-string limit


def _byte_vocab() -> Vocabulary:
    return Vocabulary(token_bytes=[bytes([i]) for i in range(256)] + [b""], eos_ids=(256,))


@pytest.mark.parametrize("backend", ["auto", "fsm", "llguidance", "xgrammar"])
@pytest.mark.parametrize("text", [f"a{{{_HUGE}}}", f"a{{1,{_HUGE}}}", f"a{{{_HUGE},}}", f"(a{{2}}){{{_HUGE}}}"],
                         ids=["exact", "upper", "lower", "nested"])
@pytest.mark.parametrize("kind", ["regex", "pattern"])
def test_a_count_of_thousands_of_digits_is_a_repeat_limit_error(vocab, backend, text, kind):
    """The count is refused as over ``max_repeat`` (typed, naming the limit), not as a bare
    ValueError from int() that the compile boundary can only report as an unknown failure."""
    spec = GuideSpec.regex(text) if kind == "regex" else \
        GuideSpec.json_schema({"type": "string", "pattern": f"^{text}$"})
    with pytest.raises(GuideLimitError) as err:
        compile_guide(spec, vocab, backend=backend)
    assert err.value.limit == "max_repeat", err.value
    assert "ValueError" not in str(err.value)


def test_the_regex_parser_refuses_a_huge_count_with_a_typed_error_and_reads_leading_zeros():
    from tokenrails.guided.fsm.regex_parser import parse_regex

    with pytest.raises(GuideLimitError) as err:
        parse_regex(f"a{{{_HUGE}}}", 10_000)
    assert err.value.limit == "max_repeat"
    padded = "a{" + "0" * 5000 + "3}"  # three, spelled with 5,000 leading zeros
    guide = compile_guide(GuideSpec.regex(padded), _byte_vocab(), backend="fsm")
    for n in (2, 3, 4):
        m = guide.matcher()
        accepted = all(m.accept_token(ord("a")) for _ in range(n)) and m.accept_token(256)
        assert accepted == (re.fullmatch("a{3}", "a" * n) is not None), n
