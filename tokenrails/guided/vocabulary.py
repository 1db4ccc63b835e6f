"""``Vocabulary``: what every backend needs to know about a tokenizer, computed once.

Token bytes, which ids are special/control (never allowed in a guided row except EOS), which
ids end generation, and the logits width (which may exceed the tokenizer length: padded ids are
never allowed). Backends hang their own derived tables off ``backend_cache``.
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Sequence

from .errors import InvalidGuideError


# backend_cache key of the model's transformers tokenizer (backends that must tokenize text)
HF_TOKENIZER_KEY = "hf_tokenizer"


def whole_utf8_prefix(data: bytes) -> str:
    """``data`` decoded up to its last whole UTF-8 character: a forced run of byte tokens may end
    inside a character, whose tail is not forced yet."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


@dataclass(eq=False)
class Vocabulary:
    """Token ``i`` decodes to ``token_bytes[i]``; ids in ``special_ids`` are never grammar tokens."""

    token_bytes: Sequence[bytes]
    eos_ids: tuple[int, ...]
    special_ids: frozenset[int] = frozenset()
    vocab_size: int = 0  # logits width; 0 → len(token_bytes)
    name: str = ""
    backend_cache: dict[str, Any] = field(default_factory=dict, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)  # re-entrant: backends build tables inside get_backend

    def __post_init__(self) -> None:
        self.token_bytes = tuple(bytes(b) for b in self.token_bytes)
        n = len(self.token_bytes)
        if not self.vocab_size:
            self.vocab_size = n
        if self.vocab_size < n:
            raise InvalidGuideError(f"vocab_size {self.vocab_size} < tokenizer size {n}")
        self.eos_ids = tuple(dict.fromkeys(int(e) for e in self.eos_ids))
        if not self.eos_ids:
            raise InvalidGuideError("vocabulary needs at least one EOS id")
        for e in self.eos_ids:
            if not 0 <= e < n:
                raise InvalidGuideError(f"EOS id {e} outside the vocabulary (size {n})")
        # EOS ids are reported separately; they are never grammar tokens either.
        self.special_ids = frozenset(int(s) for s in self.special_ids) | frozenset(self.eos_ids)
        h = hashlib.sha256()
        h.update(f"{self.vocab_size}|{sorted(self.eos_ids)}|{sorted(self.special_ids)}|".encode())
        for b in self.token_bytes:
            h.update(len(b).to_bytes(4, "little"))
            h.update(b)
        self.fingerprint = h.hexdigest()[:24]

    @property
    def num_tokens(self) -> int:
        """Ids below this have bytes; ids in ``[num_tokens, vocab_size)`` are padding."""
        return len(self.token_bytes)

    def grammar_token_bytes(self) -> list[bytes]:
        """Token bytes with special ids blanked (``b""``): the view grammar engines should see."""
        special = self.special_ids
        return [b"" if i in special else b for i, b in enumerate(self.token_bytes)]

    def cached(self, key: str, build: Any) -> Any:
        """Per-vocabulary memo for backend tables (thread-safe, built once).

        Only for keys the operator's code chooses (a backend's tables, a limits object): one entry
        per key, kept for the vocabulary's life. Keys derived from a request go to ``cached_lru``.
        """
        with self._lock:
            if key not in self.backend_cache:
                self.backend_cache[key] = build()
            return self.backend_cache[key]

    def cached_lru(self, namespace: str, key: str, build: Any, max_entries: int = 32) -> Any:
        """A bounded memo for values keyed by what a request carries (per-request reasoning
        markers...): the ``max_entries`` most recently used per namespace, so clients sending ever
        new values cost a rebuild each, never unbounded memory."""
        from collections import OrderedDict

        with self._lock:
            table = self.backend_cache.get(namespace)
            if table is None:
                table = self.backend_cache[namespace] = OrderedDict()
            if key in table:
                table.move_to_end(key)
                return table[key]
            value = table[key] = build()
            while len(table) > max_entries:
                table.popitem(last=False)
            return value

    def reread(self, token_bytes: Sequence[bytes], *, special_ids: Iterable[int], name: str = "") -> "Vocabulary":
        """The same tokenizer with its tokens read differently (an adapter's reading of each token's
        text): the EOS ids, logits width and the model's own encoder (for jump-forward) kept."""
        vocab = Vocabulary(token_bytes=token_bytes, eos_ids=self.eos_ids, special_ids=frozenset(special_ids),
                           vocab_size=self.vocab_size, name=name or self.name)
        if HF_TOKENIZER_KEY in self.backend_cache:
            vocab.backend_cache[HF_TOKENIZER_KEY] = self.backend_cache[HF_TOKENIZER_KEY]
        return vocab

    @classmethod
    def from_huggingface(
        cls,
        tokenizer: Any,
        vocab_size: int | None = None,
        *,
        eos_token_ids: Iterable[int] | None = None,
        extra_special_ids: Iterable[int] = (),
    ) -> "Vocabulary":
        """Build from a ``transformers`` tokenizer.

        Every added/special token (``<|im_start|>``, tool-call and role markers, padding
        placeholders) is marked special, so a grammar can never emit it; its literal text is
        still reachable through ordinary tokens. ``vocab_size`` is the logits width.
        """
        import xgrammar as xgr  # decoding byte-level / sentencepiece vocabularies is xgrammar's job

        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        decoded = [bytes(b) for b in info.decoded_vocab]
        n_tok = len(tokenizer)
        decoded = decoded[: max(n_tok, 1)] if len(decoded) > n_tok else decoded
        special: set[int] = set(int(i) for i in info.special_token_ids)
        special.update(int(i) for i in getattr(tokenizer, "all_special_ids", []) or [])
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        special.update(int(i) for i in added)
        special.update(int(i) for i in extra_special_ids)
        if eos_token_ids is None:
            eos = getattr(tokenizer, "eos_token_id", None)
            eos_list = [eos] if isinstance(eos, int) else list(eos or [])
            eos_list += [int(i) for i in info.stop_token_ids]
        else:
            eos_list = [int(i) for i in eos_token_ids]
        vocab = cls(
            token_bytes=decoded,
            eos_ids=tuple(eos_list),
            special_ids=frozenset(i for i in special if i < len(decoded)),
            vocab_size=int(vocab_size or len(decoded)),
            name=getattr(tokenizer, "name_or_path", "") or "",
        )
        # backends that must tokenize text (jump-forward) use the model's own canonical encoding
        vocab.backend_cache[HF_TOKENIZER_KEY] = tokenizer
        return vocab


