"""Shared plumbing of the outlines shim: tokenizer → ``Vocabulary``, spec → compiled guide.

Outlines objects take an outlines ``Tokenizer`` (or, in 1.x, a model); tokenrails needs a
``Vocabulary``. Building one decodes the whole vocabulary, so it is memoized per tokenizer object.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import json
import threading
import warnings
import weakref
from typing import Any

from ...guided.backend import CompiledGuide
from ...guided.errors import InvalidGuideError
from ...guided.registry import compile_guide
from ...guided.spec import GuideSpec
from ...guided.vocabulary import Vocabulary

_LOCK = threading.Lock()
_VOCABS: dict[int, tuple[Any, Vocabulary]] = {}


def hf_tokenizer_of(tokenizer: Any, _depth: int = 0) -> Any:
    """The ``transformers`` tokenizer behind an outlines tokenizer / model / raw tokenizer."""
    if hasattr(tokenizer, "get_vocab") and hasattr(tokenizer, "convert_ids_to_tokens"):
        return tokenizer
    if _depth < 3:
        for attr in ("hf_tokenizer", "tokenizer"):  # outlines 1.x model, TransformerTokenizer
            inner = getattr(tokenizer, attr, None)
            if inner is not None and inner is not tokenizer:
                try:
                    return hf_tokenizer_of(inner, _depth + 1)
                except InvalidGuideError:
                    continue
    raise InvalidGuideError(
        f"cannot use {type(tokenizer).__name__} as a tokenizer: pass a transformers tokenizer, "
        "an outlines TransformerTokenizer/model, or a tokenrails Vocabulary"
    )


def _wraps_transformers_exactly(tokenizer: Any) -> bool:
    """The shim's own ``TransformerTokenizer`` (its string conversion not overridden): its guides
    read the wrapped transformers tokenizer's exact bytes."""
    from .models.transformers import TransformerTokenizer

    return isinstance(tokenizer, TransformerTokenizer) and \
        type(tokenizer).convert_token_to_string is TransformerTokenizer.convert_token_to_string and \
        hasattr(getattr(tokenizer, "tokenizer", None), "get_vocab")


def _is_outlines_tokenizer(tokenizer: Any) -> bool:
    """outlines' own tokenizer interface (``vocabulary`` dict, ``eos_token_id``), as outlines'
    tests and custom integrations write it — no transformers tokenizer behind it."""
    if _wraps_transformers_exactly(tokenizer):
        return False
    return isinstance(getattr(tokenizer, "vocabulary", None), dict) and \
        getattr(tokenizer, "eos_token_id", None) is not None and \
        not (hasattr(tokenizer, "get_vocab") and hasattr(tokenizer, "convert_ids_to_tokens"))


def _byte_fallback(token: str) -> bytes | None:
    """The byte of a SentencePiece byte-fallback piece (``<0xF0>``), else None."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return bytes([int(token[3:5], 16)])
        except ValueError:
            return None
    return None


def _token_bytes(text: str) -> bytes:
    """A token's bytes: byte-fallback pieces (``<0xF0>``) are that byte, the rest UTF-8."""
    piece = _byte_fallback(text)
    return piece if piece is not None else text.encode("utf-8", "surrogatepass")


# tokens that *are* U+FFFD (Gemma/GPT-SW3 "▁" prefix, NorwAI "." suffix)
REPLACEMENT_TOKEN = re.compile(r"^▁*\ufffd+\.*$")


