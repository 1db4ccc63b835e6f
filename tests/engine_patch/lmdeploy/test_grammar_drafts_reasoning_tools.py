"""Grammar drafts and grammar-aware EAGLE drafts for reasoning rows and tool calls (issue 24, point 3).

LMDeploy 0.18's real engine on CPU, greedy, one batch per configuration: a think-first row (explicit
``<think>``/``</think>`` markers as text, ``max=8`` so the thinking section ends), a named
``tool_choice`` row and a ``tool_choice="required"`` row (the formats LMDeploy's qwen parser builds,
through the upgrade, as the server does). Configurations: plain guided decoding, grammar drafts
(k = 3, no draft model), and EAGLE (random draft, ``cpu/draft.py``) with grammar-aware drafts.

Oracles, independent of the matcher's own thinking state: the tokens every row accepted are
recorded (the spec path's ``accept_tokens_spec``), plus, for EAGLE, the drafts a step took so far;
at each proposal the row's text so far is decoded. Nothing is forced while that text has not
closed its thinking section (proposals are asked there and answer nothing); forced drafts come
after ``</think>``; the tool rows' forced drafts cover the call's marker, function name and
argument keys (a one-token piece may land on a step's bonus position, the target's own token). Greedy outputs equal plain guided decoding token for token in every configuration.
"""
from __future__ import annotations

import collections
import json

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")

from . import tool_markers as tm  # noqa: E402

pytestmark = pytest.mark.slow

K = 3
from .schemas import PERSON  # noqa: E402
THINK = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON},
         "tokenrails_reasoning": "<think>,</think>,max=8"}
PROMPTS = ["Think briefly, then give a person as JSON.", "What is the weather in Paris for 3 days?",
           "Weather in Rome, 2 days, please."]


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def draft_dir(model_dir, tmp_path_factory):
    from tokenrails.engine_patch.lmdeploy.cpu.draft import random_eagle_draft
    return str(random_eagle_draft(model_dir, tmp_path_factory.mktemp("eagle"), seed=0))


def _formats(tokenizer):
    """LMDeploy's qwen parser's formats for a named and a required tool choice (upgrade active)."""
    from tokenrails.engine_patch.lmdeploy import activate, deactivate
    activate()
    try:
        named = tm.response_parser("qwen", tokenizer, tool_choice={"type": "function",
                                                                   "function": {"name": "get_weather"}})[2]
        required = tm.response_parser("qwen", tokenizer, tool_choice="required")[2]
        return [THINK, json.loads(json.dumps(named.request.response_format)),
                json.loads(json.dumps(required.request.response_format))]
    finally:
        deactivate()


