"""Jump-forward: forced strings stay in the language; retokenized jumps keep decoding valid."""
import json
import re

import jsonschema
import pytest
import torch

from tokenrails import GuideSpec
from tokenrails.guided.manager import GuidedRow, ReasoningConfig, StepStatus

from .helpers import BACKENDS, RECORD_REGEX, allowed_set, make_manager, mask_row, reference_matcher, text_of, worst_allowed, worst_step

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
        "kind": {"enum": ["alpha", "beta"]},
        "tags": {"type": "array", "items": {"enum": ["x", "yy"]}, "maxItems": 2},
        "n": {"type": "integer"},
    },
    "required": ["name", "kind", "tags", "n"],
    "additionalProperties": False,
}


def cases(backend):
    out = [(GuideSpec.regex(RECORD_REGEX), lambda s: re.fullmatch(RECORD_REGEX, s) is not None)]
    if backend == "xgrammar":
        def valid(s):
            # strict=False: xgrammar 0.2.8 lets raw control characters into JSON strings (reported)
            jsonschema.validate(json.loads(s, strict=False), SCHEMA)
            return True
        out.append((GuideSpec.json_schema(SCHEMA, any_whitespace=False), valid))
    return out


def sample_completion(vocab, matcher, seed, max_steps=200):
    """Adversarial completion from the matcher's state (restored afterwards)."""
    gen = torch.Generator().manual_seed(seed)
    ids = []
    for _ in range(max_steps):
        logits = torch.randn(vocab.vocab_size, generator=gen)
        logits[~allowed_set(mask_row(matcher, vocab), vocab.vocab_size)] = -torch.inf
        t = worst_allowed(logits)
        assert matcher.accept_token(t)
        if t in vocab.eos_ids:
            matcher.rollback(len(ids) + 1)
            return text_of(vocab, ids)
        ids.append(t)
    raise AssertionError("no EOS")


@pytest.mark.parametrize("backend", BACKENDS)
def test_forced_strings_never_leave_the_language(vocab, backend):
    mgr = make_manager(vocab, backend)
    for spec, valid in cases(backend):
        for seed in range(2):
            row = GuidedRow(("f", seed), 0, spec)
            gen = torch.Generator().manual_seed(100 + seed)
            checked = 0
            for step in range(120):
                jf = mgr.jump_forward(("f", seed), 0, spec)
                assert jf.token_ids is None or jf.is_noop  # no tokenizer: text only
                if jf.text and checked < 3:
                    m = mgr.matcher_for(("f", seed), 0, spec)
                    prefix = text_of(vocab, mgr.sequence(("f", seed), 0).history)
                    for k in range(2):  # every sampled continuation starts with the forced text
                        rest = sample_completion(vocab, m, seed * 10 + k)
                        assert rest.startswith(jf.text), (jf.text, rest)
                        assert valid(prefix + rest)
                    checked += 1
                st = worst_step(mgr, vocab, row, gen)
                if st.state is StepStatus.TERMINATED:
                    break
                assert st.state is StepStatus.OK
            assert checked >= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_retokenized_jumps_give_text_token_by_token_decoding_allows(vocab, smollm2_tokenizer, backend):
    mgr = make_manager(vocab, backend)
    for spec, valid in cases(backend):
        for seed in range(3):
            sid = ("j", seed, spec.key)
            row = GuidedRow(sid, 0, spec)
            gen = torch.Generator().manual_seed(seed)
            ids: list[int] = []
            jumps = rollbacks = 0
            for _ in range(200):
                jf = mgr.jump_forward(sid, 0, spec, smollm2_tokenizer)
                if jf.token_ids:
                    old = text_of(vocab, ids)
                    ids = ids[: len(ids) - jf.rollback_tokens] + list(jf.token_ids)
                    new = text_of(vocab, ids)
                    assert len(new) > len(old) and new.startswith(old) and (old + jf.text).startswith(new)
                    assert not any(t in vocab.special_ids for t in jf.token_ids)
                    st = mgr.apply_jump_forward(sid, 0, spec, jf)
                    assert st.state is StepStatus.OK and st.accepted == len(jf.token_ids)
                    jumps += 1
                    rollbacks += jf.rollback_tokens > 0
                    continue
                logits = torch.randn((1, vocab.vocab_size), generator=gen)
                mgr.fill_and_apply(logits, [row])
                tok = worst_allowed(logits[0])
                (st,) = mgr.accept_tokens([tok], [row])
                if st.state is StepStatus.TERMINATED:
                    break
                assert st.state is StepStatus.OK
                ids.append(tok)
            else:
                raise AssertionError("did not terminate")
            assert jumps >= 2
            assert valid(text_of(vocab, ids))
            assert mgr.sequence(sid, 0).history == ids + [tok]
            # the very same tokens, one at a time, are allowed by a fresh matcher
            ref = reference_matcher(vocab, spec, backend)
            for t in ids + [tok]:
                assert allowed_set(mask_row(ref, vocab), vocab.vocab_size)[t]
                assert ref.accept_token(t)
            assert ref.is_terminated()


