"""Stock LMDeploy vs the upgrade on LMDeploy 0.18's real PyTorch engine (CPU path, embedded SmolLM2).

One engine per mode for the whole module (``engine`` is module-scoped and parametrized, so pytest
runs every stock test on one engine, then every upgraded test on another): built with
``max_prefill_token_num=48`` so a long prompt is prefilled in chunks while short ones are not.

* response_format kinds the upgrade adds or changes, each batched with an unguided request and
  checked by an oracle: ``choice`` (membership), ``grammar`` (xgrammar's own ``GrammarMatcher``
  over the EBNF, fed the output string), ``structural_tag`` (tags parsed, the JSON inside each
  validated with jsonschema);
* the defects of tests/engine_patch/lmdeploy/test_defects.py that the real engine can show:
  chunked prefill, a second round on the same session with a new format, bad words and a stop
  word (``min_new_tokens``) against a guided row, a rejected token. Each asserts what stock gets
  wrong and that the upgrade gets it right. The rejected token is the one fake: LMDeploy's
  ``FusedLogitsProcessor.sampling`` is wrapped to return an illegal token for one marked row
  once (the narrowest point; nothing else is replaced).

Greedy decoding (``top_k=1``) everywhere: every output below is deterministic on this model.
"""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")
jsonschema = pytest.importorskip("jsonschema")
xgr = pytest.importorskip("xgrammar")

pytestmark = pytest.mark.slow

EOS = 2  # SmolLM2 <|im_end|>
MAX_PREFILL = 48
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
UNGUIDED_PROMPT = "Hi"


@pytest.fixture(scope="module", params=["stock", "tokenrails"])
def engine(request, model_dir):
    """(mode, pipeline): stock LMDeploy (upgrade never activated while it lives) or the upgrade."""
    torch.set_num_threads(1)
    from lmdeploy import pipeline

    from tokenrails.engine_patch.lmdeploy import activate, deactivate
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    mode = request.param
    if mode == "tokenrails":
        activate()
    else:
        deactivate()
    pipe = pipeline(model_dir, backend_config=cpu_engine_config(max_batch_size=4, session_len=512,
                                                                max_prefill_token_num=MAX_PREFILL))
    try:
        yield mode, pipe
    finally:
        pipe.close()
        deactivate()


def _gen(fmt=None, **kw):
    from lmdeploy import GenerationConfig
    kw.setdefault("max_new_tokens", 24)
    return GenerationConfig(top_k=1, response_format=fmt, **kw)


def _with_unguided(pipe, prompt, gen):
    """The guided request batched with an unguided one; the unguided one must be untouched."""
    guided, plain = pipe([prompt, UNGUIDED_PROMPT], gen_config=[gen, _gen(max_new_tokens=6)])
    assert plain.finish_reason == "length" and plain.text.strip(), plain
    return guided


# ---- response_format kinds ---------------------------------------------------------------------
def test_choice_batched_with_unguided(engine):
    mode, pipe = engine
    choices = ["red", "green", "blue"]
    out = _with_unguided(pipe, "What colour is the sky?", _gen({"type": "choice", "choice": choices}))
    if mode == "stock":  # stock has no "choice": refused
        assert out.finish_reason == "error" and out.text == "", out
        return
    assert out.finish_reason == "stop", out
    assert out.text in choices, out.text


GRAMMAR = 'root ::= num " " op " " num\nop ::= "+" | "-" | "*"\nnum ::= [1-9] [0-9]?'


def _grammar_accepts(ebnf: str, text: str) -> bool:
    """xgrammar's GrammarMatcher (string-level, no tokenizer) fed the whole output, then complete."""
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)
    matcher = xgr.GrammarMatcher(compiler.compile_grammar(xgr.Grammar.from_ebnf(ebnf)),
                                 terminate_without_stop_token=True)
    return bool(matcher.accept_string(text)) and matcher.is_terminated()


def test_grammar_batched_with_unguided(engine):
    mode, pipe = engine
    assert not _grammar_accepts(GRAMMAR, "10 + ") and _grammar_accepts(GRAMMAR, "10 + 11")  # the oracle
    out = _with_unguided(pipe, "Write a sum.", _gen({"type": "grammar", "grammar": GRAMMAR}))
    if mode == "stock":  # stock has no "grammar": refused
        assert out.finish_reason == "error" and out.text == "", out
        return
    assert out.finish_reason == "stop", out
    assert _grammar_accepts(GRAMMAR, out.text), out.text


TAG = re.compile(r"<person>(.*?)</person>", re.S)


def _tag_formats():
    tag = {"type": "tag", "begin": "<person>", "content": {"type": "json_schema", "json_schema": PERSON},
           "end": "</person>"}
    return {
        "tag": {"type": "structural_tag", "format": tag},
        "triggered": {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<p"],
                                                           "tags": [tag], "at_least_one": True,
                                                           "stop_after_first": True}},
    }


@pytest.mark.parametrize("shape", ["tag", "triggered"])
def test_structural_tag_batched_with_unguided(engine, shape):
    mode, pipe = engine
    out = _with_unguided(pipe, "Describe a person.", _gen(_tag_formats()[shape], max_new_tokens=40))
    assert out.finish_reason == "stop", out  # stock compiles xgrammar's own shape too
    bodies = TAG.findall(out.text)
    assert bodies, out.text
    assert TAG.sub("", out.text).strip() == "", out.text  # nothing outside the tags
    for body in bodies:
        jsonschema.validate(json.loads(body), PERSON)


