"""The C builder (``tokenrails._dfa_native``, csrc/dfa_native/) seen from Python: loading it, its
calls, its error codes as the typed errors the Python fallback raises, and the choice between the
two (``determinize``, ``dfa_from_strings``)."""
from __future__ import annotations

import numpy as np

from ... import native
from ..errors import GuideLimitError, InvalidGuideError
from .deadline import Deadline
from .dfa import DFA, EMPTY_LANGUAGE, expanded_size_error, nfa_limit_error, state_limit_error
from .dfa_fallback import determinize_python, strings_dfa_python
from .nfa import ByteNFA

NATIVE_MAX_BYTES = 1 << 30  # working memory one native construction may allocate (refused beyond)


def native_module(use_native: bool | None = None):
    """``tokenrails._dfa_native`` or None; ``use_native=True`` insists, False refuses it."""
    if use_native is False:
        return None
    mod = native.load("dfa")
    if use_native and mod is None:
        raise RuntimeError("the native DFA builder (tokenrails._dfa_native) is not available")
    return mod


# dtype instances: ``frombuffer(b, dtype=np.int32)`` converts the type on every call (~0.2 µs)
_INT32 = np.dtype(np.int32)
_BOOL = np.dtype(np.bool_)

# error codes of tokenrails._dfa_native (see csrc/dfa_native/module.c)
_E_LIMIT, _E_TIMEOUT, _E_MEMORY, _E_EMPTY, _E_SIZE, _E_NFA = 1, 2, 3, 4, 5, 6


def native_dfa(result: tuple, max_states: int, deadline: Deadline, max_bytes: int, max_nfa: int = 0) -> DFA:
    """A native builder's result as a DFA, or its error code as the Python path's exception."""
    if len(result) == 2:
        code, value = result
        if code == _E_LIMIT:
            raise state_limit_error(max_states, value)
        if code == _E_SIZE:
            raise expanded_size_error(max_states, value)
        if code == _E_NFA:
            raise nfa_limit_error(max_nfa, value)
        if code == _E_TIMEOUT:
            raise deadline.error()
        if code == _E_EMPTY:
            raise InvalidGuideError(EMPTY_LANGUAGE)
        if code == _E_MEMORY:
            raise GuideLimitError(
                f"limit max_dfa_states={max_states} exceeded: building the automaton would need more "
                f"than {max_bytes} bytes of working memory",
                limit="max_dfa_states", value=value,
            )
        raise RuntimeError(f"tokenrails._dfa_native returned unknown error code {code}")
    trans, classmap, accepting, num, k = result
    return DFA(np.frombuffer(trans, _INT32).reshape(num, k), np.frombuffer(classmap, _INT32),
               np.frombuffer(accepting, _BOOL))


def determinize_native(mod, eps: list[list[int]] | None, edges: list[list[tuple[int, int, int]]], start: int,
                       accepting: list[int], max_states: int, deadline: Deadline,
                       max_bytes: int = NATIVE_MAX_BYTES) -> DFA:
    """Epsilon elimination + subset construction + pruning + minimization in C (same DFA).

    ``eps``/``edges`` are per-state lists (a Thompson NFA, or ``eps=None`` for an epsilon-free
    one); the C side validates every index and reads the clock every few hundred states.
    """
    result = mod.determinize(eps, edges, start, accepting, max_states, max(deadline.remaining(), 0.0), max_bytes)
    return native_dfa(result, max_states, deadline, max_bytes)


def determinize(nfa: ByteNFA, max_states: int, deadline: Deadline, *, use_native: bool | None = None) -> DFA:
    """The minimal DFA of an epsilon-free NFA: the C builder when built, else the Python fallback."""
    mod = native_module(use_native)
    if mod is not None:
        acc = [i for i, a in enumerate(nfa.accepting) if a]
        return determinize_native(mod, None, nfa.edges, 0, acc, max_states, deadline)
    return determinize_python(nfa, max_states, deadline)


def dfa_from_strings(strings: list[bytes], max_states: int, deadline: Deadline, *,
                     use_native: bool | None = None, max_bytes: int = NATIVE_MAX_BYTES) -> DFA:
    """The minimal DFA of a finite set of byte strings (Revuz): C when built, else Python."""
    mod = native_module(use_native)
    if mod is not None:
        result = mod.from_strings(strings, max_states * 4, max(deadline.remaining(), 0.0), max_bytes)
        return native_dfa(result, max_states, deadline, max_bytes)
    return strings_dfa_python(strings, max_states, deadline)
