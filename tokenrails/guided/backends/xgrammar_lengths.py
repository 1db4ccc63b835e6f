"""Exact ``minLength``/``maxLength`` strings for xgrammar, by one rewrite of its own EBNF.

xgrammar 0.2.8 lowers a length-bounded JSON string to ``"\\"" X{m,n} "\\""`` with
``X ::= [^"\\\\\\r\\n]``: raw control characters other than CR/LF (invalid JSON) are admitted. So
a grammar xgrammar built (from a structural tag) is printed, each such rule is narrowed to
``[^\\0-\\x1f"\\\\]`` (one raw JSON string character, one code point: what ``jsonschema`` counts),
and the text is compiled as EBNF; everything else (tags, triggers, dispatch) is xgrammar's own.

Escape sequences stay out of length-bounded strings, as in stock xgrammar: offering them
(``X ::= [^\\0-\\x1f"\\\\] | "\\\\" escape``) is exact but turns xgrammar's mask from a
precomputed class repeat into an Earley walk over every count, per token.
"""
from __future__ import annotations

import json
import re
from typing import Any

# the rule body xgrammar 0.2.8 prints for a length-bounded string's character
_CHAR_RULE = re.compile(r'^(?P<name>\S+) ::= \(\(\[\^\\"\\\\\\r\\n\]\)\)$', re.M)
_JSON_CHAR = '(([^\\0-\\x1f\\"\\\\]))'


def has_length_bounds(value: Any) -> bool:
    """Whether a (tag or schema) JSON value mentions ``minLength``/``maxLength`` anywhere (cheap
    text test; a false positive only costs one EBNF round trip)."""
    text = value if isinstance(value, str) else json.dumps(value)
    return '"minLength"' in text or '"maxLength"' in text


def exact_string_lengths(ebnf: str) -> str:
    """``ebnf`` (as xgrammar prints a grammar) with each length-bounded string's character rule
    narrowed to a raw JSON string character; unchanged when it has none."""
    return _CHAR_RULE.sub(lambda m: f"{m.group('name')} ::= {_JSON_CHAR}", ebnf)
