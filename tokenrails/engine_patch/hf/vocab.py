"""One ``Vocabulary`` and one ``GuidedDecodingManager`` per (tokenizer, logits width), reused.

Building a vocabulary walks the whole tokenizer (~0.5 s) and a manager owns the compile cache,
so both are memoized: repeated ``generate`` calls then hit the compiled-guide cache. The memos
are small LRUs: a process that loads tokenizer after tokenizer (or varies the limits per call)
keeps the last few, not every vocabulary (tens of MB each) and the tokenizer it pins.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from ...guided.limits import GuideLimits
from ...guided.vocabulary import Vocabulary

MAX_MEMOIZED = 8  # vocabularies, and managers, kept for reuse (least recently used dropped)

_lock = threading.Lock()
_VOCABS: "OrderedDict[tuple[int, int], tuple[Any, Vocabulary]]" = OrderedDict()
_MANAGERS: "OrderedDict[tuple[str, str, int], Any]" = OrderedDict()


def _remember(memo: OrderedDict, key: Any, value: Any) -> None:
    """Store as most recently used; drop the least recently used past ``MAX_MEMOIZED`` (under ``_lock``).
    A dropped manager is not closed: a processor may still use it, and it holds no idle thread."""
    memo[key] = value
    memo.move_to_end(key)
    while len(memo) > MAX_MEMOIZED:
        memo.popitem(last=False)


def logits_width(model: Any) -> int:
    """Width of the model's logits (may exceed ``len(tokenizer)``: padded ids are never allowed)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


def vocabulary_for(tokenizer: Any, vocab_size: int | None = None) -> Vocabulary:
    """The (memoized) ``Vocabulary`` of ``tokenizer`` for logits of width ``vocab_size``."""
    width = int(vocab_size or len(tokenizer))
    key = (id(tokenizer), width)
    with _lock:
        hit = _VOCABS.get(key)
        if hit is not None and hit[0] is tokenizer:
            _VOCABS.move_to_end(key)
            return hit[1]
    vocab = Vocabulary.from_huggingface(tokenizer, vocab_size=max(width, len(tokenizer)))
    if vocab.vocab_size != width:
        raise ValueError(
            f"tokenizer has {len(tokenizer)} tokens but the logits are {width} wide; "
            "pass the model's logits width"
        )
    with _lock:
        _remember(_VOCABS, key, (tokenizer, vocab))  # keeps the tokenizer alive so the id stays unique
    return vocab


def manager_for(vocab: Vocabulary, backend: str = "auto", limits: GuideLimits | None = None) -> Any:
    """A shared ``GuidedDecodingManager`` for this vocabulary/backend/limits (compile cache reuse)."""
    from ...guided.manager import GuidedDecodingManager

    key = (vocab.fingerprint, backend, hash(limits))
    with _lock:
        mgr = _MANAGERS.get(key)
        if mgr is None or mgr.vocab is not vocab:
            mgr = GuidedDecodingManager(vocab, backend=backend, limits=limits, fill_threads=1)
        _remember(_MANAGERS, key, mgr)
        return mgr