# ---- the process's one tokenizer -> Vocabulary memo ------------------------------------------
MEMO_SIZE = 8  # vocabularies kept (tens of MB each, each pinning its tokenizer); least recently used go
_MEMO: "OrderedDict[Hashable, tuple[Any, Vocabulary]]" = OrderedDict()
_MEMO_LOCK = threading.Lock()


def shared_vocabulary(tokenizer: Any, key: Hashable, build: Callable[[], Vocabulary]) -> Vocabulary:
    """``build()``'s vocabulary, built once per (``tokenizer`` object, ``key``) for every adapter.

    Walking a tokenizer costs ~0.5 s and the result is tens of MB, so it is shared but bounded:
    the ``MEMO_SIZE`` most recently used. An entry holds its tokenizer (a vocabulary keeps it for
    jump-forward anyway), so the object's id stays unique while the entry lives. ``key`` names what
    else the build depends on (the adapter's rule, the logits width); ``tokenizer=None`` keys by
    ``key`` alone (a content digest).
    """
    slot = (id(tokenizer), key)
    with _MEMO_LOCK:
        hit = _MEMO.get(slot)
        if hit is not None and hit[0] is tokenizer:
            _MEMO.move_to_end(slot)
            return hit[1]
    vocab = build()
    with _MEMO_LOCK:
        _MEMO[slot] = (tokenizer, vocab)
        _MEMO.move_to_end(slot)
        while len(_MEMO) > MEMO_SIZE:
            _MEMO.popitem(last=False)
    return vocab
