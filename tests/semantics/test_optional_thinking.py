"""Optional thinking: the model opens ``<think>`` itself or answers directly, constrained either way.

Every mask is compared bit for bit with an independent oracle of the documented rule
(docs/semantics.md section 1): output whose tokens begin with the start marker (ids, or bytes in
text mode) is a thinking section, anything else is the answer and must follow the grammar from
its first token.
"""
import json
import random
import re
import zlib

import jsonschema
import pytest
import torch

from tokenrails import GuideSpec, InvalidGuideError, compile_guide
from tokenrails.guided.manager import GuidedRow, ReasoningConfig, StepStatus

from .helpers import BACKENDS, allowed_set, make_manager, mask_row, tok, worst_allowed, worst_step

START, END = "<think>", "</think>"
# "<" (the start marker's first token) is also a valid start of the answer: both readings stay
# open while "<think" is being emitted.
ANGLE_REGEX = r"(<[a-z]{1,6}>)?[0-9]{1,3}"
RECORD_REGEX = r'\{"id": [0-9]{1,3}, "tag": "(red|green|blue)"\}'
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["name", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def markers(smollm2_tokenizer):
    start = tuple(smollm2_tokenizer.encode(START, add_special_tokens=False))
    end = tuple(smollm2_tokenizer.encode(END, add_special_tokens=False))
    assert len(start) == 3 and len(end) == 3  # '<' 'think' '>' / '</' 'think' '>'
    return start, end


def config(markers, mode, **kw):
    start, end = markers
    if mode == "ids":
        return ReasoningConfig.from_markers(list(end), start=list(start), optional=True, **kw)
    return ReasoningConfig.from_markers(END, start=START, optional=True, **kw)


class Oracle:
    """The allowed set after ``gen``, from the rule alone (no tracker code)."""

    def __init__(self, vocab, spec, backend, mode, markers, cap=None):
        """``markers``: (start ids, end ids) in ids mode, (start text, end text) in text mode."""
        self.vocab, self.mode, self.cap = vocab, mode, cap
        self.guide = compile_guide(spec, vocab, backend)
        if mode == "text" and not isinstance(markers[0], str):
            markers = (START, END)
        self.start = markers[0] if mode == "ids" else markers[0].encode()
        self.end = markers[1] if mode == "ids" else markers[1].encode()
        self.eos = set(vocab.eos_ids)

    def split(self, gen):
        """("open", None) undecided; ("think", thinking tokens) or ("answer", answer tokens)."""
        gen = list(gen)
        if self.mode == "ids":
            S, E = list(self.start), list(self.end)
            if len(gen) < len(S) and gen == S[: len(gen)]:
                return "open", None
            if gen[: len(S)] != S:
                return "answer", gen
            body = gen[len(S):]
            for i in range(len(body) - len(E) + 1):
                if body[i: i + len(E)] == E:
                    return "answer", body[i + len(E):]
            return "think", body
        data = b"".join(self.vocab.token_bytes[t] for t in gen)
        if len(data) < len(self.start) and self.start.startswith(data) and all(self.vocab.token_bytes[t] for t in gen):
            return "open", None
        if not data.startswith(self.start):
            return "answer", gen
        acc = b""
        for i, t in enumerate(gen):
            acc += self.vocab.token_bytes[t]
            if len(acc) > len(self.start) and self.end in acc[len(self.start):]:
                return "answer", gen[i + 1:]
        return "think", gen

    def grammar(self, answer):
        """The grammar's allowed set after ``answer`` (None when it refuses ``answer``)."""
        m = self.guide.matcher()
        for t in answer:
            if m.is_terminated() or not m.accept_token(t):
                return None
        return allowed_set(mask_row(m, self.vocab), self.vocab.vocab_size)

    def check(self, gen, allowed):
        """Assert the manager's allowed set after ``gen``."""
        forced = self.forced_rest(gen)
        if forced is None:
            assert torch.equal(allowed, self.allowed(gen))
            return
        (t,) = allowed.nonzero().reshape(-1).tolist()  # exactly one token: the marker's next
        d = self.vocab.token_bytes[t] if self.mode == "text" else (t,)
        assert d and tuple(forced[: len(d)]) == tuple(d)

    def forced_rest(self, gen):
        """At the thinking cap: what remains of the end marker (None below the cap)."""
        kind, _ = self.split(gen)
        if self.cap is None or kind != "think":
            return None
        if self.mode == "ids":
            head, body, E = [], list(gen[len(self.start):]), list(self.end)
        else:
            i, acc = 0, b""
            while len(acc) < len(self.start):
                acc += self.vocab.token_bytes[gen[i]]
                i += 1
            head, body, E = acc[len(self.start):], gen[i:], self.end
        if len(body) < self.cap:
            return None
        seen = (list(head) if self.mode == "ids" else head)
        for t in body[: self.cap]:
            seen = seen + ([t] if self.mode == "ids" else self.vocab.token_bytes[t])
        k = max(j for j in range(len(E)) if j == 0 or tuple(seen[len(seen) - j:]) == tuple(E[:j]))
        done = [] if self.mode == "ids" else b""
        for t in body[self.cap:]:
            done = done + ([t] if self.mode == "ids" else self.vocab.token_bytes[t])
        rest = E[k:]
        assert tuple(rest[: len(done)]) == tuple(done)
        return rest[len(done):]

    def allowed(self, gen):
        kind, part = self.split(gen)
        v = self.vocab
        if kind == "answer":
            row = self.grammar(part)
            assert row is not None, "the manager let the answer leave the grammar"
            return row
        ok = torch.zeros(v.vocab_size, dtype=torch.bool)
        if kind == "think":
            ok[: v.num_tokens] = True
            ok[list(self.eos)] = False
            if self.mode == "text":
                body = b"".join(v.token_bytes[t] for t in part)[len(self.start):]
                tail = body[-(len(self.end) - 1):] if len(self.end) > 1 else b""
                for t, d in enumerate(v.token_bytes):
                    j = (tail + d).find(self.end)
                    if j >= 0 and j + len(self.end) < len(tail + d):
                        ok[t] = False
            return ok
        # undecided: the marker's continuation, plus the grammar's row if it took the prefix
        k = len(gen) if self.mode == "ids" else len(b"".join(v.token_bytes[t] for t in gen))
        if self.mode == "ids":
            ok[self.start[k]] = True
        else:
            rest = self.start[k:]
            for t, d in enumerate(v.token_bytes):
                if not d or t in self.eos:
                    continue
                if rest.startswith(d):
                    ok[t] = True
                elif d.startswith(rest):
                    after = d[len(rest):]
                    j = after.find(self.end)
                    ok[t] = j < 0 or j + len(self.end) == len(after)
        g = self.grammar(gen)
        return ok | g if g is not None else ok

    def thought(self, gen) -> bool:
        """Whether ``gen`` opened a thinking section."""
        if self.mode == "ids":
            return tuple(gen[: len(self.start)]) == tuple(self.start)
        return b"".join(self.vocab.token_bytes[t] for t in gen).startswith(self.start)

    def answer_text(self, gen):
        kind, part = self.split(gen)
        assert kind == "answer", kind
        return b"".join(self.vocab.token_bytes[t] for t in part if t not in self.eos).decode()


def run(mgr, vocab, row, oracle, pick, *, max_steps=80, check=True, prefix=()):
    """Decode with ``pick(step, allowed, logits)`` after the already accepted ``prefix``; every
    mask is checked against the oracle. Returns prefix + generated tokens."""
    gen_ids = list(prefix)
    g = torch.Generator().manual_seed(zlib.crc32(str(row.session_id).encode()))
    for i in range(max_steps):
        logits = torch.randn((1, vocab.vocab_size), generator=g)
        (st,) = mgr.fill_and_apply(logits, [row])
        assert st.state is StepStatus.OK
        allowed = torch.isfinite(logits[0])
        if check:
            oracle.check(gen_ids, allowed)
        t = pick(i, allowed, logits[0], gen_ids)
        assert allowed[t]
        (acc,) = mgr.accept_tokens([t], [row])
        gen_ids.append(t)
        if acc.state is StepStatus.TERMINATED:
            return gen_ids
        assert acc.state is StepStatus.OK, acc
    raise AssertionError("did not terminate")


def prefer(tokens_at):
    """A sampler that takes ``tokens_at(i)`` when given and allowed, else the worst allowed."""
    def pick(i, allowed, logits, gen):
        t = tokens_at(i)
        return t if t is not None else worst_allowed(logits)
    return pick


# ---- config and prompt -------------------------------------------------------------------------
def test_optional_needs_a_start_marker(markers):
    with pytest.raises(InvalidGuideError):
        ReasoningConfig.from_markers(END, optional=True)
    with pytest.raises(InvalidGuideError):
        ReasoningConfig.from_markers(list(markers[1]), start=START, optional=True)  # ids mode, text start
    assert ReasoningConfig.from_markers(list(markers[1]), start=list(markers[0]), optional=True).optional


@pytest.mark.parametrize(
    "prompt, expect",
    [
        ("<|im_start|>assistant\n", "open"),                                         # template leaves it to the model
        ("<think>a</think>b<|im_end|>\n<|im_start|>assistant\n", "open"),             # closed earlier turn
        ("<|im_start|>assistant\n<think>\n", "think"),                                # template opened it
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", "done"),                   # thinking switched off
        (None, "open"),
    ],
)
@pytest.mark.parametrize("mode", ["ids", "text"])
def test_prompt_decides_who_opens_the_section(vocab, smollm2_tokenizer, markers, mode, prompt, expect):
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex("[0-9]+")
    cfg = config(markers, mode)
    ids = smollm2_tokenizer.encode(prompt, add_special_tokens=False) if prompt is not None else None
    st = mgr.begin_sequence("p", 0, spec, reasoning=cfg, prompt_token_ids=ids)
    got = "open" if st.phase.think.opening else ("done" if st.phase.think.done else "think")
    assert got == expect
    assert st.error is None and st.phase is not None
    st = mgr.begin_sequence("p", 1, spec, reasoning=cfg, prompt_token_ids=ids, thinking_done=False)
    assert st.phase.think.thinking  # the explicit flag still wins


def test_from_tokenizer_optional(smollm2_tokenizer, vocab):
    cfg = ReasoningConfig.from_tokenizer(smollm2_tokenizer, optional=True)
    assert cfg.optional and cfg.match == "text" and cfg.start_text == START
    mgr = make_manager(vocab, "xgrammar")
    assert mgr.begin_sequence("t", 0, GuideSpec.regex("[0-9]+"), reasoning=cfg).phase.think.opening


# ---- the decision ------------------------------------------------------------------------------
def _decision_case(vocab, markers, backend, mode, regex, tag):
    """(manager, spec, oracle, optional-thinking row) for one regex on one backend."""
    spec = GuideSpec.regex(regex)
    row = GuidedRow(f"{tag}-{backend}-{mode}-{len(regex)}", 0, spec, reasoning=config(markers, mode))
    return make_manager(vocab, backend), spec, Oracle(vocab, spec, backend, mode, markers), row


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["ids", "text"])
@pytest.mark.parametrize("regex", [RECORD_REGEX, ANGLE_REGEX])
def test_a_model_opens_the_thinking_section(vocab, markers, backend, mode, regex):
    """(a) start marker first, adversarial thinking (grammar-illegal text), end marker, answer."""
    mgr, spec, oracle, row = _decision_case(vocab, markers, backend, mode, regex, "a")
    script = [*markers[0], tok(vocab, "}"), tok(vocab, "<"), *[None] * 8, *markers[1]]
    out = run(mgr, vocab, row, oracle, prefer(lambda i: script[i] if i < len(script) else None))
    assert re.fullmatch(regex, oracle.answer_text(out))
    fin = mgr.finalize(row.session_id, 0)
    assert fin.finish_reason == "stop" and fin.complete


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["ids", "text"])
@pytest.mark.parametrize("regex", [RECORD_REGEX, ANGLE_REGEX])
def test_b_model_answers_directly_and_is_constrained_from_the_first_token(vocab, markers, backend, mode, regex):
    mgr, spec, oracle, row = _decision_case(vocab, markers, backend, mode, regex, "b")
    ref = compile_guide(spec, vocab, backend).matcher()
    first = allowed_set(mask_row(ref, vocab), vocab.vocab_size)
    first[markers[0][0]] = False  # a grammar token that does not begin the marker

    def pick(i, allowed, logits, gen):
        if i == 0:
            return worst_allowed(torch.where(first, logits, torch.inf))
        return worst_allowed(logits)

    out = run(mgr, vocab, row, oracle, pick)
    state = mgr.sequence(row.session_id, 0)
    assert state.phase.think.done and state.phase.answer == out  # every token went through the grammar
    for t in out:  # and the grammar alone produced it: each was allowed by the reference matcher
        assert allowed_set(mask_row(ref, vocab), vocab.vocab_size)[t]
        assert ref.accept_token(t)
    assert re.fullmatch(regex, oracle.answer_text(out))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["ids", "text"])
