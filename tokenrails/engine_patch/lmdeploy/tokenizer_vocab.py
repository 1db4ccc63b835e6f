"""LMDeploy's tokenizer as the core ``Vocabulary``: its logits-width rule (never below the
tokenizer length; InternS1's own encoded vocabulary), built once per tokenizer object through the
core memo (``shared_vocabulary``), for the engine's managers (step/) and the front end (server/)."""
from __future__ import annotations

from typing import Any

from ...guided.vocabulary import Vocabulary, shared_vocabulary


def build_vocabulary(tokenizer: Any, vocab_size: int | None) -> Vocabulary:
    """The vocabulary of ``tokenizer`` for logits ``vocab_size`` wide (never below its length)."""
    width = max(int(vocab_size or 0), len(tokenizer))
    return shared_vocabulary(tokenizer, ("lmdeploy", width), lambda: _build_vocabulary(tokenizer, width))


def _build_vocabulary(tokenizer: Any, width: int) -> Vocabulary:
    if type(tokenizer).__name__ == "InternS1Tokenizer":
        from lmdeploy._guided_decoding import get_interns1_encoded_vocab

        n = len(tokenizer)
        raw = get_interns1_encoded_vocab(tokenizer, width)[:n]
        added = set(tokenizer.get_added_vocab().values())
        return Vocabulary(raw, eos_ids=(tokenizer.eos_token_id,), special_ids=frozenset(added),
                          vocab_size=width, name=getattr(tokenizer, "name_or_path", ""))
    return Vocabulary.from_huggingface(tokenizer, vocab_size=width)
