"""llguidance backend: Earley parser + lazy lexer, ~1 ms compiles, broad JSON Schema coverage.

Optional dependency (``pip install tokenrails[llguidance]``). Compiling builds one ``LLMatcher``
(grammar validation + lexer set-up); each sequence gets a ``deep_copy`` of it, which is cheap.
Special (control) tokens are removed from every mask and refused by ``accept_token`` whatever the
grammar says, so a client grammar can never emit a role or tool-call token.
"""
from __future__ import annotations

import json
import threading
from typing import Any, Callable, Sequence

import llguidance as llg
import numpy as np
import torch

from ...kernels._common import eos_only_row
from ..backend import CompiledGuide, GuideBackend, Matcher
from ..ecma_patterns import ASCII_CLASSES, spell_shorthands
from ..errors import GuideError, GuideLimitError, InvalidGuideError, UnsupportedGuideError
from ..limits import GuideLimits
from ..native_pools import NativePools
from ..policy import find_token_reference
from ..schema_semantics import close_schema, is_strict, policy_schema
from ..limit_checks import check_spec_limits
from ..regex_hazards import refuse_regex_hazards, schema_pattern_hazards
from ..schema_walk import iter_subschemas
from .llguidance_lowering import lower_dependencies
from ..spec import GuideSpec
from ..vocabulary import HF_TOKENIZER_KEY, Vocabulary, whole_utf8_prefix

# llguidance marks special tokens by a leading 0xFF byte (never valid UTF-8). Names are private so
# a grammar cannot refer to them by their real text (``<|im_start|>`` is then plain text).
_SPECIAL_NAME = b"\xff<|tokenrails_special_%d|>"
_TABLES_LOCK = threading.Lock()
# Regex constructs llguidance misreads (measured on llguidance 1.x): it reads ``a*+a`` as ``(a*)+a``
# (accepts "aa"; Python's possessive reading matches nothing); refused, never narrowed silently.
REGEX_HAZARDS = frozenset({"possessive quantifier", "lookaround", "backreference", "atomic group",
                           "lone surrogate"})


def _greedy_encoder(token_bytes: Sequence[bytes], eos: int) -> Callable[[Any], list[int]]:
    """Longest-match tokenization by llguidance itself (used when no real tokenizer is known)."""
    boot = llg.LLTokenizer(_Wrapper(token_bytes, eos, lambda _t: []))

    def encode(text: Any) -> list[int]:
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", errors="replace")
        return list(boot.greedy_tokenize(text))

    return encode


class _Wrapper:
    """The duck type ``llguidance.LLTokenizer`` expects (see ``llguidance.TokenizerWrapper``)."""

    is_tokenizer_wrapper = True

    def __init__(self, tokens: Sequence[bytes], eos: int, encode: Callable[[Any], list[int]]):
        self.tokens = list(tokens)
        self.eos_token_id = eos
        self.bos_token_id = None
        self.special_token_ids = [i for i, b in enumerate(self.tokens) if b[:1] == b"\xff"]
        self._encode = encode

    def __call__(self, text: Any) -> list[int]:
        return self._encode(text)




