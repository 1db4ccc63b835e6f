"""Whitespace between ``</think>`` and the answer when the engine-wide reasoning gate owns the
thinking section (Qwen3-style models write ``</think>\\n\\n<tool_call>...``).

The gate allows a bounded run of whitespace-only tokens right after a generated end marker
(``ReasoningConfig.whitespace_after_end``, 2 bytes for the engine-wide settings); anything else
there still has to be accepted by the grammar, the run is bounded, and rollback is exact.
"""
from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("lmdeploy")
pytest.importorskip("xgrammar")

from tokenrails import GuideSpec  # noqa: E402
from tokenrails.engine_patch.reasoning_settings import AUTO, parse_setting, resolve  # noqa: E402
from tokenrails.guided.manager import GuidedDecodingManager, GuidedRow, StepStatus  # noqa: E402

from . import harness  # noqa: E402
from . import tool_markers as tm  # noqa: E402

logging.getLogger("lmdeploy").setLevel(logging.WARNING)

THINKING = "The user wants the weather in Paris for 3 days, so I call the tool."
REGEX = r'\{"a": [0-9]\}'


@pytest.fixture(scope="module")
def qwen3():
    if tm.tokenizer_dir("qwen3") is None:
        pytest.skip("tokenizer package for qwen3 not installed")
    tok, vocab, _ = tm.load("qwen3")
    return tok, vocab


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_newlines_after_think_then_tool_call_accepted_to_eos(qwen3, cpu_lmdeploy, upgraded, monkeypatch):
    """Real strategy → processor path, gate in charge (no reasoning parser): ``</think>\\n\\n``
    then the call, then EOS. Refused at the ``\\n\\n`` before the gap existed."""
    monkeypatch.delenv("TOKENRAILS_REASONING", raising=False)
    tok, vocab = qwen3
    from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager

    parser_cls, req, parser = tm.response_parser("qwen3", tok, tool_choice="required")
    fmt = parser.request.response_format
    text = "<think>" + THINKING + "</think>\n\n" + tm.render_call(fmt, tm.ARGS)
    ids = _ids(tok, text)
    nl2 = _ids(tok, "\n\n")
    end = tok.convert_tokens_to_ids("</think>")
    at = ids.index(end)
    assert ids[at + 1: at + 1 + len(nl2)] == nl2  # the model's tokenization: </think>, "\n\n", <tool_call>
    _, calls = tm.parse_calls(parser_cls, req, text)
    assert [c.function.name for c in calls] == ["get_weather"]

    mgr = LMDeployGuidedManager(tok, vocab.vocab_size, vocab=vocab)
    seq = harness.FakeSeq(3, harness.gen_config(fmt, max_new_tokens=1024),
                          prompt_ids=_ids(tok, "user: weather?\nassistant:"))
    strat = harness.strategy()
    eos = list(vocab.eos_ids)[0]

    harness.offer(strat, mgr, seq, ids + [eos], vocab.vocab_size)
    assert seq.generated == ids + [eos], f"refused after {tok.decode(seq.generated[:-1])!r}"


# ---- the gate itself, on the Qwen3 vocabulary ----------------------------------------------
def _manager(vocab):
    return GuidedDecodingManager(vocab, backend="xgrammar")


def _feed(mgr, vocab, row, ids) -> int:
    """Feed ``ids`` one by one (mask, then accept); the index of the first refused one, or len."""
    for k, t in enumerate(ids):
        logits = torch.zeros((1, vocab.vocab_size))
        (st,) = mgr.fill_and_apply(logits, [row])
        masked_ok = bool(torch.isfinite(logits[0, t]))
        (acc,) = mgr.accept_tokens([t], [row])
        accepted = acc is None or acc.state is StepStatus.OK
        assert masked_ok == accepted, (k, t, masked_ok, accepted)  # mask and accept agree
        if not accepted:
            return k
    return len(ids)


def _row(vocab, name, setting=AUTO):
    return GuidedRow(name, 0, GuideSpec.regex(REGEX), reasoning=resolve(parse_setting(setting), vocab))


def _allowed(mgr, vocab, row, t) -> bool:
    logits = torch.zeros((1, vocab.vocab_size))
    mgr.fill_and_apply(logits, [row])
    return bool(torch.isfinite(logits[0, t]))


def _eos_allowed(mgr, vocab, row) -> bool:
    logits = torch.zeros((1, vocab.vocab_size))
    mgr.fill_and_apply(logits, [row])
    return any(bool(torch.isfinite(logits[0, e])) for e in vocab.eos_ids)


def test_whitespace_run_then_answer_to_eos(qwen3):
    tok, vocab = qwen3
    mgr = _manager(vocab)
    row = _row(vocab, "ok")
    ids = _ids(tok, "<think>" + THINKING + "</think>\n\n" + '{"a": 7}')
    assert _feed(mgr, vocab, row, ids) == len(ids)
    assert _eos_allowed(mgr, vocab, row)


@pytest.mark.parametrize("after", ["Sure", "\n\nSure", " x", "\nOK"])
def test_non_whitespace_after_think_is_still_refused(qwen3, after):
    tok, vocab = qwen3
    mgr = _manager(vocab)
    row = _row(vocab, ("bad", after))
    head = _ids(tok, "<think>" + THINKING + "</think>")
    tail = _ids(tok, after)
    assert _feed(mgr, vocab, row, head) == len(head)
    stop = _feed(mgr, vocab, row, tail)
    assert stop < len(tail)
    assert tok.decode(tail[stop]).strip() != ""  # refused at the first non-whitespace token


