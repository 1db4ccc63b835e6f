"""LMDeploy's tokenizer as the core ``Vocabulary``: its logits-width rule (never below the
tokenizer length; InternS1's own encoded vocabulary), memoized per tokenizer object, for the
engine's managers (step/) and the front end's budget count (server/) alike."""
from __future__ import annotations

import threading
from typing import Any

_VOCABS: dict[tuple[int, int], tuple[Any, Any]] = {}  # (id(tokenizer), width) -> (tokenizer, vocab)
_VOCABS_LOCK = threading.Lock()


def build_vocabulary(tokenizer: Any, vocab_size: int | None):
    """Memoized per tokenizer object: one build even when several agents share a process."""
    key = (id(tokenizer), max(int(vocab_size or 0), len(tokenizer)))
    with _VOCABS_LOCK:
        hit = _VOCABS.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
    vocab = _build_vocabulary(tokenizer, vocab_size)
    with _VOCABS_LOCK:
        if len(_VOCABS) >= 8:
            _VOCABS.pop(next(iter(_VOCABS)))
        _VOCABS[key] = (tokenizer, vocab)
    return vocab


def _build_vocabulary(tokenizer: Any, vocab_size: int | None):
    """LMDeploy's rule for the logits width (never below the tokenizer length), InternS1 included."""
    from ...guided.vocabulary import Vocabulary

    width = int(vocab_size or 0)
    n = len(tokenizer)
    width = max(width, n)
    if type(tokenizer).__name__ == "InternS1Tokenizer":
        from lmdeploy._guided_decoding import get_interns1_encoded_vocab

        raw = get_interns1_encoded_vocab(tokenizer, width)[:n]
        added = set(tokenizer.get_added_vocab().values())
        return Vocabulary(raw, eos_ids=(tokenizer.eos_token_id,), special_ids=frozenset(added),
                          vocab_size=width, name=getattr(tokenizer, "name_or_path", ""))
    return Vocabulary.from_huggingface(tokenizer, vocab_size=width)
