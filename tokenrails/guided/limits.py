"""One place for every resource bound a client-supplied constraint is checked against."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .errors import GuideLimitError


@dataclass(frozen=True)
class GuideLimits:
    """Explicit, configurable limits with safe defaults for client-supplied constraints.

    Each bound keeps one client's constraint from costing unbounded CPU or memory; the measured
    costs behind the defaults are in docs/safety.md's limits table."""

    max_spec_bytes: int = 1 << 20          # serialized request size
    max_json_depth: int = 64               # nesting depth of a JSON schema document
    max_ref_depth: int = 32                # chained $ref resolutions
    max_schema_visits: int = 100_000       # nodes one schema walk may visit beyond 8 per document
                                           # node ($ref targets / allOf parts count each time followed)
    max_enum_values: int = 10_000          # values in one enum / choices list
    max_any_of: int = 256                  # anyOf / oneOf fan-out
    max_object_properties: int = 2_000     # properties of one object (xgrammar's compile is ~quadratic)
    max_regex_length: int = 16_384         # characters in one pattern
    max_repeat: int = 10_000               # upper bound of {m,n} repetition (serves outlines'
                                           # Field(max_length=1200) / "a.{0,1200}")
    max_repeat_total: int = 2_000          # the bounded repeats of one regex/pattern together,
                                           # besides its largest (which max_repeat bounds)
    xgrammar_max_repeat: int = 1_000       # xgrammar only: its compile cannot be interrupted;
                                           # larger bounds are served by llguidance / fsm
    max_dfa_states: int = 100_000          # FSM backend automaton size
    max_grammar_bytes: int = 256 << 10     # EBNF grammar text
    max_literal_bytes: int = 16 << 10      # one string literal/const/enum value/choice
    max_grammar_literal_bytes: int = 32 << 10  # all quoted literals of one grammar together
    compile_timeout_s: float = 30.0        # wall time for one compile
    max_fill_seconds: float = 2.0          # the filling thread's CPU time for one row's mask in one
                                           # step (load stretches wall time, not this); a row past
                                           # it ends with GuideTimeoutError, the batch goes on
    max_lowered_regex_bytes: int = 8 << 20  # fsm: the regex outlines-core lowers a schema to
    lowering_memory_bytes: int = 1 << 30   # fsm: address space of the worker that lowers large schemas
    max_abandoned_compiles: int = 16       # compiles past their deadline still running; new compiles
                                           # are refused while this many are (see compile_pool.py)
    cache_max_entries: int = 512           # compiled-guide LRU entries
    cache_max_bytes: int = 32 << 20        # compiled-guide LRU bytes (also xgrammar's own cache):
                                           # what a flood of fresh specs can add to a server's memory
    max_budget_states: int = 20_000        # fsm: DFA states of a budget="close" guide (its distance
                                           # table walks the token trie once per state)

    def replace(self, **changes: object) -> "GuideLimits":
        return dataclasses.replace(self, **changes)

    def check(self, name: str, value: int | float, where: str = "") -> None:
        """Raise ``GuideLimitError`` when ``value`` exceeds the limit called ``name`` (``where``: the
        place in the constraint, for the message)."""
        bound = getattr(self, name)
        if value > bound:
            at = f" at {where}" if where else ""
            raise GuideLimitError(f"limit {name}={bound} exceeded{at}: got {value}", limit=name, value=value)


DEFAULT_LIMITS = GuideLimits()


def repeat_count(digits: str, bound: int, where: str) -> int:
    """A ``{m,n}`` count read from client text. ``int()`` raises a bare ``ValueError`` past 4,300
    digits (and is quadratic below that), so a count longer than any bound is refused on its text
    (``max_repeat``, its value the digit count); shorter ones are compared by the caller."""
    significant = digits.lstrip("0")
    if len(significant) > max(18, len(str(bound))):
        raise GuideLimitError(
            f"limit max_repeat={bound} exceeded: a repetition count of {len(significant)} digits {where}",
            limit="max_repeat", value=f"{len(significant)} digits")
    return int(significant or "0")
