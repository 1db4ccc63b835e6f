"""The transformers tokenizer's ``Vocabulary`` (the core memo, ``shared_vocabulary``) and one
``GuidedDecodingManager`` per (vocabulary, backend, limits), reused.

A manager owns the compile cache, so repeated ``generate`` calls hit the compiled-guide cache.
The manager memo is a small LRU: a process that varies the limits per call keeps the last few.
Large specs compile in worker processes started on demand (``compile_procs.py``): a native compile
cannot be stopped, and in-process one past its deadline kept a core busy for minutes after
``generate`` had failed it.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from ...guided.limits import GuideLimits
from ...guided.vocabulary import Vocabulary, shared_vocabulary

MAX_MEMOIZED = 8  # managers kept for reuse (least recently used dropped)
COMPILE_PROCESSES = 2  # worker processes per manager for large compiles, started at the first one

_lock = threading.Lock()
_MANAGERS: "OrderedDict[tuple[str, str, int], Any]" = OrderedDict()


def logits_width(model: Any) -> int:
    """Width of the model's logits (may exceed ``len(tokenizer)``: padded ids are never allowed)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


def vocabulary_for(tokenizer: Any, vocab_size: int | None = None) -> Vocabulary:
    """The (memoized) ``Vocabulary`` of ``tokenizer`` for logits of width ``vocab_size``."""
    width = int(vocab_size or len(tokenizer))
    if width < len(tokenizer):
        raise ValueError(
            f"tokenizer has {len(tokenizer)} tokens but the logits are {width} wide; "
            "pass the model's logits width"
        )
    return shared_vocabulary(tokenizer, ("transformers", width),
                             lambda: Vocabulary.from_huggingface(tokenizer, vocab_size=width))


def manager_for(vocab: Vocabulary, backend: str = "auto", limits: GuideLimits | None = None) -> Any:
    """A shared ``GuidedDecodingManager`` for this vocabulary/backend/limits (compile cache reuse)."""
    from ...guided.manager import GuidedDecodingManager

    key = (vocab.fingerprint, backend, hash(limits))
    with _lock:
        mgr = _MANAGERS.get(key)
        if mgr is None or mgr.vocab is not vocab:  # a dropped manager is not closed: a processor may use it
            mgr = _MANAGERS[key] = GuidedDecodingManager(vocab, backend=backend, limits=limits, fill_threads=1,
                                                                compile_processes=COMPILE_PROCESSES)
        _MANAGERS.move_to_end(key)
        while len(_MANAGERS) > MAX_MEMOIZED:
            _MANAGERS.popitem(last=False)
        return mgr
