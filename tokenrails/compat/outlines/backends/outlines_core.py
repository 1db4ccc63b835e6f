"""``outlines.backends.outlines_core``: outlines-core's own regex DFA (``Index``), for code that builds
indexes itself or wants outlines-core's exact automaton; the masks are applied with tokenrails' kernels.

Regex and JSON only: outlines-core has no CFG."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from outlines_core import Index, Vocabulary
from outlines_core.json_schema import build_regex_from_schema

from ..processors.base_logits_processor import OutlinesLogitsProcessor
from ..regex_dialect import outlines_dialect
from .base import BaseBackend, tensor_library_of, tokenizer_of


class OutlinesCoreLogitsProcessor(OutlinesLogitsProcessor):
    """Walks an ``outlines_core.Index`` per row (states keyed by each row's generated ids, so beam
    reorders and new generations are followed); after EOS a row may take only what every final
    state allows (EOS among it)."""

    def __init__(self, index: Index, tensor_library_name: str = "torch"):
        super().__init__(tensor_library_name)
        self.index = index
        self.reset()

    def reset(self) -> None:
        self._start: Optional[int] = None
        self._states: Dict[Tuple[int, ...], Optional[int]] = {(): self.index.get_initial_state()}

    def _state(self, generated: Tuple[int, ...], previous: Dict[Tuple[int, ...], Optional[int]]) -> Optional[int]:
        """The row's index state (``None``: EOS emitted or a token the index refused): one step
        from the last call's state of its prefix, else a walk from the start (new rows)."""
        if generated in previous:
            return previous[generated]
        if generated[:-1] in previous:
            start, state = len(generated) - 1, previous[generated[:-1]]
        else:
            start, state = 0, self.index.get_initial_state()
        for token in generated[start:]:
            if state is None:
                break
            state = self.index.get_next_state(state, token)
        return state

    def process_logits(self, input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        length = int(input_ids.shape[1])
        if self._start is None or length < self._start:
            self.reset()
            self._start = length
        mask = torch.ones_like(logits, dtype=torch.bool)
        previous, current = self._states, {}
        for row, ids in enumerate(input_ids[:, self._start:].tolist()):
            generated = tuple(ids)
            state = current[generated] = self._state(generated, previous)
            allowed: List[int] = self._after_end if state is None else list(self.index.get_allowed_tokens(state))
            index = torch.as_tensor([t for t in allowed if t < logits.shape[1]], dtype=torch.long)
            mask[row, index.to(logits.device)] = False
        self._states = current  # only this step's rows are kept
        return logits.masked_fill_(mask, float("-inf"))

    @property
    def _after_end(self) -> List[int]:
        """What a finished row may take: the tokens every final state allows (EOS among them;
        the index does not name its EOS id otherwise)."""
        tokens = self.__dict__.get("_end_tokens")
        if tokens is None:
            finals = [set(self.index.get_allowed_tokens(s)) for s in self.index.get_final_states()]
            tokens = sorted(set.intersection(*finals)) if finals else []
            self.__dict__["_end_tokens"] = tokens
        return tokens


class OutlinesCoreBackend(BaseBackend):
    """Regex and JSON schema processors over an outlines-core ``Vocabulary`` of the model's tokenizer."""

    def __init__(self, model: Any):
        tokenizer = tokenizer_of(model)
        self.tensor_library_name = tensor_library_of(model)
        vocab = getattr(tokenizer, "vocabulary", None)
        if vocab is None and hasattr(tokenizer, "get_vocab"):
            vocab = tokenizer.get_vocab()
        self.vocabulary = self.create_outlines_core_vocabulary(
            vocab, tokenizer.eos_token_id, getattr(tokenizer, "eos_token", None),
            getattr(tokenizer, "convert_token_to_string", lambda t: t))

    @staticmethod
    def create_outlines_core_vocabulary(vocab: Dict[str, int], eos_token_id: int, eos_token: Optional[str],
                                        token_to_str: Callable[[str], str]) -> Vocabulary:
        """outlines-core's ``Vocabulary``: token text → every id spelling it, EOS left out (the
        ``Vocabulary`` adds it back itself)."""
        formatted: Dict[str, List[int]] = {}
        for token, token_id in vocab.items():
            if token == eos_token or token_id == eos_token_id:
                continue
            formatted.setdefault(token_to_str(token), []).append(token_id)
        return Vocabulary(eos_token_id, formatted)

    def get_json_schema_logits_processor(self, json_schema: str, whitespace_pattern: Optional[str] = None) -> Any:
        return self.get_regex_logits_processor(build_regex_from_schema(json_schema, whitespace_pattern))

    def get_regex_logits_processor(self, regex: str) -> OutlinesCoreLogitsProcessor:
        return OutlinesCoreLogitsProcessor(Index(outlines_dialect(regex), self.vocabulary), self.tensor_library_name)

    def get_cfg_logits_processor(self, grammar: str) -> Any:
        raise NotImplementedError("Outlines Core does not support context-free grammar.")


__all__ = ["OutlinesCoreBackend", "OutlinesCoreLogitsProcessor"]
