"""What xgrammar 0.2.8 enforces exactly, declared by its backend.

Plain Python (no ``xgrammar`` import), so routing reads it whether or not xgrammar is installed.
Everything here was found empirically (bench/conformance.py on MaskBench, then minimised, pinned
by tests/safety/test_schema_coverage.py): a keyword xgrammar accepts and drops, a place where its
language is looser or stricter than JSON Schema, a regex construct it misreads. The backend
refuses the first kind (``UnsupportedGuideError``); routing orders backends by all of them. A
backend must never pretend to enforce what it drops.
"""
from __future__ import annotations

import time
from typing import Any

from ..errors import GuideError, GuideTimeoutError, UnsupportedGuideError
from ..fsm.compiler import compile_regex
from ..fsm.json_string_safety import unsafe_in_json_string
from ..fsm.regex_ast import Alt, CharSet, Concat, Empty, Repeat
from ..fsm.regex_parser import parse_regex
from ..limits import GuideLimits
from ..regex_hazards import class_end, schema_pattern_hazards
from ..schema_walk import (allof_with_parts_or_siblings, constraining_siblings, constrains_nothing, is_int,
                           iter_subschemas, json_key, required_without_property)

# Keywords that constrain instances but that xgrammar 0.2.8 does not enforce (it accepts and drops
# them) — found with bench/conformance.py on MaskBench and confirmed by tests/backends. Values: a
# short reason shown to the user.
XGRAMMAR_IGNORED: dict[str, str] = {
    "uniqueItems": "uniqueItems=true is not enforced",
    "not": "'not' is not enforced",
    "if": "if/then/else is not enforced",
    "dependentSchemas": "dependentSchemas is not enforced",
    "dependentRequired": "dependentRequired is not enforced",
    "dependencies": "dependencies is not enforced",
    "contains": "contains is not enforced",
    "minContains": "minContains is not enforced",
    "maxContains": "maxContains is not enforced",
    "unevaluatedProperties": "unevaluatedProperties is not enforced",
    "unevaluatedItems": "unevaluatedItems is not enforced",
    "contentSchema": "contentSchema is not enforced",
    "$dynamicRef": "$dynamicRef is not enforced",
    "$recursiveRef": "$recursiveRef is not enforced",
}
# Enforced by xgrammar 0.2.8 (verified by tests/safety/test_schema_coverage.py, so an upgrade
# that stops enforcing one fails CI): propertyNames, minProperties, maxProperties,
# patternProperties, integer multipleOf, min/maxItems, min/maxLength alone, numeric bounds.

# xgrammar 0.2.8 enforces integer multipleOf up to this value and silently ignores larger ones
# (measured: multipleOf 1025 accepts 1026; 1024 refuses 1025).
XGRAMMAR_MAX_MULTIPLE_OF = 1024

# String formats xgrammar 0.2.8 turns into a grammar; any other format is dropped silently.
# "hostname" is left out on purpose: its grammar has no 63-byte label limit (JSON-Schema-Test-Suite
# draft4 optional/format: a 90-character label was accepted).
XGRAMMAR_FORMATS: frozenset[str] = frozenset({
    "date", "time", "date-time", "duration", "email", "ipv4", "ipv6", "uuid", "uri",
    "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
})

# Each entry was measured to be *accepted and mis-enforced*, not refused: xgrammar ignores ``^``/``$``
# inside a pattern (``a^b`` accepts "ab") and drops lookarounds and possessive quantifiers in schema
# patterns; llguidance reads ``a*+a`` as ``(a*)+a`` (accepts "aa"; Python's possessive reading matches
# nothing). Refusing them (``UnsupportedGuideError``) lets ``auto`` move on or fail: one spec, one
# language, whatever the routing.
XGRAMMAR_REGEX_HAZARDS = frozenset({"interior anchor", "lookaround", "backreference", "possessive quantifier",
                                    "atomic group", "lone surrogate"})
# a regex request (not a schema ``pattern``: measured at 0 ms masks there) also refuses nested quantifiers
XGRAMMAR_REGEX_KIND_HAZARDS = XGRAMMAR_REGEX_HAZARDS | {"nested quantifier"}

