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
from ...guided.errors import InvalidGuideError, UnsupportedGuideError
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


# ---- outlines' regex dialect -------------------------------------------------------------------
_POSIX = {
    "alpha": "A-Za-z", "digit": "0-9", "alnum": "0-9A-Za-z", "upper": "A-Z", "lower": "a-z",
    "space": " \\t\\n\\r\\f\\v", "blank": " \\t", "xdigit": "0-9A-Fa-f", "word": "0-9A-Za-z_",
    "cntrl": "\\x00-\\x1f\\x7f", "print": "\\x20-\\x7e", "graph": "\\x21-\\x7e", "ascii": "\\x00-\\x7f",
    "punct": "!-/:-@\\[-`{-~",
}
_POSIX_RE = re.compile(r"\[:(\^?)([a-z]+):\]")


def _spell_posix(pattern: str) -> str:
    """``[[:alpha:]]`` (POSIX classes inside a bracket expression) → ``[A-Za-z]``."""
    if "[:" not in pattern:
        return pattern

    def repl(m: re.Match) -> str:
        body = _POSIX.get(m.group(2))
        if body is None:
            raise InvalidGuideError(f"unknown POSIX class [:{m.group(2)}:]")
        if m.group(1):
            raise UnsupportedGuideError(f"negated POSIX class [:^{m.group(2)}:] is not supported",
                                        feature="negated POSIX class")
        return body

    return _POSIX_RE.sub(repl, pattern)


def _case_fold(pattern: str) -> str:
    """A pattern under ``(?i)``: every letter (literal, in a class or in a class range) with the
    letters Unicode case folding makes equal to it, as Rust's regex crate (outlines-core) reads
    ``(?i)``: ``k`` also matches the Kelvin sign, ``é`` ``É``, ``σ`` ``Σ`` and ``ς``; ``ı`` only
    itself. Escaped characters are left as written."""
    out: list[str] = []
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
                out.append(c)
            elif i + 2 < n and pattern[i + 1] == "-" and pattern[i + 2] not in "]\\":
                lo, hi = ord(c), ord(pattern[i + 2])
                out.append(pattern[i:i + 3])
                out.append(_class_body(_ranges(_fold_extras(range(lo, hi + 1)))))
                i += 3
                continue
            else:
                out.append(c if c in "^-" else _class_body(_ranges({ord(c)} | _fold_extras([ord(c)]))))
        elif c == "[":
            in_class = True
            out.append(c)
            if pattern[i + 1:i + 2] == "^":
                out.append("^")
                i += 1
            if pattern[i + 1:i + 2] == "]":
                out.append("\\]")
                i += 1
        elif c == "{":  # a repetition count: copy as is
            j = pattern.find("}", i)
            j = n - 1 if j < 0 else j
            out.append(pattern[i:j + 1])
            i = j + 1
            continue
        else:
            extras = _fold_extras([ord(c)])
            out.append(f"[{_class_body(_ranges({ord(c)} | extras))}]" if extras else c)
        i += 1
    return "".join(out)


def _fold_extras(code_points) -> set[int]:
    """The code points case folding makes equal to some of ``code_points``, not among them."""
    table = _case_classes()
    members = set(code_points)
    extras = {m for cp in members if cp in table for m in table[cp]}
    return extras - members


@functools.lru_cache(maxsize=1)
def _case_classes() -> dict[int, tuple[int, ...]]:
    """Code point -> the code points with the same Unicode case folding (only classes of two or
    more). Read once from Python's Unicode tables (~0.3 s), when a ``(?i)`` pattern first needs it."""
    groups: dict[str, set[int]] = {}
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        ch = chr(cp)
        key = ch.casefold()
        if key == ch and ch.upper() == ch and ch.lower() == ch:
            continue  # uncased (it joins a class below if another character folds to it)
        groups.setdefault(key, set()).add(cp)
    table: dict[int, tuple[int, ...]] = {}
    for key, members in groups.items():
        if len(key) == 1:
            members.add(ord(key))
        if len(members) > 1:
            ordered = tuple(sorted(members))
            for cp in ordered:
                table[cp] = ordered
    return table


def _ranges(code_points) -> tuple:
    """Sorted code points as (first, last) runs."""
    out: list[list[int]] = []
    for cp in sorted(code_points):
        if out and cp == out[-1][1] + 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return tuple((a, b) for a, b in out)


_CLASS_ESCAPE = set("\\]^-[")


def _class_body(ranges: tuple) -> str:
    """Ranges as the inside of a bracket expression (literal characters, specials escaped)."""
    def char(c: int) -> str:
        ch = chr(c)
        return "\\" + ch if ch in _CLASS_ESCAPE else ch

    return "".join(char(a) if a == b else f"{char(a)}-{char(b)}" for a, b in ranges)


def _complement(ranges: tuple) -> tuple:
    """The code points (surrogates aside) not in ``ranges``."""
    out, start = [], 0
    for a, b in ranges:
        if a > start:
            out.append((start, a - 1))
        start = b + 1
    if start <= 0x10FFFF:
        out.append((start, 0x10FFFF))
    return tuple((a, b) for a, b in _drop_surrogates(out))


def _drop_surrogates(ranges: list) -> list:
    out = []
    for a, b in ranges:
        if b < 0xD800 or a > 0xDFFF:
            out.append((a, b))
            continue
        if a < 0xD800:
            out.append((a, 0xD7FF))
        if b > 0xDFFF:
            out.append((0xE000, b))
    return out


_SHORTHAND_BODIES: dict[str, str] = {}