def test_c_worst_case_tokens_throughout(vocab, markers, backend, mode):
    """Random adversarial samplers, some biased towards the marker for a few tokens and then
    abandoning it (the answer then starts with a prefix of the marker): masks equal the oracle
    at every step and the answer always validates."""
    mgr = make_manager(vocab, backend)
    spec = GuideSpec.regex(ANGLE_REGEX)
    oracle = Oracle(vocab, spec, backend, mode, markers, cap=4)
    cfg = config(markers, mode, max_thinking_tokens=4)  # the cap ends every thinking section
    text_marker = [tok(vocab, "<"), tok(vocab, "thin"), tok(vocab, "k"), tok(vocab, "></")]
    outcomes = set()
    for seed in range(8):
        rng = random.Random(seed)
        path = list(markers[0]) if mode == "ids" else text_marker
        follow = (0, 1, 2, len(path))[seed % 4]  # tokens of the marker to take first

        def pick(i, allowed, logits, gen, follow=follow, path=path, rng=rng):
            if i < follow and allowed[path[i]]:
                return path[i]
            if rng.random() < 0.15:
                return int(rng.choice(allowed.nonzero().reshape(-1).tolist()))
            return worst_allowed(logits)

        row = GuidedRow(f"c-{backend}-{mode}-{seed}", 0, spec, reasoning=cfg)
        out = run(mgr, vocab, row, oracle, pick, max_steps=120)
        assert re.fullmatch(ANGLE_REGEX, oracle.answer_text(out))
        outcomes.add((oracle.thought(out), follow > 0))
    assert outcomes >= {(True, True), (False, True), (False, False)}  # thought / answered after a
    # partial marker / answered directly