# Formats xgrammar 0.2.8 lowers more loosely than llguidance: its date grammar admits impossible
# days ("2020-02-31"; llguidance refuses them, though neither checks leap years). Measured, and
# used for routing only: xgrammar still compiles them when asked to (docs/semantics.md section 5).
XGRAMMAR_LOOSER_FORMATS: frozenset[str] = frozenset({"date", "date-time"})


def xgrammar_unenforced(schema: Any, strict: bool = True, exact_lengths: bool = False) -> list[str]:
    """Human-readable findings (``"#/path: reason"``) for keywords xgrammar would drop or reject.

    Everything here was found empirically (bench/conformance.py on MaskBench, then minimised):
    each finding is a case where xgrammar 0.2.8 accepts an invalid instance or refuses a valid
    schema with a non-typed error. ``strict``: the spec's policy (xgrammar's ``strict_mode``).
    ``exact_lengths``: the grammar's length-bounded strings are repaired before compiling
    (backends/xgrammar_lengths.py, done for structural tags), so plain min/maxLength is enforced.
    """
    findings: list[str] = []
    for path, sub in iter_subschemas(schema):
        if strict:
            findings.extend(_strict_mode_refusals(path, sub))
        for key, reason in XGRAMMAR_IGNORED.items():
            if key in sub and not constrains_nothing(key, sub[key]):
                findings.append(f"{path}: {reason}")
        has_len = "minLength" in sub or "maxLength" in sub
        if "pattern" in sub and has_len and not _pattern_implies_lengths(sub):
            findings.append(f"{path}: a string with both pattern and min/maxLength (length bound dropped)")
        if "pattern" in sub and "format" in sub:
            findings.append(f"{path}: a string with both pattern and format")
        if "format" in sub and has_len:
            findings.append(f"{path}: a string with both format and min/maxLength (length bound dropped)")
        elif has_len and "pattern" not in sub and _is_string_schema(sub) and not (
                exact_lengths and _counted_string(sub)):
            # xgrammar 0.2.8 lowers a length-bounded string to [^"\\\r\n]{m,n}: raw control
            # characters (invalid JSON) are allowed and escape sequences are not.
            findings.append(
                f"{path}: a string with min/maxLength (xgrammar admits raw control characters there)"
            )
        fmt = sub.get("format")
        if isinstance(fmt, str) and fmt not in XGRAMMAR_FORMATS and _is_string_schema(sub):
            findings.append(f"{path}: format {fmt!r} is not enforced")
        if "multipleOf" in sub and not (sub.get("type") == "integer" and is_int(sub["multipleOf"])):
            findings.append(f"{path}: multipleOf on non-integers is not enforced")
        elif "multipleOf" in sub and abs(sub["multipleOf"]) > XGRAMMAR_MAX_MULTIPLE_OF:
            findings.append(f"{path}: multipleOf above {XGRAMMAR_MAX_MULTIPLE_OF} is not enforced")
        if allof_with_parts_or_siblings(sub):
            findings.append(f"{path}: allOf with several parts or sibling keywords is not enforced")
        if _overlapping_member_schemas(sub):
            # a key matching several patterns (or a listed name and a pattern) must satisfy every
            # matching schema; xgrammar checks one (JSON-Schema-Test-Suite draft4 patternProperties)
            findings.append(f"{path}: a key matching several patternProperties/properties is checked against one")
        one_of = sub.get("oneOf")
        if isinstance(one_of, list) and len(one_of) > 1 and not _disjoint(one_of):
            findings.append(f"{path}: oneOf with overlapping branches is enforced as anyOf")
        if isinstance(sub.get("$ref"), str) and constraining_siblings(sub, "$ref"):
            findings.append(f"{path}: keywords next to $ref are dropped")
        missing = required_without_property(sub)
        if missing:
            findings.append(f"{path}: required {missing[:3]} not listed in properties is not enforced")
        if isinstance(sub.get("items"), list):
            findings.append(f"{path}: array-form items (draft 4 tuples) is not supported")
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            val = sub.get(key)
            if sub.get("type") == "integer" and isinstance(val, (int, float)) and not isinstance(val, bool):
                if not is_int(val) or abs(val) > 2**53:
                    findings.append(f"{path}: integer bound {key}={val} is not supported")
        pattern = sub.get("pattern")
        if isinstance(pattern, str) and ("\\p{" in pattern or "\\P{" in pattern):
            findings.append(f"{path}: Unicode property classes in patterns are not supported")
        if isinstance(pattern, str) and unsafe_in_json_string(_positive_parts(pattern)):
            findings.append(f"{path}: pattern {pattern[:40]!r} can match a quote, backslash or control "
                            "character, which xgrammar admits raw (invalid JSON)")
    findings.extend(schema_pattern_hazards(schema, XGRAMMAR_REGEX_HAZARDS))
    return sorted(set(findings))


