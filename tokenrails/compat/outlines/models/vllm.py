"""``outlines.models.vllm`` (0.1 – 1.x): vLLM models, another provider (constrain a vLLM server's
requests with ``tokenrails.requests``). ``adapt_tokenizer`` is real: it gives a Hugging Face
tokenizer outlines' tokenizer interface, as the 0.x integrations do; ``VLLM``, ``vllm`` and
``from_vllm`` raise ``UnsupportedProviderError``."""
from __future__ import annotations

from typing import Any

from .providers import VLLM, make_callable, from_vllm, vllm


def adapt_tokenizer(tokenizer: Any) -> Any:
    """outlines' tokenizer interface on a Hugging Face tokenizer (``integrations.utils``)."""
    from ..integrations.utils import adapt_tokenizer as adapt

    return adapt(tokenizer)

constructor = vllm
make_callable(__name__)  # ``outlines.models.vllm(...)``: the 0.x constructor

__all__ = ["VLLM", "adapt_tokenizer", "from_vllm", "vllm"]
