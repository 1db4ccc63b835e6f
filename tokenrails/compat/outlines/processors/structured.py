"""``outlines.processors``: guide-driven logits processors with outlines' constructor signatures.

``GuideLogitsProcessor(tokenizer, guide)``, ``RegexLogitsProcessor(regex_string, tokenizer)``,
``JSONLogitsProcessor(schema, tokenizer, whitespace_pattern=None)``,
``CFGLogitsProcessor(cfg_str, tokenizer)``. Each call finds every row's guide state from the
tokens generated since the first call, then masks the row with one bitmask fill + apply
(tokenrails kernels); logits columns past the tokenizer's vocabulary are always masked.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from .... import GuideSpec, allocate_token_bitmask, apply_token_bitmask_inplace
from .._json_language import json_spec
from ..fsm.guide import CFGGuide, Guide, RegexGuide, TokenrailsGuide
from .base_logits_processor import OutlinesLogitsProcessor

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class GuideLogitsProcessor(OutlinesLogitsProcessor):
    """Bias generation with any outlines-style ``Guide`` (fast path for tokenrails guides)."""

    accepted_arguments = "(tokenizer, guide, tensor_library_name)"

    def __init__(self, tokenizer: Any, guide: Guide, tensor_library_name: str = "torch"):
        if not all(callable(getattr(guide, m, None)) for m in ("get_next_instruction", "get_next_state")):
            raise TypeError(f"{type(self).__name__} takes {self.accepted_arguments}; got a "
                            f"{type(guide).__name__} where the guide goes")
        super().__init__(tensor_library_name)
        self.tokenizer = tokenizer
        self.guide = guide
        self._bitmask: Optional[torch.Tensor] = None
        self.reset_state()

    def reset_state(self) -> None:
        self._seq_start_idx: Optional[int] = None
        self._last_len: Optional[int] = None
        self._prompts: frozenset[tuple[int, ...]] = frozenset()
        self._guide_states: dict[tuple[int, ...], Any] = {(): self.guide.initial_state}
        self._last_ids: Optional[torch.Tensor] = None  # the previous call's input_ids (a copy)
        self._last_rows: list[tuple[tuple[int, ...], Any]] = []  # per row: (generated ids, state)

    def reset(self) -> None:
        """New generation: forget positions and states (the compiled guide is kept)."""
        self.guide = self.guide.copy()
        self.reset_state()

    # ---- states ------------------------------------------------------------------------------
    def _row_states(self, input_ids: torch.Tensor) -> list[Any]:
        states = self._next_row_states(input_ids)
        if states is None:
            states = self._matched_row_states(input_ids)
        self._last_ids = input_ids.clone()
        return states

    def _next_row_states(self, input_ids: torch.Tensor) -> Optional[list[Any]]:
        """The usual step: the same rows in the same order, one token longer. One tensor compare
        and one state step per row (instead of reading every row's prompt and generated ids back
        to Python, which costs ~1 ms a step at batch 4 with 8k-token prompts)."""
        last = self._last_ids
        if (last is None or input_ids.dim() != 2 or input_ids.shape[0] != last.shape[0]
                or input_ids.shape[1] != last.shape[1] + 1 or input_ids.device != last.device
                or not torch.equal(input_ids[:, :-1], last)):
            return None
        self._last_len = int(input_ids.shape[1])
        previous, current = self._guide_states, {}
        rows = []
        for (gen, state), token in zip(self._last_rows, input_ids[:, -1].tolist()):
            gen = gen + (token,)
            nxt = current.get(gen)
            if nxt is None:
                nxt = previous.get(gen)
            if nxt is None:
                nxt = self.guide.get_next_state(state, token)
            current[gen] = nxt
            rows.append((gen, nxt))
        self._guide_states = current
        self._last_rows = rows
        return [state for _, state in rows]

    def _matched_row_states(self, input_ids: torch.Tensor) -> list[Any]:
        """Any other call (first step, rows reordered or dropped by beam search, a new generation):
        each row's state from its generated ids."""
        length = int(input_ids.shape[1])
        if self._last_len is not None and not self._continues(input_ids, length):
            self.reset()  # not the next step of the same generation: a new generate() call
        self._last_len = length
        if self._seq_start_idx is None:
            self._seq_start_idx = length
            self._prompts = frozenset(tuple(r) for r in input_ids.tolist())
        previous, current = self._guide_states, {}
        rows = []
        for row in input_ids[:, self._seq_start_idx:].tolist():
            gen = tuple(row)
            state = current.get(gen, previous.get(gen))
            if state is None:
                prev = previous.get(gen[:-1]) if gen else None
                state = (self.guide.get_next_state(prev, gen[-1]) if prev is not None
                         else self._replay(gen))
            current[gen] = state
            rows.append((gen, state))
        self._guide_states = current  # only the last step is needed: O(batch * length) memory
        self._last_rows = rows
        return [state for _, state in rows]

    def _continues(self, input_ids: torch.Tensor, length: int) -> bool:
        """One more token on rows whose prompt part is one of the recorded prompts."""
        if length != self._last_len + 1 or self._seq_start_idx is None:
            return False
        prompts = input_ids[:, : self._seq_start_idx].tolist()
        return all(tuple(p) in self._prompts for p in prompts)

    def _replay(self, gen: tuple[int, ...]) -> Any:
        state = self.guide.initial_state
        for token in gen:
            state = self.guide.get_next_state(state, token)
        return state

    # ---- masking -----------------------------------------------------------------------------
    def process_logits(self, input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        states = self._row_states(input_ids)
        if isinstance(self.guide, TokenrailsGuide):
            return self._mask_with_bitmask(states, logits)
        return self._mask_with_instructions(states, logits)

    def _mask_with_bitmask(self, states: list[Any], logits: torch.Tensor) -> torch.Tensor:
        guide: TokenrailsGuide = self.guide  # type: ignore[assignment]
        vocab_size = guide.vocabulary_.vocab_size
        rows, width = logits.shape
        bitmask = self._bitmask
        if bitmask is None or bitmask.shape[0] != rows:
            bitmask = self._bitmask = allocate_token_bitmask(rows, vocab_size)
        for i, state in enumerate(states):
            guide._fill_bitmask(state, bitmask, i)
        n = min(width, vocab_size)
        if logits.dtype in _KERNEL_DTYPES:
            apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=n)
        else:  # e.g. float64 from numpy callers: mask without a lossy dtype round trip
            allowed = _unpack(bitmask, n).to(logits.device)
            logits[:, :n].masked_fill_(~allowed, float("-inf"))
        if width > vocab_size:
            logits[:, vocab_size:] = float("-inf")
        return logits

    def _mask_with_instructions(self, states: list[Any], logits: torch.Tensor) -> torch.Tensor:
        mask = torch.ones_like(logits, dtype=torch.bool)
        for i, state in enumerate(states):
            tokens = self.guide.get_next_instruction(state).tokens
            if tokens is None:
                mask[i] = False
                continue
            ids = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
            mask[i, ids[ids < logits.shape[1]]] = False
        return logits.masked_fill_(mask, float("-inf"))

    # ---- copies ------------------------------------------------------------------------------
    def copy(self) -> "GuideLogitsProcessor":
        """An independent processor for a new generation (compiled guide shared, not rebuilt)."""
        other = self.__class__.__new__(self.__class__)
        other.__dict__.update(self.__dict__)
        other.guide = self.guide.copy()
        other._bitmask = None
        other.reset_state()
        return other

    __copy__ = copy


