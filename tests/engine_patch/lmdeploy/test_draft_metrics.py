"""The draft ledger (draft_metrics.py): per-request counters and their place in ``request_metrics``."""
from __future__ import annotations

import pytest

pytest.importorskip("lmdeploy")


@pytest.fixture
def metrics():
    from tokenrails.engine_patch.lmdeploy.speculative import draft_metrics
    draft_metrics.reset()
    yield draft_metrics
    draft_metrics.reset()


def test_emitted_counts_stop_at_rejection_and_after_a_stop_token(metrics):
    rows = [[5, 6, -1, -1], [5, 2, 7, 8], [-1, -1, -1, -1], [1, 1, 1, 1]]
    assert metrics.emitted_counts(rows, frozenset({2})) == [2, 2, 0, 4]


def test_verification_and_forced_counts_per_request(metrics):
    stops = frozenset({2})
    metrics.record_verification(["a", "b", None], 3, [[5, 6, 7, 9], [4, -1, -1, -1], [1, 1, 1, 1]], stops)
    metrics.record_verification(["a", "b", None], 3, [[5, 2, 7, 9], [4, 4, -1, -1], [1, 1, 1, 1]], stops)
    metrics.record_forced("a", 2)
    metrics.record_forced("a", 0)
    metrics.record_forced(None, 5)
    assert metrics.request_stats("a") == {"draft_tokens": 6, "accepted_draft_tokens": 3 + 1,
                                          "forced_draft_tokens": 2, "verify_steps": 2}
    assert metrics.request_stats("b") == {"draft_tokens": 6, "accepted_draft_tokens": 0 + 1,
                                          "forced_draft_tokens": 0, "verify_steps": 2}
    assert metrics.request_stats("never") == {}
    assert set(metrics.all_requests()) == {"a", "b"}


def test_request_metrics_of_the_lmdeploy_manager_carry_the_counters(metrics, smollm2_tokenizer, vocab):
    from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager

    metrics.record_verification([7], 4, [[3, 3, -1, -1, -1]], frozenset())
    metrics.record_forced(7, 3)
    mgr = LMDeployGuidedManager(smollm2_tokenizer, vocab.vocab_size, vocab=vocab)
    out = mgr.request_metrics(7)
    assert out == {"draft_tokens": 4, "accepted_draft_tokens": 1, "forced_draft_tokens": 3, "verify_steps": 1}
    assert mgr.request_metrics(8) == {}


def test_ragged_drafts_count_only_the_real_ones(metrics):
    """Adaptive grammar drafts end a row's forced run with -1: only the ids before it were drafted."""
    assert metrics.drafted_counts([[5, 6, -1, -1], [-1, -1, -1, -1], [1, 2, 3, 4]]) == [2, 0, 4]
    metrics.record_verification(["a", "b"], [2, 0], [[5, 6, 8, -1, -1], [9, -1, -1, -1, -1]], frozenset())
    assert metrics.request_stats("a") == {"draft_tokens": 2, "accepted_draft_tokens": 2,
                                          "forced_draft_tokens": 0, "verify_steps": 1}
    assert metrics.request_stats("b") == {"draft_tokens": 0, "accepted_draft_tokens": 0,
                                          "forced_draft_tokens": 0, "verify_steps": 1}


def test_one_ledger_holds_every_counter_of_a_request_under_one_cap(metrics, monkeypatch):
    """The grammar proposer's counters and the verification counters are one record: the
    proposer's drafts count as forced in the usage, and one cap drops the whole record."""
    monkeypatch.setattr(metrics, "MAX_TRACKED_REQUESTS", 2)
    metrics.record_grammar_step(["a"], [3], [(2, 1)])
    metrics.record_verification(["a"], [2], [[5, 6, 7]], frozenset())
    assert metrics.request_stats("a") == {"draft_tokens": 2, "accepted_draft_tokens": 2,
                                          "forced_draft_tokens": 2, "verify_steps": 1}
    assert metrics.all_requests()["a"]["grammar_draft_accepted"] == 2
    for key in ("b", "c"):
        metrics.record_grammar_step([key], [1], [None])
    assert "a" not in metrics.all_requests() and metrics.request_stats("a") == {}
    assert metrics.grammar_totals() == {"grammar_draft_steps": 3, "grammar_drafted": 2, "grammar_draft_accepted": 2,
                                        "grammar_forced": 1, "grammar_draft_emitted": 5}
