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

# What ``\d \w \s`` stand for, as the inside of a character class, per dialect. The regex kind's
# documented dialect is ASCII (xgrammar's, outlines'); JSON Schema patterns are ECMA-262, whose
# ``\s`` is WhiteSpace and LineTerminator.
ECMA_CLASSES = {"d": "0-9", "w": "A-Za-z0-9_",
                "s": "\\t\\n\\x0b\\x0c\\r \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"}
ASCII_CLASSES = {"d": "0-9", "w": "0-9A-Za-z_", "s": " \\t\\n\\r\\f\\v"}


def spell_shorthands(pattern: str, classes: dict[str, str], who: str,
                     negated: dict[str, str] | None = None) -> str:
    """``pattern`` with ``\\d \\w \\s \\D \\W \\S`` spelled out from ``classes``. A negated
    shorthand is ``[^body]``, and inside a class (``[\\D.]``) has no plain spelling:
    ``UnsupportedGuideError``; unless ``negated`` gives the complement's own body (keys lower
    case), which then stands for it inside and outside classes."""
    out: list[str] = []
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            nxt = pattern[i + 1]
            body = classes.get(nxt.lower())
            complement = negated.get(nxt.lower()) if negated is not None and nxt.isupper() else None
            if body is None:
                out.append(pattern[i: i + 2])
            elif complement is not None:
                out.append(complement if in_class else "[" + complement + "]")
            elif not in_class:
                out.append(("[^" if nxt.isupper() else "[") + body + "]")
            elif nxt.isupper():
                raise UnsupportedGuideError(f"\\{nxt} inside a character class is not supported",
                                            feature=f"\\{nxt} in a class", backend=who)
            else:
                out.append(body)
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


def ecma_shorthands(pattern: str) -> str:
    """A JSON Schema ``pattern`` with ECMA-262's shorthand classes spelled out."""
    return spell_shorthands(pattern, ECMA_CLASSES, "schema policy")


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
