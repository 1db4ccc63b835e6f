"""outlines.base.vectorize in the shim: numpy.vectorize semantics, coroutines too, no string
truncation (numpy alone sizes string outputs from the first result)."""
from __future__ import annotations

import numpy as np

from tokenrails.compat.outlines.base import vectorize


def test_vectorize_broadcasts_and_keeps_whole_strings():
    fn = vectorize(lambda a, b: a + b)
    out = fn([["one", "three"], ["four", "seventeen"]], ["1", "2"])
    assert out.tolist() == [["one1", "three2"], ["four1", "seventeen2"]]


def test_vectorize_runs_coroutines_and_signatures():
    async def first(x):
        return x[0]

    assert vectorize(first, "(m)->()")([["ab", "c"], ["d", "e"]]).tolist() == ["ab", "d"]
    assert np.asarray(vectorize(lambda: 7)()) == 7
