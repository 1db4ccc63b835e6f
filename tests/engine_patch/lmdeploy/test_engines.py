"""Never silently unconstrained, whatever engine runs the request (issue 13, part 3).

Stock vs upgraded on LMDeploy's own code: ``AsyncEngine.preprocess`` (the server's and the
pipeline's early check) with a TurboMind engine, gpt-oss's harmony ``response_format`` wrapper, and
the ``tokenrails lmdeploy`` CLI's engine choice. Before: ``choice``/``grammar`` passed the upgraded
check and TurboMind then dropped them (warning, unconstrained); harmony cleared them.
"""
from __future__ import annotations

import asyncio
import types

import pytest

import tokenrails as tr
from tokenrails.engine_patch.lmdeploy import lmdeploy_cli as cli

ae = pytest.importorskip("lmdeploy.serve.core.async_engine")
from lmdeploy.messages import GenerationConfig  # noqa: E402
from lmdeploy.serve.core.exceptions import ErrorCode, RequestError  # noqa: E402

STOCK_KINDS = [{"type": "json_object"}, {"type": "regex_schema", "regex_schema": "[ab]+"},
               {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}]
WIDE_KINDS = [{"type": "choice", "choice": ["yes", "no"]}, {"type": "grammar", "grammar": 'root ::= "a"'},
              {"type": "json_object", "tokenrails_reasoning": "off"},
              {"type": "regex_schema", "regex_schema": "[ab]+", "tokenrails_budget": "close"}]


def preprocess_error(backend: str, response_format: dict) -> ErrorCode | None:
    """The error code LMDeploy's real ``preprocess`` answers for this format on a stub engine of
    ``backend``: the format check runs before anything touches the engine, so a later failure on
    the stub (PREPROCESS_FAILED) means the format passed."""
    engine = types.SimpleNamespace(backend=backend)
    coro = ae.AsyncEngine.preprocess(engine, [{"role": "user", "content": "hi"}], 1,
                                     gen_config=GenerationConfig(response_format=response_format))
    try:
        asyncio.run(coro)
    except RequestError as exc:
        return exc.code
    return None


@pytest.mark.parametrize("fmt", WIDE_KINDS, ids=lambda f: f["type"] + ("+reasoning" if "tokenrails_reasoning" in f else "+budget" if "tokenrails_budget" in f else ""))
def test_turbomind_refuses_what_only_the_pytorch_engine_enforces(upgraded, fmt):
    assert preprocess_error("turbomind", fmt) is ErrorCode.INVALID_REQUEST
    assert preprocess_error("pytorch", fmt) is not ErrorCode.INVALID_REQUEST  # upgraded engine takes it


@pytest.mark.parametrize("fmt", STOCK_KINDS, ids=lambda f: f["type"])
def test_turbomind_keeps_stocks_kinds(upgraded, fmt):
    assert preprocess_error("turbomind", fmt) is not ErrorCode.INVALID_REQUEST


def test_stock_refuses_the_same_on_turbomind():
    """The reference: stock LMDeploy refuses choice on TurboMind too (so refusing is drop-in)."""
    assert preprocess_error("turbomind", WIDE_KINDS[0]) is ErrorCode.INVALID_REQUEST


def _harmony():
    return pytest.importorskip("lmdeploy.serve.parsers._openai_harmony").GptOssResponseParser


@pytest.mark.parametrize("fmt,good,bad", [
    ({"type": "choice", "choice": ["yes", "no"]}, "yes", "maybe"),
    ({"type": "grammar", "grammar": 'root ::= "a" "b"*'}, "abb", "ba"),
])
def test_harmony_wraps_choice_and_grammar_in_the_final_channel(upgraded, vocab, smollm2_tokenizer, fmt, good, bad):
    parser = _harmony()
    assert parser._build_response_format_grammar.__func__ if hasattr(parser._build_response_format_grammar, "__func__") else True
    tag = parser._build_response_format_grammar(fmt)
    guide = tr.compile_guide(tr.spec_from_request({"type": "structural_tag", **tag}), vocab, "xgrammar")

    def accepts(text: str) -> bool:
        m = guide.matcher()
        return all(m.accept_token(t) for t in smollm2_tokenizer.encode(text, add_special_tokens=False)) and \
            m.accept_token(vocab.eos_ids[0])

    assert accepts(f"<|channel|>final<|message|>{good}<|end|>")
    assert not accepts(f"<|channel|>final<|message|>{bad}<|end|>")


def test_harmony_refuses_instead_of_clearing(upgraded):
    with pytest.raises(ValueError, match="refused"):
        _harmony()._build_response_format_grammar({"type": "structural_tag", "structures": [], "triggers": []})


def test_stock_harmony_clears_choice():
    """The reference: stock returns None for choice, and the request then runs unconstrained."""
    assert _harmony()._build_response_format_grammar({"type": "choice", "choice": ["yes", "no"]}) is None


@pytest.mark.parametrize("argv,engine", [
    (["serve", "api_server", "m"], "pytorch"),
    (["serve", "api_server", "m", "--backend", "turbomind"], "turbomind"),
    (["serve", "api_server", "m", "--backend=turbomind"], "turbomind"),
    (["chat", "m"], "pytorch"),
])
def test_cli_runs_the_pytorch_engine_unless_told_otherwise(capsys, argv, engine):
    out = cli.with_engine_choice(list(argv))
    assert (out.count("pytorch") == 1) == (engine == "pytorch")
    assert f"LMDeploy engine: {engine}" in capsys.readouterr().err


@pytest.mark.parametrize("fields,good,bad", [
    ({"guided_regex": "[0-9]{3}"}, "123", "12a"),
    ({"guided_choice": ["yes", "no"]}, "no", "maybe"),
    ({"guided_json": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                      "additionalProperties": False}}, '{"n": 5}', '{"n": "5"}'),
])
def test_harmony_wraps_vllm_fields_in_the_final_channel(upgraded, vocab, smollm2_tokenizer, fields, good, bad):
    """vLLM fields folded by the server (request_fields.py) are wrapped like the kind they amount to."""
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import PACKED

    tag = _harmony()._build_response_format_grammar({"type": PACKED, PACKED: fields})
    guide = tr.compile_guide(tr.spec_from_request({"type": "structural_tag", **tag}), vocab, "xgrammar")

    def accepts(text: str) -> bool:
        m = guide.matcher()
        return all(m.accept_token(t) for t in smollm2_tokenizer.encode(text, add_special_tokens=False)) and \
            m.accept_token(vocab.eos_ids[0])

    assert accepts(f"<|channel|>final<|message|>{good}<|end|>")
    assert not accepts(f"<|channel|>final<|message|>{bad}<|end|>")


def test_harmony_refuses_vllm_options_it_cannot_wrap(upgraded):
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import PACKED

    with pytest.raises(ValueError, match="refused rather than dropped"):
        _harmony()._build_response_format_grammar(
            {"type": PACKED, PACKED: {"guided_json": {"type": "object"}, "guided_whitespace_pattern": " "}})