class CanonicalEncoder:
    """Text -> token ids for the text llguidance forces (property names, separators...).

    llguidance only allows the tokenization its encoder returns for forced text, so this must be
    the model tokenizer's own (canonical) encoding, not a greedy longest match: with greedy,
    ``{"name"`` may be forced as tokens the model never produces for that text. Sources, first
    that applies: ``vocab.encode`` (a callable), the transformers tokenizer attached with
    ``attach_tokenizer`` / ``vocab.backend_cache["hf_tokenizer"]`` (a copy of its Rust
    ``tokenizers.Tokenizer``; a slow tokenizer's ``encode(text, add_special_tokens=False)``),
    greedy longest match as the fallback. Results
    holding a special or out-of-range id (text such as ``<|im_end|>``) fall back to greedy.
    """

    def __init__(self, vocab: Vocabulary, greedy: Callable[[Any], list[int]]):
        self.vocab = vocab
        self.greedy = greedy
        self.real: Callable[[str], Sequence[int]] | None = None
        self.source = "greedy"
        self._cache: dict[Any, list[int]] = {}
        enc = getattr(vocab, "encode", None)
        if callable(enc):
            self.real, self.source = enc, "vocab.encode"
        elif vocab.backend_cache.get(HF_TOKENIZER_KEY) is not None:
            self.set_tokenizer(vocab.backend_cache[HF_TOKENIZER_KEY])

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Use ``tokenizer``'s canonical encoding from now on. A fast tokenizer is copied (its Rust
        ``tokenizers.Tokenizer`` re-read from its JSON, padding and truncation off): transformers
        calls on other threads may re-configure the caller's object. Built once per vocabulary,
        never at the first forced text, which would stall a decoding step."""
        real: Callable[[str], Sequence[int]]
        try:
            backend = tokenizer.backend_tokenizer
            own = type(backend).from_str(backend.to_str())
            own.no_padding()
            own.no_truncation()

            def real(text: str) -> Sequence[int]:
                return own.encode(text, add_special_tokens=False).ids

            source = "tokenizers"
        except Exception:  # slow (Python) tokenizers, or no transformers: its own encode
            def real(text: str) -> Sequence[int]:
                return tokenizer.encode(text, add_special_tokens=False)

            source = "tokenizer.encode"
        self.real, self.source = real, source
        self._cache = {}

    def __call__(self, text: Any) -> list[int]:
        # llguidance asks for the same forced strings again and again: memoise (bounded).
        cache = self._cache
        hit = cache.get(text)
        if hit is not None:
            return hit
        ids = self.encode(text)
        if len(cache) >= 65_536:
            cache.clear()
        cache[text] = ids
        return ids

    def encode(self, text: Any) -> list[int]:
        """Canonical ids for ``text`` (str or UTF-8 bytes), greedy when no tokenizer is known."""
        real = self.real
        if real is not None:
            try:
                s = bytes(text).decode("utf-8") if isinstance(text, (bytes, bytearray)) else text
                ids = [int(i) for i in real(s)]
                vocab = self.vocab
                if all(0 <= i < vocab.num_tokens and i not in vocab.special_ids for i in ids):
                    return ids
            except (UnicodeDecodeError, TypeError, ValueError):
                pass
        return self.greedy(text)


def build_lltokenizer(vocab: Vocabulary) -> "tuple[llg.LLTokenizer, CanonicalEncoder]":
    """An ``LLTokenizer`` over ``vocab`` (special and padding ids renamed, EOS ids as stop
    tokens) and the encoder it uses for forced text (see ``CanonicalEncoder``)."""
    tokens = [
        _SPECIAL_NAME % i if (i in vocab.special_ids or i >= vocab.num_tokens) else b
        for i, b in enumerate(list(vocab.token_bytes) + [b""] * (vocab.vocab_size - vocab.num_tokens))
    ]
    eos = vocab.eos_ids[0]
    encoder = CanonicalEncoder(vocab, _greedy_encoder(tokens, eos))
    return llg.LLTokenizer(_Wrapper(tokens, eos, encoder), eos_token=list(vocab.eos_ids)), encoder


def attach_tokenizer(vocab: Vocabulary, tokenizer: Any) -> None:
    """Give the llguidance backend the model's transformers tokenizer for ``vocab``, so forced
    text is tokenized canonically. Works before or after the backend was first used (masks
    computed afterwards use it). ``Vocabulary.from_huggingface`` attaches its tokenizer itself."""
    with _TABLES_LOCK:
        vocab.backend_cache[HF_TOKENIZER_KEY] = tokenizer
        tables = vocab.backend_cache.get("llguidance:tables")
    if tables is not None and not callable(getattr(vocab, "encode", None)):
        tables[2].set_tokenizer(tokenizer)


class SpecialMask:
    """The "never special" AND, restricted to the few words that hold special/padding ids.

    ``words``: int32 per bitmask word, bit 1 for every id a grammar may ever allow (non-special,
    plus EOS). Most words are all-ones, so only ``cols`` (the others) are AND-ed, with ``vals``:
    a few dozen words instead of the whole row (qwen2: 4,748 words per row).
    """

    __slots__ = ("words", "cols", "vals", "width")

    def __init__(self, vocab: Vocabulary):
        words = (vocab.vocab_size + 31) // 32
        allowed = np.zeros(words * 32, dtype=np.uint8)
        allowed[: vocab.num_tokens] = 1
        allowed[list(vocab.special_ids)] = 0
        allowed[list(vocab.eos_ids)] = 1
        packed = np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32)
        self.words = torch.from_numpy(packed.copy())
        self.cols = np.flatnonzero(packed != -1).astype(np.intp)
        self.vals = packed[self.cols].copy()
        self.width = words

    def apply_row(self, row: np.ndarray) -> bool:
        """AND one row in place; whether any bit is left."""
        row[self.cols] &= self.vals
        return _any(row)

    def apply_rows(self, a: np.ndarray, rows: np.ndarray) -> list[bool]:
        """AND ``a[rows]`` in place; per row, whether any bit is left."""
        seen = None
        if self.cols.size:
            ix = np.ix_(rows, self.cols)
            anded = a[ix] & self.vals
            a[ix] = anded
            seen = anded.any(axis=1)  # EOS usually sits in those words
        head = a[rows, :64].any(axis=1)
        if seen is not None:
            head |= seen
        # Almost every row has a bit among these words; scan the whole row only for the others.
        return [h or _any(a[r]) for h, r in zip(head.tolist(), rows.tolist())]


def _any(row: np.ndarray) -> bool:
    if row.size % 2 == 0 and row.flags.c_contiguous:
        return bool(row.view(np.uint64).max() != 0)
    return bool(row.any())


_EXEC = NativePools(lambda threads: llg.LLExecutor(num_threads=threads))  # one per thread count (native_pools.py)


class LLGuidanceMatcher(Matcher):
    """One sequence's parser state; refuses special ids and anything past EOS."""

    __slots__ = ("vocab", "_m", "_guide", "_terminated", "_history", "_eos_in_parser")

    def __init__(self, guide: "LLGuidanceGuide"):
        self.vocab = guide.vocab
        self._guide = guide
        self._m = guide.prototype.deep_copy()
        self._terminated = False
        self._history = 0  # accepted tokens, EOS included
        # llguidance records EOS in its history only when the parser was not already stopped.
        self._eos_in_parser = False

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> bool:
        row = bitmask[index]
        if self._terminated or self._m.is_error():
            eos_only_row(row, self.vocab.eos_ids)  # fail closed: an errored parser may only end the sequence
            return True
        if not row.is_contiguous() or row.dtype != torch.int32 or row.device.type != "cpu":
            raise ValueError("bitmask rows must be contiguous int32 CPU memory")
        special = self._guide.special
        if row.numel() != special.width:
            raise ValueError(f"bitmask row has {row.numel()} words; this vocabulary needs {special.width}")
        self._m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)
        if self._m.is_error():
            eos_only_row(row, self.vocab.eos_ids)
            return True
        if not special.apply_row(row.numpy()):  # only special ids wanted: end, never go unconstrained
            eos_only_row(row, self.vocab.eos_ids)
        return True

    @classmethod
    def batch_fill(cls, matchers: Sequence[Matcher], bitmask: torch.Tensor, rows: Sequence[int],
                   threads: int = 1) -> None:
        """One native call (``LLExecutor``: ``threads`` threads, no GIL) for every live matcher, then
        one vectorised special-token AND. Terminated/errored matchers, foreign matchers, repeated
        rows and unusual bitmasks take the per-row path; the result is bit-identical to it."""
        rows = [int(r) for r in rows]
        if (bitmask.dim() != 2 or bitmask.dtype != torch.int32 or bitmask.device.type != "cpu"
                or not bitmask.is_contiguous() or len(set(rows)) != len(rows)
                or any(not 0 <= r < bitmask.shape[0] for r in rows)):
            Matcher.batch_fill(matchers, bitmask, rows)
            return
        live: list[tuple[Any, int]] = []
        live_rows: list[int] = []
        live_ms: list[LLGuidanceMatcher] = []
        special = None
        width = bitmask.shape[1]
        for m, r in zip(matchers, rows):
            if type(m) is not LLGuidanceMatcher or m._terminated or m._m.is_error():
                m.fill_next_token_bitmask(bitmask, r)
                continue
            sp = m._guide.special
            if sp is not special and (special is not None or sp.width != width):
                m.fill_next_token_bitmask(bitmask, r)  # another vocabulary, or a bad width: per row
                continue
            special = sp
            live.append((m._m, r))
            live_rows.append(r)
            live_ms.append(m)
        if len(live) < 2:
            for m, r in zip(live_ms, live_rows):
                m.fill_next_token_bitmask(bitmask, r)
            return
        assert special is not None
        with _EXEC.lock:
            _EXEC.get(threads).unsafe_compute_mask_ptr(live, bitmask.data_ptr(), bitmask.shape[1] * 4, bitmask.shape[0])
        nonempty = special.apply_rows(bitmask.numpy(), np.asarray(live_rows, dtype=np.intp))
        for m, r, ok in zip(live_ms, live_rows, nonempty):
            # fail closed exactly like the per-row path: errored parser or nothing but specials
            if not ok or m._m.is_error():
                eos_only_row(bitmask[r], m.vocab.eos_ids)

    def accept_token(self, token_id: int) -> bool:
        token_id = int(token_id)
        if self._terminated or not 0 <= token_id < self.vocab.vocab_size:
            return False
        is_eos = token_id in self.vocab.eos_ids
        if token_id in self.vocab.special_ids and not is_eos:
            return False
        if self._m.is_error():
            return False
        if is_eos:
            if not self._m.is_accepting():
                return False
            stopped = bool(self._m.is_stopped())
            ok = self._m.consume_token(token_id)
            if ok:
                self._terminated = True
                self._eos_in_parser = not stopped
                self._history += 1
            return bool(ok)
        if self._m.try_consume_tokens([token_id]) != 1:
            return False
        self._history += 1
        return True

    def rollback(self, num_tokens: int) -> None:
        n = int(num_tokens)
        if n <= 0:
            return
        if n > self._history:
            raise ValueError(f"cannot roll back {n} tokens: only {self._history} accepted")
        parser_n = n - 1 if (self._terminated and not self._eos_in_parser) else n
        if parser_n and not self._m.rollback(parser_n):
            raise RuntimeError(f"llguidance rollback failed: {self._m.get_error()[:200]}")
        self._history -= n
        self._terminated = False  # EOS, if any, was the last token and is now undone

    def is_terminated(self) -> bool:
        return self._terminated

    def reset(self) -> None:
        self._m = self._guide.prototype.deep_copy()
        self._terminated = False
        self._history = 0
        self._eos_in_parser = False

    def find_jump_forward_string(self) -> str:
        if self._terminated or self._m.is_error():
            return ""
        return whole_utf8_prefix(self._m.compute_ff_bytes())  # only whole UTF-8 characters

    def forced_token_ids(self, max_tokens: int) -> Sequence[int] | None:
        if self._terminated or self._m.is_error():
            return None  # the fill decides (EOS only)
        # llguidance forces forced bytes as their canonical tokens: its mask allows each alone
        return self._m.compute_ff_tokens()[:max(max_tokens, 0)]

    def jump_forward_probe(self) -> str | None:
        if self._terminated or self._m.is_error():
            return None  # the fill decides (EOS only)
        # no forced byte: '' (special ids are never allowed here). Forced bytes: llguidance's mask
        # allows only its own tokenization of them, so the fill tells whether one token is forced.
        return None if self._m.compute_ff_bytes() else ""

    def is_accepting(self) -> bool:
        return self._terminated or (not self._m.is_error() and bool(self._m.is_accepting()))

    @property
    def error(self) -> str:
        """llguidance's error text ('' when healthy)."""
        return self._m.get_error() if self._m.is_error() else ""


