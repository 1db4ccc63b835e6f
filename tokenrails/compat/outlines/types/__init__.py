"""``outlines.types``: output-type terms and the regexes of common Python types."""
from .convert import BOOLEAN, DATE, DATETIME, INTEGER, NUMBER, STRING, TIME, spec_for_output_type
from typing import Annotated as _Annotated

from pydantic import StringConstraints as _StringConstraints

from . import airports, countries, phone_numbers, zip_codes
from . import locale as _locale_module
from .common import (bic, credit_card, e164, email, hex_color, hex_str, iban, ipv4, ipv6, isbn, latitude,
                     longitude, mac_address, paragraph, semver, sentence, slug, uuid4)
from .dsl import (CFG, Choice, JsonSchema, Regex, String, Term, at_least, at_most, between, cfg, either, exactly,
                  json_schema, one_or_more, optional, regex, to_regex, zero_or_more)

integer = Regex(INTEGER)
number = Regex(NUMBER)
boolean = Regex(BOOLEAN)
string = Regex(STRING)
date = Regex(DATE)
time = Regex(TIME)
datetime = Regex(DATETIME)
digit = Regex(r"\d")
char = Regex(r"\w")
newline = Regex(r"(\r\n|\r|\n)")  # Unix, Windows and old Mac line ends

# outlines 0.x names: pydantic-ready annotated strings
ISBN = _Annotated[str, _StringConstraints(pattern=isbn.pattern)]
Email = _Annotated[str, _StringConstraints(pattern=email.pattern)]


class _Locale:
    """``types.locale``: the 1.x namespace (``types.locale.us.phone_number``) and the 0.x
    function (``types.locale("us").PhoneNumber``) at once."""

    us = _locale_module.us

    def __call__(self, name: str):
        if name != "us":
            raise NotImplementedError(f"locale {name!r} is not available (only 'us')")

        class _US:
            ZipCode = zip_codes.USZipCode
            PhoneNumber = phone_numbers.USPhoneNumber

        return _US


locale = _Locale()
whitespace = Regex(r"\s")

__all__ = [
    "CFG", "Choice", "Email", "ISBN", "JsonSchema", "Regex", "String", "Term", "airports", "at_least", "at_most",
    "between", "bic", "boolean", "cfg", "char", "countries", "credit_card", "date", "datetime", "digit", "e164", "either",
    "email", "exactly", "hex_color", "hex_str", "iban", "integer", "ipv4", "ipv6", "isbn", "json_schema", "latitude",
    "locale", "longitude", "mac_address", "newline", "number", "one_or_more", "optional", "phone_numbers", "zip_codes",
    "paragraph", "regex", "semver", "sentence", "slug", "spec_for_output_type", "string", "time", "to_regex", "uuid4",
    "whitespace", "zero_or_more",
]
