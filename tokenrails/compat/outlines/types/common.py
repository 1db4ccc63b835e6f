"""Ready-made output types of outlines 1.x (``outlines.types.email``, ``.ipv4``, ...), written
here from their documented behaviour and outlines' test cases (no outlines code is copied).

Each is a ``Regex`` term: usable as a generation output type, inside a pydantic model
(``attr: types.email`` → ``{"type": "string", "pattern": ...}``) and through ``to_regex``.
Patterns use only ASCII classes, so Python ``re``, every backend and pydantic's Rust regex read
them the same way.
"""
from __future__ import annotations

from .dsl import Regex

_HEX = "[0-9a-fA-F]"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"({_OCTET}\.){{3}}{_OCTET}"
_H16 = f"{_HEX}{{1,4}}"


def _ipv6() -> str:
    """RFC 4291 text forms: 8 groups, one ``::`` standing for at least one group, and an IPv4
    tail counting as two groups."""
    alts = [f"({_H16}:){{7}}{_H16}", f"({_H16}:){{6}}{_IPV4}"]
    for head in range(0, 8):  # groups before "::"
        prefix = "" if head == 0 else f"({_H16}:){{{head - 1}}}{_H16}"
        tail_max = 7 - head  # groups after "::" (at most 7 in all, "::" covers >= 1)
        tail = "" if tail_max <= 0 else f"(({_H16}:){{0,{tail_max - 1}}}{_H16})?"
        alts.append(f"{prefix}::{tail}")
        if head <= 5:  # the IPv4 tail takes two groups
            v4_max = 5 - head
            alts.append(f"{prefix}::({_H16}:){{0,{v4_max}}}{_IPV4}")
    return "(" + "|".join(alts) + ")"


_SENTENCE = r"[A-Z].*\s*[.!?]"
_SEMVER_ID = "[0-9A-Za-z-]+"
_NUM = "(0|[1-9][0-9]*)"

sentence = Regex(_SENTENCE)
paragraph = Regex(rf"{_SENTENCE}(?:\s+{_SENTENCE})*\n+")
hex_str = Regex(f"(0x)?{_HEX}+")
uuid4 = Regex(f"{_HEX}{{8}}-{_HEX}{{4}}-4{_HEX}{{3}}-[89abAB]{_HEX}{{3}}-{_HEX}{{12}}")
ipv4 = Regex(_IPV4)
ipv6 = Regex(_ipv6())
semver = Regex(rf"{_NUM}\.{_NUM}\.{_NUM}(-{_SEMVER_ID}(\.{_SEMVER_ID})*)?(\+{_SEMVER_ID}(\.{_SEMVER_ID})*)?")
mac_address = Regex(f"({_HEX}{{2}}:){{5}}{_HEX}{{2}}")
hex_color = Regex(f"#({_HEX}{{6}}|{_HEX}{{3}})")
slug = Regex("[a-z0-9]+(-[a-z0-9]+)*")
email = Regex(r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*\.[a-zA-Z]{2,}")
isbn = Regex(r"(ISBN(-1[03])?:? )?(97[89][- ]?([0-9][- ]?){9}[0-9]|([0-9][- ]?){9}[0-9X])")
e164 = Regex(r"\+[1-9][0-9]{1,14}")
latitude = Regex(r"[+-]?(90(\.0+)?|[1-8]?[0-9](\.[0-9]+)?)")
longitude = Regex(r"[+-]?(180(\.0+)?|(1[0-7][0-9]|[1-9]?[0-9])(\.[0-9]+)?)")
iban = Regex(r"[A-Z]{2}(0[2-9]|[1-8][0-9]|9[0-8])[A-Z0-9]{11,30}")
bic = Regex(r"[A-Z]{4}[A-Z]{2}[A-Z2-9][A-NP-Z0-9]([A-Z0-9]{3})?")
credit_card = Regex(
    "("
    "4[0-9]{12}([0-9]{3}){0,2}"                                       # Visa 13/16/19
    "|5[1-5][0-9]{14}"                                                # Mastercard 51-55
    "|2(22[1-9]|2[3-9][0-9]|[3-6][0-9]{2}|7[01][0-9]|720)[0-9]{12}"   # Mastercard 2221-2720
    "|3[47][0-9]{13}"                                                 # American Express
    "|3(0[0-5]|[68][0-9])[0-9]{11}"                                   # Diners Club
    "|6011[0-9]{12}|64[4-9][0-9]{13}|65[0-9]{14}"                     # Discover
    "|35(2[89]|[3-8][0-9])[0-9]{12}"                                  # JCB
    "|(5018|5020|5038|5893|6304|6759|676[1-3])[0-9]{8,15}"            # Maestro
    "|62[0-9]{14,17}"                                                 # UnionPay (and 622126-622925)
    ")"
)
