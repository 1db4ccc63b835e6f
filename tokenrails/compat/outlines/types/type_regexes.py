"""Regexes of common Python types (outlines' ``types`` constants), shared by the converters."""

INTEGER = r"[+-]?(0|[1-9][0-9]*)"
NUMBER = rf"{INTEGER}(\.[0-9]+)?([eE][+-]?[0-9]+)?"
BOOLEAN = "(True|False)"
STRING = r'"[^"]*"'
DATE = r"(\d{4})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
TIME = r"([0-1][0-9]|2[0-3]):([0-5][0-9]):([0-5][0-9])"
DATETIME = rf"({DATE})(\s)({TIME})"