def refuse_unenforced_tag_schema(schema: dict, node: dict) -> None:
    """A structural tag's schema using a keyword xgrammar drops is refused: a tag has no other
    backend to fall back to. JSON-style strings get exact lengths (xgrammar_lengths.py); an
    XML-style value is raw text the parser trims, so its length stays unenforced there."""
    dropped = xgrammar_unenforced(schema, exact_lengths=node.get("style") in (None, "json"))
    if dropped:
        raise UnsupportedGuideError(
            "structural tag schema uses keywords xgrammar cannot enforce: " + "; ".join(dropped[:3]),
            feature=dropped[0], backend="xgrammar")


def _pattern_implies_lengths(sub: dict) -> bool:
    """Whether every string the anchored ``pattern`` matches already has a length within
    ``minLength``..``maxLength`` (``constr(pattern=r"^\\d{5}$", min_length=5, max_length=5)``), so
    xgrammar dropping the length drops nothing. Only ``^M$`` with no top-level ``|`` in M (search
    semantics then equal a full match of M); anything else answers False."""
    pattern, lo, hi = sub.get("pattern"), sub.get("minLength", 0), sub.get("maxLength")
    if not (isinstance(pattern, str) and is_int(lo) and (hi is None or is_int(hi))):
        return False
    if not _anchored(pattern):
        return False
    middle = pattern[1:-1]
    if _top_level_alternation(middle):
        return False
    try:
        node = parse_regex(middle, 100_000)
    except GuideError:
        return False

    def bounds(n) -> tuple[int, float]:
        if isinstance(n, CharSet):
            return 1, 1
        if isinstance(n, Empty):
            return 0, 0
        if isinstance(n, Concat):
            parts = [bounds(i) for i in n.items]
            return sum(p[0] for p in parts), sum(p[1] for p in parts)
        if isinstance(n, Alt):
            parts = [bounds(i) for i in n.items]
            return min(p[0] for p in parts), max(p[1] for p in parts)
        if isinstance(n, Repeat):
            a, b = bounds(n.item)
            return a * n.min, (float("inf") if n.max is None and b > 0 else b * (n.max or 0))
        return 0, float("inf")  # unknown node: assume nothing

    shortest, longest = bounds(node)
    return shortest >= lo and (hi is None or longest <= hi)


def _top_level_alternation(pattern: str) -> bool:
    depth, i, n = 0, 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = class_end(pattern, i)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            return True
        i += 1
    return False


def _counted_string(sub: dict) -> bool:
    """Whether xgrammar 0.2.8 lowers this length-bounded schema to a counted repeat of one string
    character (what xgrammar_lengths repairs): an explicit string type, no enum/const (kept as
    literals, lengths unchecked) and no type-less schema (lowered to any JSON value)."""
    t = sub.get("type")
    return (t == "string" or (isinstance(t, list) and "string" in t)) and "enum" not in sub and "const" not in sub


