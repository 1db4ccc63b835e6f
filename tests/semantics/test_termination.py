"""Termination: every EOS id works, only EOS after the end, length stops reported honestly."""
import pytest
import torch

from tokenrails import GuideSpec, Vocabulary
from tokenrails.guided.manager import GuidedRow, ReasoningConfig, StepStatus

from .helpers import BACKENDS, make_manager, tok, worst_allowed

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}


@pytest.fixture(scope="module")
def multi_eos_vocab(vocab):
    """The SmolLM2 vocabulary with three end ids (end-of-message, end-of-text, a tool-end id)."""
    return Vocabulary(
        token_bytes=vocab.token_bytes, eos_ids=(2, 0, 5), special_ids=vocab.special_ids,
        vocab_size=vocab.vocab_size, name="smollm2-multi-eos",
    )


def finite_ids(logits_row):
    return torch.isfinite(logits_row).nonzero().reshape(-1).tolist()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("eos", [2, 0, 5])
def test_every_eos_id_ends_the_output(multi_eos_vocab, backend, eos):
    v = multi_eos_vocab
    mgr = make_manager(v, backend)
    spec = GuideSpec.regex("(alpha|beta)")
    row = GuidedRow("e", eos, spec)
    for t in (tok(v, "alpha"),):
        (st,) = mgr.accept_tokens([t], [row])
        assert st.state is StepStatus.OK
    logits = torch.zeros((1, v.vocab_size))
    mgr.fill_and_apply(logits, [row])
    assert finite_ids(logits[0]) == [0, 2, 5]  # complete: every end id, nothing else
    (st,) = mgr.accept_tokens([eos], [row])
    assert st.state is StepStatus.TERMINATED
    assert mgr.finalize("e", eos).finish_reason == "stop" and mgr.finalize("e", eos).complete
    # after the end only EOS: masks, speculative masks and accepts agree
    logits = torch.zeros((3, v.vocab_size))
    (sst,) = mgr.fill_and_apply_spec(logits, [row], [[0, tok(v, "a")]])
    assert sst.valid_drafts == 0
    for j in range(3):
        assert finite_ids(logits[j]) == [0, 2, 5]
    for other in (0, 2, 5):
        (st,) = mgr.accept_tokens([other], [row])
        assert st.state is StepStatus.TERMINATED
    (st,) = mgr.accept_tokens([tok(v, "a")], [row])
    assert st.state is StepStatus.REJECTED
    assert mgr.finalize("e", eos).finish_reason == "error"


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_eos_before_the_structure_is_complete(multi_eos_vocab, backend):
    v = multi_eos_vocab
    mgr = make_manager(v, backend)
    spec = GuideSpec.regex("(alpha|beta)")
    row = GuidedRow("n", 0, spec)
    mgr.accept_tokens([tok(v, "al")], [row])
    logits = torch.zeros((1, v.vocab_size))
    mgr.fill_and_apply(logits, [row])
    assert not torch.isfinite(logits[0, [0, 2, 5]]).any()
    (st,) = mgr.accept_tokens([5], [row])
    assert st.state is StepStatus.REJECTED


def test_every_eos_id_is_blocked_while_thinking(multi_eos_vocab):
    v = multi_eos_vocab
    mgr = make_manager(v, "xgrammar")
    row = GuidedRow("t", 0, GuideSpec.regex("a"), reasoning=ReasoningConfig.from_markers("</think>"))
    logits = torch.zeros((1, v.vocab_size))
    mgr.fill_and_apply(logits, [row])
    assert not torch.isfinite(logits[0, [0, 2, 5]]).any()
    assert torch.isfinite(logits[0]).sum() == v.num_tokens - 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_length_stop_mid_structure_is_incomplete(vocab, backend):
    mgr = make_manager(vocab, backend)
    spec = GuideSpec.regex(r'\{"a": [0-9]{1,3}\}')
    row = GuidedRow("L", 0, spec)
    gen = torch.Generator().manual_seed(0)
    for n in range(1, 40):
        logits = torch.randn((1, vocab.vocab_size), generator=gen)
        mgr.fill_and_apply(logits, [row])
        t = worst_allowed(logits[0])
        if t in vocab.eos_ids:
            break
        (st,) = mgr.accept_tokens([t], [row])
        assert st.state is StepStatus.OK
        fin = mgr.finalize("L", 0, "length")  # as if max_tokens were n
        accepting = mgr.matcher_for("L", 0, spec).is_accepting()
        assert fin.complete is accepting
        assert fin.finish_reason == ("length" if accepting else "length_incomplete")
        assert mgr.finish_reason("L", 0, "abort") == ("abort" if accepting else "abort_incomplete")
    else:
        raise AssertionError("never completed")
    assert mgr.finalize("L", 0).complete  # EOS was allowed: the output is a complete match
    (st,) = mgr.accept_tokens([t], [row])
    assert st.state is StepStatus.TERMINATED and mgr.finish_reason("L", 0) == "stop"


def test_length_stop_inside_json_and_inside_thinking(vocab):
    mgr = make_manager(vocab, "xgrammar")
    spec = GuideSpec.json_schema(SCHEMA)
    row = GuidedRow("J", 0, spec)
    for t in (tok(vocab, '{"'), tok(vocab, "a"), tok(vocab, '":'), tok(vocab, "1")):
        (st,) = mgr.accept_tokens([t], [row])
        assert st.state is StepStatus.OK
    fin = mgr.finalize("J", 0)
    assert fin.finish_reason == "length_incomplete" and not fin.complete and fin.error is None
    (st,) = mgr.accept_tokens([tok(vocab, "}")], [row])
    assert mgr.finalize("J", 0).finish_reason == "length" and mgr.finalize("J", 0).complete
    think = GuidedRow("K", 0, spec, reasoning=ReasoningConfig.from_markers("</think>"))
    mgr.accept_tokens([tok(vocab, "hello")], [think])
    fin = mgr.finalize("K", 0)
    assert fin.finish_reason == "length_incomplete" and fin.thinking and not fin.complete
    with pytest.raises(KeyError):
        mgr.finalize("nope", 0)


def test_failed_constraint_finalizes_as_error(vocab):
    mgr = make_manager(vocab, "xgrammar")
    row = GuidedRow("x", 0, GuideSpec.regex("(bad"))
    mgr.fill_and_apply(torch.zeros((1, vocab.vocab_size)), [row])
    fin = mgr.finalize("x", 0)
    assert fin.finish_reason == "error" and fin.error is not None and not fin.complete
