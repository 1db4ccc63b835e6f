"""``outlines.grammars``: ready-made grammars, in Lark like outlines' own.

``grammar_spec`` sends Lark grammars to llguidance (which reads Lark natively) and EBNF
(GBNF-like: ``rule ::= ...``, root rule ``root``) to xgrammar. ``json`` and ``arithmetic`` are Lark
(they parse with ``lark.Lark(..., import_paths=[GRAMMAR_PATH])`` too); ``json_ebnf`` and
``arithmetic_ebnf`` are the same languages in EBNF, for code that needs xgrammar's dialect
(``check_ebnf`` insists on EBNF).
"""
from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from ... import InvalidGuideError

if TYPE_CHECKING:
    from ... import GuideSpec

# where outlines' grammar imports resolve (Lark's own ``common`` grammar is found by Lark itself)
GRAMMAR_PATH = os.path.dirname(os.path.abspath(__file__))

json = r"""
?start: value

?value: object
      | array
      | ESCAPED_STRING
      | SIGNED_NUMBER
      | "true"
      | "false"
      | "null"

array: "[" [value ("," value)*] "]"
object: "{" [pair ("," pair)*] "}"
pair: ESCAPED_STRING ":" value

%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
""".strip()

arithmetic = r"""
?start: sum

?sum: product
    | sum "+" product
    | sum "-" product

?product: atom
    | product "*" atom
    | product "/" atom

?atom: NUMBER
     | "-" atom
     | "(" sum ")"

%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE
""".strip()

json_ebnf = r"""
root ::= ws value ws
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* ws )? "}"
member ::= string ws ":" ws value
array ::= "[" ws ( value ( ws "," ws value )* ws )? "]"
string ::= "\"" char* "\""
char ::= [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" hex hex hex hex )
hex ::= [0-9a-fA-F]
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [+-]? [0-9]+ )?
ws ::= [ \t\n\r]*
""".strip()

arithmetic_ebnf = r"""
root ::= sum
sum ::= product ( ws [+-] ws product )*
product ::= atom ( ws [*/] ws atom )*
atom ::= number | "-" ws atom | "(" ws sum ws ")"
number ::= [0-9]+ ( "." [0-9]+ )?
ws ::= " "*
""".strip()

_LARK_RULE = re.compile(r"^\s*[?!]?[A-Za-z_][A-Za-z_0-9.]*\s*:(?!:=)", re.MULTILINE)


def grammar_spec(grammar: str, *, lark_guide: bool = False) -> "GuideSpec":
    """The spec of an outlines CFG: Lark (outlines' dialect) compiles on llguidance, which reads
    Lark natively; EBNF (``name ::= ...``) on xgrammar. Lark's ``%ignore``d terminals may come
    first and last (``edge_ignores``), as in Lark.

    ``lark_guide``: read the grammar as outlines 0.x's Lark-based ``CFGGuide`` did (outlines 1.x
    hands it to llguidance as it is, which is the default here):

    * ``%import common.X`` comes from outlines' own ``common`` grammar where it differs from
      Lark's/llguidance's (``outlines_common``: its ``ESCAPED_STRING`` is JSON's, with no control
      characters, so ``outlines.grammars.json`` gives JSON strings without raw newlines);
    * every tokenization of the language is allowed: where the grammar forces text (only one
      string can come next) llguidance would allow only that text's canonical tokenization
      (llguidance's ``no_forcing``; xgrammar always allows every tokenization).
    """
    from ... import GuideSpec

    if not isinstance(grammar, str) or not grammar.strip():
        raise InvalidGuideError("grammar must be a non-empty Lark or EBNF string")
    if "::=" not in grammar and _LARK_RULE.search(grammar):
        if lark_guide:
            return GuideSpec.grammar(_NO_FORCING + edge_ignores(outlines_common(grammar)), dialect="lark")
        return GuideSpec.grammar(edge_ignores(grammar), dialect="lark")
    return GuideSpec.grammar(grammar)


_NO_FORCING = '%llguidance {"no_forcing": true}\n'

