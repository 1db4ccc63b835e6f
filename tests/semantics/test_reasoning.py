"""Reasoning sections: free while thinking, constrained right after the end marker."""
import json
import re

import jsonschema
import pytest
import torch

from tokenrails import GuideSpec, InvalidGuideError
from tokenrails.guided.manager import GuidedRow, ReasoningConfig, StepStatus

from .helpers import BACKENDS, RECORD_REGEX, make_manager, mask_row, reference_matcher, text_of, tok, worst_allowed

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
END = "</think>"


@pytest.fixture(scope="module")
def end_ids(smollm2_tokenizer):
    ids = tuple(smollm2_tokenizer.encode(END, add_special_tokens=False))
    assert len(ids) > 1  # SmolLM2 has no </think> token: a multi-token marker
    return ids


def configs(end_ids, **kw):
    return {"ids": ReasoningConfig.from_markers(list(end_ids), **kw), "text": ReasoningConfig.from_markers(END, **kw)}


def free_row(vocab, generated: bytes, marker: bytes | None) -> torch.Tensor:
    """Oracle for a thinking row: everything but EOS and padding; in text mode also no token
    whose bytes complete the marker and continue past it."""
    ok = torch.zeros(vocab.vocab_size, dtype=torch.bool)
    ok[: vocab.num_tokens] = True
    ok[list(vocab.eos_ids)] = False
    if marker is not None:
        tail = generated[-(len(marker) - 1):] if len(marker) > 1 else b""
        for t, data in enumerate(vocab.token_bytes):
            joined = tail + data
            at = joined.find(marker)
            if at >= 0 and at + len(marker) < len(joined):
                ok[t] = False
    return ok


def step(mgr, vocab, row, gen, pick=None):
    logits = torch.randn((1, vocab.vocab_size), generator=gen)
    (st,) = mgr.fill_and_apply(logits, [row])
    token = worst_allowed(logits[0]) if pick is None else pick
    allowed = torch.isfinite(logits[0])
    (acc,) = mgr.accept_tokens([token], [row])
    return token, allowed, st, acc


def decode_rest(mgr, vocab, row, gen, max_steps=400):
    out = []
    for _ in range(max_steps):
        token, allowed, st, acc = step(mgr, vocab, row, gen)
        assert st.state is StepStatus.OK
        if acc.state is StepStatus.TERMINATED:
            return out
        assert acc.state is StepStatus.OK, acc
        out.append(token)
    raise AssertionError("did not terminate")


@pytest.mark.parametrize("mode", ["ids", "text"])
def test_arbitrary_thinking_then_valid_json(vocab, end_ids, mode):
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.json_schema(SCHEMA, any_whitespace=False)
    cfg = configs(end_ids)[mode]
    row = GuidedRow("s", 0, spec, reasoning=cfg)
    gen = torch.Generator().manual_seed(1)
    # grammar-illegal thinking text first, then adversarial free tokens
    illegal = [tok(vocab, "}"), tok(vocab, "]"), tok(vocab, "hello"), tok(vocab, "<"), tok(vocab, "/")]
    thought = b""
    marker = END.encode() if mode == "text" else None
    for i in range(30):
        token, allowed, st, acc = step(mgr, vocab, row, gen, pick=illegal[i] if i < len(illegal) else None)
        assert st.state is StepStatus.OK and acc.state is StepStatus.OK
        if i in (0, 3, 29):
            assert torch.equal(allowed, free_row(vocab, thought, marker))
        thought += vocab.token_bytes[token]
    state = mgr.sequence("s", 0)
    assert not state.phase.think.done and state.phase.answer == []
    for t in end_ids:
        _, _, _, acc = step(mgr, vocab, row, gen, pick=t)
        assert acc.state is StepStatus.OK
    assert state.phase.think.done
    # the first constrained mask is the grammar's start mask, bit for bit
    ref = reference_matcher(vocab, spec, "xgrammar")
    logits = torch.zeros((1, vocab.vocab_size))
    mgr.fill_and_apply(logits, [row])
    from .helpers import allowed_set

    assert torch.equal(torch.isfinite(logits[0]), allowed_set(mask_row(ref, vocab), vocab.vocab_size))
    out = decode_rest(mgr, vocab, row, gen)
    jsonschema.validate(json.loads(text_of(vocab, out)), SCHEMA)
    fin = mgr.finalize("s", 0)
    assert fin.finish_reason == "stop" and fin.complete


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["ids", "text"])
def test_thinking_then_regex_on_every_backend(vocab, end_ids, backend, mode):
    mgr = make_manager(vocab, backend)
    spec = GuideSpec.regex(RECORD_REGEX)
    row = GuidedRow("r", 0, spec, reasoning=configs(end_ids)[mode])
    gen = torch.Generator().manual_seed(7)
    for _ in range(12):
        _, _, st, acc = step(mgr, vocab, row, gen)
        assert acc.state is StepStatus.OK
    for t in end_ids:
        step(mgr, vocab, row, gen, pick=t)
    out = decode_rest(mgr, vocab, row, gen)
    assert re.fullmatch(RECORD_REGEX, text_of(vocab, out))