class Recorder:
    """Accepted tokens per session (and the current step's drafts), and every proposal."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.accepted: dict = collections.defaultdict(list)
        self.step: dict = collections.defaultdict(list)
        # (session, text so far, tokens so far, forced tokens proposed there)
        self.proposals: list[tuple[object, str, int, tuple[int, ...]]] = []

    def text(self, sid) -> str:
        return self.tok.decode(self.accepted[sid] + self.step[sid])

    def install(self, monkeypatch):
        from tokenrails.engine_patch.lmdeploy.speculative import grammar_eagle, spec_helper as spec
        from tokenrails.guided.manager import GuidedDecodingManager

        rec = self
        accept = GuidedDecodingManager.accept_tokens_spec

        def accept_tokens_spec(mgr, accepted, rows):
            for toks, row in zip(accepted, rows):
                if row is not None:
                    rec.accepted[row.session_id] += [int(t) for t in toks]
            rec.step.clear()
            return accept(mgr, accepted, rows)

        forced = GuidedDecodingManager.forced_tokens

        def forced_tokens(mgr, row, max_tokens, **kw):
            run = forced(mgr, row, max_tokens, **kw)
            sid = row.session_id
            rec.proposals.append((sid, rec.text(sid), len(rec.accepted[sid]), tuple(run.tokens)))
            return run

        draft = spec.RowHandle.accept_draft

        def accept_draft(handle, token):
            rec.step[handle.raw.session_id].append(int(token))
            return draft(handle, token)

        nxt = grammar_eagle.ForcingDraftHelper._forced_next

        def forced_next(helper, plan, idx, handle, encode, words):
            tok = nxt(helper, plan, idx, handle, encode, words)
            sid = handle.raw.session_id
            n = len(rec.accepted[sid]) + len(rec.step[sid])
            rec.proposals.append((sid, rec.text(sid), n, () if tok is None else (tok,)))
            return tok

        monkeypatch.setattr(GuidedDecodingManager, "accept_tokens_spec", accept_tokens_spec)
        monkeypatch.setattr(GuidedDecodingManager, "forced_tokens", forced_tokens)
        monkeypatch.setattr(spec.RowHandle, "accept_draft", accept_draft)
        monkeypatch.setattr(grammar_eagle.ForcingDraftHelper, "_forced_next", forced_next)
        return self


def _run(model_dir, formats, *, mode: str, draft_dir=None):
    from lmdeploy import GenerationConfig, pipeline
    from lmdeploy.messages import SpeculativeConfig

    from tokenrails.engine_patch.lmdeploy import activate, deactivate
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    torch.set_num_threads(1)
    activate(grammar_drafts=K if mode == "grammar" else 0)
    try:
        config = SpeculativeConfig(method="eagle", model=draft_dir, num_speculative_tokens=K) if mode == "eagle" else None
        cfg = cpu_engine_config(max_batch_size=4, session_len=1024)
        cfg.dtype = "float32"  # one dtype for every configuration, float32 (see test_grammar_drafts.FLOAT32)
        pipe = pipeline(model_dir, backend_config=cfg, speculative_config=config)
        try:
            return pipe([[{"role": "user", "content": p}] for p in PROMPTS],
                        gen_config=[GenerationConfig(max_new_tokens=60, top_k=1, response_format=rf) for rf in formats])
        finally:
            pipe.close()
    finally:
        deactivate()


def _forced_spans(tokenizer, ids: list[int], proposals) -> list[tuple[int, int]]:
    """Character spans of the output tokens that were proposed as forced drafts at their position."""
    marked = set()
    for _, _, n, forced in proposals:
        for j, t in enumerate(forced):  # the accepted prefix of the proposed run
            if n + j >= len(ids) or ids[n + j] != t:
                break
            marked.add(n + j)
    ends = [len(tokenizer.decode(ids[:j + 1])) for j in range(len(ids))]
    return [(ends[j - 1] if j else 0, ends[j]) for j in sorted(marked)]


def _has_forced(text: str, piece: str, spans) -> bool:
    at = text.find(piece)
    return at >= 0 and any(lo < at + len(piece) and hi > at for lo, hi in spans)


@pytest.mark.parametrize("mode", ["grammar", "eagle"])
def test_thinking_rows_draft_nothing_until_think_ends_and_tool_calls_get_forced_drafts(
        model_dir, draft_dir, tokenizer, mode, monkeypatch):
    formats = _formats(tokenizer)
    # forced drafts only: the recorder reads every proposal as forced (tests/guided/test_lookup.py:
    # no lookup while thinking; test_grammar_drafts.py: lookup drafts token for token). Float32: in
    # float16 a multi-position forward may flip a near-tie between digits here (the greedy
    # identity's documented bound), as it did when the CPU rotary stopped going through torch.compile
    monkeypatch.setenv("TOKENRAILS_LOOKUP_DRAFTS", "0")
    plain = _run(model_dir, formats, mode="plain")
    assert "</think>" in plain[0].text and json.loads(plain[0].text.split("</think>", 1)[1]), plain[0].text
    assert '"name": "get_weather"' in plain[1].text, plain[1].text
    rec = Recorder(tokenizer).install(monkeypatch)
    drafted = _run(model_dir, formats, mode=mode, draft_dir=draft_dir)
    assert [o.token_ids for o in drafted] == [o.token_ids for o in plain]

    by_text = {tokenizer.decode(toks): sid for sid, toks in rec.accepted.items()}
    sids = [next(sid for text, sid in by_text.items() if text.startswith(o.text[:20]) or o.text in text)
            for o in plain]
    think = [(text, forced) for sid, text, _, forced in rec.proposals if sid == sids[0]]
    inside = [forced for text, forced in think if "</think>" not in text]
    after = [forced for text, forced in think if "</think>" in text]
    assert len(inside) >= 3 and not any(inside), inside  # asked while thinking, nothing proposed
    assert sum(map(len, after)) >= 3, think  # forced drafts once the section is closed

    for i in (1, 2):
        ids = list(plain[i].token_ids)
        text = tokenizer.decode(ids)
        spans = _forced_spans(tokenizer, ids, [p for p in rec.proposals if p[0] == sids[i]])
        proposed = [tokenizer.decode(list(f)) for sid, _, _, f in rec.proposals if sid == sids[i] and f]
        pieces = ("tool_call", "weather", "arguments", "city", "days")
        # a piece counts when a forced draft that was accepted lies in it, or a proposed forced run
        # spells it (a forced string in its canonical tokenization, which the model may split
        # otherwise); a one-token piece may also fall on a step's bonus position (the target's
        # own token, never a draft), hence 4 of 5
        hits = [p for p in pieces if _has_forced(text, p, spans) or any(p in run for run in proposed)]
        assert len(hits) >= 4 and "weather" in hits, (i, hits, text, spans, proposed)