def test_whitespace_run_is_bounded(qwen3):
    tok, vocab = qwen3
    head = _ids(tok, "<think>" + THINKING + "</think>")
    # default bound: 2 bytes ("\n\n" or two spaces), a third byte is refused
    for extra in (" ", " ", " "), ("\n\n", "\n"), ("\n", "\n", "\n"):
        mgr = _manager(vocab)
        row = _row(vocab, ("bound", extra))
        assert _feed(mgr, vocab, row, head) == len(head)
        ws = [t for piece in extra for t in _ids(tok, piece)]
        assert _feed(mgr, vocab, row, ws) == len(ws) - 1
    # configurable: ws=0 hands over exactly, ws=4 allows four newlines, never more
    mgr = _manager(vocab)
    row = _row(vocab, "zero", "<think>,</think>,optional,ws=0")
    assert _feed(mgr, vocab, row, head) == len(head)
    assert _feed(mgr, vocab, row, _ids(tok, "\n\n")) == 0
    mgr = _manager(vocab)
    row = _row(vocab, "four", {"start": "<think>", "end": "</think>", "optional": True, "whitespace_after_end": 4})
    assert _feed(mgr, vocab, row, head) == len(head)
    nl = _ids(tok, "\n")
    assert _feed(mgr, vocab, row, nl * 4) == 4
    assert not _allowed(mgr, vocab, row, nl[0])  # a fifth byte: masked (a refusal would end the row)
    assert _feed(mgr, vocab, row, _ids(tok, '{"a": 1}')) == len(_ids(tok, '{"a": 1}'))
    with pytest.raises(Exception):
        parse_setting({"end": "</think>", "whitespace_after_end": -1})


def test_rollback_across_the_gap_is_exact(qwen3):
    tok, vocab = qwen3
    mgr = _manager(vocab)
    row = _row(vocab, "rb")
    head = _ids(tok, "<think>" + THINKING + "</think>")
    assert _feed(mgr, vocab, row, head) == len(head)
    st = mgr.sequence("rb", 0)
    words = (vocab.vocab_size + 31) // 32

    def mask():
        m = torch.zeros((1, words), dtype=torch.int32)
        st.phase.fill_next_token_bitmask(m, 0)
        return m.clone()

    at_gap = mask()
    nl2 = _ids(tok, "\n\n")
    body = _ids(tok, '{"a": ')
    assert _feed(mgr, vocab, row, nl2 + body) == len(nl2 + body)
    after = mask()
    st.phase.rollback(len(body))
    assert st.in_gap and st.phase.answer == []
    st.phase.rollback(len(nl2))
    assert st.in_gap and torch.equal(mask(), at_gap)
    assert _feed(mgr, vocab, row, nl2 + body) == len(nl2 + body)  # the same path again
    assert torch.equal(mask(), after)
    st.phase.rollback(len(nl2 + body) + 1)  # back before the end marker: thinking again
    assert st.thinking


def test_answer_first_has_no_gap(qwen3):
    """Optional thinking, the model answers directly: no end marker, so no whitespace gap; the
    grammar takes the first token."""
    tok, vocab = qwen3
    mgr = _manager(vocab)
    row = _row(vocab, "direct")
    assert _feed(mgr, vocab, row, _ids(tok, "\n\n")) == 0
    mgr = _manager(vocab)
    row = _row(vocab, "direct2")
    ids = _ids(tok, '{"a": 3}')
    assert _feed(mgr, vocab, row, ids) == len(ids)
    assert _eos_allowed(mgr, vocab, row) and not mgr.sequence("direct2", 0).in_gap


def test_text_mode_marker_and_whitespace_in_one_token():
    """Text-matched end marker (Llama 3 has no </think> token, but has ``>\n\n``): a token that
    completes the marker and carries the gap's whitespace is allowed; one that carries anything
    else, or more whitespace than the bound, is not."""
    from tokenrails.guided.reasoning import ReasoningConfig

    if tm.tokenizer_dir("llama3.2") is None:
        pytest.skip("tokenizer package for llama3.2 not installed")
    tok, vocab, _ = tm.load("llama3.2")
    by_bytes = {b: t for t, b in enumerate(vocab.token_bytes) if b}
    gt_nl, gt_x, gt_nl3 = by_bytes[b">\n\n"], by_bytes[b">x"], by_bytes[b">\n\n\n"]
    head = _ids(tok, "thinking </think")
    cfg = ReasoningConfig.from_markers("</think>", whitespace_after_end=2)
    spec = GuideSpec.regex(REGEX)
    mgr = GuidedDecodingManager(vocab, backend="xgrammar")
    row = GuidedRow("txt", 0, spec, reasoning=cfg)
    assert _feed(mgr, vocab, row, head) == len(head)
    assert not _allowed(mgr, vocab, row, gt_x) and not _allowed(mgr, vocab, row, gt_nl3)
    assert _feed(mgr, vocab, row, [gt_nl]) == 1 and mgr.sequence("txt", 0).in_gap
    body = _ids(tok, '{"a": 5}')
    assert _feed(mgr, vocab, row, body) == len(body) and _eos_allowed(mgr, vocab, row)
    exact = GuidedRow("txt0", 0, spec, reasoning=ReasoningConfig.from_markers("</think>"))
    assert _feed(mgr, vocab, exact, head) == len(head)
    assert not _allowed(mgr, vocab, exact, gt_nl)  # whitespace_after_end=0: exact hand-off