@pytest.mark.parametrize("mode", ["ids", "text"])
def test_end_marker_inside_a_multi_token_step(vocab, end_ids, mode):
    """The marker's last token and the first constrained tokens arrive in one step."""
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex(RECORD_REGEX)
    cfg = configs(end_ids)[mode]
    first = [tok(vocab, "{\""), tok(vocab, "id")]
    stepwise, batched = GuidedRow("a", 0, spec, reasoning=cfg), GuidedRow("b", 0, spec, reasoning=cfg)
    thinking = [tok(vocab, "hello"), *end_ids[:-1]]
    for t in thinking:
        mgr.accept_tokens([t, t], [stepwise, batched])
    # verification masks: position 0 is thinking, positions 1.. follow the grammar
    drafts = [end_ids[-1], *first]
    logits = torch.zeros((1 + len(drafts), vocab.vocab_size))
    (st,) = mgr.fill_and_apply_spec(logits, [batched], [drafts])
    assert st.valid_drafts == len(drafts)
    ref = reference_matcher(vocab, spec, "xgrammar")
    from .helpers import allowed_set

    generated = b"".join(vocab.token_bytes[t] for t in thinking)
    expect = free_row(vocab, generated, END.encode() if mode == "text" else None)
    assert torch.equal(torch.isfinite(logits[0]), expect)  # free (thinking) row
    for j, t in enumerate(first):
        assert torch.equal(torch.isfinite(logits[1 + j]), allowed_set(mask_row(ref, vocab), vocab.vocab_size))
        assert ref.accept_token(t)
    assert torch.equal(torch.isfinite(logits[-1]), allowed_set(mask_row(ref, vocab), vocab.vocab_size))
    # accept marker end + constrained tokens in one step == one at a time
    (acc,) = mgr.accept_tokens_spec([drafts], [batched])
    assert acc.state is StepStatus.OK and acc.accepted == len(drafts)
    for t in drafts:
        mgr.accept_tokens([t], [stepwise])
    a = mgr.matcher_for("a", 0, spec)
    b = mgr.matcher_for("b", 0, spec)
    assert torch.equal(mask_row(a, vocab), mask_row(b, vocab))
    assert torch.equal(mask_row(b, vocab), mask_row(ref, vocab))
    assert mgr.sequence("b", 0).phase.answer == first


def _first_mask_is_grammar(mgr, vocab, spec, row):
    ref = reference_matcher(vocab, spec, "xgrammar")
    from .helpers import allowed_set

    logits = torch.zeros((1, vocab.vocab_size))
    mgr.fill_and_apply(logits, [row])
    return torch.equal(torch.isfinite(logits[0]), allowed_set(mask_row(ref, vocab), vocab.vocab_size))


