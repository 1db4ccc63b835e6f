"""The budget rule (tokenrails/guided/budget.py) on the SmolLM2 vocabulary, no model.

Oracles: a brute-force breadth-first search over token sequences (Python's own DFA walk, checked
with ``re.fullmatch``) for the distance table; ``re.fullmatch`` / ``jsonschema`` for outputs of an
adversarial sampler that always takes the allowed token that most delays completion.
"""
from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from tokenrails import GuideSpec
from tokenrails.guided.budget import INF, budget_spec, budget_table
from tokenrails.guided.errors import GuideLimitError, UnsupportedGuideError
from tokenrails.guided.fsm.dfa import DEAD, START
from tokenrails.guided.fsm.matcher import grammar_bytes
from tokenrails.guided.manager import GuidedDecodingManager
from tokenrails.guided.reasoning import ReasoningConfig
from tokenrails.guided.sequence import GuidedRow, StepStatus

from .helpers import allowed_ids

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "status": {"enum": ["active", "inactive"]},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "status", "age", "tags"],
}
REGEXES = [r"[a-z]{1,30}@[a-z]{2,12}\.(com|org)", r"(ab|cd)+x[0-9]{2,6}", r"\d{4}-\d{2}-\d{2}"]


@pytest.fixture(scope="module")
def mgr(vocab):
    m = GuidedDecodingManager(vocab, compile_workers=2)
    yield m
    m.close()


def _guide(mgr, spec):
    return mgr.get_compiled(budget_spec(spec))


# ---- exactness: the table against a brute-force search over token sequences --------------------
def _brute_shortest(vocab, dfa, pattern: str) -> int | None:
    """Fewest tokens + EOS of any full match, by BFS over token sequences (one text kept per DFA
    state: sequences reaching the same state have the same continuations)."""
    table = grammar_bytes(vocab)
    alive = set()  # bytes some state does not kill: a token with another byte is never allowed
    for b in range(256):
        if any(dfa.walk(s, bytes([b])) != DEAD for s in range(1, dfa.num_states)):
            alive.add(b)
    tokens = [(t, b) for t, b in enumerate(table) if b is not None and set(b) <= alive]
    frontier, seen, depth = [(START, b"")], {START}, 0
    while frontier:
        depth += 1
        for state, text in frontier:
            if dfa.accepting[state]:
                assert re.fullmatch(pattern, text.decode("utf-8")), text
                return depth  # the tokens so far plus EOS
        nxt = []
        for state, text in frontier:
            for _, data in tokens:
                s2 = dfa.walk(state, data)
                if s2 != DEAD and s2 not in seen:
                    seen.add(s2)
                    nxt.append((s2, text + data))
        frontier = nxt
    return None


@pytest.mark.parametrize("pattern", REGEXES + [r"x{7}", r"(hello|world)+!?"])
def test_table_start_equals_brute_force(mgr, vocab, pattern):
    guide = _guide(mgr, GuideSpec.regex(pattern))
    assert budget_table(guide).start == _brute_shortest(vocab, guide.dfa, pattern)


_atom = hs.sampled_from(["a", "b", "ab", "ba", "[ab]", "[0-9]", "x", "\\.", "(a|bb)", "(ab|x)"])
_quant = hs.sampled_from(["", "", "?", "*", "+", "{2}", "{1,3}", "{3,5}"])
_regex = hs.lists(hs.tuples(_atom, _quant).map("".join), min_size=1, max_size=4).map("".join)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=_regex)
def test_table_is_exact_on_random_regexes(mgr, vocab, pattern):
    """Every state's distance, not only the start's: brute force from each state."""
    guide = _guide(mgr, GuideSpec.regex(pattern))
    table = budget_table(guide)
    assert table.start == _brute_shortest(vocab, guide.dfa, pattern)
    # maxnext: the largest distance an allowed token leads to, by walking every allowed token
    walker = guide.index.walker
    for state in range(1, min(guide.dfa.num_states, 6)):
        ids = allowed_ids(guide.index.row(state), vocab.vocab_size).tolist()
        nexts = [walker.advance(state, t) for t in ids if t not in vocab.eos_ids]
        want = max((int(table.dist[s]) for s in nexts), default=0)
        assert int(table.maxnext[state]) == want
        if nexts:  # the Bellman equation: one token then the rest
            best = min(int(table.dist[s]) for s in nexts) + 1
            assert int(table.dist[state]) == (1 if guide.dfa.accepting[state] else best)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=_regex, extra=hs.integers(0, 6))
