"""outlines 1.3's type DSL in the shim, against outlines 1.3.3 itself (issue 28): the
``outlines.types`` functions (``either``, ``optional``, ``exactly``, ``at_least``, ``at_most``,
``between``, ``one_or_more``, ``zero_or_more``) and constants (``sentence``, ``char``,
``newline``...) build terms with the same repr, tree and regex; the term classes read as
``outlines.types.dsl.X`` (module, qualname, ``type()`` repr), and still pickle. outlines runs in a
subprocess from its sdist fetched at test time. On main the functions and ``char``/``newline``
were missing from ``outlines.types``, ``sentence`` had another pattern, reprs escaped
backslashes and the classes were ``tokenrails.compat....``.
"""
from __future__ import annotations

import pickle
import re

import pytest

from outlines_peer import run_peer
from tokenrails.compat.outlines import types as shim_types
from tokenrails.compat.outlines.types import dsl as shim_dsl

pytestmark = pytest.mark.slow  # fetches outlines 1.3.3 from the package registry on first use

EXPRESSIONS = [
    'types.either("a", types.Regex("[0-9]+"), "b.c")',
    'types.optional("x")',
    "types.exactly(3, types.digit)",
    'types.at_least(2, "ab")',
    'types.at_most(4, types.Regex("[a-z]"))',
    'types.between(1, 3, types.either("cat", "dog"))',
    "types.one_or_more(types.char)",
    "types.zero_or_more(types.whitespace)",
    'types.Regex("[A-Z]") + types.optional(types.digit).exactly(2) + "!"',
    '"id-" + types.digit.between(2, 4) | dsl.String("none")',
    'dsl.String("a").one_or_more().zero_or_more()',
    "types.integer.at_most(2).at_least(1)",
    'types.Choice(["a", "b"])',
    'types.Choice(["a", types.Regex("[0-9]"), 3])',
    'types.CFG("start: \\"a\\"")',
    "types.JsonSchema({\"type\": \"integer\"})",
    "types.sentence", "types.paragraph", "types.newline", "types.char", "types.digit", "types.whitespace",
    "types.string", "types.integer", "types.number", "types.boolean", "types.date", "types.time", "types.datetime",
]
ERRORS = ['types.exactly(-1, "a")', 'types.at_least(-2, "a")', 'types.at_most(-1, "a")', 'types.between(3, 1, "a")',
          'types.between(-1, 1, "a")']
CLASSES = ["Term", "String", "Regex", "CFG", "JsonSchema", "Choice", "Sequence", "Alternatives", "Optional",
           "KleeneStar", "KleenePlus", "QuantifyExact", "QuantifyMinimum", "QuantifyMaximum", "QuantifyBetween"]
FUNCTIONS = ["either", "optional", "exactly", "at_least", "at_most", "between", "one_or_more", "zero_or_more",
             "regex", "cfg", "json_schema", "to_regex", "python_types_to_terms"]

_PEER_CODE = f"""
import json
from outlines import types
from outlines.types import dsl

def describe(expr):
    term = eval(expr)
    try:
        regex = dsl.to_regex(term)
    except Exception as exc:
        regex = type(exc).__name__
    return {{"repr": repr(term), "tree": str(term), "regex": regex, "type": repr(type(term))}}

def error(expr):
    try:
        eval(expr)
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
    return None

print(json.dumps({{
    "terms": {{e: describe(e) for e in {EXPRESSIONS!r}}},
    "errors": {{e: error(e) for e in {ERRORS!r}}},
    "classes": {{c: [getattr(dsl, c).__module__, getattr(dsl, c).__qualname__] for c in {CLASSES!r}}},
    "functions": {{f: [getattr(dsl, f).__module__, getattr(dsl, f).__qualname__] for f in {FUNCTIONS!r}}},
    "exported": sorted(types.__all__),
}}))
"""


@pytest.fixture(scope="module")
def outlines_dsl() -> dict:
    return run_peer("1.3.3", _PEER_CODE)


def _shim_eval(expr: str):
    return eval(expr, {"types": shim_types, "dsl": shim_dsl})


@pytest.mark.parametrize("expr", EXPRESSIONS)
def test_term_reads_like_outlines(expr, outlines_dsl):
    term = _shim_eval(expr)
    theirs = outlines_dsl["terms"][expr]
    assert repr(term) == theirs["repr"]
    assert str(term) == theirs["tree"]
    assert repr(type(term)) == theirs["type"]
    if theirs["regex"] == "TypeError":  # CFG: no regex in outlines either
        with pytest.raises(TypeError):
            shim_dsl.to_regex(term)
    else:
        assert shim_dsl.to_regex(term) == theirs["regex"]


@pytest.mark.parametrize("expr", ERRORS)
def test_bad_quantifiers_fail_like_outlines(expr, outlines_dsl):
    kind, message = outlines_dsl["errors"][expr]
    with pytest.raises(ValueError) as info:
        _shim_eval(expr)
    assert [type(info.value).__name__, str(info.value)] == [kind, message]


def test_classes_and_functions_are_outlines_names(outlines_dsl):
    for name, where in {**outlines_dsl["classes"], **outlines_dsl["functions"]}.items():
        obj = getattr(shim_dsl, name)
        assert [obj.__module__, obj.__qualname__] == where, name


def test_every_name_outlines_types_exports(outlines_dsl):
    missing = [n for n in outlines_dsl["exported"] if not hasattr(shim_types, n)]
    assert missing == []


def test_terms_still_pickle_without_install():
    """``__module__`` says outlines, but a term pickles (and copies) whether or not the shim is
    installed as ``outlines``."""
    import copy

    term = _shim_eval('types.either("a", types.Regex("[0-9]+")).at_least(2) + types.JsonSchema({"type": "integer"})')
    for clone in (pickle.loads(pickle.dumps(term)), copy.deepcopy(term)):
        assert repr(clone) == repr(term)
        assert shim_dsl.to_regex(clone) == shim_dsl.to_regex(term)


@pytest.mark.parametrize("expr", EXPRESSIONS)
def test_generation_uses_outlines_regex(expr, outlines_dsl):
    """As an output type, a term constrains to outlines' regex for it (in the shim's dialect), or
    to the same strings as a choice, or to its grammar / JSON schema."""
    from tokenrails.compat.outlines.regex_dialect import outlines_dialect
    from tokenrails.compat.outlines.types.convert import spec_for_output_type

    term, theirs = _shim_eval(expr), outlines_dsl["terms"][expr]["regex"]
    spec = spec_for_output_type(term)
    if spec.kind == "regex":
        assert outlines_dialect(theirs) in (spec.pattern, f"({spec.pattern})")  # a bare Regex: no group
    elif spec.kind == "choice":
        assert theirs == "(" + "|".join(re.escape(c) for c in spec.choices) + ")"
    else:
        assert (spec.kind, type(term).__name__) in {("grammar", "CFG"), ("json_schema", "JsonSchema")}
