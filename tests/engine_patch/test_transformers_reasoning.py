"""Reasoning rows in the transformers adapter (``GuidedLogitsProcessor`` and ``generate_guided``).

No model: scores are scripted (a wanted token far on top, EOS and grammar breakers next), so
every mask decision shows in the output. ``think_tokenizer`` = SmolLM2 + added ``<think>`` /
``</think>`` ("auto" finds them); SmolLM2 alone has no markers ("auto" changes nothing).
Also: the setting parser and the prompt cut used before reading long prompts.
"""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

from tokenrails import GuideSpec
from tokenrails.engine_patch.reasoning_settings import (
    AUTO, ReasoningSetting, parse_setting, prompt_for_reading, resolve,
)
from tokenrails.engine_patch.transformers import GuidedLogitsProcessor, generate_guided
from tokenrails.guided.errors import InvalidGuideError
from tokenrails.guided.reasoning import ReasoningConfig, ReasoningTracker

REGEX = r"[0-9]{3}-[a-z]{2}"
EOS = 2
BREAKERS = (EOS, 25276, 33)  # EOS, "abc", "1"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("TOKENRAILS_REASONING", raising=False)


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def _drive(proc, prompts, scripts, vocab_size, steps=24, seed=0):
    """A fake ``generate`` (left-padded prompts, greedy); returns (sequences, masked scores)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    gen = torch.Generator().manual_seed(seed)
    done = [False] * len(prompts)
    seen = []
    for step in range(steps):
        scores = torch.randn((len(prompts), vocab_size), generator=gen)
        scores[:, list(BREAKERS)] += 50.0
        for r, want in enumerate(scripts):
            if step < len(want) and want[step] is not None:
                scores[r, want[step]] += 100.0
        scores = proc(ids, scores)
        seen.append(scores.clone())
        nxt = [EOS if done[r] else int(scores[r].argmax()) for r in range(len(prompts))]
        done = [d or t == EOS for d, t in zip(done, nxt)]
        ids = torch.cat([ids, torch.tensor(nxt)[:, None]], dim=1)
        if all(done):
            break
    return ids, seen


def _gen(seqs, r, width):
    out = seqs[r, width:].tolist()
    return out[: out.index(EOS) + 1] if EOS in out else out


def test_processor_thinks_then_answers(think_tokenizer, think_vocab):
    tok = think_tokenizer
    T, E = tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")
    think = _ids(tok, "hello world")
    prompt = _ids(tok, "q: code?")
    proc = GuidedLogitsProcessor([GuideSpec.regex(REGEX)], tok, vocab=think_vocab)
    seqs, seen = _drive(proc, [prompt], [[T, *think, EOS, E]], think_vocab.vocab_size)
    out = _gen(seqs, 0, len(prompt))
    k = 1 + len(think)
    assert out[:k] == [T, *think] and out[k] != EOS and out[k + 1] == E
    assert not torch.isfinite(seen[k][0][EOS]) and torch.isfinite(seen[0][0][T])
    (rep,) = proc.finalize(seqs)
    assert rep.status == "complete" and rep.valid, rep
    assert rep.answer_start == k + 2
    assert re.fullmatch(REGEX, tok.decode(out[rep.answer_start:-1]))


def test_processor_prefilled_and_closed_prompts(think_tokenizer, think_vocab):
    tok = think_tokenizer
    T, E = tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")
    opened = _ids(tok, "q:") + [T] + _ids(tok, "\n")
    closed = _ids(tok, "q:<think>\n\n</think>\n\n")
    letters = _ids(tok, "abc")
    spec = GuideSpec.regex(REGEX)
    proc = GuidedLogitsProcessor([spec, spec], tok, vocab=think_vocab)
    seqs, seen = _drive(proc, [opened, closed], [[*letters, E], [T, *letters]], think_vocab.vocab_size)
    width = max(len(opened), len(closed))
    a, b = _gen(seqs, 0, width), _gen(seqs, 1, width)
    assert a[: len(letters) + 1] == [*letters, E]
    assert T not in b and not torch.isfinite(seen[0][1][T]) and not torch.isfinite(seen[0][1][letters[0]])
    reps = proc.finalize(seqs)
    assert [r.valid for r in reps] == [True, True]
    assert reps[0].answer_start == len(letters) + 1 and reps[1].answer_start == 0
    # the closed row's masks are exactly those of reasoning off
    off = GuidedLogitsProcessor([spec, spec], tok, vocab=think_vocab, reasoning="off")
    seqs2, seen2 = _drive(off, [opened, closed], [[*letters, E], [T, *letters]], think_vocab.vocab_size)
    n = min(len(seen), len(seen2), len(b))
    assert all(torch.equal(seen[i][1], seen2[i][1]) for i in range(n))


@pytest.mark.parametrize("seed", [0, 1])
def test_processor_no_markers_bit_identical(smollm2_tokenizer, vocab, seed, monkeypatch):
    assert resolve(AUTO, vocab) is None
    specs = [GuideSpec.regex(REGEX), GuideSpec.json_object(), None]
    prompts = [_ids(smollm2_tokenizer, "q: <think>")] * 3
    runs = []
    for setting in (None, "auto", "off", ["off", "auto", "off"]):
        proc = GuidedLogitsProcessor(specs, smollm2_tokenizer, vocab=vocab, reasoning=setting)
        runs.append(_drive(proc, prompts, [[]] * 3, vocab.vocab_size, seed=seed))
        assert all(r is None or r.reasoning is None for r in proc.rows)
    for seqs, seen in runs[1:]:
        assert torch.equal(seqs, runs[0][0]) and all(torch.equal(x, y) for x, y in zip(seen, runs[0][1]))


def test_processor_per_row_settings(smollm2_tokenizer, vocab):
    """Row 0 off, row 1 explicit id markers (SmolLM2's own tokens), row 2 text markers."""
    tok = smollm2_tokenizer
    S, E = tok.convert_tokens_to_ids("<issue_start>"), tok.convert_tokens_to_ids("<issue_closed>")
    letters = _ids(tok, "abc")
    text_end = _ids(tok, "</think>")
    spec = GuideSpec.regex(REGEX)
    proc = GuidedLogitsProcessor([spec] * 3, tok, vocab=vocab,
                                 reasoning=["off", "<issue_start>,<issue_closed>", "<think>,</think>"])
    prompt = _ids(tok, "q:")
    seqs, _ = _drive(proc, [prompt] * 3, [[*letters], [*letters, E], [*letters, *text_end]], vocab.vocab_size)
    outs = [_gen(seqs, r, len(prompt)) for r in range(3)]
    assert outs[0][: len(letters)] != letters  # off: letters refused from the first token
    assert outs[1][: len(letters) + 1] == [*letters, E] and S not in outs[0]
    assert outs[2][: len(letters) + len(text_end)] == [*letters, *text_end]
    reps = proc.finalize(seqs)
    assert [r.valid for r in reps] == [True, True, True], reps
    assert [r.answer_start for r in reps] == [0, len(letters) + 1, len(letters) + len(text_end)]


class _ScriptedModel:
    """Stands in for a causal LM in ``generate_guided``: logits from a per-row script."""

    def __init__(self, vocab_size: int, scripts, prompt_lens, seed=0):
        from transformers import LlamaConfig

        self.config = LlamaConfig(vocab_size=vocab_size, hidden_size=8, num_hidden_layers=1,
                                  num_attention_heads=1, num_key_value_heads=1, intermediate_size=8)
        self.generation_config = SimpleNamespace(eos_token_id=EOS)
        self.scripts, self.prompt_lens = scripts, prompt_lens
        self.real = [0] * len(scripts)
        self.gen = torch.Generator().manual_seed(seed)
        self.widths = []

    def get_output_embeddings(self):
        return None

    def __call__(self, input_ids, attention_mask, **kw):
        rows, width = input_ids.shape
        self.widths.append(width)
        fed = attention_mask[:, -width:].sum(dim=1).tolist()
        logits = torch.randn(rows, 1, self.config.vocab_size, generator=self.gen)
        logits[:, :, list(BREAKERS)] += 50.0
        for r in range(rows):
            self.real[r] += int(fed[r])
            n = self.real[r] - self.prompt_lens[r]
            if n < len(self.scripts[r]) and self.scripts[r][n] is not None:
                logits[r, 0, self.scripts[r][n]] += 100.0
        return SimpleNamespace(logits=logits)


def test_generate_guided_reasoning(think_tokenizer, think_vocab):
    tok = think_tokenizer
    T, E = tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>")
    prompts = ["q: code?", "q: again<think>\n\n</think>\n\n"]
    lens = [len(tok.encode(p)) for p in prompts]
    think = _ids(tok, "let me see")
    model = _ScriptedModel(think_vocab.vocab_size, [[T, *think, EOS, E], [T]], lens)
    spec = GuideSpec.regex(r'"[0-9]{3}-[a-z]{2}"')  # the quote makes jump-forward possible
    rep = generate_guided(model, tok, prompts, [spec, spec], max_new_tokens=24)
    a, b = rep.results
    assert a.finish_reason == "stop" and a.valid, a
    assert a.token_ids[: len(think) + 1] == [T, *think] and E in a.token_ids
    assert a.reasoning_text == tok.decode(a.token_ids[: a.answer_start])
    # the end marker, then at most 2 bytes of whitespace the model may write before the answer
    gap = a.reasoning_text.split("</think>")[-1]
    assert a.reasoning_text.startswith("<think>") and gap.strip(" \t\r\n") == "" and len(gap.encode()) <= 2
    assert re.fullmatch(r'"[0-9]{3}-[a-z]{2}"', a.answer_text) and a.text == a.reasoning_text + a.answer_text
    assert b.valid and b.answer_start == 0 and b.reasoning_text == "" and T not in b.token_ids
    off = generate_guided(_ScriptedModel(think_vocab.vocab_size, [[T, *think, EOS, E], [T]], lens), tok,
                          prompts, [spec, spec], max_new_tokens=24, reasoning="off")
    assert off.results[1].token_ids == b.token_ids  # closed prompt: exactly reasoning off
    assert T not in off.results[0].token_ids and off.results[0].valid


# ---- settings and prompt reading --------------------------------------------------------
def test_parse_setting_forms():
    assert parse_setting(None) is None
    assert parse_setting("auto") is AUTO and parse_setting(True) is AUTO
    assert parse_setting("off").kind == parse_setting(False).kind == "off"
    s = parse_setting(" <a> , </a> , optional , max=5 ")
    assert (s.kind, s.start, s.end, s.optional, s.max_thinking_tokens) == ("markers", "<a>", "</a>", True, 5)
    assert parse_setting({"end": "</a>", "max_thinking_tokens": 2}) == ReasoningSetting("markers", None, "</a>", False, 2)
    cfg = ReasoningConfig.from_markers("</x>")
    assert parse_setting(cfg).config is cfg
    for bad in ("x", ",y", "a,b,sometimes", "a,b,max=-1", {"start": "a"}, {"end": "b", "why": 1}, 3):
        with pytest.raises(InvalidGuideError):
            parse_setting(bad)


def test_env_default(monkeypatch, think_tokenizer, think_vocab):
    from tokenrails.engine_patch.reasoning_settings import default_setting

    assert default_setting() is AUTO
    monkeypatch.setenv("TOKENRAILS_REASONING", "off")
    assert default_setting().kind == "off" and default_setting("auto") is AUTO
    proc = GuidedLogitsProcessor([GuideSpec.regex(REGEX)], think_tokenizer, vocab=think_vocab)
    assert proc.rows[0].reasoning is None


@settings(max_examples=150, deadline=None)
@given(prompt=hs.lists(hs.sampled_from([5, 6, 7, 8, 9, 49152, 49153, 216, 1116]), min_size=0, max_size=140),
       optional=hs.booleans(), with_start=hs.booleans())
def test_prompt_cut_reads_like_the_whole_prompt(think_vocab, prompt, optional, with_start):
    """The vectorized cut gives ``initial()`` exactly the answer of the whole prompt."""
    cfg = ReasoningConfig(end_ids=(49153,), start_ids=(49152,) if with_start or optional else (),
                          match="ids", optional=optional)
    tracker = ReasoningTracker(think_vocab, cfg)
    cut = prompt_for_reading(prompt, cfg)
    assert tracker.initial(cut) == tracker.initial(prompt)
    if len(prompt) >= 64 and 49152 not in prompt and 49153 not in prompt:
        assert len(cut) == 1