def test_adversary_completes_random_regexes_within_any_feasible_budget(mgr, vocab, pattern, extra):
    shortest = budget_table(_guide(mgr, GuideSpec.regex(pattern))).start
    text, used, _ = _adversarial_run(mgr, vocab, GuideSpec.regex(pattern), shortest + extra)
    assert re.fullmatch(pattern, text) and used <= shortest + extra


# ---- the per-step rule --------------------------------------------------------------------------
def test_fast_path_is_the_grammars_row(mgr, vocab):
    """With room for every allowed token, ``fill_within`` writes the grammar's row exactly."""
    guide = _guide(mgr, GuideSpec.json_schema(SCHEMA, any_whitespace=False))
    table = budget_table(guide)
    out = torch.zeros((1, guide.index.words), dtype=torch.int32)
    for state in range(1, guide.dfa.num_states):
        if table.dist[state] >= INF:
            continue
        guide.index.walker.fill_within(state, table.dist, int(table.maxnext[state]), out.data_ptr(), out.shape[1])
        assert torch.equal(out[0], guide.index.row(state)), state


def _worst_token(guide, table, vocab, ids: list[int], state: int, rng) -> int:
    """The allowed token that most delays completion: the largest distance after it (ties: the
    longest token); EOS only when nothing else is allowed."""
    eos = set(vocab.eos_ids)
    cands = [t for t in ids if t not in eos]
    if not cands:
        return ids[0]
    if len(cands) > 1500:
        cands = list(rng.choice(cands, 1500, replace=False))
    walker = guide.index.walker
    table_bytes = grammar_bytes(vocab)
    return max(cands, key=lambda t: (int(table.dist[walker.advance(state, int(t))]), len(table_bytes[int(t)])))


