"""Thinking models with tool calls (issue 25, point 1): one owner of the thinking section per request.

With a reasoning parser, LMDeploy builds the tool-call format with its own thinking part (xgrammar's
``reasoning=True`` structural tags, InternLM's own): the prompt has opened ``<think>``, the format
reads the thinking text up to ``</think>`` and then the call. The engine-wide reasoning gate
(default "auto") must then stand aside for that request, or the model thinks twice: the gate takes
the thinking, and the format wants a second ``</think>`` — the call's first marker after the first
one is refused, and a plain answer never reaches EOS.

Per parser family, with the think-first tokenization of a valid call (``required``) and of a plain
answer (``auto``): stock LMDeploy's own matcher accepts it to EOS, and so does the upgrade on the
real strategy → FusedLogitsProcessor path (gate included), the prompt having opened ``<think>``.
"""
from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("lmdeploy")
pytest.importorskip("xgrammar")

from . import harness  # noqa: E402
from . import tool_markers as tm  # noqa: E402

logging.getLogger("lmdeploy").setLevel(logging.WARNING)

# parser -> (tokenizer with its markers where the registries have one, reasoning parser, template kwargs)
FAMILIES = {
    "qwen3": ("qwen3", "default", None),
    "qwen3coder": ("qwen3", "default", None),
    "glm47": ("qwen3", "default", None),
    "interns2-preview": ("qwen3", "default", None),
    "internlm": ("qwen3", "default", None),
    "kimi_k2": ("qwen3", "default", None),
    "deepseek-v32": ("deepseek_v3", "deepseek-v32", {"thinking": True}),
    "deepseek-v4": ("deepseek_v3", "deepseek-v4", {"thinking": True}),
}
THINKING = "The user wants the weather in Paris for 3 days, so I call the tool."
ANSWER = "\n\nIt is sunny in Paris."


def _tokenizer(name):
    if tm.tokenizer_dir(name) is None:
        pytest.skip(f"tokenizer package for {name} not installed")
    return tm.load(name)


def _parser(parser_name, tok, tool_choice):
    from lmdeploy.serve.openai.protocol import ChatCompletionRequest
    from lmdeploy.serve.parsers.response_parser import BaseResponseParser

    _, reasoning_parser, kwargs = FAMILIES[parser_name]
    parser_cls = type(f"Parser_{parser_name}", (BaseResponseParser,), {})
    parser_cls.set_parsers(tool_parser_name=parser_name, reasoning_parser_name=reasoning_parser, tokenizer=tok)
    fields = {"chat_template_kwargs": kwargs} if kwargs else {}
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "weather?"}],
                                tools=tm.TOOLS, tool_choice=tool_choice, **fields)
    parser = parser_cls(req)
    assert parser.reasoning_enabled
    return parser_cls, req, parser


def _prompt(tok):
    """A chat prompt whose template opened the thinking section (what the formats assume)."""
    return tok.encode("user: weather in Paris?\nassistant:", add_special_tokens=False) + \
        tok.encode("<think>\n", add_special_tokens=False)


def _stock_accepts(stock_manager, vocab, fmt, ids):
    stock = tm.Stock(stock_manager, fmt)
    for k, t in enumerate(ids):
        assert bool(stock.allowed()[t]), f"stock refuses step {k}"
        assert stock.accept(t)
    assert any(bool(stock.allowed()[e]) for e in vocab.eos_ids), "stock: no EOS after the output"


def _upgrade_decodes(tok, vocab, fmt, script):
    """The script then EOS through the real strategy/processor path; returns the emitted tokens."""
    from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager

    mgr = LMDeployGuidedManager(tok, vocab.vocab_size, vocab=vocab, limits=harness.unhurried_limits())
    seq = harness.FakeSeq(1, harness.gen_config(fmt, max_new_tokens=1024), prompt_ids=_prompt(tok))
    strat = harness.strategy()
    gen = torch.Generator().manual_seed(0)
    eos = list(vocab.eos_ids)[0]
    wanted = list(script) + [eos]

    harness.offer(strat, mgr, seq, wanted, vocab.vocab_size, noise=gen)
    return seq.generated, wanted


