"""Wrapping automaton arrays as a ``DFA``: the list views (``cls``, ``accepting_list``) are built on
first use but always equal the arrays, on both the native and the Python construction path, and a
spec's choices reach the automaton builder unchanged."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tokenrails import GuideSpec
from tokenrails.guided.fsm.compiler import compile_choices, compile_regex
from tokenrails.guided.fsm.dfa import DEAD, START
from tokenrails.guided.limits import GuideLimits

LIMITS = GuideLimits()
CHOICES = [["apple", "banana", "cherry", "durian", "elderberry"], ['say "hi"', "a\\b", "\u00e9t\u00e9", "x"],
           [f"c{i:03d}" for i in range(200)], [""]]
REGEXES = [r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", r"(25[0-5]|2[0-4]\d|1?\d?\d)(\.(25[0-5]|2[0-4]\d|1?\d?\d)){3}",
           r"[a-z]+@[a-z]+\.(com|org)"]


def _set_native(monkeypatch, on: bool) -> None:
    monkeypatch.setenv("TOKENRAILS_NATIVE", "1" if on else "0")


def _builds(monkeypatch):
    """Every (path, dfa, accepted strings) built for the corpus on both construction paths."""
    out = []
    for on in (True, False):
        _set_native(monkeypatch, on)
        for choices in CHOICES:
            out.append((on, compile_choices(GuideSpec.choice(choices).choices, LIMITS), choices))
        for regex in REGEXES:
            out.append((on, compile_regex(regex, LIMITS), None))
    _set_native(monkeypatch, True)
    return out


def test_list_views_are_lazy_and_equal_the_arrays(monkeypatch):
    for native, dfa, accepted in _builds(monkeypatch):
        assert "cls" not in vars(dfa) and "accepting_list" not in vars(dfa), native
        assert dfa.trans.dtype == np.int32 and dfa.classmap.dtype == np.int32 and dfa.accepting.dtype == np.bool_
        assert dfa.trans.shape == (dfa.num_states, dfa.num_classes) and dfa.classmap.shape == (256,)
        if accepted is not None:  # walk/fullmatch build the views they need on the way
            assert all(dfa.fullmatch(s.encode()) for s in accepted)
            assert not dfa.fullmatch(accepted[0].encode() + b"\x00")
        cls, acc = dfa.cls, dfa.accepting_list
        assert cls == dfa.classmap.tolist() and all(type(c) is int for c in cls)
        assert acc == dfa.accepting.tolist() and all(type(a) is bool for a in acc)
        assert dfa.cls is cls and dfa.accepting_list is acc  # built once
        assert dfa.rows == dfa.trans.tolist() and not acc[DEAD]
        assert dfa.walk(START, b"") == START


def test_native_and_python_wraps_are_identical(monkeypatch):
    builds = _builds(monkeypatch)
    half = len(builds) // 2
    for (_, nat, _), (_, py, _) in zip(builds[:half], builds[half:]):
        assert np.array_equal(nat.trans, py.trans) and np.array_equal(nat.classmap, py.classmap)
        assert np.array_equal(nat.accepting, py.accepting)
        assert nat.cls == py.cls and nat.accepting_list == py.accepting_list and nat.forced == py.forced


@pytest.mark.parametrize("choices", CHOICES)
def test_choice_spec_feeds_the_builder_its_strings(choices):
    spec = GuideSpec.choice(choices)
    assert spec.choices == json.loads(spec.payload) == choices
    via_spec = compile_choices(spec.choices, LIMITS)
    direct = compile_choices(choices, LIMITS)
    assert np.array_equal(via_spec.trans, direct.trans) and np.array_equal(via_spec.accepting, direct.accepting)
