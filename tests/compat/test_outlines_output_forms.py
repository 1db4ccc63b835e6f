"""Every typing form outlines 1.3's ``python_types_to_terms`` turns into an output type becomes
the same thing in the shim (issue 28): the same term and regex / JSON Schema / CFG as outlines
1.3.3 itself produces (run in a subprocess from its sdist, fetched at test time), and a guide
whose language is outlines' — strings drawn from outlines' own regex (and mutations of them) are
accepted by the shim's compiled guide exactly when outlines' regex accepts them. Forms outlines
refuses are refused with a typed error. On main, ``Union[Model, Literal[...]]``, ``Dict[int, str]``,
nested dicts, tuples, lists and unions raised ``UnsupportedGuideError``.
"""
from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import outlines_type_forms as forms
from outlines_peer import run_peer
from tokenrails import compile_guide
from tokenrails.compat.outlines.types.convert import spec_for_output_type
from tokenrails.compat.outlines.types.dsl import CFG, JsonSchema, python_types_to_terms, to_regex
from tokenrails.guided.errors import GuideError

pytestmark = pytest.mark.slow  # fetches outlines 1.3.3 from the package registry on first use

VERSION = "1.3.3"

_PEER_CODE = """
import json
from outlines.types.dsl import CFG, JsonSchema, python_types_to_terms, to_regex
import outlines_type_forms as forms

out = {"forms": {}, "refused": {}}
for name, form in forms.FORMS.items():
    term = python_types_to_terms(form)
    if isinstance(term, CFG):
        out["forms"][name] = {"kind": "cfg", "value": term.definition}
    elif isinstance(term, JsonSchema):
        out["forms"][name] = {"kind": "json", "value": json.loads(term.schema), "regex": to_regex(term)}
    else:
        out["forms"][name] = {"kind": "regex", "value": to_regex(term)}
    out["forms"][name]["repr"] = repr(term)
for name, form in forms.REFUSED.items():
    try:
        python_types_to_terms(form)
        out["refused"][name] = None
    except Exception as exc:
        out["refused"][name] = type(exc).__name__
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def outlines_terms() -> dict:
    return run_peer(VERSION, _PEER_CODE)


def _shim_side(form):
    term = python_types_to_terms(form)
    if isinstance(term, CFG):
        return {"kind": "cfg", "value": term.definition}
    if isinstance(term, JsonSchema):
        return {"kind": "json", "value": json.loads(term.schema), "regex": to_regex(term)}
    return {"kind": "regex", "value": to_regex(term)}


@pytest.mark.parametrize("name", list(forms.FORMS))
def test_same_term_as_outlines(name, outlines_terms):
    theirs = dict(outlines_terms["forms"][name])
    their_repr = theirs.pop("repr")
    ours = _shim_side(forms.FORMS[name])
    if theirs["kind"] == "cfg":  # outlines' Lark JSON grammar, spelled for llguidance: same language
        assert ours["kind"] == "cfg"  # (test_dict_is_outlines_json_grammar)
        return
    assert ours == theirs
    assert repr(python_types_to_terms(forms.FORMS[name])) == their_repr


@pytest.mark.parametrize("name", list(forms.REFUSED))
def test_refused_like_outlines(name, outlines_terms):
    assert outlines_terms["refused"][name] is not None, "outlines accepts it: the shim must too"
    with pytest.raises(GuideError):
        spec_for_output_type(forms.REFUSED[name])


# where Python's ``re`` and outlines-core (Rust) read ``\d \w \s`` alike: printable ASCII, tab, newlines
# (the classes' full tables are tests/compat/test_outlines_regex_dialect.py's subject)
_ALPHABET = st.sampled_from([chr(c) for c in range(32, 127)] + ["\t", "\n", "\r"])
_NOISE = '0123456789abz -+.,:"[]{}()\\N'


def _mutations(text: str, rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        i = rng.randrange(len(text) + 1)
        kind = rng.randrange(3)
        if kind == 0 and text:
            out.append(text[:max(i - 1, 0)] + text[i:])
        elif kind == 1:
            out.append(text[:i] + rng.choice(_NOISE) + text[i:])
        elif text:
            out.append(text[:max(i - 1, 0)] + rng.choice(_NOISE) + text[i:])
    return out


def _accepts(guide, tokenizer, text: str) -> bool:
    m = guide.matcher()
    ids = tokenizer.encode(text, add_special_tokens=False)
    return all(m.accept_token(t) for t in ids) and m.is_accepting()


REGEX_FORMS = [n for n in forms.FORMS if n != "dict"]


@pytest.mark.parametrize("name", REGEX_FORMS)
def test_guide_language_is_outlines(name, outlines_terms, vocab, smollm2_tokenizer):
    """The shim's guide for the output type accepts what outlines' regex accepts, on strings drawn
    from that regex and on near misses."""
    theirs = outlines_terms["forms"][name]
    pattern = theirs["regex"] if theirs["kind"] == "json" else theirs["value"]
    compiled = re.compile(pattern)
    spec = spec_for_output_type(forms.FORMS[name])
    guide = compile_guide(spec, vocab, "fsm")
    samples: list[str] = []

    @settings(max_examples=25, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.from_regex(compiled, fullmatch=True, alphabet=_ALPHABET))
    def draw(text: str) -> None:
        samples.append(text)

    draw()
    rng = random.Random(name)
    positives = sorted(set(samples))
    assert positives
    negatives = [t for p in positives for t in _mutations(p, rng, 3)]
    for text in positives + negatives:
        expected = compiled.fullmatch(text) is not None
        assert _accepts(guide, smollm2_tokenizer, text) == expected, (name, text, expected)


def test_dict_is_outlines_json_grammar(outlines_terms, vocab, smollm2_tokenizer):
    """``dict`` is outlines' Lark JSON grammar (any JSON value, whitespace between tokens)."""
    assert outlines_terms["forms"]["dict"]["kind"] == "cfg"
    spec = spec_for_output_type(dict)
    assert spec.kind == "grammar"
    guide = compile_guide(spec, vocab, "llguidance")
    for text in ['{"a": 1}', '[1, 2]', '"x"', "-2.5e3", "true", "null", '{"a": [ {"b": null} ]}']:
        assert _accepts(guide, smollm2_tokenizer, text), text
    for text in ["{a: 1}", "[1,]", "'x'", "True", "{", '{"a" 1}']:
        assert not _accepts(guide, smollm2_tokenizer, text), text
