"""``outlines.fsm.guide``: ``Guide``, ``RegexGuide``, ``CFGGuide``, ``Write``, ``Generate``.

Same protocol as outlines/outlines-core 0.x: ``initial_state == 0``; ``get_next_instruction``
returns ``Generate(tokens)`` (allowed ids, EOS included once the text is complete) or
``Write([eos])`` in the final state; ``get_next_state`` returns ``-1`` after EOS or a forbidden
token; ``is_final_state(-1)`` is True. Regex guides run on the FSM backend (outlines' exact
language); CFG guides take EBNF and run on xgrammar.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from ....guided.backend import CompiledGuide
from ....guided.errors import InvalidGuideError
from ....guided.spec import GuideSpec
from .._runtime import compile_for, outlines_dialect, vocabulary_for
from ..grammars import grammar_spec
from .states import FINAL, StateSpace


class TokenIds(torch.Tensor):
    """A ``LongTensor`` of token ids (outlines-core 0.1's instruction type) that also reads as
    outlines 0.0.x's list of ints: iterating gives ints, ``== [1, 2]`` compares as a list. Every
    other operation gives a plain tensor."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __iter__(self):
        return iter(self.tolist()) if self.dim() == 1 else super().__iter__()

    def __eq__(self, other: object):  # type: ignore[override]
        if isinstance(other, (list, tuple)):
            return self.tolist() == list(other)
        return torch.Tensor.__eq__(self, other)

    __hash__ = torch.Tensor.__hash__


def token_ids(ids: Any) -> TokenIds:
    return torch.as_tensor(ids, dtype=torch.long).reshape(-1).as_subclass(TokenIds)


@dataclass(frozen=True)
class Write:
    """Append ``tokens`` (outlines' instruction; emitted with ``[eos]`` in the final state)."""

    tokens: Any


@dataclass(frozen=True)
class Generate:
    """Sample one of ``tokens`` (None = any token)."""

    tokens: Optional[Any]


Instruction = Union[Write, Generate]


class Guide:
    """Base of every guide (outlines' protocol); subclasses implement the four methods."""

    initial_state: Any = 0
    start_state: Any = 0

    def get_next_instruction(self, state: Any) -> Instruction:
        raise NotImplementedError

    def get_next_state(self, state: Any, token_id: int) -> Any:
        raise NotImplementedError

    def is_final_state(self, state: Any) -> bool:
        raise NotImplementedError

    def copy(self) -> "Guide":
        raise NotImplementedError


class TokenrailsGuide(Guide):
    """A guide backed by a compiled tokenrails guide (shared) and its own state space."""

    initial_state = 0
    start_state = 0
    final_state = FINAL

    def __init__(self, compiled: CompiledGuide, tokenizer: Any = None):
        self._init_compiled(compiled, tokenizer)

    def _init_compiled(self, compiled: CompiledGuide, tokenizer: Any = None) -> None:
        self.compiled = compiled
        self.spec = compiled.spec
        self.vocabulary_ = compiled.vocab
        self.tokenizer = tokenizer
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_id = eos if eos in compiled.vocab.eos_ids else compiled.vocab.eos_ids[0]
        self.final_states = {FINAL}
        self.states = StateSpace(compiled)

    @classmethod
    def from_spec(cls, spec: GuideSpec, tokenizer: Any, backend: Optional[str] = None) -> "TokenrailsGuide":
        guide = cls.__new__(cls)
        guide._init_compiled(compile_for(spec, tokenizer, backend), tokenizer)
        return guide

    def get_next_instruction(self, state: int) -> Instruction:
        if state == FINAL:
            return Write(token_ids([self.eos_token_id]))
        return Generate(token_ids(self.states.allowed(int(state))))

    def get_next_state(self, state: int, token_id: int) -> int:
        return self.states.advance(int(state), int(token_id))

    def is_final_state(self, state: int) -> bool:
        return self.states.is_accepting(int(state))

    @property
    def states_to_token_maps(self) -> dict:
        """``{state: {token: next state}}`` of a finite automaton (outlines' attribute); see
        ``StateSpace.token_maps`` for the numbering and the bounds."""
        return self.states.token_maps()

    def can_terminate_state(self, state: int) -> bool:
        return self.is_final_state(state)

    def must_terminate_state(self, state: int) -> bool:
        """Only EOS can follow (the final state, or a complete text with no continuation)."""
        if state == FINAL:
            return True
        allowed = self.states.allowed(int(state))
        return bool(allowed.numel()) and set(allowed.tolist()) <= set(self.vocabulary_.eos_ids)

    def copy(self) -> "TokenrailsGuide":
        """Same compiled guide, fresh state table (cheap: nothing is recompiled)."""
        other = self.__class__.__new__(self.__class__)
        other._init_compiled(self.compiled, self.tokenizer)
        return other

    def _fill_bitmask(self, state: int, bitmask: torch.Tensor, row: int) -> None:
        """Fast path used by the logits processors."""
        self.states.fill(int(state), bitmask, row)


class RegexGuide(TokenrailsGuide):
    """Text in the language of a regular expression (outlines' regex dialect)."""

    def __init__(self, regex_string: str, tokenizer: Any):
        self.regex_string = regex_string
        try:
            compiled = compile_for(GuideSpec.regex(outlines_dialect(regex_string)), tokenizer)
        except InvalidGuideError as exc:
            if "language is empty" not in str(exc):
                raise
            # outlines' wording: no token sequence of this vocabulary spells a match
            raise InvalidGuideError(
                "The vocabulary does not allow us to build a sequence that matches the input regex"
            ) from exc
        super().__init__(compiled, tokenizer)

    @classmethod
    def from_regex(cls, regex_string: str, tokenizer: Any, **_kwargs: Any) -> "RegexGuide":
        return cls(regex_string, tokenizer)


class CFGGuide(TokenrailsGuide):
    """Text in the language of a context-free grammar, written in EBNF (xgrammar's dialect)."""

    def __init__(self, cfg_string: str, tokenizer: Any):
        self.cfg_string = cfg_string
        super().__init__(compile_for(grammar_spec(cfg_string), tokenizer), tokenizer)


class StopAtEOSGuide(Guide):
    """Unconstrained text until EOS (outlines' guide for ``generate.text``)."""

    final_state = 1
    start_state = 0
    initial_state = 0

    def __init__(self, tokenizer: Any):
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_id = eos if eos is not None else vocabulary_for(tokenizer).eos_ids[0]

    def get_next_instruction(self, state: int) -> Instruction:
        if self.is_final_state(state):
            return Write([self.eos_token_id])
        return Generate(None)

    def get_next_state(self, state: int, token_id: int) -> int:
        if token_id == self.eos_token_id or state == self.final_state:
            return self.final_state
        return self.initial_state

    def is_final_state(self, state: int) -> bool:
        return state == self.final_state

    def copy(self) -> "StopAtEOSGuide":
        return self
