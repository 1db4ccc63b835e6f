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

from ...guided.errors import InvalidGuideError

if TYPE_CHECKING:
    from ...guided.spec import GuideSpec

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


def grammar_spec(grammar: str, *, every_tokenization: bool = False) -> "GuideSpec":
    """The spec of an outlines CFG: Lark (outlines' dialect) compiles on llguidance, which reads
    Lark natively; EBNF (``name ::= ...``) on xgrammar.

    Where the grammar forces text (only one string can come next), llguidance allows only that
    text's canonical tokenization, as outlines 1.x's llguidance backend does. outlines 0.x's own
    Lark guide allowed every tokenization of the language; ``every_tokenization`` asks for that
    (llguidance's ``no_forcing`` option; xgrammar always allows every tokenization)."""
    from ...guided.spec import GuideSpec

    if not isinstance(grammar, str) or not grammar.strip():
        raise InvalidGuideError("grammar must be a non-empty Lark or EBNF string")
    if "::=" not in grammar and _LARK_RULE.search(grammar):
        text = leading_ignores(grammar)
        if every_tokenization:
            text = _NO_FORCING + text
        return GuideSpec.grammar(text, dialect="lark")
    return GuideSpec.grammar(grammar)


_NO_FORCING = '%llguidance {"no_forcing": true}\n'


_IGNORE_NAME = re.compile(r"^[ \t]*%ignore[ \t]+([A-Z_][A-Z_0-9]*)[ \t]*$", re.MULTILINE)
_START_DEF = re.compile(r"^([ \t]*[?!]?)start([ \t]*(?:\.[0-9-]+)?[ \t]*:)", re.MULTILINE)
_PROTECTED = re.compile(r'"(?:[^"\\\n]|\\.)*"i?|/(?:[^/\\\n]|\\.)+/[imslux]*|//[^\n]*')
_START_REF = re.compile(r"\bstart\b")
_LIFTED_START = "tokenrails_lark_start"


def leading_ignores(grammar: str) -> str:
    """Lark lets an ``%ignore``d terminal come before the first token too; llguidance ignores only
    between tokens. A grammar ignoring named terminals gets a new ``start`` that allows them first
    (the old one renamed; string, regex and comment text untouched). Others are left as they are."""
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
    return f"start: ({ignored})* {_LIFTED_START}\n{renamed}"


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
