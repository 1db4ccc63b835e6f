"""Spec payloads → minimal byte DFA, under the configured limits and compile deadline."""
from __future__ import annotations

from ..gc_pause import gc_paused
from ..limits import GuideLimits
from .dfa import (
    DFA, NATIVE_MAX_BYTES, _native_dfa, compile_ast_native, determinize, dfa_from_strings, expanded_size_error,
    native_module,
)
from .nfa import Deadline, _charset_fragment, build_nfa
from .regex_ast import Node, expanded_size
from .regex_parser import parse_regex
from .unicode_classes import unicode_digit, unicode_space, unicode_word

NFA_STATES_PER_DFA_STATE = 2  # the Thompson NFA may be this many times max_dfa_states


def compile_ast(node: Node, limits: GuideLimits, deadline: Deadline | None = None) -> DFA:
    with gc_paused():  # the one process-wide pause (gc_pause.py)
        return _compile_ast(node, limits, deadline or Deadline(limits.compile_timeout_s))


def _compile_ast(node: Node, limits: GuideLimits, deadline: Deadline) -> DFA:
    max_nfa = max(NFA_STATES_PER_DFA_STATE * limits.max_dfa_states, 1024)
    mod = native_module()
    if mod is not None:  # Thompson construction onwards in C (same size guard, same DFA)
        return compile_ast_native(mod, node, max_nfa, limits.max_dfa_states, deadline)
    size = expanded_size(node)  # a lower bound on NFA states: refuse before building anything
    if size > max_nfa:
        raise expanded_size_error(limits.max_dfa_states, size)
    return determinize(build_nfa(node, max_nfa, deadline), limits.max_dfa_states, deadline)


def compile_regex(pattern: str, limits: GuideLimits, *, check_length: bool = True) -> DFA:
    """DFA for ``re.fullmatch(pattern, text)`` on the UTF-8 bytes of ``text``.

    With the native builder, common patterns are parsed and built in one C call
    (``_dfa_native.compile_regex``); it declines everything else, including every malformed
    pattern, and the Python parser then gives the same DFA or the error with its position.
    """
    if check_length:
        limits.check("max_regex_length", len(pattern))
    deadline = Deadline(limits.compile_timeout_s)
    mod = native_module()
    if mod is not None and hasattr(mod, "compile_regex"):  # a handful of Python objects: no GC pause
        dfa = _compile_regex_native(mod, pattern, limits, deadline)
        if dfa is not None:
            return dfa
    with gc_paused():
        return _compile_ast(parse_regex(pattern, limits.max_repeat), limits, deadline)


# \d \w \s tables (regex_parser's Unicode semantics) by the bit the native parser asks for them with
_CLASS_TABLES = ((1, 0, unicode_digit), (2, 1, unicode_word), (4, 2, unicode_space))


def _compile_regex_native(mod, pattern: str, limits: GuideLimits, deadline: Deadline) -> DFA | None:
    """The C fast path (parse + build), or None when it does not handle ``pattern``."""
    max_nfa = max(NFA_STATES_PER_DFA_STATE * limits.max_dfa_states, 1024)
    for _ in range(4):  # at most one round per missing table, then it answers
        result = mod.compile_regex(pattern, limits.max_repeat, max_nfa, limits.max_dfa_states,
                                   max(deadline.remaining(), 0.0), NATIVE_MAX_BYTES, _charset_fragment)
        if type(result) is not int:
            break
        for bit, index, table in _CLASS_TABLES:  # first use of \d/\w/\s in this process
            if result & bit:
                mod.set_class_ranges(index, table())
    if result is None or type(result) is int:
        return None
    return _native_dfa(result, limits.max_dfa_states, deadline, NATIVE_MAX_BYTES, max_nfa)


def compile_choices(choices: list[str], limits: GuideLimits) -> DFA:
    """DFA accepting exactly the given strings."""
    limits.check("max_enum_values", len(choices))
    deadline = Deadline(limits.compile_timeout_s)
    with gc_paused():
        return dfa_from_strings([c.encode("utf-8", "surrogatepass") for c in choices], limits.max_dfa_states, deadline)
