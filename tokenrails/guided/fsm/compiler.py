"""Spec payloads → minimal byte DFA, under the configured limits and compile deadline."""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

from ..limits import GuideLimits
from .dfa import DFA, compile_ast_native, determinize, dfa_from_strings, expanded_size_error, native_module
from .nfa import Deadline, build_nfa
from .regex_ast import Node, expanded_size
from .regex_parser import parse_regex

NFA_STATES_PER_DFA_STATE = 2  # the Thompson NFA may be this many times max_dfa_states


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic GC while building automata.

    Construction allocates many short-lived lists and tuples (none of them in cycles); in a
    process holding a large vocabulary, each generation-2 pass they trigger walks hundreds of
    thousands of objects and costs milliseconds. Re-enabled only if it was enabled on entry.
    """
    was_enabled = gc.isenabled()
    if was_enabled:
        gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def compile_ast(node: Node, limits: GuideLimits, deadline: Deadline | None = None) -> DFA:
    deadline = deadline or Deadline(limits.compile_timeout_s)
    max_nfa = max(NFA_STATES_PER_DFA_STATE * limits.max_dfa_states, 1024)
    mod = native_module()
    if mod is not None:  # Thompson construction onwards in C (same size guard, same DFA)
        with no_gc():
            return compile_ast_native(mod, node, max_nfa, limits.max_dfa_states, deadline)
    size = expanded_size(node)  # a lower bound on NFA states: refuse before building anything
    if size > max_nfa:
        raise expanded_size_error(limits.max_dfa_states, size)
    with no_gc():
        nfa = build_nfa(node, max_nfa, deadline)
        return determinize(nfa, limits.max_dfa_states, deadline)


def compile_regex(pattern: str, limits: GuideLimits, *, check_length: bool = True) -> DFA:
    """DFA for ``re.fullmatch(pattern, text)`` on the UTF-8 bytes of ``text``."""
    if check_length:
        limits.check("max_regex_length", len(pattern))
    deadline = Deadline(limits.compile_timeout_s)
    with no_gc():
        return compile_ast(parse_regex(pattern, limits.max_repeat), limits, deadline)


def compile_choices(choices: list[str], limits: GuideLimits) -> DFA:
    """DFA accepting exactly the given strings."""
    limits.check("max_enum_values", len(choices))
    deadline = Deadline(limits.compile_timeout_s)
    with no_gc():
        return dfa_from_strings([c.encode("utf-8", "surrogatepass") for c in choices], limits.max_dfa_states, deadline)