@pytest.mark.parametrize("mode", ["ids", "text"])
def test_json_schema_either_way(vocab, markers, mode):
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.json_schema(SCHEMA, any_whitespace=False)
    oracle = Oracle(vocab, spec, "xgrammar", mode, markers)
    cfg = config(markers, mode)
    think = [*markers[0], tok(vocab, "hello"), *markers[1]]
    for name, script in (("think", think), ("direct", [tok(vocab, "{\"")])):
        row = GuidedRow(f"j-{mode}-{name}", 0, spec, reasoning=cfg)
        out = run(mgr, vocab, row, oracle, prefer(lambda i, s=script: s[i] if i < len(s) else None), max_steps=200)
        jsonschema.validate(json.loads(oracle.answer_text(out)), SCHEMA)


def test_text_marker_completed_by_a_token_that_starts_the_end_marker(vocab, markers):
    """'>' + '</' in one token: the start marker completes and the end marker is half-seen."""
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex("[0-9]+")
    row = GuidedRow("tx", 0, spec, reasoning=config(markers, "text"))
    for t in (tok(vocab, "<"), tok(vocab, "think"), tok(vocab, "></"), tok(vocab, "think")):
        (acc,) = mgr.accept_tokens([t], [row])
        assert acc.state is StepStatus.OK
    state = mgr.sequence("tx", 0)
    assert state.phase.think.thinking and state.phase.think.pos == len("</think")
    mgr.accept_tokens([tok(vocab, ">")], [row])
    assert state.phase.think.done and state.phase.answer == []


