"""Issue 13 part 2: valid tool-call arguments for ``tool_choice="auto"`` and named functions.

Stock LMDeploy constrains only ``tool_choice="required"``: with ``auto`` (the OpenAI default) a
model that writes a wrong argument type reaches the client. The upgrade gives those requests the
format of the model's own call syntax. Per parser family, a hostile model that insists on an
invalid call (its own tokens when allowed, else the lowest-scored allowed token) still produces
calls LMDeploy's own parser reads with arguments valid against the tool's ``parameters``; free
text before the call stays possible; named tool choice yields exactly that function.
"""
from __future__ import annotations

import json
import logging

import jsonschema
import pytest

from . import tool_markers as tm

logging.getLogger("lmdeploy").setLevel(logging.WARNING)

# parser family -> the tokenizer that carries its markers where the registries have one
FAMILIES = {
    "qwen3": "qwen3", "qwen3coder": "qwen3", "glm47": "qwen3", "interns2-preview": "qwen3",
    "kimi_k2": "smollm2", "deepseek-v32": "deepseek_v3", "deepseek-v4": "deepseek_v3",
}
BAD_ARGS = {"city": 5, "days": 42, "extra": True}  # wrong type, out of range, unknown key
SECOND_TOOL = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}


def _tokenizer(name):
    if tm.tokenizer_dir(name) is None:
        pytest.skip(f"tokenizer package for {name} not installed")
    return tm.load(name)


def _call_format(parser_name, tok):
    """A required-format rendering of one call: what a model of this family writes."""
    _, _, rf = tm.required_format(parser_name, tok)
    return rf


def _validate_calls(calls, tools):
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), by_name[c.function.name])


@pytest.mark.parametrize("parser", sorted(FAMILIES))
def test_auto_stock_leaves_arguments_free_upgrade_enforces_them(parser, upgraded):
    tok, vocab, _ = _tokenizer(FAMILIES[parser])
    rf_required = _call_format(parser, tok)
    bad_call = tm.render_call(rf_required, BAD_ARGS)
    good_call = tm.render_call(rf_required, tm.ARGS)
    preface = "Let me look that up.\n"

    upgraded.deactivate()
    parser_cls, req, stock_parser = tm.response_parser(parser, tok, tool_choice="auto")
    assert stock_parser.request.response_format is None  # stock: nothing constrains the call
    _, stock_calls = tm.parse_calls(parser_cls, req, preface + bad_call)
    assert stock_calls, "LMDeploy's parser reads the invalid call"
    with pytest.raises(jsonschema.ValidationError):
        _validate_calls(stock_calls, tm.TOOLS)  # ... and hands invalid arguments to the client

    upgraded.activate()
    parser_cls, req, parser_obj = tm.response_parser(parser, tok, tool_choice="auto")
    fmt = parser_obj.request.response_format
    assert fmt is not None and fmt["type"] == "structural_tag"
    ours = tm.Ours(vocab, fmt)
    free = tok.encode(preface, add_special_tokens=False)
    for t in free:  # free text before the call is still possible
        assert bool(ours.allowed()[t]) and ours.accept(t)
    scripts = [tok.encode(bad_call, add_special_tokens=False), tok.encode(good_call, add_special_tokens=False)]
    closing = good_call[good_call.rfind("3") + 1:]  # after the last argument value
    out = free + tm.insistent_walk(ours, tok, scripts, seed=sum(map(ord, parser)),
                                   end_text=tok.decode(tok.encode(good_call, add_special_tokens=False)[-3:]),
                                   closing=tok.encode(closing, add_special_tokens=False))
    text = tok.decode(out, skip_special_tokens=False)
    for e in vocab.eos_ids:
        text = text.replace(tok.decode([e], skip_special_tokens=False), "")
    content, calls = tm.parse_calls(parser_cls, req, text)
    assert calls, f"no call in {text!r}"
    _validate_calls(calls, tm.TOOLS)
    assert content is None or content.startswith("Let me")


@pytest.mark.parametrize("parser", ["qwen3", "deepseek-v32", "internlm"])
def test_named_tool_choice_gives_exactly_that_function(parser, upgraded):
    tok, vocab, _ = _tokenizer(FAMILIES.get(parser, "smollm2"))
    tools = tm.TOOLS + [SECOND_TOOL]
    choice = {"type": "function", "function": {"name": "get_time"}}
    parser_cls, req, parser_obj = tm.response_parser(parser, tok, tools=tools, tool_choice=choice)
    fmt = parser_obj.request.response_format
    assert fmt is not None
    ours = tm.Ours(vocab, fmt)
    # the model insists on the other tool with bad arguments
    bad = tm.render_call(_call_format(parser, tok), BAD_ARGS)
    out = tm.insistent_walk(ours, tok, [tok.encode(bad, add_special_tokens=False)], seed=3)
    text = tok.decode(out, skip_special_tokens=False)
    for e in vocab.eos_ids:
        text = text.replace(tok.decode([e], skip_special_tokens=False), "")
    _, calls = tm.parse_calls(parser_cls, req, text)
    assert [c.function.name for c in calls] == ["get_time"], text
    _validate_calls(calls, tools)


