"""``outlines.fsm.guide``: ``Guide``, ``RegexGuide``, ``CFGGuide``, ``Write``, ``Generate``.

Same protocol as outlines/outlines-core 0.x: ``initial_state == 0``; ``get_next_instruction``
returns ``Generate(tokens)`` (allowed ids, EOS included once the text is complete) or
``Write([eos])`` in the final state; ``get_next_state`` returns ``-1`` after EOS or a forbidden
token; ``is_final_state(-1)`` is True. Regex guides run on the FSM backend (outlines' exact
language); CFG guides take EBNF and run on xgrammar.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from .... import CompiledGuide, GuideSpec, InvalidGuideError
from .._compile import compile_for
from .._vocabulary import vocabulary_for
from ..regex_dialect import outlines_dialect
from ..grammars import grammar_spec, outlines_common
from .outlines_labels import outlines_labels
from .states import FINAL, StateSpace


class TokenIds(torch.Tensor):
    """A ``LongTensor`` of token ids (outlines-core 0.1's instruction type) that also reads as
    outlines 0.0.x's list of ints: iterating gives ints (ascending), and ``== [2, 1]`` compares
    the allowed *sets* (0.0.x listed them in its index's hash order, which carries no meaning).
    Every other operation gives a plain tensor."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __iter__(self):
        return iter(self.tolist()) if self.dim() == 1 else super().__iter__()

    def __eq__(self, other: object):  # type: ignore[override]
        if isinstance(other, (list, tuple)):
            return sorted(self.tolist()) == sorted(other)
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


class StatesToTokenMaps(dict):
    """outlines 0.0.x's ``states_to_token_maps`` dict that also answers outlines-core 0.1's
    ``Index.get_transitions()`` (what 0.1.x returned in its place)."""

    def get_transitions(self) -> dict:
        return {state: dict(row) for state, row in self.items()}


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
        self.states = StateSpace(compiled, labels=getattr(self, "_state_labels", None))

    @classmethod
    def from_spec(cls, spec: GuideSpec, tokenizer: Any, backend: Optional[str] = None,
                  core_reading: bool = False) -> "TokenrailsGuide":
        guide = cls.__new__(cls)
        guide._init_compiled(compile_for(spec, tokenizer, backend, core_reading), tokenizer)
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
    def states_to_token_maps(self) -> "StatesToTokenMaps":
        """``{state: {token: next state}}`` of a finite automaton (outlines' attribute); see
        ``StateSpace.token_maps`` for the numbering and the bounds."""
        return StatesToTokenMaps(self.states.token_maps())

    def can_terminate_state(self, state: int) -> bool:
        return self.is_final_state(state)

    def must_terminate_state(self, state: int) -> bool:
        """Only EOS can follow (the final state, or a complete text with no continuation)."""
        if state == FINAL:
            return True
        allowed = self.states.allowed(int(state))
        return bool(allowed.numel()) and set(allowed.tolist()) <= set(self.vocabulary_.eos_ids)

    def copy(self) -> "TokenrailsGuide":
        """Same compiled guide (cheap: nothing is recompiled), and a copy of the state table: the
        ids handed out so far stay valid in the copy, new ones are its own. outlines' loop copies
        a row's guide mid-walk (``reorder_fsms``) and goes on from that row's state id, which a
        fresh table did not know (it read as final: a batch of 0.0.x ``generate.choice`` stopped
        after one token)."""
        other = self.__class__.__new__(self.__class__)
        other.__dict__.update({k: v for k, v in self.__dict__.items() if k in ("regex_string", "cfg_string",
                                                                               "_state_labels")})
        other._init_compiled(self.compiled, self.tokenizer)
        other.states = self.states.copy()
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
        if getattr(compiled, "dfa", None) is not None:  # FSM backend: states are outlines' own numbers
            self._state_labels = functools.partial(_cached_labels, compiled, regex_string)
        super().__init__(compiled, tokenizer)

    @classmethod
    def from_regex(cls, regex_string: str, tokenizer: Any, **_kwargs: Any) -> "RegexGuide":
        return cls(regex_string, tokenizer)


def _cached_labels(compiled: CompiledGuide, regex: str) -> Optional[dict]:
    """outlines' labels for a compiled regex, computed once per compiled guide."""
    cache = compiled.__dict__.setdefault("_outlines_labels", {})
    if regex not in cache:
        cache[regex] = outlines_labels(regex, compiled.dfa)  # type: ignore[attr-defined]
    return cache[regex]


class CFGGuide(TokenrailsGuide):
    """Text in the language of a context-free grammar (outlines' Lark, or EBNF).

    As in outlines 0.0.x, a CFG guide is final only once EOS is generated (``is_final_state``);
    whether the text may end or must end now is ``can_terminate_state`` / ``must_terminate_state``
    (0.1.x's names), and ``get_next_instruction`` is ``Write([eos])`` when it must. Like 0.0.x's
    guide it also keeps ``generation``, the text of every non-EOS token passed to
    ``get_next_state`` since it was made (0.0.x guides served one sequence), and ``reset_state``:
    whether the last ``Generate`` instruction was for a position between terminals (read lazily
    with Lark; ``False`` for EBNF grammars). The grammar means what it meant to outlines 0.x's
    Lark guide: ``%import common.X`` from outlines' ``common`` grammar, every tokenization of the
    language allowed (``grammar_spec(..., lark_guide=True)``).
    """

    def __init__(self, cfg_string: str, tokenizer: Any):
        self.cfg_string = cfg_string
        super().__init__(compile_for(grammar_spec(cfg_string, lark_guide=True), tokenizer), tokenizer)

    def _init_compiled(self, compiled: CompiledGuide, tokenizer: Any = None) -> None:
        super()._init_compiled(compiled, tokenizer)
        self.generation = ""
        self._generate_state: Optional[int] = None
        self._boundaries: dict = {}

    def get_next_instruction(self, state: int) -> Instruction:
        if state == FINAL or self.must_terminate_state(state):
            return Write(token_ids([self.eos_token_id]))
        self._generate_state = int(state)
        return super().get_next_instruction(state)

    def get_next_state(self, state: int, token_id: int) -> int:
        if state != FINAL and int(token_id) not in self.vocabulary_.eos_ids:
            self.generation += _token_text(self.tokenizer, self.vocabulary_, int(token_id))
        return super().get_next_state(state, token_id)

    def is_final_state(self, state: int) -> bool:
        return state == FINAL

    def can_terminate_state(self, state: int) -> bool:
        return self.states.is_accepting(int(state))

    @functools.cached_property
    def _lark_text(self) -> str:
        """The grammar as Lark reads it for ``reset_state`` (outlines' ``common`` strings)."""
        return outlines_common(self.cfg_string)

    @property
    def reset_state(self) -> bool:
        state = self._generate_state
        if state is None:
            return False
        hit = self._boundaries.get(state)
        if hit is None:
            text = "".join(_token_text(self.tokenizer, self.vocabulary_, t) for t in self.states.path(state))
            hit = self._boundaries[state] = _lexes_completely(self._lark_text, text)
        return hit


def _token_text(tokenizer: Any, vocab: Any, token_id: int) -> str:
    """One token's text the way outlines 0.0.x read it (``tokenizer.decode([id])[0]``)."""
    decode = getattr(tokenizer, "decode", None)
    if decode is not None:
        try:
            out = decode([token_id])
            return out[0] if isinstance(out, (list, tuple)) else str(out)
        except Exception:  # noqa: BLE001 - fall back to the vocabulary's bytes
            pass
    return vocab.token_bytes[token_id].decode("utf-8", "replace")


def _lexes_completely(grammar: str, text: str) -> bool:
    """Whether Lark's contextual lexer reads ``text`` as whole terminals (False if it cannot tell)."""
    try:
        from lark.exceptions import LarkError

        from ..grammars import GRAMMAR_PATH
    except ImportError:
        return False
    try:
        parser = _lark_parser(grammar, GRAMMAR_PATH)
        interactive = parser.parse_interactive(text)
        interactive.exhaust_lexer()
        return True
    except LarkError:
        return False


_LARK_PARSERS: dict = {}


def _lark_parser(grammar: str, grammar_path: str) -> Any:
    from lark import Lark

    parser = _LARK_PARSERS.get(grammar)
    if parser is None:
        if len(_LARK_PARSERS) >= 16:
            _LARK_PARSERS.pop(next(iter(_LARK_PARSERS)))
        parser = _LARK_PARSERS[grammar] = Lark(grammar, parser="lalr", lexer="contextual",
                                               import_paths=[grammar_path])
    return parser


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
