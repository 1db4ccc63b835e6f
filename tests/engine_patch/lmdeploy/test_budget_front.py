"""The api_server's up-front budget refusal counts on each engine's own vocabulary, through the
front's core manager for that vocabulary (one compile cache, keyed by tokenizer and limits).

The count was memoized by spec alone: a process serving two models (two tokenizers) refused a
request that fits the second model with the first model's count.
"""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")

from tokenrails.guided.budget import budget_table  # noqa: E402
from tokenrails.guided.errors import GuideLimitError  # noqa: E402
from tokenrails.guided.manager import GuidedDecodingManager  # noqa: E402
from tokenrails.guided.vocabulary import Vocabulary  # noqa: E402


def _char_tokenizer():
    """One token per character: the same text takes many more tokens than with SmolLM2's."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    chars = "abcdefghijklmnopqrstuvwxyz0123456789 -"
    words = {c: i for i, c in enumerate(chars)} | {"</s>": len(chars), "<unk>": len(chars) + 1}
    tok = Tokenizer(WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")


def _engine(tokenizer):
    """What the front reads of LMDeploy's ``AsyncEngine``: its tokenizer wrapper."""
    return SimpleNamespace(backend="pytorch", tokenizer=SimpleNamespace(model=SimpleNamespace(model=tokenizer)))


def _front_error(engine, fmt, max_tokens):
    """The verdict the patched ``preprocess`` hands LMDeploy's own call (None: accepted)."""
    from tokenrails.engine_patch.lmdeploy.server import front_check
    from tokenrails.engine_patch.lmdeploy.server import request_parsing as req

    async def stock(self, messages, session_id, gen_config=None, **kwargs):
        return req.FRONT_VERDICT.get()

    preprocess = front_check.checked_preprocess(stock)
    config = SimpleNamespace(response_format=fmt, max_new_tokens=max_tokens)
    verdict = asyncio.run(preprocess(engine, [{"role": "user", "content": "hi"}], "s", gen_config=config))
    return verdict[1]


def _shortest(tokenizer, spec) -> int:
    """The oracle: D(start) from a manager of the core on that tokenizer's vocabulary."""
    mgr = GuidedDecodingManager(Vocabulary.from_huggingface(tokenizer), backend="fsm", fill_threads=1)
    try:
        return budget_table(mgr.get_compiled(spec)).start
    finally:
        mgr.close()


def test_each_model_is_counted_on_its_own_vocabulary(smollm2_tokenizer):
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import parse_format

    text = f"hello world {time.time_ns() % 10**6}"
    fmt = {"type": "regex_schema", "regex_schema": text, "tokenrails_budget": "close"}
    spec = parse_format(fmt)[0]
    chars = _char_tokenizer()
    coarse, fine = _shortest(smollm2_tokenizer, spec), _shortest(chars, spec)
    assert coarse < fine == len(text) + 1
    err = _front_error(_engine(chars), fmt, coarse)  # the fine model first: its count is remembered
    assert isinstance(err, GuideLimitError) and err.limit == "max_tokens" and err.value == fine, err
    assert _front_error(_engine(smollm2_tokenizer), fmt, coarse) is None  # fits the coarse model
    err = _front_error(_engine(smollm2_tokenizer), fmt, coarse - 1)
    assert isinstance(err, GuideLimitError) and err.value == coarse, err


def test_the_count_is_the_front_manager_s_compile(smollm2_tokenizer):
    """One compile per (spec, vocabulary): the count is read from the front's core manager."""
    from tokenrails.engine_patch.lmdeploy.boot.settings import configured_limits
    from tokenrails.engine_patch.lmdeploy.server import request_parsing as req

    fmt = {"type": "regex_schema", "regex_schema": f"[a-z]{{3}}-{time.time_ns()}", "tokenrails_budget": "close"}
    engine = _engine(smollm2_tokenizer)
    for _ in range(3):
        assert isinstance(_front_error(engine, fmt, 2), GuideLimitError)
    mgr = req.built_probe_manager(configured_limits(), tokenizer=smollm2_tokenizer)
    assert mgr is not None and mgr.vocab.num_tokens == len(smollm2_tokenizer)
    future, _ = mgr.compile_future(req.parse_format(fmt)[0])
    assert future.done() and budget_table(future.result()).start > 2
    assert mgr.counters["compiles"] >= 1 and mgr.counters["cache_hits"] >= 2