def _unpack(bitmask: torch.Tensor, n: int) -> torch.Tensor:
    """Bool ``[rows, n]`` view of an int32 bitmask (bit ``t % 32`` of word ``t // 32``)."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :n].bool()


class RegexLogitsProcessor(GuideLogitsProcessor):
    """Bias generation towards the language of ``regex_string``."""

    def __init__(self, regex_string: str, tokenizer: Any, tensor_library_name: str = "torch"):
        super().__init__(tokenizer, RegexGuide.from_regex(regex_string, tokenizer), tensor_library_name)


class JSONLogitsProcessor(GuideLogitsProcessor):
    """Bias generation towards JSON valid for ``schema`` (dict, JSON text or pydantic model)."""

    def __init__(
        self,
        schema: Any,
        tokenizer: Any,
        whitespace_pattern: Optional[str] = None,
        tensor_library_name: str = "torch",
    ):
        guide = TokenrailsGuide.from_spec(json_spec(schema, whitespace_pattern), tokenizer)
        super().__init__(tokenizer, guide, tensor_library_name)


class CFGLogitsProcessor(GuideLogitsProcessor):
    """Bias generation towards the language of an EBNF grammar (xgrammar's dialect)."""

    def __init__(self, cfg_str: str, tokenizer: Any, tensor_library_name: str = "torch"):
        super().__init__(tokenizer, CFGGuide(cfg_str, tokenizer), tensor_library_name)


def processor_for_spec(spec: GuideSpec, tokenizer: Any, core_reading: bool = False) -> GuideLogitsProcessor:
    """A processor for any spec (used by ``generate.*`` and ``Generator``); ``core_reading``: tokens
    read as outlines 1.x reads them for outlines-core (``core_reading.py``)."""
    return GuideLogitsProcessor(tokenizer, TokenrailsGuide.from_spec(spec, tokenizer, core_reading=core_reading))
