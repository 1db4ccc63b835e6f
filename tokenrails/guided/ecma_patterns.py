"""JSON Schema ``pattern``s mean ECMA-262 regexes: ``\\d`` is ``[0-9]``, ``\\s`` is ECMA's whitespace.

Each backend reads the shorthand classes in its own dialect (measured): the fsm backend's parser
reads Python's (``^\\d+$`` accepted "٣", Arabic-Indic three), llguidance's ``\\s`` is Unicode
White_Space (accepts U+0085, refuses U+FEFF), xgrammar's is ASCII (refuses U+00A0). So the
policy schema every backend compiles (``schema_policy``) spells them out as ECMA-262 defines them,
and the three backends read one language.
"""
from __future__ import annotations

from typing import Any

from .errors import UnsupportedGuideError

# ECMA-262 WhiteSpace and LineTerminator code points (what ``\s`` matches there).
_ECMA_SPACE = "\\t\\n\\x0b\\x0c\\r \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"
_INSIDE = {"d": "0-9", "w": "A-Za-z0-9_", "s": _ECMA_SPACE}


def ecma_shorthands(pattern: str) -> str:
    """``pattern`` with ``\\d \\w \\s \\D \\W \\S`` replaced by their ECMA-262 classes."""
    out: list[str] = []
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            nxt = pattern[i + 1]
            low = nxt.lower()
            if low in _INSIDE:
                if in_class:
                    if nxt.isupper():  # a complement inside a class has no plain spelling
                        raise UnsupportedGuideError(
                            f"\\{nxt} inside a character class is not supported in schema patterns",
                            feature=f"\\{nxt} in a class", backend="schema policy",
                        )
                    out.append(_INSIDE[low])
                else:
                    out.append(("[^" if nxt.isupper() else "[") + _INSIDE[low] + "]")
            else:
                out.append(pattern[i: i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
            out.append(c)
            if pattern[i + 1: i + 2] == "^":
                out.append("^")
                i += 1
            if pattern[i + 1: i + 2] == "]":  # a leading ']' is a literal
                out.append("\\]")
                i += 1
        elif c == "]" and in_class:
            in_class = False
            out.append(c)
        else:
            out.append(c)
        i += 1
    return "".join(out)


def spell_out_schema_patterns(schema: Any) -> bool:
    """Rewrite every ``pattern`` and ``patternProperties`` key of ``schema`` in place; True if any changed."""
    from .schema_features import iter_subschemas

    changed = False
    for _, sub, _ in iter_subschemas(schema):
        pattern = sub.get("pattern")
        if isinstance(pattern, str) and "\\" in pattern:
            spelled = ecma_shorthands(pattern)
            changed |= spelled != pattern
            sub["pattern"] = spelled
        props = sub.get("patternProperties")
        if isinstance(props, dict) and any("\\" in k for k in props):
            renamed = {ecma_shorthands(k): v for k, v in props.items()}
            changed |= list(renamed) != list(props)
            sub["patternProperties"] = renamed
    return changed