def _formats(parser_name, tok, tool_choice, patch):
    patch.deactivate()
    stock = _parser(parser_name, tok, tool_choice)[2].request.response_format
    patch.activate()
    parser_cls, req, upgraded = _parser(parser_name, tok, tool_choice)
    return parser_cls, req, stock, upgraded.request.response_format


@pytest.mark.parametrize("parser", sorted(FAMILIES))
def test_required_call_after_thinking_stock_and_upgrade(parser, cpu_lmdeploy, upgraded, monkeypatch):
    monkeypatch.delenv("TOKENRAILS_REASONING", raising=False)
    tok, vocab, stock_manager = _tokenizer(FAMILIES[parser][0])
    parser_cls, req, stock_fmt, fmt = _formats(parser, tok, "required", upgraded)
    text = THINKING + tm.render_call(stock_fmt, tm.ARGS)
    _, calls = tm.parse_calls(parser_cls, req, text)
    assert [c.function.name for c in calls] == ["get_weather"], text
    ids = tok.encode(text, add_special_tokens=False)
    _stock_accepts(stock_manager, vocab, stock_fmt, ids)
    out, wanted = _upgrade_decodes(tok, vocab, fmt, ids)
    assert out == wanted, (f"upgrade refused {tok.decode(wanted[len(out) - 1:len(out)])!r} after "
                           f"{tok.decode(out[:-1])!r}")


@pytest.mark.parametrize("parser", sorted(FAMILIES))
def test_auto_plain_answer_after_thinking_stock_and_upgrade(parser, cpu_lmdeploy, upgraded, monkeypatch):
    monkeypatch.delenv("TOKENRAILS_REASONING", raising=False)
    tok, vocab, stock_manager = _tokenizer(FAMILIES[parser][0])
    _, _, stock_fmt, fmt = _formats(parser, tok, "auto", upgraded)
    ids = tok.encode(THINKING + "</think>" + ANSWER, add_special_tokens=False)
    if stock_fmt is not None:  # stock leaves auto unconstrained: nothing to refuse
        _stock_accepts(stock_manager, vocab, stock_fmt, ids)
    out, wanted = _upgrade_decodes(tok, vocab, fmt, ids)
    assert out == wanted, (f"upgrade refused {tok.decode(wanted[len(out) - 1:len(out)])!r} after "
                           f"{tok.decode(out[:-1])!r}")


def test_format_without_thinking_part_leaves_the_gate_in_charge(cpu_lmdeploy, upgraded, monkeypatch):
    """The reverse: no reasoning parser, so the format has no thinking part; the engine gate owns
    the thinking section (a model that opens <think> itself thinks, then calls)."""
    monkeypatch.delenv("TOKENRAILS_REASONING", raising=False)
    tok, vocab, _ = _tokenizer("qwen3")
    from tokenrails.engine_patch.reasoning_settings import REQUEST_KEY

    parser_cls, req, parser = tm.response_parser("qwen3", tok, tool_choice="required")
    fmt = parser.request.response_format
    assert REQUEST_KEY not in fmt
    text = "<think>" + THINKING + "</think>" + tm.render_call(fmt, tm.ARGS)
    ids = tok.encode(text, add_special_tokens=False)
    from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager

    mgr = LMDeployGuidedManager(tok, vocab.vocab_size, vocab=vocab, limits=harness.unhurried_limits())
    seq = harness.FakeSeq(2, harness.gen_config(fmt, max_new_tokens=1024),
                          prompt_ids=tok.encode("user: weather?\nassistant:", add_special_tokens=False))
    strat = harness.strategy()
    eos = list(vocab.eos_ids)[0]

    harness.offer(strat, mgr, seq, ids + [eos], vocab.vocab_size)
    assert seq.generated == ids + [eos]


# ---- a model that opens <think> itself (Qwen3-hybrid templates: the prompt does not pre-fill it) ----

BAD_CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": 5, "days": "many", "extra": true}}'
            "\n</tool_call>")
CLOSING = '"}}\n</tool_call>'  # how a hostile model that gives up tries to end a call
CHOICES = {"auto": "auto", "named": {"type": "function", "function": {"name": "get_weather"}},
           "required": "required"}


