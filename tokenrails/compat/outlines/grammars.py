"""``outlines.grammars``: ready-made grammars, in EBNF (the dialect tokenrails' CFG path takes).

Outlines writes its grammars in Lark; ``grammar_spec`` sends Lark grammars to llguidance (which
reads Lark natively) and EBNF (GBNF-like: ``rule ::= ...``, root rule ``root``) to xgrammar.
The ready-made grammars here are EBNF; ``check_ebnf`` insists on EBNF where only xgrammar will do.
"""
from __future__ import annotations

import re

from ...guided.errors import InvalidGuideError

json = r"""
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

arithmetic = r"""
root ::= sum
sum ::= product ( ws [+-] ws product )*
product ::= atom ( ws [*/] ws atom )*
atom ::= number | "-" ws atom | "(" ws sum ws ")"
number ::= [0-9]+ ( "." [0-9]+ )?
ws ::= " "*
""".strip()

_LARK_RULE = re.compile(r"^\s*[?!]?[A-Za-z_][A-Za-z_0-9.]*\s*:(?!:=)", re.MULTILINE)


def grammar_spec(grammar: str) -> "GuideSpec":
    """The spec of an outlines CFG: Lark (outlines' dialect) compiles on llguidance, which reads
    Lark natively; EBNF (``name ::= ...``) on xgrammar."""
    from ...guided.spec import GuideSpec

    if not isinstance(grammar, str) or not grammar.strip():
        raise InvalidGuideError("grammar must be a non-empty Lark or EBNF string")
    if "::=" not in grammar and _LARK_RULE.search(grammar):
        return GuideSpec.grammar(grammar, dialect="lark")
    return GuideSpec.grammar(grammar)


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