def test_opt_outs_leave_the_request_as_stock(upgraded, monkeypatch):
    tok, _, _ = tm.load("smollm2")
    _, _, p = tm.response_parser("qwen3", tok, tool_choice="auto", response_format={"type": "text"})
    rf = p.request.response_format  # LMDeploy normalizes "text" to None: nothing constrained
    assert rf is None or (rf.get("type") if isinstance(rf, dict) else rf.type) == "text"
    _, _, p = tm.response_parser("qwen3", tok, tool_choice="none")
    assert p.request.response_format is None
    monkeypatch.setenv("TOKENRAILS_TOOL_CALLS", "0")
    _, _, p = tm.response_parser("qwen3", tok, tool_choice="auto")
    assert p.request.response_format is None
    monkeypatch.delenv("TOKENRAILS_TOOL_CALLS")
    _, _, p = tm.response_parser("qwen3", tok, tool_choice="auto")
    assert p.request.response_format is not None
    # a parser without an auto format (InternLM's) keeps stock behaviour for auto
    _, _, p = tm.response_parser("internlm", tok, tool_choice="auto")
    assert p.request.response_format is None


def test_activate_switch_reaches_children_through_the_environment():
    import os

    import tokenrails.engine_patch.lmdeploy as patch

    patch.activate(tool_calls=False)
    try:
        assert os.environ["TOKENRAILS_TOOL_CALLS"] == "0"
    finally:
        patch.deactivate()
    assert "TOKENRAILS_TOOL_CALLS" not in os.environ


def test_parallel_calls_follow_the_request(upgraded):
    tok, vocab, _ = _tokenizer("qwen3")
    rf = _call_format("qwen3", tok)
    two = tm.render_call(rf, tm.ARGS) + "\n" + tm.render_call(rf, tm.ARGS)
    for parallel, ok in ((True, True), (False, False)):
        _, _, p = tm.response_parser("qwen3", tok, tool_choice="auto", parallel_tool_calls=parallel)
        ours = tm.Ours(vocab, p.request.response_format)
        ids = tok.encode(two, add_special_tokens=False)
        accepted = all(bool(ours.allowed()[t]) and ours.accept(t) for t in ids)
        assert accepted == ok


def test_qwen_xml_enum_whitespace_is_a_shared_xgrammar_lmdeploy_mismatch(upgraded):
    """Found by the hostile walk: xgrammar's ``qwen_xml`` style allows whitespace around an enum
    value, LMDeploy's qwen3coder parser keeps it in the string, so a call both stock (required)
    and the upgrade accept reaches the client with ``"zone": "  UTC"``. Kept here as a measured
    fact of both sides (docs/lmdeploy.md); it is not the upgrade's to hide."""
    tok, vocab, stock_manager = _tokenizer("qwen3")
    tools = [SECOND_TOOL]
    parser_cls, req, rf = tm.required_format("qwen3coder", tok)
    parser_cls, req, p = tm.response_parser("qwen3coder", tok, tools=tools, tool_choice="required")
    rf = p.request.response_format
    text = "<tool_call>\n<function=get_time>\n<parameter=zone>  UTC</parameter>\n</function>\n</tool_call>"
    ids = tok.encode(text, add_special_tokens=False)
    for side in (tm.Ours(vocab, rf), tm.Stock(stock_manager, rf)):
        assert all(bool(side.allowed()[t]) and side.accept(t) for t in ids)
    _, calls = tm.parse_calls(parser_cls, req, text)
    assert json.loads(calls[0].function.arguments) == {"zone": "  UTC"}


@pytest.mark.parametrize("parser", ["qwen3", "deepseek-v32"])
def test_streamed_deltas_of_a_constrained_call_match_the_complete_parse(parser, upgraded):
    """Streaming is LMDeploy's own parser on the constrained output, token by token."""
    tok, vocab, _ = _tokenizer(FAMILIES[parser])
    parser_cls, req, p = tm.response_parser(parser, tok, tool_choice="auto", stream=True)
    ours = tm.Ours(vocab, p.request.response_format)
    good = tm.render_call(_call_format(parser, tok), tm.ARGS)
    ids = tok.encode("Checking.\n" + good, add_special_tokens=False)
    for t in ids:
        assert bool(ours.allowed()[t]) and ours.accept(t)
    streamer = parser_cls(req)
    deltas = []
    for k, t in enumerate(ids):
        for message, _ in streamer.stream_chunk(tok.decode([t]), [t], final=k == len(ids) - 1):
            deltas.extend(message.tool_calls or [])
    calls = streamer.tool_parser.build_tool_calls(deltas)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("get_weather", tm.ARGS)]