def test_jump_over_special_token_text_is_ambiguous(vocab, smollm2_tokenizer):
    """'<|im_end|>' as text would tokenize to the special EOS token: never appended as tokens."""
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex(r"<\|im_end\|>[a-z]")
    jf = mgr.jump_forward("s", 0, spec, smollm2_tokenizer)
    assert jf.text == "<|im_end|>" and jf.token_ids is None and jf.rollback_tokens == 0
    with pytest.raises(ValueError):
        mgr.apply_jump_forward("s", 0, spec, jf)


def test_no_jump_while_thinking_or_after_the_end(vocab, smollm2_tokenizer):
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex("abc")
    cfg = ReasoningConfig.from_markers("</think>")
    mgr.begin_sequence("t", 0, spec, reasoning=cfg)
    assert mgr.jump_forward("t", 0, spec, smollm2_tokenizer).is_noop
    jf = mgr.jump_forward("u", 0, spec, smollm2_tokenizer)
    assert jf.text == "abc" and jf.token_ids
    mgr.apply_jump_forward("u", 0, spec, jf)
    row = GuidedRow("u", 0, spec)
    while not mgr.matcher_for("u", 0, spec).is_terminated():
        worst_step(mgr, vocab, row)
    assert mgr.jump_forward("u", 0, spec, smollm2_tokenizer).is_noop
    assert text_of(vocab, mgr.sequence("u", 0).history[:-1]) == "abc"


def test_jump_over_the_forced_end_marker_at_the_thinking_cap(vocab, smollm2_tokenizer):
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex("[0-9]+")
    end_ids = smollm2_tokenizer.encode("</think>", add_special_tokens=False)
    for cfg in (ReasoningConfig.from_markers(end_ids, max_thinking_tokens=1),
                ReasoningConfig.from_markers("</think>", max_thinking_tokens=1)):
        sid = ("cap", cfg.match)
        row = GuidedRow(sid, 0, spec, reasoning=cfg)
        mgr.begin_sequence(sid, 0, spec, reasoning=cfg)
        assert mgr.jump_forward(sid, 0, spec).is_noop  # thinking, below the cap: nothing forced
        mgr.accept_tokens([end_ids[0]], [row])  # at the cap, one marker token already emitted
        jf = mgr.jump_forward(sid, 0, spec, smollm2_tokenizer)
        assert jf.rollback_tokens == 0 and jf.text == "think>"
        assert b"".join(vocab.token_bytes[t] for t in jf.token_ids) == b"think>"
        st = mgr.apply_jump_forward(sid, 0, spec, jf)
        assert st.state is StepStatus.OK and st.accepted == len(jf.token_ids)
        assert mgr.sequence(sid, 0).phase.think.done
        assert mgr.jump_forward(sid, 0, spec, smollm2_tokenizer).is_noop  # [0-9]+: a choice


@pytest.mark.parametrize("mode", ["ids", "text"])
def test_jump_never_retokenizes_back_into_the_thinking_section(vocab, smollm2_tokenizer, mode):
    """Right after the end marker the forced text starts the answer: the rule may not join it with
    the marker's or the thinking text's tokens (the sequence's history holds them too)."""
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.regex("=abc[0-9]")  # ">" (the marker's end) + "=" is one token: ">="
    end_ids = smollm2_tokenizer.encode("</think>", add_special_tokens=False)
    cfg = ReasoningConfig.from_markers(end_ids if mode == "ids" else "</think>")
    sid = ("back", mode)
    row = GuidedRow(sid, 0, spec, reasoning=cfg)
    mgr.begin_sequence(sid, 0, spec, reasoning=cfg)
    thinking = smollm2_tokenizer.encode("ab ab", add_special_tokens=False) + end_ids
    assert len(smollm2_tokenizer.encode(">=", add_special_tokens=False)) == 1
    for t in thinking:
        assert mgr.accept_tokens([t], [row])[0].state is StepStatus.OK
    state = mgr.sequence(sid, 0)
    assert state.answering and state.phase.answer == []
    jf = mgr.jump_forward(sid, 0, spec, smollm2_tokenizer, max_rollback=4)
    assert jf.text == "=abc" and jf.rollback_tokens == 0
    assert b"=abc".startswith(b"".join(vocab.token_bytes[t] for t in jf.token_ids))
    status = mgr.apply_jump_forward(sid, 0, spec, jf)
    assert status.state is StepStatus.OK and state.phase.answer == list(jf.token_ids)
    assert state.history == thinking + list(jf.token_ids)