@pytest.mark.parametrize("mode", ["ids", "text"])
def test_token_neither_marker_nor_grammar_is_rejected(vocab, markers, mode):
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex("[0-9]+")
    row = GuidedRow("r", 0, spec, reasoning=config(markers, mode))
    (acc,) = mgr.accept_tokens([tok(vocab, "hello")], [row])
    assert acc.state is StepStatus.REJECTED and mgr.finalize("r", 0).finish_reason == "error"
    # a partial marker the grammar refused must be completed
    row = GuidedRow("r2", 0, spec, reasoning=config(markers, mode))
    mgr.accept_tokens([markers[0][0]], [row])
    logits = torch.zeros((1, vocab.vocab_size))
    mgr.fill_and_apply(logits, [row])
    assert not torch.isfinite(logits[0, tok(vocab, "5")])
    (acc,) = mgr.accept_tokens([tok(vocab, "5")], [row])
    assert acc.state is StepStatus.REJECTED


@pytest.mark.parametrize("mode", ["ids", "text"])
def test_eos_only_when_the_answer_is_complete(vocab, markers, mode):
    mgr = make_manager(vocab, "xgrammar")
    eos = list(vocab.eos_ids)
    cfg = config(markers, mode)
    # the grammar needs a digit: no EOS at the decision point, nor after a partial marker
    spec = GuideSpec.regex("[0-9]+")
    row = GuidedRow("e", 0, spec, reasoning=cfg)
    for i in range(2):
        logits = torch.zeros((1, vocab.vocab_size))
        mgr.fill_and_apply(logits, [row])
        assert not torch.isfinite(logits[0, eos]).any()
        (acc,) = mgr.accept_tokens([markers[0][i]], [row])
        assert acc.state is StepStatus.OK
    (acc,) = mgr.accept_tokens([eos[0]], [row])
    assert acc.state is StepStatus.REJECTED
    # the empty answer is complete: EOS is the grammar's choice at the decision point
    spec = GuideSpec.regex("[0-9]*")
    row = GuidedRow("e2", 0, spec, reasoning=cfg)
    logits = torch.zeros((1, vocab.vocab_size))
    mgr.fill_and_apply(logits, [row])
    assert torch.isfinite(logits[0, eos]).all()
    (acc,) = mgr.accept_tokens([eos[0]], [row])
    assert acc.state is StepStatus.TERMINATED
    fin = mgr.finalize("e2", 0)
    assert fin.finish_reason == "stop" and fin.complete