def _positive_parts(pattern: str) -> str:
    """``pattern`` with every negated class, ``.`` and xgrammar's own shorthand classes replaced by
    a plain letter: xgrammar keeps those clear of JSON's control characters, quote and backslash
    (measured: ``^[^a]+$``, ``^.+$``, a raw ``^\\s$`` and ``^[\\s\\S]$`` refused a raw tab and
    newline); only what a literal or a positive class names explicitly reaches the string raw."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            pair = pattern[i: i + 2]
            out.append("a" if pair[1:] in ("s", "S", "d", "D", "w", "W") else pair)
            i += 2
        elif c == "[" and pattern[i + 1: i + 2] == "^":
            out.append("a")
            i = class_end(pattern, i)
        elif c == "[":
            j = i + 1
            body = ["["]
            if pattern[j: j + 1] == "]":
                body.append("\\]")
                j += 1
            while j < n and pattern[j] != "]":
                if pattern[j] == "\\":
                    pair = pattern[j: j + 2]
                    body.append("a" if pair[1:] in ("s", "S", "d", "D", "w", "W") else pair)
                    j += 2
                else:
                    body.append(pattern[j])
                    j += 1
            out.append("".join(body) + "]")
            i = j + 1
        else:
            out.append("a" if c == "." else c)
            i += 1
    return "".join(out)


def _strict_mode_refusals(path: str, sub: dict) -> list[str]:
    """Valid schemas xgrammar 0.2.8's strict_mode refuses with a compile error ("minProperties
    is greater than the number of properties, but additional properties aren't allowed"; same
    for minItems and prefixItems): it closes these objects/arrays although nothing declares the
    members, where the policy keeps them open."""
    out = []
    props = sub.get("properties") if isinstance(sub.get("properties"), dict) else {}
    min_props = sub.get("minProperties")
    if (is_int(min_props) and min_props > len(props) and "additionalProperties" not in sub
            and "patternProperties" not in sub):
        out.append(f"{path}: strict mode refuses minProperties above the listed properties")
    prefix = sub.get("prefixItems") if isinstance(sub.get("prefixItems"), list) else []
    min_items = sub.get("minItems")
    if is_int(min_items) and min_items > len(prefix) and "items" not in sub:
        out.append(f"{path}: strict mode refuses minItems above the prefixItems without an items schema")
    return out


def xgrammar_looser(schema: Any) -> list[str]:
    """Where xgrammar's language is an approximation llguidance makes tighter (routing only)."""
    return [f"{path}: format {sub['format']!r} admits impossible days"
            for path, sub in iter_subschemas(schema)
            if isinstance(sub.get("format"), str) and sub["format"] in XGRAMMAR_LOOSER_FORMATS]


def xgrammar_stricter(schema: Any, strict: bool = True) -> list[str]:
    """Where xgrammar accepts *less* than JSON Schema allows (safe, but valid output refused).

    Used for routing only: such schemas go to llguidance first when it is installed. ``strict``:
    the spec's policy (xgrammar's ``strict_mode``); without it item-less arrays stay open.
    """
    findings: list[str] = []
    for path, sub in iter_subschemas(schema):
        pattern = sub.get("pattern")
        if isinstance(pattern, str) and not _anchored(pattern):
            findings.append(f"{path}: unanchored pattern is matched as a full match")
        pprops = sub.get("patternProperties")
        if isinstance(pprops, dict) and any(not _anchored(k) for k in pprops):
            findings.append(f"{path}: unanchored patternProperties key is matched as a full match")
        for key in ("enum", "const"):
            values = sub.get(key) if key == "enum" else [sub.get(key)] if key in sub else []
            if isinstance(values, list) and any(isinstance(v, (dict, list)) for v in values):
                findings.append(f"{path}: object/array {key} values only match one fixed layout")
        names = sub.get("propertyNames")
        if isinstance(names, dict) and isinstance(names.get("pattern"), str) and not _anchored(names["pattern"]):
            findings.append(f"{path}: unanchored propertyNames pattern is matched as a full match")
        # Unlisted properties and items beyond prefixItems are refused by both backends (one strict
        # policy, see schema_semantics.py); xgrammar alone also closes item-less arrays with a bound.
        if strict and sub.get("type") == "array" and "items" not in sub and "prefixItems" not in sub and (
            "minItems" in sub or "maxItems" in sub
        ):
            findings.append(f"{path}: strict mode admits no items in a bounded array without an items schema")
    return sorted(set(findings))


