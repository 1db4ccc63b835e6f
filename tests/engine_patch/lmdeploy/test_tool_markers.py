"""Issue 13 part 1: LMDeploy's own tool-call constraints keep their marker tokens.

For every tool parser LMDeploy 0.18 ships with a ``tool_choice="required"`` format, and every
tokenizer the registries give us (Qwen3, DeepSeek-V3, Llama-3.2, plus the committed SmolLM2),
stock LMDeploy (its own ``GuidedDecodingManager``) and the upgrade run the same request side by
side:

* the model's own tokenization of a valid call (marker tokens included) is accepted by the
  upgrade at every step and ends at EOS, and LMDeploy's own parser reads a call from the text
  whose arguments validate against the tool's ``parameters``;
* spelled with plain tokens only, the same text sees the upgrade allow every non-special token
  stock allows, at every step (nothing stock lets the model write gets lost);
* wherever the model's own tokenization uses a marker, stock allows it too (the upgrade is not
  looser than stock about markers);
* inside an argument string no special token is allowed by the upgrade, while stock allows them.
"""
from __future__ import annotations

import json
import logging

import jsonschema
import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("xgrammar")

from . import tool_markers as tm  # noqa: E402

logging.getLogger("lmdeploy").setLevel(logging.WARNING)

PARSERS = ["qwen3", "qwen3coder", "internlm", "glm47", "kimi_k2", "deepseek-v32", "deepseek-v4",
           "interns2-preview"]
NO_REQUIRED_FORMAT = ["llama3"]  # LMDeploy 0.18 builds no required format for it (checked below)
TOKENIZERS = ["qwen3", "deepseek_v3", "llama3.2", "smollm2"]
# (tokenizer, parser) pairs whose formats use the tokenizer's own marker tokens
EXPECT_MARKERS = {
    ("qwen3", "qwen3"), ("qwen3", "qwen3coder"), ("qwen3", "glm47"), ("qwen3", "interns2-preview"),
    ("deepseek_v3", "deepseek-v32"), ("deepseek_v3", "deepseek-v4"),
}


def _tokenizer_or_skip(name: str):
    if tm.tokenizer_dir(name) is None:
        pytest.skip(f"tokenizer package for {name} not installed")
    return tm.load(name)


@pytest.mark.parametrize("parser", NO_REQUIRED_FORMAT)
def test_parsers_without_required_format_are_refused_by_lmdeploy_itself(parser):
    tok, _, _ = tm.load("smollm2")
    with pytest.raises(ValueError, match="does not support"):
        tm.required_format(parser, tok)


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
@pytest.mark.parametrize("parser", PARSERS)
def test_required_tool_call_stock_vs_upgrade(parser, tokenizer):
    tok, vocab, stock_manager = _tokenizer_or_skip(tokenizer)
    parser_cls, req, rf = tm.required_format(parser, tok)
    text = tm.render_call(rf, tm.ARGS)

    # LMDeploy's own parser reads one valid call out of the text
    _, calls = tm.parse_calls(parser_cls, req, text)
    assert [c.function.name for c in calls] == ["get_weather"], text
    args = json.loads(calls[0].function.arguments)
    jsonschema.validate(args, tm.TOOLS[0]["function"]["parameters"])
    assert args == tm.ARGS

    own = tok.encode(text, add_special_tokens=False)
    used_markers = [t for t in own if t in vocab.special_ids]
    assert bool(used_markers) == ((tokenizer, parser) in EXPECT_MARKERS), (
        f"marker use changed: {[tok.convert_ids_to_tokens(t) for t in used_markers]}")

    # the model's own tokenization: accepted at every step, then EOS; markers also allowed by stock
    ours, stock = tm.Ours(vocab, rf), tm.Stock(stock_manager, rf)
    inside_string_step = _inside_argument_string(tok, own)
    stock_specials_in_string = 0
    for k, t in enumerate(own):
        a, s = ours.allowed(), stock.allowed()
        assert bool(a[t]), f"step {k}: upgrade refuses {tok.convert_ids_to_tokens(t)!r} of {text!r}"
        if t in vocab.special_ids:
            assert bool(s[t]), f"step {k}: upgrade allows marker {tok.convert_ids_to_tokens(t)!r}, stock not"
        if k == inside_string_step:
            special_allowed = [i for i in a.nonzero().flatten().tolist() if i in vocab.special_ids]
            assert special_allowed == [], "a special token is allowed inside an argument string"
            stock_specials_in_string = sum(1 for i in s.nonzero().flatten().tolist() if i in vocab.special_ids)
        assert ours.accept(t)
        assert stock.accept(t)
    assert any(bool(ours.allowed()[e]) for e in vocab.eos_ids), "EOS not allowed after a complete call"
    assert inside_string_step is not None
    # stock lets markers into the argument string whenever the vocabulary has any
    assert stock_specials_in_string > 0 or len(vocab.special_ids - set(vocab.eos_ids)) == 0

    # plain tokens only: the upgrade allows every non-special token stock allows, every step
    plain = _plain_tokens(tok, vocab, text)
    assert not any(t in vocab.special_ids for t in plain)
    ours, stock = tm.Ours(vocab, rf), tm.Stock(stock_manager, rf)
    for k, t in enumerate(plain):
        a, s = ours.allowed(), stock.allowed()
        missing = [i for i in (s & ~a).nonzero().flatten().tolist() if i not in vocab.special_ids]
        assert missing == [], (
            f"step {k}: stock allows {[tok.convert_ids_to_tokens(i) for i in missing[:5]]} "
            f"({len(missing)} tokens) the upgrade refuses")
        assert ours.accept(t) and stock.accept(t)


def _inside_argument_string(tok, ids: list[int]) -> int | None:
    """The step that emits " city" of the value "Paris city": the row is inside the string then."""
    for k in range(1, len(ids)):
        before = tok.decode(ids[:k])
        if "Paris" in before and "Paris city" not in before and "Paris city" in tok.decode(ids[:k + 1]):
            return k
    return None


def _plain_tokens(tok, vocab, text: str) -> list[int]:
    """``text`` with every marker spelled character by character in ordinary tokens."""
    from tokenrails.guided.backends.xgrammar_markers import marker_set

    finder = marker_set(vocab).finder
    out: list[int] = []
    pos = 0
    for m in (finder.finditer(text) if finder is not None else []):
        out += tok.encode(text[pos:m.start()], add_special_tokens=False)
        for ch in m.group(0):
            out += tok.encode(ch, add_special_tokens=False)
        pos = m.end()
    return out + tok.encode(text[pos:], add_special_tokens=False)