@pytest.mark.parametrize("mode", ["ids", "text"])
def test_cap_counts_after_the_start_marker(vocab, markers, mode):
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex("[0-9]+")
    cfg = config(markers, mode, max_thinking_tokens=0)
    row = GuidedRow("cap", 0, spec, reasoning=cfg)
    logits = torch.zeros((1, vocab.vocab_size))
    mgr.fill_and_apply(logits, [row])
    assert torch.isfinite(logits[0]).sum() > 2  # undecided: not forced
    for t in markers[0]:
        mgr.accept_tokens([t], [row])
    forced = []
    state = mgr.sequence("cap", 0)
    while not state.phase.think.done:
        logits = torch.zeros((1, vocab.vocab_size))
        mgr.fill_and_apply(logits, [row])
        (t,) = torch.isfinite(logits[0]).nonzero().reshape(-1).tolist()
        mgr.accept_tokens([t], [row])
        forced.append(t)
    assert b"".join(vocab.token_bytes[t] for t in forced) == END.encode()


def test_batch_of_mixed_rows_equals_single_rows(vocab, markers):
    """An undecided row among grammar and thinking rows (the grouped fill path)."""
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex(ANGLE_REGEX)
    rows = [GuidedRow("m0", 0, spec, reasoning=config(markers, "ids")),
            GuidedRow("m1", 0, spec),
            GuidedRow("m2", 0, spec, reasoning=config(markers, "text")),
            GuidedRow("m3", 0, spec, reasoning=ReasoningConfig.from_markers(END))]
    mgr.accept_tokens([markers[0][0]] * 4, rows)  # '<' everywhere: undecided+fed, grammar, fed, thinking
    batch = torch.zeros((4, vocab.vocab_size))
    mgr.fill_and_apply(batch, rows)
    for i, r in enumerate(rows):
        single = torch.zeros((1, vocab.vocab_size))
        mgr.fill_and_apply(single, [r])
        assert torch.equal(torch.isfinite(batch[i]), torch.isfinite(single[0]))
    assert torch.equal(torch.isfinite(batch[0]), torch.isfinite(batch[1]) | _one_hot(vocab, markers[0][1]))


