"""One place for every resource bound a client-supplied constraint is checked against."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .errors import GuideLimitError


@dataclass(frozen=True)
class GuideLimits:
    """Explicit, configurable limits with safe defaults for client-supplied constraints."""

    max_spec_bytes: int = 1 << 20          # serialized request size
    max_json_depth: int = 64               # nesting depth of a JSON schema document
    max_ref_depth: int = 32                # chained $ref resolutions
    max_schema_visits: int = 100_000       # nodes one walk over a schema (closing, type inference)
                                           # may visit beyond 8 per document node, $ref targets and
                                           # allOf parts counted each time they are followed (a 2.2 KB
                                           # allOf/$ref chain of 30 levels is 2^30 visits)
    max_enum_values: int = 10_000          # values in one enum / choices list
    max_any_of: int = 256                  # anyOf / oneOf fan-out
    max_object_properties: int = 2_000     # properties of one object (xgrammar's compile grows
                                           # ~quadratically: 1,000 → 0.3 s, 2,000 → 0.9 s, 28,000
                                           # → minutes of a core after the deadline abandoned it)
    max_regex_length: int = 16_384         # characters in one pattern
    max_repeat: int = 10_000               # upper bound of {m,n} repetition. Real outlines and
                                           # llguidance serve Field(max_length=1200) / "a.{0,1200}";
                                           # measured on SmolLM2's 49k vocabulary (docs/safety.md):
                                           # a.{0,10000} compiles in 0.01 s on llguidance, 0.05 s on
                                           # fsm; maxLength 10,000 0.01 s on llguidance (fsm: over
                                           # max_dfa_states, typed, the ladder moves on)
    max_repeat_total: int = 2_000          # the bounded repeats of one regex/pattern together,
                                           # besides its largest (which max_repeat bounds): 300 x
                                           # [\u0000-\uffff]{0,9} is .{0,2700} spelled out: fsm 30 s,
                                           # llguidance out of lexer fuel, xgrammar 11 s on a 49k
                                           # vocabulary, while each {0,9} is under max_repeat
    xgrammar_max_repeat: int = 1_000       # xgrammar only (its compile cannot be interrupted):
                                           # a.{0,1200} compiled in 5.8 s, a schema pattern's
                                           # {0,10000} ran 27 s then failed an internal check; larger
                                           # bounds are served by llguidance / fsm
    max_dfa_states: int = 100_000          # FSM backend automaton size
    max_grammar_bytes: int = 256 << 10     # EBNF grammar text
    max_literal_bytes: int = 16 << 10      # one string literal/const/enum value/choice (xgrammar
                                           # compile time grows ~quadratically: 100 KB ≈ 20 s)
    max_grammar_literal_bytes: int = 32 << 10  # all quoted literals of one grammar together
                                           # (15 x 16 KB literals: a 47 s compile on a 257-token vocabulary)
    compile_timeout_s: float = 30.0        # wall time for one compile
    max_fill_seconds: float = 2.0          # CPU time of one row's mask in one step (typical:
                                           # microseconds), the filling thread's own: a loaded
                                           # machine stretches wall time, not this; a row past it
                                           # ends with GuideTimeoutError, the batch goes on
    max_lowered_regex_bytes: int = 8 << 20  # fsm: the regex outlines-core lowers a schema to
    lowering_memory_bytes: int = 1 << 30   # fsm: address space of the worker that lowers large schemas
    max_abandoned_compiles: int = 16       # compiles past their deadline still running; new compiles
                                           # are refused while this many are (see compile_pool.py)
    cache_max_entries: int = 512           # compiled-guide LRU entries
    cache_max_bytes: int = 32 << 20        # compiled-guide LRU bytes (also xgrammar's own cache): a
                                           # server's memory after a flood of fresh specs grows by
                                           # about this much; raise it for many large guides
    max_budget_states: int = 20_000        # fsm: DFA states of a budget="close" guide (its distance
                                           # table walks the token trie once per state: 768 states of
                                           # a permissive regex ~0.1 s on a 49k vocabulary)

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
