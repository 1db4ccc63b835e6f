"""Spec payloads → minimal byte DFA, under the configured limits and compile deadline."""
from __future__ import annotations

from ..errors import GuideLimitError
from ..limits import GuideLimits
from .dfa import DFA, determinize, dfa_from_strings
from .nfa import Deadline, build_nfa
from .regex_ast import Node, expanded_size
from .regex_parser import parse_regex

NFA_STATES_PER_DFA_STATE = 2  # the Thompson NFA may be this many times max_dfa_states


def compile_ast(node: Node, limits: GuideLimits, deadline: Deadline | None = None) -> DFA:
    deadline = deadline or Deadline(limits.compile_timeout_s)
    max_nfa = max(NFA_STATES_PER_DFA_STATE * limits.max_dfa_states, 1024)
    size = expanded_size(node)  # a lower bound on NFA states: refuse before building anything
    if size > max_nfa:
        raise GuideLimitError(
            f"limit max_dfa_states={limits.max_dfa_states} exceeded: the pattern expands to {size} "
            "character positions (nested or large repetition counts)",
            limit="max_dfa_states", value=size,
        )
    nfa = build_nfa(node, max_nfa, deadline)
    return determinize(nfa, limits.max_dfa_states, deadline)


def compile_regex(pattern: str, limits: GuideLimits, *, check_length: bool = True) -> DFA:
    """DFA for ``re.fullmatch(pattern, text)`` on the UTF-8 bytes of ``text``."""
    if check_length:
        limits.check("max_regex_length", len(pattern))
    deadline = Deadline(limits.compile_timeout_s)
    return compile_ast(parse_regex(pattern, limits.max_repeat), limits, deadline)


def compile_choices(choices: list[str], limits: GuideLimits) -> DFA:
    """DFA accepting exactly the given strings."""
    limits.check("max_enum_values", len(choices))
    deadline = Deadline(limits.compile_timeout_s)
    return dfa_from_strings([c.encode("utf-8", "surrogatepass") for c in choices], limits.max_dfa_states, deadline)