def _one_hot(vocab, t):
    x = torch.zeros(vocab.vocab_size, dtype=torch.bool)
    x[t] = True
    return x


# ---- speculative decoding, rollback, jump-forward ---------------------------------------------
def _state(mgr, row):
    """The row's state, started (as a step would) on first sight."""
    st = mgr.sequence(row.session_id, row.seq_id)
    return st if st is not None else mgr.begin_sequence(row.session_id, row.seq_id, row.spec,
                                                        reasoning=row.reasoning)


def _raw_mask(mgr, row):
    """The row's packed bitmask as filled now (bit-exact comparisons)."""
    st = _state(mgr, row)
    buf = torch.zeros((1, mgr.step.buffer.words), dtype=torch.int32)
    st.fill(buf, 0)
    return buf[0].clone()


def _snapshot(mgr, row):
    st = _state(mgr, row)
    return st.phase.think, list(st.phase.answer), _raw_mask(mgr, row)


def _expected_rows(vocab, oracle, prefix, drafts):
    eos_only = torch.zeros(vocab.vocab_size, dtype=torch.bool)
    eos_only[list(vocab.eos_ids)] = True
    rows, valid, dead = [], 0, False
    for j in range(len(drafts) + 1):
        if dead:
            rows.append(eos_only)
            continue
        rows.append(oracle.allowed(list(prefix) + list(drafts[:j])))
        if j < len(drafts):
            if rows[-1][drafts[j]]:
                valid += 1
            else:
                dead = True
    return rows, valid


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["ids", "text"])
def test_speculative_drafts_cross_the_decision(vocab, markers, backend, mode):
    """Verification masks equal the one-token-at-a-time oracle across the decision point (start
    marker among the drafts, tentatively fed marker prefix dropped and re-accepted, answer among
    the drafts); the state is bit-identical afterwards; accepting equals stepping."""
    mgr = make_manager(vocab, backend)
    spec = GuideSpec.regex(ANGLE_REGEX)
    oracle = Oracle(vocab, spec, backend, mode, markers)
    cfg = config(markers, mode)
    S, E = list(markers[0]), list(markers[1])
    digits = [tok(vocab, "4"), tok(vocab, "2")]
    think = [tok(vocab, "hello"), tok(vocab, "}")]
    paths = [S + think + E + digits, digits, [S[0], tok(vocab, "abc"), tok(vocab, ">"), *digits],
             S[:2] + [tok(vocab, ">")] + think + E + [S[0], tok(vocab, "ab"), tok(vocab, ">"), digits[0]]]
    if mode == "text":
        paths.append([tok(vocab, "<"), tok(vocab, "thin"), tok(vocab, "k"), tok(vocab, "></"),
                      tok(vocab, "think"), tok(vocab, ">"), *digits])
    rng = random.Random(5)
    trials = [(p, i, k) for p in paths for i in range(0, 4) for k in (len(p),)]
    rng.shuffle(trials)
    n = 0
    for path, p, k in trials:
        prefix, drafts = path[:p], list(path[p:])
        if n % 3 == 2 and drafts:  # corrupt one draft
            drafts[rng.randrange(len(drafts))] = tok(vocab, "hello")
        n += 1
        sid = f"s-{backend}-{mode}-{n}"
        row, twin = GuidedRow(sid, 0, spec, reasoning=cfg), GuidedRow(sid, 1, spec, reasoning=cfg)
        for t in prefix:
            accs = mgr.accept_tokens([t, t], [row, twin])
            assert all(a.state is StepStatus.OK for a in accs)
        before = _snapshot(mgr, row)
        logits = torch.zeros((1 + len(drafts), vocab.vocab_size))
        (st,) = mgr.fill_and_apply_spec(logits, [row], [drafts])
        rows, valid = _expected_rows(vocab, oracle, prefix, drafts)
        assert st.valid_drafts == valid
        for j, expect in enumerate(rows):
            assert torch.equal(torch.isfinite(logits[j]), expect), (path, p, j)
        after = _snapshot(mgr, row)
        assert before[:2] == after[:2] and torch.equal(before[2], after[2])  # exact rollback
        assert mgr.validate_drafts(sid, 0, spec, drafts) == valid
        assert torch.equal(_snapshot(mgr, row)[2], before[2])
        (acc,) = mgr.accept_tokens_spec([drafts[:valid]], [row])
        assert acc.state is StepStatus.OK and acc.accepted == valid
        for t in drafts[:valid]:
            mgr.accept_tokens([t], [twin])
        a, b = _snapshot(mgr, row), _snapshot(mgr, twin)
        assert a[:2] == b[:2] and torch.equal(a[2], b[2])
        assert torch.equal(allowed_set(a[2], vocab.vocab_size), oracle.allowed(prefix + drafts[:valid]))