class LLGuidanceGuide(CompiledGuide):
    backend = "llguidance"

    def __init__(self, spec: GuideSpec, vocab: Vocabulary, grammar: str, prototype: "llg.LLMatcher",
                 special: SpecialMask):
        super().__init__(spec, vocab)
        self.grammar = grammar
        self.prototype = prototype
        self.special = special

    @property
    def allowed_words(self) -> torch.Tensor:
        """int32 words, bit 1 for every id a grammar may ever allow."""
        return self.special.words

    def matcher(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self)

    @property
    def memory_bytes(self) -> int:
        # llguidance builds lexer states lazily per matcher; count the grammar text plus a floor.
        return 64 * 1024 + 4 * len(self.grammar)


ITEMS_PER_PROPERTY = 6  # llguidance parser row items per optional property (4 measured) + margin


class LLGuidanceBackend(GuideBackend):
    """json_schema, json_object, regex, choice, grammar (Lark, or GBNF converted to Lark)."""

    name = "llguidance"
    kinds = frozenset({"json_schema", "json_object", "regex", "choice", "grammar"})

    def __init__(self, vocab: Vocabulary, limits: GuideLimits):
        super().__init__(vocab, limits)
        # Not vocab.cached(): get_backend() already holds the vocabulary's (non-reentrant) lock.
        with _TABLES_LOCK:
            tables = vocab.backend_cache.get("llguidance:tables")
            if tables is None:
                lltok, encoder = build_lltokenizer(vocab)
                tables = (lltok, SpecialMask(vocab), encoder)
                vocab.backend_cache["llguidance:tables"] = tables
        self.tokenizer, self.special, self.encoder = tables
        self.parser_limits = llg.LLParserLimits(
            # llguidance's Earley rows grow ~4 items per optional property of an object; at its
            # default a schema it compiled could refuse a token mid-generation. The row bound
            # follows the properties GuideLimits admits.
            max_items_in_row=max(2_000, ITEMS_PER_PROPERTY * limits.max_object_properties),
            max_lexer_states=min(250_000, max(1_000, limits.max_dfa_states)),
            max_grammar_size=min(2_000_000, max(10_000, 2 * limits.max_grammar_bytes)),
            verbose_errors=False,  # errors go back to clients: never echo parser internals
        )

    def check(self, spec: GuideSpec) -> None:
        super().check(spec)
        check_spec_limits(spec, self.limits)
        if spec.kind == "json_schema":
            findings = schema_pattern_hazards(spec.schema, REGEX_HAZARDS)
            if findings:
                raise UnsupportedGuideError("llguidance misreads " + "; ".join(findings[:3]),
                                            feature=findings[0], backend=self.name)
        elif spec.kind == "regex":
            refuse_regex_hazards(spec.pattern, REGEX_HAZARDS, self.name)
        elif spec.kind == "grammar":
            ref = find_token_reference(spec.ebnf)
            if ref is not None:
                raise UnsupportedGuideError(
                    f"grammar references token {ref!r}: guided rows never emit special tokens",
                    feature="token reference", backend=self.name,
                )

    # ---- compile ------------------------------------------------------------------------
    def grammar_text(self, spec: GuideSpec) -> str:
        """The llguidance grammar (JSON text) for ``spec``; raises a ``GuideError``."""
        kind = spec.kind
        try:
            if kind in ("json_schema", "json_object"):
                # One policy across backends (schema_semantics.py): keyword-implied types explicit,
                # and (unless strict=False) closed objects/tuples, as xgrammar's strict_mode.
                schema: Any = {"type": "object"}
                if kind == "json_schema":
                    schema = lower_dependencies(policy_schema(spec, self.limits))
                    if is_strict(spec):
                        schema = close_schema(schema, self.limits.max_schema_visits)
                    self._check_closed_sizes(schema)
                return llg.LLMatcher.grammar_from_json_schema(schema, overrides=self._json_options(spec))
            if kind == "regex":
                return llg.LLMatcher.grammar_from_regex(ascii_shorthands(spec.pattern))
            if kind == "choice":
                lark = "start: " + " | ".join(json.dumps(c) for c in spec.choices) + "\n"
                return llg.LLMatcher.grammar_from_lark(lark)
            if kind == "grammar":
                if spec.option("dialect") == "lark":
                    return llg.LLMatcher.grammar_from_lark(spec.ebnf)
                from llguidance.gbnf_to_lark import any_to_lark

                return llg.LLMatcher.grammar_from_lark(any_to_lark(spec.ebnf))
        except GuideError:
            raise
        except Exception as exc:  # converter errors (GbnfToLarkError, ValueError...)
            raise InvalidGuideError(f"llguidance rejected the {kind} constraint: {_short(exc)}") from exc
        raise UnsupportedGuideError(f"llguidance does not support {kind}", feature=kind, backend=self.name)

    def _check_closed_sizes(self, schema: Any) -> None:
        """Properties per object *after* closing (allOf parts' names are hoisted into one object),
        against the same bound the parser's row limit was sized for: refused before acceptance,
        never mid-generation."""
        for path, sub in iter_subschemas(schema):
            props = sub.get("properties")
            if isinstance(props, dict) and len(props) > self.limits.max_object_properties:
                raise GuideLimitError(
                    f"limit max_object_properties={self.limits.max_object_properties} exceeded at {path}: "
                    f"{len(props)} properties once its allOf parts are merged",
                    limit="max_object_properties", value=len(props))

    @staticmethod
    def _json_options(spec: GuideSpec) -> dict[str, Any]:
        """Same whitespace as the xgrammar backend: flexible, or json.dumps' ``", "``/``": "``."""
        pattern = spec.option("whitespace_pattern")
        if pattern is not None:
            return {"whitespace_flexible": True, "whitespace_pattern": pattern, "lenient": False}
        if spec.option("any_whitespace", True):
            return {"whitespace_flexible": True, "lenient": False}
        return {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
                "lenient": False}

    def compile(self, spec: GuideSpec) -> LLGuidanceGuide:
        return self.compile_grammar(spec, self.grammar_text(spec))

    def compile_grammar(self, spec: GuideSpec, grammar: str) -> LLGuidanceGuide:
        """``grammar`` in llguidance's own form (what ``grammar_text`` or ``llguidance.grammar_from``
        produce), with the same limits and the same refusal of dropped constraints; ``spec`` names it."""
        proto = llg.LLMatcher(self.tokenizer, grammar, log_level=0, limits=self.parser_limits)
        if proto.is_error():
            raise classify_error(proto.get_error(), spec.kind)
        warnings = proto.get_grammar_warnings()
        if warnings:  # llguidance warns when it drops a constraint: never pretend to enforce it
            raise UnsupportedGuideError(
                "llguidance cannot enforce: " + "; ".join(w[:200] for w in warnings[:3]),
                feature=warnings[0][:200], backend=self.name,
            )
        return LLGuidanceGuide(spec, self.vocab, grammar, proto, self.special)

    # ---- a compile done in another process (compile_procs.py) ----------------------------
    @staticmethod
    def export(guide: LLGuidanceGuide) -> dict:
        """The grammar text: the schema walks that produced it (the dear part) are not redone."""
        return {"grammar": guide.grammar}

    def restore(self, spec: GuideSpec, state: dict) -> LLGuidanceGuide:
        return self.compile_grammar(spec, state["grammar"])


