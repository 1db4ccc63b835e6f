"""``outlines.types``: output-type terms and the regexes of common Python types."""
from .convert import BOOLEAN, DATE, DATETIME, INTEGER, NUMBER, STRING, TIME, spec_for_output_type
from .dsl import CFG, Choice, JsonSchema, Regex, String, Term, cfg, json_schema, regex

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
    "CFG", "Choice", "JsonSchema", "Regex", "String", "Term", "boolean", "cfg", "date",
    "datetime", "digit", "integer", "json_schema", "number", "regex", "spec_for_output_type",
    "string", "time", "whitespace",
]