@pytest.mark.parametrize("mode", ["ids", "text"])
def test_marker_completion_rolls_the_grammar_back_to_its_start(vocab, markers, mode):
    """'<' is fed to the grammar tentatively; completing the marker rolls it back: after the
    thinking section the grammar's row is the fresh start row, bit for bit."""
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex(ANGLE_REGEX)
    row = GuidedRow("rb", 0, spec, reasoning=config(markers, mode))
    fresh = mask_row(compile_guide(spec, vocab, "xgrammar").matcher(), vocab)
    mgr.accept_tokens([markers[0][0]], [row])
    st = mgr.sequence("rb", 0)
    assert st.phase.think.opening and st.phase.think.fed == 1 and st.phase.answer == [markers[0][0]]
    for t in [*markers[0][1:], tok(vocab, "x"), *markers[1]]:
        (acc,) = mgr.accept_tokens([t], [row])
        assert acc.state is StepStatus.OK
    assert st.phase.think.done and st.phase.answer == []
    assert torch.equal(_raw_mask(mgr, row), fresh)


def test_no_jump_forward_while_undecided(vocab, smollm2_tokenizer, markers):
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex(r"<abc>[0-9]")  # the grammar forces '<abc>' ... but '<' may open <think>
    cfg = config(markers, "ids")
    row = GuidedRow("jf", 0, spec, reasoning=cfg)
    mgr.begin_sequence("jf", 0, spec, reasoning=cfg)
    assert mgr.jump_forward("jf", 0, spec, smollm2_tokenizer).is_noop
    mgr.accept_tokens([tok(vocab, "<")], [row])
    st = mgr.sequence("jf", 0)
    assert st.phase.think.opening and st.phase.think.fed == 1  # both readings open: still no jump
    assert mgr.jump_forward("jf", 0, spec, smollm2_tokenizer).is_noop
    with pytest.raises(ValueError):
        from tokenrails.guided.jump_forward import JumpForward

        mgr.apply_jump_forward("jf", 0, spec, JumpForward("<", (tok(vocab, "<"),), 1))
    mgr.accept_tokens([tok(vocab, "ab")], [row])  # the answer: decided
    assert st.phase.think.done
    jf = mgr.jump_forward("jf", 0, spec, smollm2_tokenizer)
    assert jf.text == "c>" and jf.token_ids is not None
    (acc,) = [mgr.apply_jump_forward("jf", 0, spec, jf)]
    assert acc.state is StepStatus.OK
    assert b"".join(vocab.token_bytes[t] for t in st.phase.answer).startswith(b"<abc")
    g = torch.Generator().manual_seed(0)
    for _ in range(8):
        acc = worst_step(mgr, vocab, row, g)
        if acc.state is StepStatus.TERMINATED:
            break
    assert acc.state is StepStatus.TERMINATED
    text = b"".join(vocab.token_bytes[t] for t in st.phase.answer if t not in vocab.eos_ids).decode()
    assert re.fullmatch(r"<abc>[0-9]", text)


