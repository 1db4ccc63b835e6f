"""Eager rows at compile (``TokenIndex.prime``): the id-list rows of the first states, within a
time budget; packed rows, choices and permissive patterns stay lazy; primed rows equal lazy ones."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tokenrails import GuideSpec, compile_guide, native
from tokenrails.guided.fsm import token_index
from tokenrails.guided.fsm.compiler import compile_regex
from tokenrails.guided.fsm.token_index import TokenIndex
from tokenrails.guided.limits import GuideLimits

pytestmark = pytest.mark.skipif(native.load("fsm") is None, reason="tokenrails._fsm_native is not built")
TIGHT = r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}"


def test_tight_regex_rows_are_cached_at_compile_and_equal_lazy_rows(vocab, monkeypatch):
    monkeypatch.setattr(token_index, "EAGER_BUDGET_S", 1.0)  # not time-bound here (loaded CI machines)
    guide = compile_guide(GuideSpec.regex(TIGHT), vocab, backend="fsm")
    primed = guide.index
    assert primed.cached_states == guide.dfa.num_states - 1  # every live state (all id lists here)
    monkeypatch.setattr(token_index, "EAGER_MAX_STATES", 0)
    lazy = compile_guide(GuideSpec.regex(TIGHT), vocab, backend="fsm").index
    assert lazy.cached_states == 1
    for state in range(1, guide.dfa.num_states):
        assert torch.equal(primed.row(state), lazy.row(state)), state


def test_permissive_patterns_and_choices_are_not_primed(vocab):
    assert compile_guide(GuideSpec.regex(r"[^\"]{0,8}x[0-9]"), vocab, backend="fsm").index.cached_states == 1
    assert compile_guide(GuideSpec.choice(["alpha", "beta", "gamma"]), vocab, backend="fsm").index.cached_states == 1


def test_budget_and_state_bound(vocab):
    dfa = compile_regex(TIGHT, GuideLimits())
    index = TokenIndex(dfa, vocab, use_native=True)
    index.ensure(1)
    assert index.prime(max_states=3) == 2 and index.cached_states == 3  # states 2 and 3 (1 was cached)
    assert index.prime(budget_s=-1.0, max_states=0) == 0
    assert index.prime(budget_s=0.0) <= 1  # the clock is read before each row
    before = index.cached_states
    assert index.prime(budget_s=-1.0) == dfa.num_states - 1 - before  # unbounded: every remaining state
    assert index.cached_states == dfa.num_states - 1


def test_sparse_only_precompute_leaves_packed_rows_lazy(vocab):
    dfa = compile_regex(r"(a[^\"]*|[0-9])x", GuideLimits())
    walker = TokenIndex(dfa, vocab, use_native=True).walker
    states = np.arange(1, dfa.num_states, dtype=np.int32)
    added = walker.precompute(states, 1.0, True)
    packed = [s for s in states.tolist() if not walker.is_cached(s)]
    assert added == walker.cached_states and packed  # the [^"]* states were skipped
    assert all(walker.is_packed(s) for s in packed)  # (is_packed computes them)
    assert walker.precompute(states) == 0  # nothing left
    with pytest.raises(TypeError):
        walker.precompute()
    with pytest.raises(ValueError):
        walker.precompute(np.array([dfa.num_states], np.int32), 1.0, True)