def _open_prompt(tok):
    """A hybrid template's prompt with thinking left to the model: no <think> pre-filled."""
    return tok.encode("<|im_start|>user\nweather in Paris?<|im_end|>\n<|im_start|>assistant\n",
                      add_special_tokens=False)


def _hostile_decode(tok, vocab, fmt, script_text, *, seed=0, window=12, max_steps=400):
    """A hostile model on the real strategy → FusedLogitsProcessor path: it wants the tokens of
    ``script_text`` in order (an invalid call in it), the first of its next ``window`` tokens the
    mask allows on top; when none is allowed, a random allowed token (whitespace less liked);
    scripts used up with the call still open, it writes ``CLOSING`` again and again. EOS only once
    a call's end was written (then it wants EOS above all). Returns the generated ids."""
    import asyncio

    from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager

    mgr = LMDeployGuidedManager(tok, vocab.vocab_size, vocab=vocab, limits=harness.unhurried_limits())
    seq = harness.FakeSeq(next(_SESSIONS), harness.gen_config(fmt, max_new_tokens=max_steps),
                          prompt_ids=_open_prompt(tok))
    strat = harness.strategy()
    gen = torch.Generator().manual_seed(seed)
    eos = list(vocab.eos_ids)
    blank = tm._whitespace_tokens(vocab)
    script = tok.encode(script_text, add_special_tokens=False)
    closing = tok.encode(CLOSING, add_special_tokens=False)

    wanted = len(script)

    async def run():
        pos = 0
        for _ in range(max_steps):
            done = pos >= wanted and "</tool_call>" in tok.decode(seq.generated)
            logits = -torch.rand(vocab.vocab_size, generator=gen)
            logits[blank] -= 0.99
            logits[eos] = 1000.0 if done else -1000.0
            while pos + window > len(script):
                script.extend(closing)
            for k in range(pos, pos + window):
                logits[script[k]] = max(float(logits[script[k]]), 200.0 - k + pos)
            (t,), _ = await harness.step(strat, mgr, [seq], logits[None])
            seq.generated.append(int(t))
            if int(t) in eos:
                return
            for k in range(pos, pos + window):
                if script[k] == int(t):
                    pos = k + 1
                    break

    asyncio.run(run())
    assert seq.generated and seq.generated[-1] in eos, f"no EOS: {tok.decode(seq.generated)!r}"
    return seq.generated


def _checked_calls(parser_cls, req, tok, ids):
    """LMDeploy's parser on the output: (content, calls, reasoning); every call's arguments
    validate against its tool's schema."""
    import json

    import jsonschema

    content, calls, reasoning = parser_cls(req).parse_complete(tok.decode(ids[:-1]))
    schema = tm.TOOLS[0]["function"]["parameters"]
    for call in calls or []:
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), schema)
    return content, calls or [], reasoning


_SESSIONS = iter(range(7000, 8000))


@pytest.mark.parametrize("choice", sorted(CHOICES))
def test_model_opens_think_itself_then_calls(choice, cpu_lmdeploy, upgraded, monkeypatch):
    """Stock leaves auto/named free, so such a model thinks; its required format and the
    upgrade's tags assumed the prompt opened <think> and refused the model's own. Now the model's
    first token <think> is allowed under every tool_choice, and the arguments after </think> are
    still enforced against a model that writes an invalid call."""
    monkeypatch.delenv("TOKENRAILS_REASONING", raising=False)
    tok, vocab, _ = _tokenizer("qwen3")
    parser_cls, req, parser = _parser("qwen3", tok, CHOICES[choice])
    fmt = parser.request.response_format
    ids = _hostile_decode(tok, vocab, fmt, "<think>" + THINKING + "</think>\n\n" + BAD_CALL)
    think = tok.convert_tokens_to_ids("<think>")
    assert ids[0] == think, f"the model's own <think> was refused: {tok.decode(ids[:8])!r}"
    content, calls, reasoning = _checked_calls(parser_cls, req, tok, ids)
    assert reasoning is not None and THINKING in reasoning, reasoning
    assert calls, f"no call: {tok.decode(ids)!r}"