def _adversarial_run(mgr, vocab, spec, max_tokens: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    bspec = budget_spec(spec)
    guide = mgr.get_compiled(bspec)
    table = budget_table(guide)
    row = GuidedRow("adv", (str(spec.key), max_tokens, seed), bspec, max_tokens=max_tokens)
    out: list[int] = []
    try:
        for _ in range(max_tokens):
            filled = mgr.fill_rows([row])
            st = mgr.sequence(row.session_id, row.seq_id)
            assert st.error is None, st.error
            ids = allowed_ids(filled.bitmask[0], vocab.vocab_size).tolist()
            assert ids, "the budget left no token"
            tok = _worst_token(guide, table, vocab, ids, st.matcher.state, rng)
            status = mgr.accept_tokens([tok], [row])[0]
            assert not status.failed, status
            if status.state is StepStatus.TERMINATED:
                text = b"".join(vocab.token_bytes[t] for t in out).decode("utf-8")
                return text, len(out) + 1, mgr.request_metrics(row.session_id, row.seq_id)
            out.append(tok)
        raise AssertionError(f"no EOS within {max_tokens} tokens: {out}")
    finally:
        mgr.release(row.session_id, row.seq_id)


@pytest.mark.parametrize("pattern", REGEXES)
def test_adversary_always_completes_a_regex_within_budget(mgr, vocab, pattern):
    shortest = budget_table(_guide(mgr, GuideSpec.regex(pattern))).start
    for budget in range(shortest, shortest + 12, 2):
        text, used, metrics = _adversarial_run(mgr, vocab, GuideSpec.regex(pattern), budget)
        assert re.fullmatch(pattern, text), (budget, text)
        assert used <= budget
        assert isinstance(metrics["budget_closed"], bool)


def test_adversary_always_completes_a_json_schema_within_budget(mgr, vocab):
    spec = GuideSpec.json_schema(SCHEMA, any_whitespace=False)
    shortest = budget_table(_guide(mgr, spec)).start
    for budget in (shortest, shortest + 1, shortest + 5, shortest + 17, 64):
        text, used, metrics = _adversarial_run(mgr, vocab, spec, budget)
        jsonschema.validate(json.loads(text), SCHEMA)
        assert used <= budget
        assert metrics["budget_closed"] is True  # the adversary would fill the array forever


def test_untight_budget_is_not_reported_closed(mgr, vocab):
    """A choice's every path is short: a big budget never removes anything."""
    spec = budget_spec(GuideSpec.choice(["yes", "no"]))
    row = GuidedRow("loose", 1, spec, max_tokens=50)
    mgr.fill_rows([row])
    st = mgr.sequence("loose", 1)
    tok = [t for t in allowed_ids(mgr.fill_rows([row]).bitmask[0], vocab.vocab_size).tolist()
           if vocab.token_bytes[t] == b"yes"][0]
    mgr.accept_tokens([tok], [row])
    assert mgr.accept_tokens([vocab.eos_ids[0]], [row])[0].state is StepStatus.TERMINATED
    assert st.finalize().budget_closed is False and mgr.request_metrics("loose", 1)["budget_closed"] is False
    mgr.release("loose", 1)


# ---- refusals -----------------------------------------------------------------------------------
def test_budget_below_the_shortest_output_is_refused_up_front(mgr, vocab):
    spec = GuideSpec.json_schema(SCHEMA, any_whitespace=False)
    shortest = budget_table(_guide(mgr, spec)).start
    st = mgr.begin_sequence("refuse", 1, budget_spec(spec), max_tokens=shortest - 1)
    assert isinstance(st.error, GuideLimitError) and st.error.limit == "max_tokens"
    assert st.error.value == shortest and f"needs {shortest} tokens" in str(st.error)
    assert st.history == []
    ok = mgr.begin_sequence("refuse", 2, budget_spec(spec), max_tokens=shortest)
    assert ok.error is None and ok.budget is not None
    mgr.end_session("refuse")


def test_non_dfa_constraints_are_refused_with_a_typed_error(mgr):
    with pytest.raises(UnsupportedGuideError, match="budget"):
        budget_spec(GuideSpec.grammar('root ::= "a"'))
    with pytest.raises(UnsupportedGuideError, match="budget"):
        budget_spec(GuideSpec.json_object())
    bounded = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}, "required": ["n"]}
    st = mgr.begin_sequence("rec", 1, budget_spec(GuideSpec.json_schema(bounded)), max_tokens=32)
    assert isinstance(st.error, UnsupportedGuideError) and "budget" in str(st.error)
    mgr.end_session("rec")


def test_budget_is_part_of_the_key_and_routes_to_fsm(mgr):
    spec = GuideSpec.regex("[a-z]+")
    bspec = budget_spec(spec)
    assert bspec.key != spec.key and bspec.option("backend") == "fsm" and bspec.option("fallback") is False
    assert mgr.get_compiled(bspec).backend == "fsm"