def test_text_start_completed_by_a_token_that_also_ends_the_section(vocab):
    """Markers '(' / ')': '()' opens and closes the section in one token (allowed: the answer
    starts on the next token boundary); '(),' would put ',' past the end marker (forbidden)."""
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex("[0-9]+")
    oracle = Oracle(vocab, spec, "xgrammar", "text", ("(", ")"))
    row = GuidedRow("br", 0, spec, reasoning=ReasoningConfig.from_markers(")", start="(", optional=True))
    logits = torch.zeros((1, vocab.vocab_size))
    mgr.fill_and_apply(logits, [row])
    allowed = torch.isfinite(logits[0])
    oracle.check([], allowed)
    both, straddle = tok(vocab, "()"), tok(vocab, "(),")
    assert allowed[tok(vocab, "(")] and allowed[both] and not allowed[straddle]
    (acc,) = mgr.accept_tokens([straddle], [GuidedRow("br", 1, spec, reasoning=row.reasoning)])
    assert acc.state is StepStatus.REJECTED
    mgr.accept_tokens([both], [row])
    st = mgr.sequence("br", 0)
    assert st.phase.think.done and st.phase.answer == []
    out = run(mgr, vocab, row, oracle, prefer(lambda i: None), prefix=[both])
    assert re.fullmatch("[0-9]+", oracle.answer_text(out))


@pytest.mark.parametrize("mode", ["ids", "text"])
def test_finalize_while_undecided(vocab, markers, mode):
    """A length stop before the model decided: the output is the answer (no full start marker),
    complete iff the grammar accepts it."""
    mgr = make_manager(vocab, "xgrammar")
    cfg = config(markers, mode)
    cases = [("[0-9]*", [], True, False), ("[0-9]+", [], False, False),
             ("<?[0-9]*", [markers[0][0]], True, False), ("<?[0-9]+", [markers[0][0]], False, False),
             ("[0-9]*", [markers[0][0]], False, True)]  # '<' refused by the grammar: must think
    for n, (regex, gen, complete, thinking) in enumerate(cases):
        spec = GuideSpec.regex(regex)
        row = GuidedRow(f"fin-{mode}", n, spec, reasoning=cfg)
        mgr.begin_sequence(f"fin-{mode}", n, spec, reasoning=cfg)
        for t in gen:
            (acc,) = mgr.accept_tokens([t], [row])
            assert acc.state is StepStatus.OK
        assert mgr.sequence(f"fin-{mode}", n).phase.think.opening
        fin = mgr.finalize(f"fin-{mode}", n, "length")
        assert (fin.finish_reason, fin.complete, fin.thinking) == (
            "length" if complete else "length_incomplete", complete, thinking), regex
