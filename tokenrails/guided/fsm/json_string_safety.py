"""Whether a ``pattern`` can match a character that JSON must escape inside a string literal.

Backends that splice a schema's ``pattern`` into the JSON string unescaped (outlines-core's
lowering; xgrammar 0.2.8 for characters a positive class or literal names: ``^\\t$`` admitted a raw
tab, ``^["\\\\]$`` the text ``\"\"\"``, measured) then emit invalid JSON for such a pattern.
"""
from __future__ import annotations

from ..errors import GuideError
from .charset import Ranges
from .regex_ast import Alt, CharSet, Concat, Node, Repeat
from .regex_parser import parse_regex

# characters that must never appear raw inside a JSON string literal
JSON_UNSAFE: Ranges = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))


def unsafe_in_json_string(pattern: str) -> bool:
    """True when some character ``pattern`` can match is a raw quote, backslash or control character."""
    try:
        node = parse_regex(pattern)
    except GuideError:
        return False  # reported when the lowered regex is parsed
    stack: list[Node] = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, CharSet):
            if any(lo <= uhi and ulo <= hi for lo, hi in n.ranges for ulo, uhi in JSON_UNSAFE):
                return True
        elif isinstance(n, (Concat, Alt)):
            stack.extend(n.items)
        elif isinstance(n, Repeat):
            stack.append(n.item)
    return False
