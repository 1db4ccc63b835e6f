"""Spec payloads → minimal byte DFA, under the configured limits and compile deadline."""
from __future__ import annotations

from ..gc_pause import gc_paused
from ..limits import GuideLimits
from .deadline import Deadline
from .dfa import DFA, expanded_size_error
from .native_builder import NATIVE_MAX_BYTES, determinize, dfa_from_strings, native_dfa, native_module
from .thompson import AST_TYPES, build_nfa, charset_fragment
from .regex_ast import Node, expanded_size
from .regex_parser import parse_regex

NFA_STATES_PER_DFA_STATE = 2  # the Thompson NFA may be this many times max_dfa_states
# Patterns up to this long compile without the GC pause: their parse allocates a few hundred
# objects at most, fewer than one young collection's worth, and entering and leaving the pause
# (a process-wide lock) costs as much as the C build of a short pattern.
UNPAUSED_PATTERN_CHARS = 256


def compile_ast_native(mod, node: Node, max_nfa: int, max_states: int, deadline: Deadline,
                       max_bytes: int = NATIVE_MAX_BYTES) -> DFA:
    """The whole AST → minimal DFA step in C: the tree walked there into the program
    ``flatten_ast`` would give (with the cached charset fragments), the size guard, Thompson
    construction, then as ``determinize_native``."""
    result = mod.compile_tree(node, AST_TYPES, charset_fragment, max_nfa, max_states,
                              max(deadline.remaining(), 0.0), max_bytes)
    return native_dfa(result, max_states, deadline, max_bytes, max_nfa)


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

    One parser (``regex_parser``, Python: typed errors with positions); the AST then goes to the
    C builder when it is built, else to the Python fallback builder.
    """
    if check_length:
        limits.check("max_regex_length", len(pattern))
    deadline = Deadline(limits.compile_timeout_s)
    if len(pattern) <= UNPAUSED_PATTERN_CHARS:
        return _compile_ast(parse_regex(pattern, limits.max_repeat), limits, deadline)
    with gc_paused():
        return _compile_ast(parse_regex(pattern, limits.max_repeat), limits, deadline)


def compile_choices(choices: list[str], limits: GuideLimits) -> DFA:
    """DFA accepting exactly the given strings."""
    limits.check("max_enum_values", len(choices))
    deadline = Deadline(limits.compile_timeout_s)
    with gc_paused():
        return dfa_from_strings([c.encode("utf-8", "surrogatepass") for c in choices], limits.max_dfa_states, deadline)
