"""The api_server's early check judges a spec as the engine will: with the engine's backend
setting and its limits, and a verdict under one setting is never reused under another.

On the code before, the check compiled with ``"auto"`` whatever the engine's backend was, and
memoized verdicts by spec only: with ``backend="fsm"`` a grammar passed the check (HTTP 200) and
the engine then refused it mid-stream.
"""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from tokenrails import GuideSpec
from tokenrails.guided.errors import GuideLimitError, UnsupportedGuideError
from tokenrails.guided.limits import GuideLimits

pytest.importorskip("fastapi")


def _nonce() -> str:
    return str(time.time_ns())


def _verdict(spec, limits=None):
    from tokenrails.engine_patch.lmdeploy.server import front_check

    return asyncio.run(front_check.FRONT.verdict(spec, limits or GuideLimits()))


def test_the_check_uses_the_engine_backend(upgraded, monkeypatch):
    from tokenrails.engine_patch.lmdeploy.boot import settings

    monkeypatch.setattr(settings, "_ACTIVATED", settings.Settings(backend="fsm"))
    spec = GuideSpec.grammar(f'root ::= "yes-{_nonce()}" | "no"')  # a grammar: fsm refuses it
    err = _verdict(spec)
    assert isinstance(err, UnsupportedGuideError), err
    assert "fsm" in str(err)


def test_a_verdict_under_one_backend_is_not_reused_under_another(upgraded, monkeypatch):
    from tokenrails.engine_patch.lmdeploy.boot import settings

    spec = GuideSpec.grammar(f'root ::= "yes-{_nonce()}" | "no"')
    monkeypatch.setattr(settings, "_ACTIVATED", settings.Settings(backend="auto"))
    assert _verdict(spec) is None  # xgrammar compiles it
    monkeypatch.setattr(settings, "_ACTIVATED", settings.Settings(backend="fsm"))
    assert isinstance(_verdict(spec), UnsupportedGuideError)


def test_a_verdict_under_looser_limits_is_not_reused_under_tighter_ones(upgraded):
    spec = GuideSpec.regex(f"a{{0,50}}-{_nonce()}")
    assert _verdict(spec, GuideLimits()) is None
    err = _verdict(spec, GuideLimits(max_repeat=10))
    assert isinstance(err, GuideLimitError) and err.limit == "max_repeat", err


def test_preprocess_refuses_with_400_what_the_engine_backend_cannot_enforce(upgraded, monkeypatch):
    """The whole path LMDeploy runs: a ``RequestError`` (HTTP 400) before any session exists."""
    from lmdeploy.messages import GenerationConfig
    from lmdeploy.serve.core import async_engine
    from lmdeploy.serve.core.exceptions import RequestError

    from tokenrails.engine_patch.lmdeploy.boot import settings

    monkeypatch.setattr(settings, "_ACTIVATED", settings.Settings(backend="fsm"))
    fmt = {"type": "grammar", "grammar": f'root ::= "ok-{_nonce()}"'}
    fake = SimpleNamespace(backend="pytorch", session_mgr=None)

    async def main():
        try:
            return await async_engine.AsyncEngine.preprocess(
                fake, [{"role": "user", "content": "hi"}], "not-a-session", gen_config=GenerationConfig(response_format=fmt))
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            return exc

    result = asyncio.run(main())
    assert isinstance(result, RequestError), result
    assert "fsm" in str(result)


def test_the_budget_check_compiles_as_the_engine_does(smollm2_tokenizer, monkeypatch):
    """The up-front budget check asks the same routing rule as the engine, with the engine's
    backend: a budget spec (fsm only) on an xgrammar engine is the engine's refusal, not a count
    computed on a backend the engine will not use."""
    from tokenrails.engine_patch.lmdeploy.boot import settings
    from tokenrails.engine_patch.lmdeploy.server import budget_front, front_check
    from tokenrails.guided.budget import budget_spec

    spec = budget_spec(GuideSpec.regex(f"[ab]{{2,4}}-{_nonce()}"))
    engine = SimpleNamespace(tokenizer=SimpleNamespace(model=SimpleNamespace(model=smollm2_tokenizer)))

    def refusal(max_tokens):
        return asyncio.run(budget_front.refusal(front_check.FRONT.compiled, engine, spec, max_tokens, GuideLimits()))

    monkeypatch.setattr(settings, "_ACTIVATED", settings.Settings(backend="fsm"))
    assert refusal(64) is None  # "ab-N" and EOS fit
    too_small = refusal(2)
    assert isinstance(too_small, GuideLimitError) and too_small.limit == "max_tokens" and too_small.value >= 3
    monkeypatch.setattr(settings, "_ACTIVATED", settings.Settings(backend="xgrammar"))
    assert isinstance(refusal(64), UnsupportedGuideError)
