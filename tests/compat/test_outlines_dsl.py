"""outlines 1.x type DSL in the shim: terms combine and print like outlines', their regexes are
enforced by the backends as Python ``re`` reads them, Python types become terms and schemas
become types (outlines' own suites: bench/outlines_suites.py, types/ 345/345 on 1.3.3)."""
from __future__ import annotations

import re
from typing import List, Literal, Optional

import pytest

from tokenrails import GuideSpec, compile_guide
from tokenrails.compat.outlines.types import dsl, json_schema_utils
from tokenrails.compat.outlines.types.dsl import Regex, String, either, optional, to_regex
from tokenrails.compat.outlines.types.python_terms import python_types_to_terms

TERMS = [
    (String("a") + Regex("[0-9]{2}") + optional("!"), ["a12", "a12!"], ["a1", "b12"]),
    (either("cat", "dog").at_least(2), ["catdog", "dogdogcat"], ["cat", "bird"]),
    (python_types_to_terms(List[Literal["x", "y z"]]), ['["x"]', '["x", "y z"]'], ["[x]", "[]"]),
    (python_types_to_terms(Optional[int]), ["None", "-3"], ['"None"', "03"]),
    (python_types_to_terms(dict[Literal["k"], int]), ['{"k":1}', "{}"], ["{k:1}"]),
]


@pytest.mark.parametrize("term,good,bad", TERMS, ids=[str(i) for i in range(len(TERMS))])
def test_term_regex_is_enforced_as_python_reads_it(term, good, bad, vocab, smollm2_tokenizer):
    pattern = to_regex(term)
    for backend in ("xgrammar", "fsm"):
        guide = compile_guide(GuideSpec.regex(pattern), vocab, backend)
        for text, expect in [(t, True) for t in good] + [(t, False) for t in bad]:
            assert (re.fullmatch(pattern, text) is not None) == expect, text
            assert term.matches(text) == expect
            m = guide.matcher()
            ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
            assert (all(m.accept_token(t) for t in ids) and m.is_accepting()) == expect, (backend, text)


def test_tree_display_and_quantifier_checks():
    t = dsl.Sequence([dsl.KleeneStar(either("a", "b")), Regex("[0-9]")])
    assert str(t).splitlines()[0] == "└── Sequence"
    with pytest.raises(ValueError, match="greater than"):
        dsl.QuantifyBetween(String("a"), 3, 1)


def test_schema_to_types_round_trip():
    schema = {"type": "object", "title": "P", "properties": {"name": {"type": "string"},
                                                              "age": {"type": ["integer", "null"]}},
              "required": ["name"]}
    model = json_schema_utils.json_schema_dict_to_pydantic(schema)
    assert model(name="x").age is None
    dc = json_schema_utils.json_schema_dict_to_dataclass(schema)
    assert dc(name="y").age is None