def test_structural_tag_legacy_shape_free_text_allowed(engine):
    """Legacy ``structures``/``triggers``: text is free until a trigger; any tag must hold valid JSON."""
    mode, pipe = engine
    fmt = {"type": "structural_tag", "structures": [{"begin": "<person>", "schema": PERSON, "end": "</person>"}],
           "triggers": ["<person>"]}
    out = _with_unguided(pipe, "Describe a person inside <person></person> tags as JSON.", _gen(fmt, max_new_tokens=32))
    if mode == "stock":  # stock hands it to xgrammar's parser: "Structural tag must have a format field"
        assert out.finish_reason == "error", out
        return
    assert out.finish_reason in ("stop", "length"), out
    for body in TAG.findall(out.text):
        jsonschema.validate(json.loads(body), PERSON)


# ---- defects, stock vs upgraded ------------------------------------------------------------------
CODE = r"[0-9]{3}-[a-z]{2}"


def test_chunked_prefill(engine):
    """A long prompt prefilled in chunks: LMDeploy samples (and discards) a token on each non-last
    chunk; stock feeds it to the matcher, which then runs ahead of the real output."""
    mode, pipe = engine
    prompt = "Here is some context about codes. " * 12 + "Write a code."
    out = _with_unguided(pipe, prompt, _gen({"type": "regex_schema", "regex_schema": CODE}, max_new_tokens=12))
    assert out.input_token_len > 2 * MAX_PREFILL  # three chunks
    if mode == "stock":
        assert re.fullmatch(CODE, out.text) is None, out.text
    else:
        assert out.finish_reason == "stop" and re.fullmatch(CODE, out.text), out


def test_second_round_new_format(engine):
    """Round two of a session with a different format: stock reuses round one's (finished) matcher."""
    mode, pipe = engine
    sess = pipe.session()
    sess = pipe.chat("Is the sky blue?", session=sess,
                     gen_config=_gen({"type": "regex_schema", "regex_schema": "(yes|no)"}, max_new_tokens=6))
    assert re.fullmatch("(yes|no)", sess.response.text), sess.response
    sess = pipe.chat("How old are you?", session=sess,
                     gen_config=_gen({"type": "regex_schema", "regex_schema": "[0-9]{2}"}, max_new_tokens=6))
    text = sess.response.text
    if mode == "stock":
        assert re.fullmatch("[0-9]{2}", text) is None, text
    else:
        assert sess.response.finish_reason == "stop" and re.fullmatch("[0-9]{2}", text), sess.response


def test_bad_words_ban_every_legal_token(engine):
    """Bad words ban every token the grammar allows: stock masks first and bans afterwards, so the
    row has no finite logit and an arbitrary (illegal) token is emitted; the upgrade fails the row."""
    mode, pipe = engine
    out = _with_unguided(pipe, "Say ab.", _gen({"type": "regex_schema", "regex_schema": "ab"},
                                                bad_words=["a", "ab"], max_new_tokens=6))
    if mode == "stock":
        assert out.finish_reason == "length" and out.text != "ab", out  # silently garbage
        assert all(t not in (81, 369) for t in out.token_ids), out.token_ids
    else:
        assert out.finish_reason == "error" and out.text == "", out


def test_stop_word_banned_after_complete_grammar(engine):
    """``min_new_tokens`` bans EOS (a stop word) while the grammar is already complete: stock leaves
    the row with no legal token and emits garbage after "ab"; the upgrade ends the output."""
    mode, pipe = engine
    out = _with_unguided(pipe, "Say ab.", _gen({"type": "regex_schema", "regex_schema": "ab"},
                                                min_new_tokens=6, max_new_tokens=8))
    if mode == "stock":
        assert list(out.token_ids[:1]) == [369] and len(out.token_ids) >= 6, out.token_ids  # 'ab' + garbage
    else:
        assert out.finish_reason == "stop" and list(out.token_ids) == [369], out


MARK = "[0-9]{4}"  # the row whose token is forced illegal


@pytest.fixture
def forced_illegal_token(monkeypatch):
    """Wrap LMDeploy's sampling: the row whose format is MARK gets 'a' (id 81) once."""
    from lmdeploy.pytorch.engine import logits_process as lp
    original = lp.FusedLogitsProcessor.sampling
    fired = []

    def sampling(self, logits):
        tokens = original(self, logits)
        formats = self.sampling_inputs.response_formats or ()
        for i, fmt in enumerate(formats):
            if not fired and isinstance(fmt, dict) and fmt.get("regex_schema") == MARK and tokens.numel() > i:
                tokens = tokens.clone()
                tokens[i] = 81
                fired.append(i)
        return tokens

    monkeypatch.setattr(lp.FusedLogitsProcessor, "sampling", sampling)
    return fired


def test_rejected_token_finishes_only_its_request(engine, forced_illegal_token):
    """A token the grammar rejects (a sampler bug, a broken row): stock's matcher ignores the
    rejection and the request goes on as if nothing happened; the upgrade ends that request with an
    error, and the other guided request and the unguided one in the batch finish normally."""
    mode, pipe = engine
    outs = pipe(["Give a PIN.", "Is the sky blue?", UNGUIDED_PROMPT],
                gen_config=[_gen({"type": "regex_schema", "regex_schema": MARK}, max_new_tokens=8),
                            _gen({"type": "regex_schema", "regex_schema": "(yes|no)"}, max_new_tokens=6),
                            _gen(max_new_tokens=6)])
    assert forced_illegal_token, "the forced token never fired"
    marked, other, plain = outs
    assert re.fullmatch("(yes|no)", other.text) and other.finish_reason == "stop", other
    assert plain.finish_reason == "length" and plain.text.strip(), plain
    if mode == "stock":
        assert marked.finish_reason != "error" and re.fullmatch(MARK, marked.text) is None, marked
        assert 81 in marked.token_ids
    else:
        assert marked.finish_reason == "error", marked