def _overlapping_member_schemas(sub: dict) -> bool:
    """Can one key be governed by two member schemas? Several patterns: assumed yes (regex overlap
    is not decided here); a listed name: yes if a pattern finds it (or cannot be read)."""
    pprops = sub.get("patternProperties")
    if not isinstance(pprops, dict) or not pprops:
        return False
    if len(pprops) > 1:
        return True
    names = sub.get("properties") if isinstance(sub.get("properties"), dict) else {}
    (pattern,) = pprops
    return any(_pattern_may_find(pattern, name) for name in names)


# A client's pattern never runs on a backtracking engine here (``^(a+)+$`` doubles its time per
# character, holding the GIL): it is decided on our own DFA, built under small bounds. Anything the
# bounds or the parser refuse counts as "may find". The time bound is the analysis' own CPU time:
# the DFA build's deadline is a wall clock, so a build it stopped after less than half that much
# CPU (its thread was mostly waiting for the machine) is tried again, a few times at most, instead
# of letting the load decide.
_ANALYSIS_LIMITS = GuideLimits(max_dfa_states=2_000, max_repeat=200, max_regex_length=1_000,
                               compile_timeout_s=0.05)
_ANALYSIS_CPU_S = 0.05
_ANALYSIS_TRIES = 4


def _pattern_may_find(pattern: Any, name: str) -> bool:
    """Does ``pattern`` (JSON Schema: unanchored search) find a match in ``name``? True when
    undecided, so a routing decision built on it errs on the refusing side."""
    if not isinstance(pattern, str):
        return True
    start = pattern.startswith("^")
    end = pattern.endswith("$") and not pattern.endswith("\\$")
    body = pattern[1 if start else 0: len(pattern) - 1 if end else len(pattern)]
    search = ("" if start else "(?s:.*)") + f"(?:{body})" + ("" if end else "(?s:.*)")
    spent = 0.0
    for _ in range(_ANALYSIS_TRIES):
        began = time.thread_time()
        try:
            return compile_regex(search, _ANALYSIS_LIMITS).fullmatch(name.encode("utf-8", "surrogatepass"))
        except GuideTimeoutError:
            spent += time.thread_time() - began
            if spent >= _ANALYSIS_CPU_S / 2:
                return True
        except (GuideError, RecursionError, ValueError):
            return True
    return True


def _anchored(pattern: str) -> bool:
    return pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$")


_TYPE_OF_CONST = {bool: "boolean", int: "integer", float: "number", str: "string",
                  type(None): "null", list: "array", dict: "object"}


def _branch_types(branch: Any) -> set[str] | None:
    """JSON types a oneOf branch can match, or None when unknown (then overlap is assumed)."""
    if not isinstance(branch, dict):
        return None
    if "const" in branch:
        return {_TYPE_OF_CONST.get(type(branch["const"]), "?")}
    t = branch.get("type")
    if isinstance(t, str):
        return {"integer", "number"} if t in ("integer", "number") else {t}
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        out: set[str] = set()
        for x in t:
            out |= {"integer", "number"} if x in ("integer", "number") else {x}
        return out
    return None


def _disjoint(branches: list) -> bool:
    """True when no instance can match two branches (by type or by a required const tag)."""
    types = [_branch_types(b) for b in branches]
    if all(t is not None for t in types):
        seen: set[str] = set()
        ok = True
        for t in types:
            if seen & t:  # type: ignore[operator]
                ok = False
                break
            seen |= t  # type: ignore[operator]
        if ok:
            return True
    return _tagged(branches)


def _tagged(branches: list) -> bool:
    """Object branches discriminated by one required property with distinct const values."""
    if not all(isinstance(b, dict) and isinstance(b.get("properties"), dict) for b in branches):
        return False
    common = set.intersection(*(set(b["properties"]) for b in branches))
    for name in sorted(common):
        values = []
        for b in branches:
            prop = b["properties"][name]
            if name not in (b.get("required") or []) or not isinstance(prop, dict):
                break
            if "const" in prop:
                values.append(json_key(prop["const"]))
            elif isinstance(prop.get("enum"), list) and len(prop["enum"]) == 1:
                values.append(json_key(prop["enum"][0]))
            else:
                break
        else:
            if len(set(values)) == len(values):
                return True
    return False


def _is_string_schema(sub: dict) -> bool:
    t = sub.get("type")
    return t is None or t == "string" or (isinstance(t, list) and "string" in t)
