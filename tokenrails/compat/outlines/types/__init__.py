"""``outlines.types``: output-type terms and the regexes of common Python types."""
from .convert import BOOLEAN, DATE, DATETIME, INTEGER, NUMBER, STRING, TIME, spec_for_output_type
from . import airports, countries, locale
from .common import (bic, credit_card, e164, email, hex_color, hex_str, iban, ipv4, ipv6, isbn, latitude,
                     longitude, mac_address, paragraph, semver, sentence, slug, uuid4)
from .dsl import CFG, Choice, JsonSchema, Regex, String, Term, cfg, json_schema, regex, to_regex

integer = Regex(INTEGER)
number = Regex(NUMBER)
boolean = Regex(BOOLEAN)
string = Regex(STRING)
date = Regex(DATE)
time = Regex(TIME)
datetime = Regex(DATETIME)
digit = Regex(r"\d")
whitespace = Regex(r"\s")

__all__ = [
    "CFG", "Choice", "JsonSchema", "Regex", "String", "Term", "airports", "bic", "boolean", "cfg",
    "countries", "credit_card", "date", "datetime", "digit", "e164", "email", "hex_color", "hex_str",
    "iban", "integer", "ipv4", "ipv6", "isbn", "json_schema", "latitude", "locale", "longitude",
    "mac_address", "number", "paragraph", "regex", "semver", "sentence", "slug", "spec_for_output_type",
    "string", "time", "to_regex", "uuid4", "whitespace",
]