# ---- thinking -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def think_vocab():
    """SmolLM2 plus added ``<think>``/``</think>`` tokens (as in tests/engine_patch/conftest.py)."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from tokenrails import Vocabulary

    tok = AutoTokenizer.from_pretrained(str(Path(__file__).resolve().parents[1] / "fixtures" / "smollm2"))
    tok.add_tokens(["<think>", "</think>"], special_tokens=False)
    return Vocabulary.from_huggingface(tok)


def test_thinking_ends_in_time_and_the_answer_fits(think_vocab):
    """The model would think forever; the budget forces ``</think>`` while the answer still fits."""
    end = 49153  # "</think>" added after SmolLM2's 49,152 ids (tests/engine_patch/conftest.py)
    assert think_vocab.token_bytes[end] == b"</think>"
    mgr = GuidedDecodingManager(think_vocab, compile_workers=1)
    cfg = ReasoningConfig(end_ids=(end,), start_ids=(49152,))
    pattern = r"[0-9]{3}-[a-z]{2}"
    spec = budget_spec(GuideSpec.regex(pattern))
    answer = budget_table(mgr.get_compiled(spec)).start
    think_tok = think_vocab.token_bytes.index(b"hmm") if b"hmm" in think_vocab.token_bytes else 1000
    try:
        for budget in (answer + 1, answer + 4, answer + 20):
            row = GuidedRow("think", budget, spec, reasoning=cfg, max_tokens=budget)
            st = mgr.begin_sequence("think", budget, spec, reasoning=cfg, thinking_done=False, max_tokens=budget)
            assert st.error is None and st.thinking
            out = []
            for _ in range(budget):
                ids = allowed_ids(mgr.fill_rows([row]).bitmask[0], think_vocab.vocab_size).tolist()
                # keep thinking whenever allowed, then the longest answer token
                tok = think_tok if think_tok in ids else max(ids, key=lambda t: len(think_vocab.token_bytes[t]))
                status = mgr.accept_tokens([tok], [row])[0]
                assert not status.failed, status
                out.append(tok)
                if status.state is StepStatus.TERMINATED:
                    break
            assert out[-1] in think_vocab.eos_ids and len(out) <= budget
            cut = out.index(end)
            assert cut == budget - answer - 1  # thought as long as the answer still fit after </think>
            text = b"".join(think_vocab.token_bytes[t] for t in out[cut + 1:-1]).decode()
            assert re.fullmatch(pattern, text), text
            assert mgr.request_metrics("think", budget)["budget_closed"] is True
        st = mgr.begin_sequence("think", 0, spec, reasoning=cfg, thinking_done=False, max_tokens=answer)
        assert isinstance(st.error, GuideLimitError) and st.error.value == answer + 1
    finally:
        mgr.close()


def test_table_size_is_bounded_by_a_limit(vocab):
    from tokenrails.guided.limits import GuideLimits

    small = GuidedDecodingManager(vocab, compile_workers=1, limits=GuideLimits(max_budget_states=5))
    try:
        st = small.begin_sequence("big", 1, budget_spec(GuideSpec.regex(r"[a-z]{1,20}@x\.com")), max_tokens=64)
        assert isinstance(st.error, GuideLimitError) and st.error.limit == "max_budget_states"
    finally:
        small.close()


# ---- drafts -------------------------------------------------------------------------------------
def test_speculative_blocks_count_drafts_against_the_budget(mgr, vocab):
    """Block position j of a verification block masks as if the j drafts were emitted: equal to the
    mask of a sequence that accepted them; a draft the budget excludes ends the valid drafts."""
    spec = budget_spec(GuideSpec.regex(r"(ab|cd)+x[0-9]{2,6}"))
    table = budget_table(mgr.get_compiled(spec))
    budget = table.start + 2
    ab = vocab.token_bytes.index(b"ab")
    drafts = [ab, ab, ab, ab]  # each grammar-valid; the budget has room for two "ab" beyond the shortest
    row = GuidedRow("spec", 1, spec, max_tokens=budget)
    logits = torch.zeros((1 + len(drafts), vocab.vocab_size))
    status = mgr.fill_and_apply_spec(logits, [row], [drafts])[0]
    assert mgr.sequence("spec", 1).history == []  # rolled back
    for j in range(len(drafts) + 1):
        ref = GuidedRow("spec-ref", j, spec, max_tokens=budget)
        for t in drafts[:j]:
            mgr.accept_tokens([t], [ref])
        want = allowed_ids(mgr.fill_rows([ref]).bitmask[0], vocab.vocab_size)
        got = torch.nonzero(torch.isfinite(logits[j])).reshape(-1)
        assert torch.equal(got, want), j
    assert status.valid_drafts == 3
    assert ab in torch.nonzero(torch.isfinite(logits[2])).reshape(-1).tolist()
    assert ab not in torch.nonzero(torch.isfinite(logits[3])).reshape(-1).tolist()
    mgr.end_session("spec"), mgr.end_session("spec-ref")


def test_optional_thinking_opens_only_while_it_can_still_close(think_vocab):
    start, end = 49152, 49153
    mgr = GuidedDecodingManager(think_vocab, compile_workers=1)
    cfg = ReasoningConfig(end_ids=(end,), start_ids=(start,), optional=True)
    spec = budget_spec(GuideSpec.regex(r"[0-9]{3}"))
    answer = budget_table(mgr.get_compiled(spec)).start
    try:
        for budget, may_open in ((answer, False), (answer + 1, False), (answer + 2, True)):
            row = GuidedRow("opt", budget, spec, reasoning=cfg, max_tokens=budget)
            st = mgr.begin_sequence("opt", budget, spec, reasoning=cfg, max_tokens=budget)
            assert st.error is None and st.phase.think.opening
            ids = allowed_ids(mgr.fill_rows([row]).bitmask[0], think_vocab.vocab_size).tolist()
            assert (start in ids) is may_open, budget  # <think> + </think> + the answer must fit
            assert any(think_vocab.token_bytes[t] == b"1" for t in ids)
    finally:
        mgr.close()


# ---- jump-forward -------------------------------------------------------------------------------
def test_a_jump_whose_tokenization_would_not_fit_is_not_taken(mgr, vocab):
    """The forced text spelled one character per token takes more tokens than the shortest path:
    with a budget of exactly the shortest, the jump is refused (and taken with room to spare)."""
    from tokenrails.guided.jump_forward import compute_jump_forward

    single = {vocab.token_bytes[t]: t for t in range(vocab.vocab_size)
              if len(vocab.token_bytes[t]) == 1 and t not in vocab.special_ids}

    def per_char(text):
        return [single[c.encode()] for c in text]

    spec = budget_spec(GuideSpec.regex("abcdefgh"))
    shortest = budget_table(mgr.get_compiled(spec)).start
    assert shortest < 9  # "abcdefgh" is fewer than 8 tokens + EOS under this vocabulary
    tight = mgr.begin_sequence("jump", 1, spec, max_tokens=shortest)
    jf = compute_jump_forward(tight, vocab, per_char)
    assert jf.text == "abcdefgh" and jf.token_ids == ()
    loose = mgr.begin_sequence("jump", 2, spec, max_tokens=9)
    jf = compute_jump_forward(loose, vocab, per_char)
    assert jf.token_ids == tuple(per_char("abcdefgh"))
    assert loose.apply_jump(jf.rollback_tokens, jf.token_ids).state is StepStatus.OK
    mgr.end_session("jump")


def test_a_step_past_the_budget_ends_the_row_with_a_typed_error(mgr, vocab):
    """If an engine keeps stepping past the budget it gave (a mismatched count), the row ends
    (EOS only, GuideLimitError) instead of running unconstrained by the budget."""
    spec = budget_spec(GuideSpec.regex("[a-z]+"))
    row = GuidedRow("over", 1, spec, max_tokens=1)
    a = vocab.token_bytes.index(b"a")
    st = mgr.begin_sequence("over", 1, spec, max_tokens=1)
    st.history.append(a)  # as if one token had been emitted outside the manager's view
    filled = mgr.fill_rows([row])
    assert allowed_ids(filled.bitmask[0], vocab.vocab_size).tolist() == list(vocab.eos_ids)
    assert isinstance(filled.statuses[0].error, GuideLimitError) and filled.statuses[0].error.limit == "max_tokens"
    mgr.end_session("over")


def test_native_table_calls_check_their_arguments(mgr):
    walker = mgr.get_compiled(budget_spec(GuideSpec.regex("[a-z]+"))).index.walker
    n = mgr.get_compiled(budget_spec(GuideSpec.regex("[a-z]+"))).dfa.num_states
    with pytest.raises(ValueError):
        walker.budget_table(np.empty(n + 1, np.int32), np.empty(n, np.int32), 100)
    with pytest.raises((ValueError, BufferError, TypeError)):
        walker.budget_table(np.empty(n, np.int32)[::-1], np.empty(n, np.int32), 100)
    with pytest.raises(OverflowError):
        walker.budget_table(np.empty(n, np.int32), np.empty(n, np.int32), 0)
    out = torch.zeros(walker.words, dtype=torch.int32)
    with pytest.raises(ValueError):
        walker.fill_within(1, np.zeros(n - 1, np.int32), 3, out.data_ptr(), walker.words)
    with pytest.raises(ValueError):
        walker.fill_within(n, np.zeros(n, np.int32), 3, out.data_ptr(), walker.words)
    with pytest.raises(ValueError):
        walker.fill_within(1, np.zeros(n, np.int32), 3, out.data_ptr(), walker.words - 1)
    assert walker.fill_within(1, np.full(n, 5, np.int32), 4, out.data_ptr(), walker.words) == 0
    assert not out.any()  # nothing finishes within 4: an empty row, EOS included (state 1 rejects "")


@pytest.mark.parametrize("pattern", [r"(ab|cd)+x[0-9]{2,6}", r"[a-z]{1,8}@x\.(com|org)"])
def test_numpy_path_equals_the_native_walker(mgr, vocab, pattern):
    """Without the C module (``TOKENRAILS_NATIVE=0``) the table and the restricted rows are the same."""
    from tokenrails.guided.backends.fsm_backend import FSMGuide
    from tokenrails.guided.budget import Budget
    from tokenrails.guided.fsm.token_index import TokenIndex

    native = mgr.get_compiled(budget_spec(GuideSpec.regex(pattern)))
    index = TokenIndex(native.dfa, vocab, use_native=False)
    plain = FSMGuide(native.spec, vocab, native.dfa, index, native.regex)
    a, b = budget_table(native), budget_table(plain)
    assert np.array_equal(a.dist, b.dist) and np.array_equal(a.maxnext, b.maxnext) and a.edges == b.edges
    slow = Budget(64, plain, b)
    out = torch.zeros((1, native.index.words), dtype=torch.int32)
    for state in range(1, min(native.dfa.num_states, 8)):
        for bound in (-1, 0, 1, 3, int(a.maxnext[state])):
            native.index.walker.fill_within(state, a.dist, bound, out.data_ptr(), out.shape[1])
            assert torch.equal(slow._numpy_row(state, bound), out[0]), (state, bound)


def test_output_finished_exactly_at_the_budget_is_not_an_error(mgr, vocab, smollm2_tokenizer):
    """An engine may fill a row once more after it emitted EOS (LMDeploy does, a step ahead): an
    output that completed on its last budgeted token stays a success, not "max_tokens exhausted"."""
    ids = smollm2_tokenizer.encode("ab", add_special_tokens=False)
    row = GuidedRow("exact", 1, budget_spec(GuideSpec.regex("ab")), max_tokens=len(ids) + 1)
    try:
        for tok in ids + [vocab.eos_ids[0]]:
            mgr.fill_rows([row])
            status = mgr.accept_tokens([tok], [row])[0]
            assert not status.failed, status
        assert status.state is StepStatus.TERMINATED
        mgr.fill_rows([row])
        assert mgr.sequence("exact", 1).error is None
    finally:
        mgr.release("exact", 1)
