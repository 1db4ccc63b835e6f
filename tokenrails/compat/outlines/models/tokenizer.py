"""``outlines.models.tokenizer``: the tokenizer interface outlines' guides expect."""
from __future__ import annotations

from typing import Any, Dict, Hashable, List, Protocol, Set, Tuple, Union


class Tokenizer(Hashable, Protocol):
    """What a guide needs from a tokenizer. Hashable (abstract ``__hash__``), so the protocol
    itself cannot be instantiated; ``TransformerTokenizer`` implements it."""

    eos_token: str
    eos_token_id: int
    pad_token_id: int
    vocabulary: Dict[str, int]
    special_tokens: Set[str]

    def encode(self, prompt: Union[str, List[str]]) -> Tuple[Any, Any]:
        ...

    def decode(self, token_ids: Any) -> List[str]:
        ...

    def convert_token_to_string(self, token: str) -> str:
        ...


def _check_hf_chat_template(tokenizer: Any) -> bool:
    """Whether a transformers tokenizer carries a chat template."""
    return getattr(tokenizer, "chat_template", None) is not None


__all__ = ["Tokenizer", "_check_hf_chat_template"]
