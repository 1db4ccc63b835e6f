"""Length-bounded tool strings on xgrammar: compile and mask cost, stock tag vs the repaired one.

A pydantic tool (five bounded strings, qwen_3 call format, tool_choice="auto") on SmolLM2's
vocabulary: the tag as stock compiles it (lengths counted, raw control characters admitted), the
tag as tokenrails compiles it (``backends/xgrammar_lengths.py``), and the tag without length
keywords (what a tool without them costs). The mask is timed over the same accepted call.

    PYTHONPATH=. OMP_NUM_THREADS=1 python bench/tool_string_lengths.py
"""
from __future__ import annotations

import json
import statistics
import time
from typing import Annotated, Optional

import xgrammar as xgr
from pydantic import BaseModel, Field, StringConstraints, constr
from transformers import AutoTokenizer

from tokenrails import Vocabulary
from tokenrails.guided.backends.xgrammar_lengths import exact_string_lengths
from tokenrails.guided.backends.xgrammar_markers import tag_grammar

from _common import FIXTURE


class Address(BaseModel):
    street: str = Field(min_length=3, max_length=20)
    zip_code: constr(min_length=5, max_length=5)


class CreateUser(BaseModel):
    name: str = Field(min_length=2, max_length=12)
    bio: Optional[str] = Field(default=None, max_length=8)
    tags: list[Annotated[str, StringConstraints(min_length=1, max_length=4)]] = Field(max_length=2)
    address: Address


CALL = ('<tool_call>\n{"name": "create_user", "arguments": {"name": "Alice Smith", "bio": null, '
        '"tags": ["ab", "c"], "address": {"street": "Main Street 5", "zip_code": "12345"}}}\n</tool_call>')


def _median_s(fn, n: int = 5) -> tuple[float, object]:
    times, out = [], None
    for _ in range(n):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    tok = AutoTokenizer.from_pretrained(str(FIXTURE))
    vocab = Vocabulary.from_huggingface(tok)
    info = xgr.TokenizerInfo(vocab.grammar_token_bytes(), xgr.VocabType.RAW, vocab_size=vocab.vocab_size,
                             stop_token_ids=list(vocab.eos_ids))
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    tools = [{"type": "function", "function": {"name": "create_user", "parameters": CreateUser.model_json_schema()}}]
    tag = xgr.get_model_structural_tag("qwen_3", tools, tool_choice="auto", reasoning=False).model_dump(mode="json")
    plain = json.loads(json.dumps(tag).replace('"maxLength"', '"x_max"').replace('"minLength"', '"x_min"'))
    rows = {
        "stock tag (unenforced)": lambda: compiler.compile_structural_tag(json.dumps(tag)),
        "tokenrails tag (exact)": lambda: compiler.compile_grammar(exact_string_lengths(str(tag_grammar(tag)))),
        "tag without lengths": lambda: compiler.compile_structural_tag(json.dumps(plain)),
    }
    ids = tok.encode(CALL, add_special_tokens=False)
    bitmask = xgr.allocate_token_bitmask(1, vocab.vocab_size)
    for name, build in rows.items():
        compile_s, grammar = _median_s(build)
        matcher, fills = xgr.GrammarMatcher(grammar), []
        for t in ids:
            start = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            fills.append(time.perf_counter() - start)
            assert matcher.accept_token(t), name
        print(f"{name:24} compile {compile_s * 1e3:7.1f} ms   mask mean {statistics.mean(fills) * 1e3:6.2f} ms"
              f"  max {max(fills) * 1e3:6.1f} ms  ({len(ids)} tokens)")


if __name__ == "__main__":
    main()