def _shorthand_body(letter: str) -> str:
    """The bracket-expression body of outlines-core's ``\\w \\d \\s`` (or their negations)."""
    body = _SHORTHAND_BODIES.get(letter)
    if body is None:
        from . import regex_classes

        ranges = {"w": regex_classes.WORD, "d": regex_classes.DIGIT, "s": regex_classes.SPACE}[letter.lower()]
        body = _class_body(ranges if letter.islower() else _complement(ranges))
        _SHORTHAND_BODIES[letter] = body
    return body


def _spell_shorthands(pattern: str) -> str:
    """``\\w \\d \\s \\W \\D \\S`` (outside and inside brackets) as the exact code points
    outlines-core's (Rust's) classes match: Python's and Rust's Unicode tables differ (marks, newer
    digits, ``\\x1c``-``\\x1f``), measured over every code point."""
    if "\\" not in pattern:
        return pattern
    out: list[str] = []
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            letter = pattern[i + 1]
            if letter in "wdsWDS":
                body = _shorthand_body(letter)
                out.append(body if in_class else f"[{body}]")
            else:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
        elif c == "[":
            in_class = True
            out.append(c)
            i += 1
            if pattern[i:i + 1] == "^":
                out.append("^")
                i += 1
            if pattern[i:i + 1] == "]":  # a leading ] is a literal
                out.append("\\]")
                i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def outlines_dialect(pattern: str) -> str:
    """An outlines regex in the dialect tokenrails' backends read.

    outlines-core 0.2 (Rust's regex crate, what outlines 1.x runs) knows POSIX classes inside
    brackets (``[[:alpha:]]``, ASCII) and a leading ``(?i)``; both are spelled out here. Its
    ``\\d \\w \\s`` are Rust's Unicode classes, which differ from Python's in thousands of code
    points: they are spelled out as the exact code points outlines-core matches
    (``regex_classes.py``, read from outlines-core; compared with it in
    tests/compat/test_outlines_regex_dialect.py).
    """
    if not isinstance(pattern, str):
        return pattern
    fold = False
    while pattern.startswith("(?i)"):
        fold, pattern = True, pattern[4:]
    pattern = _spell_posix(pattern)
    if fold:
        pattern = _case_fold(pattern)
    return _group_stacked_repeats(_spell_shorthands(pattern))


_REPEAT = re.compile(r"[*+?]|\{[0-9]+(?:,[0-9]*)?\}|\{,[0-9]+\}")


def _group_stacked_repeats(pattern: str) -> str:
    """Rust's regex crate (so outlines-core) reads a repetition of a repetition, ``X+{1,2}`` or
    ``X{2}{3}``, as nested repetition; Python's parser refuses it ("multiple repeat"). Each
    repetition after the first is given its operand as a group: ``(?:X+){1,2}``. A ``?`` right
    after a repetition stays its lazy marker."""
    if not any(c in pattern for c in "*+?}"):
        return pattern
    items: list[list[str]] = []  # [text, kind]; kind: atom | repeat | op | open
    groups: list[int] = []  # where each open group's items start
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        m = _REPEAT.match(pattern, i)
        if m and items and items[-1][1] in ("atom", "repeat"):
            text, i = m.group(0), m.end()
            if pattern.startswith("?", i):  # lazy marker of this repetition
                text, i = text + "?", i + 1
            last = items[-1]
            if last[1] == "repeat":
                last[0] = f"(?:{last[0]})"
            last[0], last[1] = last[0] + text, "repeat"
        elif c == "\\" and i + 1 < n:
            items.append([pattern[i:i + 2], "atom"])
            i += 2
        elif c == "[":
            j = _class_end(pattern, i)
            items.append([pattern[i:j], "atom"])
            i = j
        elif c == "(":
            j, standalone = _group_prefix_end(pattern, i)
            if standalone:  # (?i) and the like: a flag setting, not a group
                items.append([pattern[i:j], "op"])
            else:
                groups.append(len(items))
                items.append([pattern[i:j], "open"])
            i = j
        elif c == ")" and groups:
            start = groups.pop()
            text = "".join(t for t, _ in items[start:]) + ")"
            del items[start:]
            items.append([text, "atom"])
            i += 1
        else:
            items.append([c, "op" if c in "|^$" else "atom"])
            i += 1
    return "".join(t for t, _ in items)


def _group_prefix_end(pattern: str, i: int) -> tuple[int, bool]:
    """Where the opening of the group at ``pattern[i] == "("`` ends (``(``, ``(?:``, ``(?P<n>``,
    ``(?=``, ``(?i:``...), and whether it is a standalone flag setting such as ``(?i)``."""
    j = i + 1
    if not pattern.startswith("?", j):
        return j, False
    j += 1
    if pattern[j:j + 1] in (":", "=", "!"):
        return j + 1, False
    if pattern.startswith("<=", j) or pattern.startswith("<!", j):
        return j + 2, False
    if pattern.startswith("P<", j) or pattern.startswith("<", j):
        k = pattern.find(">", j)
        return (k + 1, False) if k >= 0 else (j, False)
    while j < len(pattern) and (pattern[j].isalpha() or pattern[j] == "-"):
        j += 1
    if pattern[j:j + 1] == ")":
        return j + 1, True
    return j + (1 if pattern[j:j + 1] == ":" else 0), False


def _class_end(pattern: str, i: int) -> int:
    """The index just past the bracket class starting at ``pattern[i] == "["``."""
    j = i + 1
    if pattern[j:j + 1] == "^":
        j += 1
    if pattern[j:j + 1] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return min(j + 1, len(pattern))
