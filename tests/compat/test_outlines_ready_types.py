"""outlines 1.x ready-made types in the shim: pydantic fields, ``to_regex``, and each pattern
enforced by the backends exactly as Python ``re`` reads it (outlines' own cases run in
bench/outlines_suites.py: 232/232)."""
from __future__ import annotations

import re

import pytest
from pydantic import BaseModel

from tokenrails import GuideSpec, compile_guide
from tokenrails.compat.outlines import types
from tokenrails.compat.outlines.types.dsl import to_regex

CASES = [
    (types.email, ["a.b@c.org"], ["a@.c.org", "a@b"]),
    (types.ipv4, ["10.0.0.1"], ["01.2.3.4", "1.2.3"]),
    (types.ipv6, ["::1", "1:2:3:4::5.6.7.8"], ["2001::db8::1", "::ffff:01.1.1.1"]),
    (types.uuid4, ["00000000-0000-4000-8000-000000000000"], ["00000000-0000-1000-8000-000000000000"]),
    (types.iban, ["NO9386011117947"], ["GB00WEST12345698765432"]),
    (types.credit_card, ["4111111111111111"], ["1234567890123456"]),
    (types.locale.us.zip_code, ["12345-1234"], ["1234"]),
]


@pytest.mark.parametrize("term,good,bad", CASES, ids=[str(i) for i in range(len(CASES))])
def test_ready_made_types(term, good, bad, vocab, smollm2_tokenizer):
    class Model(BaseModel):
        attr: term

    prop = Model.model_json_schema()["properties"]["attr"]
    assert prop["type"] == "string" and prop["pattern"] == to_regex(term)
    pattern = to_regex(term)
    for backend in ("xgrammar", "fsm"):
        guide = compile_guide(GuideSpec.regex(pattern), vocab, backend)
        for text, expect in [(t, True) for t in good] + [(t, False) for t in bad]:
            assert (re.fullmatch(pattern, text) is not None) == expect
            m = guide.matcher()
            ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
            ok = all(m.accept_token(t) for t in ids) and m.is_accepting()
            assert ok == expect, (backend, text)


def test_country_and_airport_enums():
    assert "FR" in types.countries.Alpha2.__members__
    assert "XX" not in types.countries.Alpha2.__members__
    assert "CDG" in types.airports.IATA.__members__