def ascii_shorthands(pattern: str) -> str:
    """``\\d``, ``\\w``, ``\\s`` as ASCII classes, as in xgrammar, outlines and JSON Schema.

    Rust's regex (llguidance) makes them Unicode-aware; without this the same regex request would
    accept ``"٣"`` as a digit on one backend and not on another.
    """
    return spell_shorthands(pattern, ASCII_CLASSES, "llguidance")


_UNSUPPORTED_PREFIXES = ("unknown format",)
_LIMIT_MARKERS = ("too complex", "fuel", "limit", "too many", "too large", "too big", "exceeded")
_UNSUPPORTED_MARKERS = ("unimplemented", "not supported", "unsupported", "not implemented", "not disjoint")


def classify_error(message: str, kind: str) -> GuideError:
    """Map an llguidance error message onto tokenrails' typed errors."""
    text = _short(message)
    low = text.lower()
    if any(m in low for m in _UNSUPPORTED_MARKERS) or low.startswith(_UNSUPPORTED_PREFIXES):
        return UnsupportedGuideError(f"llguidance cannot enforce this {kind}: {text}",
                                     feature=text, backend="llguidance")
    if any(m in low for m in _LIMIT_MARKERS):
        return GuideLimitError(f"llguidance limit exceeded compiling {kind}: {text}",
                               limit="llguidance", value=text)
    return InvalidGuideError(f"llguidance rejected the {kind} constraint: {text}")


def _short(exc: object) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return (lines[0] if lines else type(exc).__name__)[:500]