# outlines' ``common`` grammar (outlines/grammars/common.lark, 0.0 - 1.x) against Lark's: the same
# terminals but for its strings, which follow outlines' JSON string regex. Same languages here:
_NOT_CONTROL = r"\x00-\x1F\x7F-\x9F"
_OUTLINES_COMMON = {
    "ESCAPED_STRING": rf'/"([^"\\{_NOT_CONTROL}]|\\[^{_NOT_CONTROL}])*"/',
    "ESCAPED_STRING_INNER": rf'/[^"\\{_NOT_CONTROL}]|\\[^{_NOT_CONTROL}]/',
    "UNESCAPED_STRING": r'/"[^"]*"/',
    "_NON_CONTROL_CHAR": rf'/[^"\\{_NOT_CONTROL}]/',
    "_ESCAPED_CHAR": rf'/\\[^{_NOT_CONTROL}]/',
}
_COMMON_IMPORT = re.compile(
    r"^[ \t]*%import[ \t]+common(?:\.([A-Z_][A-Z_0-9]*)(?:[ \t]*->[ \t]*([A-Z_][A-Z_0-9]*))?"
    r"|[ \t]*\(([^)]*)\))[ \t]*$", re.MULTILINE)


def outlines_common(grammar: str) -> str:
    """``grammar`` with its imports of the terminals outlines' ``common`` defines differently from
    Lark's replaced by those definitions (``%import common.X``, ``... -> ALIAS`` and
    ``%import common (X, Y)``); every other import is left to the parser's own ``common``."""

    defined: set[str] = set()  # an import repeated: one definition (Lark imports it once too)

    def replace(m: re.Match) -> str:
        if m.group(3) is not None:  # %import common (A, B, ...)
            names = [n.strip() for n in m.group(3).split(",") if n.strip()]
            pairs = [(n, n) for n in names]
        else:
            pairs = [(m.group(1), m.group(2) or m.group(1))]
        kept = [n for n, _ in pairs if n not in _OUTLINES_COMMON]
        if len(kept) == len(pairs):
            return m.group(0)
        lines = []
        for name, alias in pairs:
            if name in _OUTLINES_COMMON and alias not in defined:
                defined.add(alias)
                lines.append(f"{alias}: {_OUTLINES_COMMON[name]}")
        if kept:
            lines.append(f"%import common ({', '.join(kept)})")
        return "\n".join(lines)

    return _COMMON_IMPORT.sub(replace, grammar)


_IGNORE_NAME = re.compile(r"^[ \t]*%ignore[ \t]+([A-Z_][A-Z_0-9]*)[ \t]*$", re.MULTILINE)
_START_DEF = re.compile(r"^([ \t]*[?!]?)start([ \t]*(?:\.[0-9-]+)?[ \t]*:)", re.MULTILINE)
_PROTECTED = re.compile(r'"(?:[^"\\\n]|\\.)*"i?|/(?:[^/\\\n]|\\.)+/[imslux]*|//[^\n]*')
_START_REF = re.compile(r"\bstart\b")
_LIFTED_START = "tokenrails_lark_start"


def edge_ignores(grammar: str) -> str:
    """Lark lets an ``%ignore``d terminal come before the first token and after the last too;
    llguidance ignores only between tokens. A grammar ignoring named terminals gets a new
    ``start`` that allows them first and last (the old one renamed; string, regex and comment text
    untouched). Others are left as they are."""
    names = _IGNORE_NAME.findall(grammar)
    if not names or not _START_DEF.search(grammar) or _LIFTED_START in grammar:
        return grammar
    out, last = [], 0
    for m in _PROTECTED.finditer(grammar):  # rename ``start`` outside literals, regexes, comments
        out.append(_START_REF.sub(_LIFTED_START, grammar[last:m.start()]))
        out.append(m.group(0))
        last = m.end()
    out.append(_START_REF.sub(_LIFTED_START, grammar[last:]))
    renamed = "".join(out)
    ignored = " | ".join(dict.fromkeys(names))
    return f"start: ({ignored})* {_LIFTED_START} ({ignored})*\n{renamed}"


def check_ebnf(grammar: str) -> str:
    """Return ``grammar`` if it looks like EBNF; raise ``InvalidGuideError`` for Lark input."""
    if not isinstance(grammar, str) or not grammar.strip():
        raise InvalidGuideError("grammar must be a non-empty EBNF string")
    if "::=" not in grammar and _LARK_RULE.search(grammar):
        raise InvalidGuideError(
            "this looks like a Lark grammar (outlines' CFG dialect); tokenrails takes EBNF: "
            "write rules as `name ::= ...` with a `root` rule (see docs/migrating-from-outlines.md)"
        )
    return grammar