@pytest.mark.parametrize(
    "prompt, cfg_kind, done",
    [
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", "tokenizer", True),   # qwen3 thinking off
        ("<|im_start|>assistant\n<think>\n", "tokenizer", False),                 # deepseek-r1 style
        ("<think>a</think>b<|im_end|>\n<|im_start|>assistant\n<think>\n", "tokenizer", False),  # old turn
        ("<|im_start|>assistant\n", "tokenizer", False),                           # model opens <think> itself
        ("<|im_start|>assistant\n</think>\n\n", "end_only", True),
        ("x</think>answer<|im_end|>\n<|im_start|>assistant\n", "end_only", False),
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", "ids", True),
        ("<|im_start|>assistant\n<think>\n", "ids", False),
    ],
)
def test_prompt_decides_whether_thinking_is_over(vocab, smollm2_tokenizer, end_ids, prompt, cfg_kind, done):
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex(RECORD_REGEX)
    if cfg_kind == "tokenizer":
        cfg = ReasoningConfig.from_tokenizer(smollm2_tokenizer)
    elif cfg_kind == "ids":
        start_ids = smollm2_tokenizer.encode("<think>", add_special_tokens=False)
        cfg = ReasoningConfig.from_markers(list(end_ids), start=start_ids)
    else:
        cfg = ReasoningConfig.from_markers(END)
    prompt_ids = smollm2_tokenizer.encode(prompt, add_special_tokens=False)
    state = mgr.begin_sequence("p", 0, spec, reasoning=cfg, prompt_token_ids=prompt_ids)
    assert state.phase.think.done is done
    row = GuidedRow("p", 0, spec, reasoning=cfg)
    assert _first_mask_is_grammar(mgr, vocab, spec, row) is done
    # the explicit flag wins over the prompt
    state = mgr.begin_sequence("p", 1, spec, reasoning=cfg, prompt_token_ids=prompt_ids, thinking_done=not done)
    assert state.phase.think.done is (not done)


def test_prompt_ending_inside_the_marker_continues_the_match(vocab, smollm2_tokenizer, end_ids):
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex("[0-9]+")
    cfg = ReasoningConfig.from_markers(list(end_ids))
    state = mgr.begin_sequence("q", 0, spec, reasoning=cfg, prompt_token_ids=[tok(vocab, "ok"), *end_ids[:-1]])
    assert not state.phase.think.done and state.phase.think.pos == len(end_ids) - 1
    (acc,) = mgr.accept_tokens([end_ids[-1]], [GuidedRow("q", 0, spec, reasoning=cfg)])
    assert acc.state is StepStatus.OK and state.phase.think.done


@pytest.mark.parametrize("mode", ["ids", "text"])
@pytest.mark.parametrize("cap", [0, 5])
def test_thinking_cap_forces_the_end_marker(vocab, end_ids, mode, cap):
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.json_schema(SCHEMA, any_whitespace=False)
    row = GuidedRow("c", 0, spec, reasoning=configs(end_ids, max_thinking_tokens=cap)[mode])
    gen = torch.Generator().manual_seed(3)
    for _ in range(cap):
        _, allowed, _, acc = step(mgr, vocab, row, gen)
        assert allowed.sum() > 1 and acc.state is StepStatus.OK
    forced = []
    state = mgr.sequence("c", 0) or mgr.begin_sequence("c", 0, spec, reasoning=row.reasoning)
    while not state.phase.think.done:
        token, allowed, _, acc = step(mgr, vocab, row, gen)
        assert allowed.nonzero().reshape(-1).tolist() == [token]  # exactly one token allowed
        assert acc.state is StepStatus.OK
        forced.append(token)
        assert len(forced) <= 8
    if mode == "ids":
        assert tuple(forced) == end_ids
    else:
        assert b"".join(vocab.token_bytes[t] for t in forced) == END.encode()
    out = decode_rest(mgr, vocab, row, gen)
    jsonschema.validate(json.loads(text_of(vocab, out)), SCHEMA)


def test_cap_continues_a_partially_emitted_marker_and_rejects_others(vocab, end_ids):
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex("[0-9]+")
    cfg = ReasoningConfig.from_markers(list(end_ids), max_thinking_tokens=2)
    row = GuidedRow("k", 0, spec, reasoning=cfg)
    mgr.accept_tokens([tok(vocab, "so")], [row])
    mgr.accept_tokens([end_ids[0]], [row])  # marker started right at the cap
    logits = torch.zeros((1, vocab.vocab_size))
    mgr.fill_and_apply(logits, [row])
    assert torch.isfinite(logits[0]).nonzero().reshape(-1).tolist() == [end_ids[1]]
    (acc,) = mgr.accept_tokens([tok(vocab, "so")], [row])
    assert acc.state is StepStatus.REJECTED
    assert mgr.finalize("k", 0).finish_reason == "error"


