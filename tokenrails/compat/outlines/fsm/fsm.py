"""``outlines.fsm.fsm`` (0.0.x, deprecated there too): the ``FSM`` interface over guides.

``allowed_token_ids(state)`` / ``next_state(state, token_id)`` / ``is_final_state(state)`` on
top of the shim's guides; constructing one warns, as outlines 0.0.46 did (use the guides)."""
from __future__ import annotations

import warnings
from typing import Any, List, Optional

from .guide import CFGGuide, RegexGuide, StopAtEOSGuide


def _deprecated(name: str, replacement: str) -> None:
    warnings.warn(f"outlines.fsm.fsm.{name} is deprecated: use outlines.fsm.guide.{replacement}",
                  UserWarning, stacklevel=3)


def _as_list(tokens: Any) -> Optional[List[int]]:
    if tokens is None:
        return None
    return [int(t) for t in (tokens.tolist() if hasattr(tokens, "tolist") else tokens)]


class _GuideFSM:
    """The FSM names of a guide's methods."""

    guide: Any

    @property
    def start_state(self) -> Any:
        return self.guide.initial_state

    @property
    def final_states(self) -> Any:
        return getattr(self.guide, "final_states", {self.final_state})

    @property
    def states_to_token_maps(self) -> Any:
        return self.guide.states_to_token_maps

    def allowed_token_ids(self, state: Any) -> Optional[List[int]]:
        return _as_list(self.guide.get_next_instruction(state).tokens)

    def next_state(self, state: Any, token_id: int) -> Any:
        return self.guide.get_next_state(state, token_id)

    def is_final_state(self, state: Any) -> bool:
        return self.guide.is_final_state(state)

    def copy(self) -> "_GuideFSM":
        other = self.__class__.__new__(self.__class__)
        other.__dict__.update(self.__dict__)
        other.guide = self.guide.copy()
        return other


class StopAtEosFSM(_GuideFSM):
    def __init__(self, tokenizer: Any):
        _deprecated("StopAtEosFSM", "StopAtEOSGuide")
        self.guide = StopAtEOSGuide(tokenizer)
        self.final_state = self.guide.final_state


class RegexFSM(_GuideFSM):
    def __init__(self, regex_string: str, tokenizer: Any):
        _deprecated("RegexFSM", "RegexGuide")
        self.guide = RegexGuide(regex_string, tokenizer)
        self.final_state = self.guide.final_state


class CFGFSM(_GuideFSM):
    """``generation`` / ``reset_state`` are the guide's (see ``CFGGuide``)."""

    def __init__(self, cfg_string: str, tokenizer: Any):
        _deprecated("CFGFSM", "CFGGuide")
        self.guide = CFGGuide(cfg_string, tokenizer)
        self.tokenizer = tokenizer
        self.final_state = self.guide.final_state

    @property
    def generation(self) -> str:
        return self.guide.generation

    @property
    def reset_state(self) -> bool:
        return self.guide.reset_state


__all__ = ["CFGFSM", "RegexFSM", "StopAtEosFSM"]
