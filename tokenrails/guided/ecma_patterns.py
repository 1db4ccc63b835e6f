"""JSON Schema ``pattern``s mean ECMA-262 regexes: ``\\d`` is ``[0-9]``, ``\\s`` is ECMA's whitespace.

Each backend reads the shorthand classes in its own dialect (measured): the fsm backend's parser
reads Python's (``^\\d+$`` accepted "٣", Arabic-Indic three), llguidance's ``\\s`` is Unicode
White_Space (accepts U+0085, refuses U+FEFF), xgrammar's is ASCII (refuses U+00A0). So the
policy schema every backend compiles (``schema_semantics``) spells them out as ECMA-262 defines them,
and the three backends read one language.
"""
from __future__ import annotations

from typing import Any

from .errors import UnsupportedGuideError
from .fsm.charset import negate, normalize, without_surrogates
from .schema_walk import iter_subschemas

# What ``\d \w \s`` stand for, as the inside of a character class, per dialect. The regex kind's
# documented dialect is ASCII (xgrammar's, outlines'); JSON Schema patterns are ECMA-262, whose
# ``\s`` is WhiteSpace and LineTerminator.
ECMA_CLASSES = {"d": "0-9", "w": "A-Za-z0-9_",
                "s": "\\t\\n\\x0b\\x0c\\r \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"}
ASCII_CLASSES = {"d": "0-9", "w": "0-9A-Za-z_", "s": " \\t\\n\\r\\f\\v"}
_ECMA_RANGES = {
    "d": ((0x30, 0x39),),
    "w": normalize([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]),
    "s": normalize([(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                    (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]),
}


def escape_code_point(cp: int) -> str:
    """A code point as every backend's regex reader takes it (Python, Rust, xgrammar): letters and
    digits as themselves, the rest as fixed-width ``\\uHHHH`` / ``\\UHHHHHHHH``."""
    if chr(cp).isascii() and chr(cp).isalnum():
        return chr(cp)
    if cp <= 0xFFFF:  # never \\xHH: xgrammar reads \\x greedily ("\\x5fa" is U+05FA)
        return f"\\u{cp:04x}"
    return f"\\U{cp:08x}"


def class_body(ranges) -> str:
    """The inside of a character class spelling exactly ``ranges`` (code point pairs)."""
    return "".join(escape_code_point(a) if a == b else f"{escape_code_point(a)}-{escape_code_point(b)}"
                   for a, b in ranges)


# ``\D \W \S`` as the code points they match (surrogates left out: no backend emits one), so a
# negated shorthand inside a class (``[\s\S]``, the usual "any character") has a spelling too.
ECMA_NEGATED = {k: class_body(without_surrogates(negate(r))) for k, r in _ECMA_RANGES.items()}


def spell_shorthands(pattern: str, classes: dict[str, str], who: str,
                     negated: dict[str, str] | None = None, complement_outside: bool = True) -> str:
    """``pattern`` with ``\\d \\w \\s \\D \\W \\S`` spelled out from ``classes``. A negated
    shorthand is ``[^body]``, and inside a class (``[\\D.]``) has no plain spelling:
    ``UnsupportedGuideError``; unless ``negated`` gives the complement's own body (keys lower
    case), which then stands for it inside classes, and outside too unless ``complement_outside``
    is False (``[^body]`` there: xgrammar keeps a negated class clear of JSON's control characters,
    not a positive one)."""
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
            elif complement is not None and (in_class or complement_outside):
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
    return spell_shorthands(pattern, ECMA_CLASSES, "schema policy", negated=ECMA_NEGATED,
                            complement_outside=False)


def spell_out_schema_patterns(schema: Any) -> bool:
    """Rewrite every ``pattern`` and ``patternProperties`` key of ``schema`` in place; True if any changed."""
    changed = False
    for _, sub in iter_subschemas(schema):
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