@pytest.mark.parametrize("mode", ["ids", "text"])
def test_eos_is_not_allowed_while_thinking(vocab, end_ids, mode):
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex("[0-9]+")
    row = GuidedRow("e", 0, spec, reasoning=configs(end_ids)[mode])
    logits = torch.zeros((1, vocab.vocab_size))
    mgr.fill_and_apply(logits, [row])
    assert not torch.isfinite(logits[0, list(vocab.eos_ids)]).any()
    (acc,) = mgr.accept_tokens([vocab.eos_ids[0]], [row])
    assert acc.state is StepStatus.REJECTED


def test_text_marker_never_straddles_into_the_constraint(vocab, end_ids):
    """A token that finishes '</think>' and carries more bytes would bypass the grammar."""
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex("[0-9]+")
    row = GuidedRow("t", 0, spec, reasoning=ReasoningConfig.from_markers(END))
    for t in end_ids[:-1]:
        mgr.accept_tokens([t], [row])
    logits = torch.zeros((1, vocab.vocab_size))
    mgr.fill_and_apply(logits, [row])
    generated = b"".join(vocab.token_bytes[t] for t in end_ids[:-1])
    expect = free_row(vocab, generated, END.encode())
    assert torch.equal(torch.isfinite(logits[0]), expect)
    straddlers = [t for t, d in enumerate(vocab.token_bytes) if d.startswith(b">") and len(d) > 1]
    assert straddlers and not torch.isfinite(logits[0, straddlers]).any()
    (acc,) = mgr.accept_tokens([straddlers[0]], [row])
    assert acc.state is StepStatus.REJECTED


def test_single_special_token_marker(vocab):
    """Marker given as one (special) token id, like qwen3's </think>."""
    mgr = make_manager(vocab, "xgrammar")
    marker = 3  # a special token of SmolLM2: allowed while thinking, never inside the grammar
    assert marker in vocab.special_ids
    spec = GuideSpec.regex("[0-9]+")
    row = GuidedRow("m", 0, spec, reasoning=ReasoningConfig(end_ids=(marker,)))
    logits = torch.zeros((1, vocab.vocab_size))
    mgr.fill_and_apply(logits, [row])
    assert torch.isfinite(logits[0, marker])
    mgr.accept_tokens([marker], [row])
    assert _first_mask_is_grammar(mgr, vocab, spec, row)


def test_compile_failure_is_reported_while_thinking(vocab, end_ids):
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex("(unclosed")
    row = GuidedRow("f", 0, spec, reasoning=ReasoningConfig.from_markers(list(end_ids)))
    with pytest.raises(InvalidGuideError):
        mgr.get_compiled(spec)  # let the background compile finish
    logits = torch.zeros((1, vocab.vocab_size))
    (st,) = mgr.fill_and_apply(logits, [row])
    assert st.state is StepStatus.ERROR and isinstance(st.error, InvalidGuideError)
    assert torch.isfinite(logits[0]).nonzero().reshape(-1).tolist() == list(vocab.eos_ids)


def test_bad_reasoning_configs_are_typed_errors(vocab):
    with pytest.raises(InvalidGuideError):
        ReasoningConfig()
    with pytest.raises(InvalidGuideError):
        ReasoningConfig(end_text="</think>", max_thinking_tokens=-1)
    mgr = make_manager(vocab, "xgrammar")
    row = GuidedRow("x", 0, GuideSpec.regex("a"), reasoning=ReasoningConfig(end_ids=(vocab.vocab_size + 5,)))
    (st,) = mgr.fill_and_apply(torch.zeros((1, vocab.vocab_size)), [row])
    assert st.state is StepStatus.ERROR and isinstance(st.error, InvalidGuideError)