@functools.lru_cache()
def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character table (what byte-level BPE vocabularies are written in)."""
    try:
        from transformers.convert_slow_tokenizer import bytes_to_unicode
    except ImportError:  # transformers < 4.40 kept it with the GPT-2 tokenizer
        from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode
    return dict(bytes_to_unicode())


@functools.lru_cache()
def gpt2_unicode_to_bytes() -> dict[str, int]:
    return {v: k for k, v in gpt2_bytes_to_unicode().items()}


def partial_char_bytes(token: str, text: str) -> bytes | None:
    """The bytes of a token that holds part of a UTF-8 character, by outlines' rule: its text
    shows U+FFFD and it is not itself a replacement-character token. A ``<0xXX>`` byte-fallback
    piece is that byte; otherwise the token is read through GPT-2's byte table (byte-level BPE).
    None when the token is whole text, or is neither kind."""
    if "\ufffd" not in text or REPLACEMENT_TOKEN.match(token):
        return None
    if token.startswith("<0x"):
        return _byte_fallback(token)
    table = gpt2_unicode_to_bytes()
    raw = [table.get(c) for c in token]
    return None if None in raw else bytes(raw)  # type: ignore[arg-type]


def _vocabulary_from_outlines_tokenizer(tokenizer: Any) -> Vocabulary:
    vocab_map: dict = tokenizer.vocabulary
    eos = int(tokenizer.eos_token_id)
    size = max([int(i) for i in vocab_map.values()] + [eos]) + 1
    token_bytes = [b""] * size
    convert = getattr(tokenizer, "convert_token_to_string", None)
    special = {vocab_map[t] for t in (getattr(tokenizer, "special_tokens", None) or ()) if t in vocab_map}
    for token, idx in vocab_map.items():
        text = convert(token) if callable(convert) else token
        partial = partial_char_bytes(token, text)
        token_bytes[int(idx)] = partial if partial is not None else \
            _token_bytes(token if token.startswith("<0x") else text)
    # ids the vocabulary does not name are never tokens (empty bytes, special)
    special |= {i for i, b in enumerate(token_bytes) if not b}
    return Vocabulary(token_bytes=token_bytes, eos_ids=(eos,), special_ids=frozenset(special),
                      name=type(tokenizer).__name__)


def vocabulary_for(tokenizer: Any) -> Vocabulary:
    """The (memoized) ``Vocabulary`` of ``tokenizer``; a ``Vocabulary`` passes through."""
    if isinstance(tokenizer, Vocabulary):
        return tokenizer
    vocab = getattr(tokenizer, "_tokenrails_vocabulary", None)
    if isinstance(vocab, Vocabulary):
        return vocab
    if _is_outlines_tokenizer(tokenizer):
        return _vocabulary_from_outlines_tokenizer(tokenizer)
    hf = hf_tokenizer_of(tokenizer)
    with _LOCK:
        hit = _VOCABS.get(id(hf))
        if hit is not None and hit[0]() is hf:
            return hit[1]
    vocab = Vocabulary.from_huggingface(hf)
    with _LOCK:
        try:
            ref = weakref.ref(hf, lambda _r, k=id(hf): _VOCABS.pop(k, None))
        except TypeError:  # not weak-referenceable: keep it alive with the entry
            ref = (lambda obj=hf: obj)
        _VOCABS[id(hf)] = (ref, vocab)
    return vocab


def fsm_available() -> bool:
    """Whether the FSM backend (outlines' exact regex/JSON language) is installed and not
    switched off with ``TOKENRAILS_OUTLINES_REGEX_BACKEND=xgrammar``."""
    if os.environ.get("TOKENRAILS_OUTLINES_REGEX_BACKEND", "fsm") == "xgrammar":
        return False
    return importlib.util.find_spec("tokenrails.guided.fsm.backend") is not None


def backend_for(spec: GuideSpec) -> str:
    """Regex/choice/JSON → the FSM backend (outlines' language); CFG/EBNF → xgrammar."""
    if spec.kind == "grammar":
        return "llguidance" if spec.option("dialect") == "lark" else "xgrammar"
    if spec.kind in ("regex", "choice", "json_schema"):
        return "fsm" if fsm_available() else "xgrammar"
    return "auto"


def compile_for(spec: GuideSpec, tokenizer: Any, backend: str | None = None) -> CompiledGuide:
    """``spec`` compiled for ``tokenizer``; ``backend`` overrides the outlines-language routing."""
    return compile_guide(spec, vocabulary_for(tokenizer), backend=backend or backend_for(spec))


def schema_to_str(schema: Any) -> str:
    """outlines' ``convert_json_schema_to_str``: dict / JSON text / pydantic model → JSON text."""
    if isinstance(schema, dict):
        return json.dumps(schema)
    if isinstance(schema, str):
        return schema
    if isinstance(schema, type) and callable(getattr(schema, "model_json_schema", None)):
        return json.dumps(schema.model_json_schema())
    raise InvalidGuideError(
        f"cannot parse schema {schema!r}: expected a dict, a JSON string or a pydantic model"
    )


class UnenforcedSchemaWarning(UserWarning):
    """The schema uses keywords outlines ignored; the shim keeps outlines' language, so they
    are not enforced either (use ``GuideSpec.json_schema`` + ``compile_guide`` to enforce them)."""


def json_spec(schema: Any, whitespace_pattern: str | None = None) -> GuideSpec:
    """outlines' JSON language: ``build_regex_from_schema(schema, whitespace_pattern)``.

    With the FSM backend this is a ``json_schema`` spec that asks it for outlines' lenient
    lowering (``fsm_ignore_unenforced``); without it, the very regex outlines-core builds.
    Either way the accepted language is outlines'; keywords outlines ignored raise an
    ``UnenforcedSchemaWarning`` naming them instead of passing silently.
    """
    from outlines_core.json_schema import build_regex_from_schema

    text = schema_to_str(schema)
    base = GuideSpec.json_schema(text, whitespace_pattern=whitespace_pattern)
    _warn_unenforced(base.schema)
    if fsm_available():
        options = dict(base.options, fsm_ignore_unenforced=True)
        return GuideSpec("json_schema", base.payload, tuple(sorted(options.items())))
    try:
        regex = build_regex_from_schema(text, whitespace_pattern)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise InvalidGuideError(f"outlines-core rejected the JSON schema: {exc}") from exc
    return GuideSpec.regex(regex)


def outlines_regex(spec: GuideSpec) -> str:
    """The regex outlines would have used for a spec made by ``json_spec`` (or a regex spec)."""
    from outlines_core.json_schema import build_regex_from_schema

    if spec.kind == "regex":
        return spec.pattern
    if spec.kind == "json_schema":
        return build_regex_from_schema(spec.payload, spec.option("whitespace_pattern"))
    raise InvalidGuideError(f"{spec.kind} specs have no outlines regex")


def _warn_unenforced(schema: dict) -> None:
    try:
        from ...guided.fsm.schema import outlines_unenforced
    except ImportError:  # the FSM backend is optional
        return
    findings = outlines_unenforced(schema)
    if findings:
        warnings.warn(
            "outlines ignores these schema keywords and so does the outlines shim: "
            + "; ".join(findings[:5]),
            UnenforcedSchemaWarning,
            stacklevel=3,
        )