@pytest.mark.parametrize("choice", ["named", "required"])
def test_required_means_calls_not_prose_first(choice, cpu_lmdeploy, upgraded, monkeypatch):
    """The same model without thinking, wanting prose before its (invalid) call: required and a
    named function answer with the call first (stock's required format reads that prose as
    thinking, lets the call's text through unconstrained inside it, and waits for a </think>)."""
    monkeypatch.delenv("TOKENRAILS_REASONING", raising=False)
    tok, vocab, _ = _tokenizer("qwen3")
    parser_cls, req, parser = _parser("qwen3", tok, CHOICES[choice])
    ids = _hostile_decode(tok, vocab, parser.request.response_format,
                          "Sure, let me look that up for you. " + BAD_CALL, max_steps=300)
    content, calls, reasoning = _checked_calls(parser_cls, req, tok, ids)
    assert calls, f"no call: {tok.decode(ids)!r}"
    assert not tok.decode(ids[:-1]).startswith("Sure"), tok.decode(ids)
    assert not (content or "").strip(), content


NAMED_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'


def test_no_step_walks_the_vocabulary_for_the_thinking_gate(cpu_lmdeploy, upgraded, monkeypatch):
    """The thinking gate's row tables (the start marker's, the thinking row, the whitespace gap's:
    each a walk over the vocabulary, 8-20 ms of CPU on qwen3's 151k tokens, many times that on a
    loaded machine) are built when the engine's manager is, on a thread of their own: a named
    call the model thinks before is served with no walk inside a step."""
    import threading
    from collections import OrderedDict

    from tokenrails.engine_patch.lmdeploy.server.request_parsing import parse_format
    from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager

    monkeypatch.delenv("TOKENRAILS_REASONING", raising=False)
    tok, vocab, _ = _tokenizer("qwen3")
    monkeypatch.setitem(vocab.backend_cache, "reasoning:trackers", OrderedDict())  # built here, not earlier
    walks: list[str] = []

    class Walked(tuple):
        def __iter__(self):
            walks.append(threading.current_thread().name)
            return super().__iter__()

    monkeypatch.setattr(vocab, "token_bytes", Walked(vocab.token_bytes))
    parser_cls, req, parser = _parser("qwen3", tok, CHOICES["named"])
    fmt = parser.request.response_format
    mgr = LMDeployGuidedManager(tok, vocab.vocab_size, vocab=vocab, limits=harness.unhurried_limits())
    warming = getattr(mgr, "warming", None)
    if warming is not None:
        warming.join()
    mgr.core().get_compiled(parse_format(fmt)[0])  # the grammar's compile is not what is counted
    walks.clear()  # from here on, every walk is a decoding step's (on its thread or a worker's)
    seq = harness.FakeSeq(next(_SESSIONS), harness.gen_config(fmt, max_new_tokens=256), prompt_ids=_open_prompt(tok))
    eos = list(vocab.eos_ids)[0]
    wanted = tok.encode("<think>" + THINKING + "</think>\n\n" + NAMED_CALL, add_special_tokens=False) + [eos]
    harness.offer(harness.strategy(), mgr, seq, wanted, vocab.vocab_size)
    assert seq.generated == wanted, tok.decode(seq.generated)
    _, calls, reasoning = _checked_calls(parser_cls, req, tok, seq.generated)
    assert [c.function.name for c in calls] == ["get_weather"] and THINKING in reasoning
    assert not walks, f"{len(walks)} vocabulary walks inside decoding steps (threads {walks})"


