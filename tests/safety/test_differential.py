"""Differential fuzzing: every backend's acceptance against an independent oracle.

Random regexes (oracle: Python ``re.fullmatch``, ASCII) and random JSON Schemas (oracle:
``jsonschema``), each asked about 8 candidate texts plus 2 texts the backend's own masks chose
(an adversarial sampler that never ends while it can go on, and a random one), on every backend
and ``auto``. The count of checks is printed; ``TOKENRAILS_FUZZ_SPECS`` raises the number of specs
(``bench/differential_fuzz.py`` runs 100k checks).
"""
from __future__ import annotations

import os
import random

import pytest

from tokenrails.testing import Tally, check_spec, regex_case, schema_case

SPECS = int(os.environ.get("TOKENRAILS_FUZZ_SPECS", "150"))  # ~10.5k checks in all, ~70 s
BACKENDS = ["auto", "fsm", "xgrammar", "llguidance"]


@pytest.fixture(scope="module")
def codec(smollm2_tokenizer):
    return (lambda text: smollm2_tokenizer.encode(text, add_special_tokens=False),
            lambda ids: smollm2_tokenizer.decode(ids, clean_up_tokenization_spaces=False))


@pytest.mark.parametrize("make_case", [regex_case, schema_case], ids=["regex", "json_schema"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_no_wrong_accepts(vocab, codec, backend, make_case):
    encode, decode = codec
    rng = random.Random(f"{backend}-{make_case.__name__}")
    tally = Tally()
    for _ in range(SPECS):
        spec, oracle, texts = make_case(rng)
        tally.merge(check_spec(spec, oracle, texts, vocab, encode, decode, backend, rng))
    print(f"{backend} {make_case.__name__}: {tally.checks} checks, {tally.compiled_specs} compiled, "
          f"{tally.refused_specs} refused")
    assert tally.compiled_specs > SPECS // 2  # a backend refusing everything proves nothing
    assert not tally.wrong_accepts, tally.wrong_accepts[:5]