def test_the_first_tool_call_compile_builds_no_tokenizer_info(cpu_lmdeploy, upgraded, monkeypatch):
    """xgrammar's per-vocabulary tables (a tokenizer info per view of the vocabulary, 0.07-0.15 s
    of CPU each on qwen3's 151k tokens) are built when the engine's manager is, as stock LMDeploy
    builds its tokenizer info when it starts: the first tool call's compile, which its request
    waits for, builds none, and its guide takes a valid call."""
    import xgrammar as xgr

    from tokenrails.engine_patch.lmdeploy.server.request_parsing import parse_format
    from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager

    monkeypatch.setenv("TOKENRAILS_REASONING", "off")  # only xgrammar's tables are built here
    tok, vocab, _ = _tokenizer("qwen3")
    fresh = vocab.reread(vocab.token_bytes, special_ids=vocab.special_ids)  # no tables built by other tests
    mgr = LMDeployGuidedManager(tok, vocab.vocab_size, vocab=fresh, limits=harness.unhurried_limits())
    warming = getattr(mgr, "warming", None)
    if warming is not None:
        warming.join()
    built, init = [], xgr.TokenizerInfo.__init__

    def counted(self, *args, **kwargs):
        built.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(xgr.TokenizerInfo, "__init__", counted)
    fmt = _parser("qwen3", tok, CHOICES["named"])[2].request.response_format
    guide = mgr.core().get_compiled(parse_format(fmt)[0])
    assert not built, f"the first compile built {len(built)} xgrammar tokenizer infos"
    matcher = guide.matcher()
    assert all(matcher.accept_token(t) for t in tok.encode(NAMED_CALL, add_special_tokens=False))
    assert matcher.is_accepting()


def test_the_first_schema_routed_to_llguidance_builds_no_tokenizer(cpu_lmdeploy, upgraded, monkeypatch):
    """llguidance's per-vocabulary tables (its tokenizer and the canonical encoder for forced text:
    about 1.3 s of CPU on a 128k vocabulary, seconds of wall under load) are built on the
    manager's warm thread too: ``auto`` sends a schema it has not seen to llguidance, and that
    first request's compile deadline must not pay for them."""
    from tokenrails import GuideSpec
    from tokenrails.guided.backends import llguidance_backend
    from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager

    monkeypatch.setenv("TOKENRAILS_REASONING", "off")
    tok, vocab, _ = _tokenizer("qwen3")
    fresh = vocab.reread(vocab.token_bytes, special_ids=vocab.special_ids)  # no tables built by other tests
    fresh.backend_cache["hf_tokenizer"] = tok
    mgr = LMDeployGuidedManager(tok, vocab.vocab_size, vocab=fresh, limits=harness.unhurried_limits())
    warming = getattr(mgr, "warming", None)
    if warming is not None:
        warming.join()
    built, build = [], llguidance_backend.build_lltokenizer

    def counted(*args, **kwargs):
        built.append(1)
        return build(*args, **kwargs)

    monkeypatch.setattr(llguidance_backend, "build_lltokenizer", counted)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    guide = mgr.core().get_compiled(GuideSpec.json_schema(schema))
    assert guide.backend == "llguidance"
    assert not built, "the first compile routed to llguidance built its tokenizer"
    assert fresh.backend_cache["llguidance:tables"][2].source == "tokenizers"  # canonical forced text
    matcher = guide.matcher()
    assert all(matcher.accept_token(t) for t in tok.encode('{"city": "Paris"}', add_special_tokens=False))
    assert matcher.is_accepting()


def test_resolving_the_markers_is_cheap_on_a_large_vocabulary(cpu_lmdeploy, upgraded, monkeypatch):
    """The markers' token index (built once per vocabulary, on the first request's path when no
    manager built it ahead) costs little CPU on qwen3's 151k tokens: at most 0.3 s of
    this thread's CPU (load does not stretch it). The markers found are the tokenizer's own."""
    import time

    from tokenrails.engine_patch.reasoning_settings import parse_setting, resolve

    tok, vocab, _ = _tokenizer("qwen3")
    fresh = vocab.reread(vocab.token_bytes, special_ids=vocab.special_ids)
    began = time.thread_time()
    cfg = resolve(parse_setting("auto"), fresh)
    spent = time.thread_time() - began
    assert cfg.start_ids == (tok.convert_tokens_to_ids("<think>"),)
    assert cfg.end_ids == (tok.convert_tokens_to_ids("</think>"),)
    assert resolve(parse_setting("<think>,</think>,optional"), fresh).end_ids == cfg.end_ids
    assert spent < 0.3, f"{spent:.2f} s of CPU to find two markers"
