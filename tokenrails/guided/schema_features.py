"""Static analysis of client constraints before any compiler sees them.

Two jobs: (1) resource pre-checks that bound compile work (depth, ``$ref`` chains and loops, enum
size, fan-out, ``{m,n}`` repetition bounds in patterns and grammars), because xgrammar compiles in
C++ and cannot be interrupted; (2) which JSON-Schema keywords a backend would silently ignore, so
``auto`` routes a schema to a backend that enforces every keyword or fails with
``UnsupportedGuideError``. A backend must never pretend to enforce what it drops.
"""
from __future__ import annotations

import re
from typing import Any, Iterator

from .errors import GuideError, GuideLimitError, InvalidGuideError, UnsupportedGuideError
from .fsm.json_string_safety import unsafe_in_json_string
from .limits import GuideLimits

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

# Keywords that only annotate (never constrain an instance) — allowed next to $ref / allOf.
ANNOTATIONS: frozenset[str] = frozenset({
    "title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
    "writeOnly", "$schema", "$id", "$anchor", "$defs", "definitions", "contentEncoding",
    "contentMediaType", "nullable", "discriminator", "x-guidance",
})

# String formats xgrammar 0.2.8 turns into a grammar; any other format is dropped silently.
# "hostname" is left out on purpose: its grammar has no 63-byte label limit (JSON-Schema-Test-Suite
# draft4 optional/format: a 90-character label was accepted).
XGRAMMAR_FORMATS: frozenset[str] = frozenset({
    "date", "time", "date-time", "duration", "email", "ipv4", "ipv6", "uuid", "uri",
    "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
})

# Keys whose value is a map name -> subschema, a single subschema, or a list of subschemas.
_MAP_KEYS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_ONE_KEYS = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
             "propertyNames", "additionalItems", "unevaluatedItems", "unevaluatedProperties",
             "contentSchema")
_LIST_KEYS = ("anyOf", "oneOf", "allOf", "prefixItems")
# Keys under which a subschema describes a nested *value* (so recursion through them produces
# output and terminates); refs reached through anything else are chained without progress.
_NESTING_KEYS = ("properties", "patternProperties", "items", "additionalProperties", "contains",
                 "additionalItems", "prefixItems", "unevaluatedItems", "unevaluatedProperties",
                 "dependentSchemas", "propertyNames")


def iter_subschemas(schema: Any, path: str = "#", depth: int = 0) -> Iterator[tuple[str, dict, int]]:
    """Yield ``(json_pointer, subschema, depth)`` for every schema object in the document."""
    stack: list[tuple[Any, str, int]] = [(schema, path, depth)]
    while stack:
        node, p, d = stack.pop()
        if not isinstance(node, dict):
            continue
        yield p, node, d
        for key, value in node.items():
            if key in _MAP_KEYS and isinstance(value, dict):
                for name, sub in value.items():
                    stack.append((sub, f"{p}/{key}/{_escape(name)}", d + 1))
            elif key in _ONE_KEYS or key in _LIST_KEYS:
                if isinstance(value, dict):
                    stack.append((value, f"{p}/{key}", d + 1))
                elif isinstance(value, list):
                    for i, sub in enumerate(value):
                        stack.append((sub, f"{p}/{key}/{i}", d + 1))
            elif key == "dependencies" and isinstance(value, dict):
                for name, sub in value.items():
                    stack.append((sub, f"{p}/{key}/{_escape(name)}", d + 1))


def _escape(name: str) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")


# ---- resource pre-checks -------------------------------------------------------------------
_COUNT_KEYS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
               "minContains", "maxContains")


def check_schema_limits(schema: Any, limits: GuideLimits) -> None:
    """Depth, ``$ref`` chains/loops, enum size, fan-out, pattern bounds — before any compiler."""
    _check_json_depth(schema, limits.max_json_depth)
    for path, sub, _ in iter_subschemas(schema):
        enum = sub.get("enum")
        if isinstance(enum, list):
            _check_at(limits, "max_enum_values", len(enum), path)
            for value in enum:
                _check_literal(limits, value, path)
        if "const" in sub:
            _check_literal(limits, sub["const"], path)
        for key in ("anyOf", "oneOf", "allOf"):
            if isinstance(sub.get(key), list):
                _check_at(limits, "max_any_of", len(sub[key]), path)
        if isinstance(sub.get("properties"), dict):
            _check_at(limits, "max_object_properties", len(sub["properties"]), path)
        pattern = sub.get("pattern")
        if isinstance(pattern, str):
            _check_at(limits, "max_regex_length", len(pattern), path)
            scan_repeat_bounds(pattern, limits)
        for name in (sub.get("patternProperties") or {}) if isinstance(sub.get("patternProperties"), dict) else ():
            _check_at(limits, "max_regex_length", len(name), path)
            scan_repeat_bounds(name, limits)
    check_refs(schema, limits)


def _check_literal(limits: GuideLimits, value: Any, path: str) -> None:
    size = len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else (
        len(json_key(value)) if isinstance(value, (dict, list)) else 0)
    _check_at(limits, "max_literal_bytes", size, path)


def check_literals(texts: Any, limits: GuideLimits) -> None:
    """Each choice option / literal within ``max_literal_bytes``."""
    for t in texts:
        _check_literal(limits, t, "choice")


def check_grammar_literals(grammar: str, limits: GuideLimits) -> None:
    """Quoted literals in an EBNF/Lark grammar: each within ``max_literal_bytes``, all together
    within ``max_grammar_literal_bytes`` (xgrammar's compile cost grows with every long literal:
    15 literals of 16 KB, each under the per-literal limit, took 47 s on a 257-token vocabulary)."""
    i, n = 0, len(grammar)
    total = 0
    while i < n:
        if grammar[i] in "\"'":
            end = _skip_quoted(grammar, i)
            size = len(grammar[i + 1:end - 1].encode("utf-8", "surrogatepass"))
            _check_at(limits, "max_literal_bytes", size, f"grammar offset {i}")
            total += size
            _check_at(limits, "max_grammar_literal_bytes", total, f"grammar offset {i} (all literals so far)")
            i = end
        else:
            i += 1


def _check_at(limits: GuideLimits, name: str, value: int, path: str) -> None:
    bound = getattr(limits, name)
    if value > bound:
        raise GuideLimitError(f"limit {name}={bound} exceeded at {path}: got {value}",
                              limit=name, value=value)


def _check_json_depth(value: Any, bound: int) -> None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > bound:
            raise GuideLimitError(
                f"limit max_json_depth={bound} exceeded: schema nests deeper than {bound}",
                limit="max_json_depth", value=depth,
            )
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def resolve_pointer(root: Any, ref: str) -> Any:
    """The subschema a local ``#...`` ref points at; ``InvalidGuideError`` when it does not exist."""
    if not ref.startswith("#"):
        raise InvalidGuideError(f"only local $ref ('#/...') is supported, got {ref[:100]!r}")
    node = root
    body = ref[1:]
    if body in ("", "/"):
        return root
    if not body.startswith("/"):
        raise InvalidGuideError(f"unsupported $ref anchor {ref[:100]!r}")
    for raw in body[1:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        from urllib.parse import unquote

        part = unquote(part)
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise InvalidGuideError(f"$ref {ref[:100]!r} does not resolve")
    return node


def check_refs(schema: Any, limits: GuideLimits) -> None:
    """``$ref`` chains longer than ``max_ref_depth`` and non-productive ref loops are refused.

    A loop is non-productive when a schema reaches itself through ``$ref``/``allOf``/``anyOf``/
    ``oneOf`` without nesting a value (``{"$ref": "#"}`` at the root, ``a -> b -> a``): it
    describes nothing and makes compilers recurse forever. Recursion through ``properties`` or
    ``items`` (trees, linked lists) is fine.
    """
    if not isinstance(schema, dict):
        return
    # Graph over ref targets: node id -> ref targets reachable without nesting a value.
    edges: dict[str, set[str]] = {}
    refs_seen = 0
    targets: dict[str, Any] = {"#": schema}
    for path, sub, _ in iter_subschemas(schema):
        ref = sub.get("$ref")
        if isinstance(ref, str):
            refs_seen += 1
            if not ref.startswith("#"):
                raise UnsupportedGuideError(
                    f"$ref {ref[:100]!r} at {path} is not local: remote schemas are never fetched",
                    feature="remote $ref",
                )
            if ref not in targets:
                targets[ref] = resolve_pointer(schema, ref)
    for name, node in list(targets.items()):
        edges[name] = _direct_refs(node)
        for r in edges[name]:
            if r not in targets and r.startswith("#"):
                targets[r] = resolve_pointer(schema, r)
                edges.setdefault(r, _direct_refs(targets[r]))
    # Longest non-productive chain and cycles, iteratively (no Python recursion on client data).
    depth: dict[str, int] = {}
    state: dict[str, int] = {}
    for start in edges:
        if start in depth:
            continue
        stack: list[tuple[str, list[str]]] = [(start, sorted(edges.get(start, ())))]
        state[start] = 1
        while stack:
            node, todo = stack[-1]
            if todo:
                nxt = todo.pop()
                if state.get(nxt) == 1:
                    raise GuideLimitError(
                        f"limit max_ref_depth={limits.max_ref_depth} exceeded: $ref loop through "
                        f"{nxt!r} nests no value (infinitely recursive schema)",
                        limit="max_ref_depth", value="loop",
                    )
                if nxt not in depth:
                    state[nxt] = 1
                    stack.append((nxt, sorted(edges.get(nxt, ()))))
                continue
            stack.pop()
            state[node] = 2
            depth[node] = 1 + max((depth.get(n, 0) for n in edges.get(node, ())), default=0)
            if depth[node] - 1 > limits.max_ref_depth:
                raise GuideLimitError(
                    f"limit max_ref_depth={limits.max_ref_depth} exceeded: chain of "
                    f"{depth[node] - 1} $refs from {node!r}",
                    limit="max_ref_depth", value=depth[node] - 1,
                )


def _direct_refs(node: Any) -> set[str]:
    """Refs reachable from ``node`` without passing through a value-nesting keyword."""
    out: set[str] = set()
    stack = [node]
    while stack:
        cur = stack.pop()
        if not isinstance(cur, dict):
            continue
        ref = cur.get("$ref")
        if isinstance(ref, str):
            out.add(ref)
        for key, value in cur.items():
            if key in _NESTING_KEYS or key in ("$defs", "definitions", "not"):
                continue
            if key in ("allOf", "anyOf", "oneOf") and isinstance(value, list):
                stack.extend(value)
            elif key in ("then", "else", "if") and isinstance(value, dict):
                stack.append(value)
    return out


_QUANT = re.compile(r"\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}")
_LARK_QUANT = re.compile(r"~\s*(\d+)(\s*\.\.\s*(\d+))?")


def scan_repeat_bounds(text: str, limits: GuideLimits, *, grammar: bool = False) -> int:
    """Largest effective ``{m,n}`` bound in a regex or grammar (nested bounds multiply).

    Raises ``GuideLimitError(limit="max_repeat")`` above ``limits.max_repeat``; done before
    compiling because ``a{1,100000}`` or ``(a{1000}){1000}`` expand inside compilers that cannot
    be interrupted. Quoted literals in grammars and character classes are skipped.
    """
    bound = limits.max_repeat
    worst = 0
    total = 0  # regexes: every bounded repeat's expansion, summed (max_repeat_total)
    group_max: list[int] = [1]  # per open group: largest multiplier seen inside
    last_atom_factor = 1  # multiplier carried by the atom just closed (a group's inner max)
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            last_atom_factor = 1
            continue
        if ch == "[":
            i = _skip_class(text, i)
            last_atom_factor = 1
            continue
        if grammar and ch in "\"'":
            i = _skip_quoted(text, i)
            last_atom_factor = 1
            continue
        if grammar and ch == "/" and _looks_like_regex_literal(text, i):
            end = _skip_regex_literal(text, i)
            worst = max(worst, scan_repeat_bounds(text[i + 1:end - 1], limits))
            i = end
            last_atom_factor = 1
            continue
        if ch == "(":
            group_max.append(1)
            i += 1
            continue
        if ch == ")":
            inner = group_max.pop() if len(group_max) > 1 else 1
            last_atom_factor = inner
            i += 1
            continue
        m = _QUANT.match(text, i) if ch == "{" else (_LARK_QUANT.match(text, i) if grammar and ch == "~" else None)
        if m:
            lo = int(m.group(1))
            hi_txt = m.group(3)
            hi = int(hi_txt) if hi_txt else lo
            eff = max(lo, hi) * max(1, last_atom_factor)
            worst = max(worst, eff)
            if eff > bound:
                raise GuideLimitError(
                    f"limit max_repeat={bound} exceeded: repetition {m.group(0)!r} expands to {eff}",
                    limit="max_repeat", value=eff,
                )
            group_max[-1] = max(group_max[-1], eff)
            if not grammar:  # beyond the largest repeat (max_repeat bounds that one alone)
                total += eff
                if total - worst > limits.max_repeat_total:
                    raise GuideLimitError(
                        f"limit max_repeat_total={limits.max_repeat_total} exceeded: the pattern's bounded "
                        f"repeats besides the largest expand to {total - worst} together",
                        limit="max_repeat_total", value=total - worst)
            last_atom_factor = 1
            i = m.end()
            continue
        if ch not in "*+?":
            last_atom_factor = 1
        i += 1
    return worst


def _skip_class(text: str, i: int) -> int:
    j = i + 1
    if j < len(text) and text[j] == "^":
        j += 1
    if j < len(text) and text[j] == "]":
        j += 1
    while j < len(text) and text[j] != "]":
        j += 2 if text[j] == "\\" else 1
    return j + 1


def _skip_quoted(text: str, i: int) -> int:
    q = text[i]
    j = i + 1
    while j < len(text) and text[j] != q:
        j += 2 if text[j] == "\\" else 1
    return j + 1


def _looks_like_regex_literal(text: str, i: int) -> bool:
    """Lark ``/regex/`` terminals: a slash after whitespace, ':' or an operator."""
    k = i - 1
    while k >= 0 and text[k] in " \t":
        k -= 1
    return k < 0 or text[k] in ":|(\n=>"


def _skip_regex_literal(text: str, i: int) -> int:
    j = i + 1
    while j < len(text) and text[j] not in "/\n":
        j += 2 if text[j] == "\\" else 1
    return j + 1


# ---- backend coverage ----------------------------------------------------------------------
def xgrammar_unenforced(schema: Any, strict: bool = True, exact_lengths: bool = False) -> list[str]:
    """Human-readable findings (``"#/path: reason"``) for keywords xgrammar would drop or reject.

    Everything here was found empirically (bench/conformance.py on MaskBench, then minimised):
    each finding is a case where xgrammar 0.2.8 accepts an invalid instance or refuses a valid
    schema with a non-typed error. ``strict``: the spec's policy (xgrammar's ``strict_mode``).
    ``exact_lengths``: the grammar's length-bounded strings are repaired before compiling
    (backends/xgrammar_lengths.py, done for structural tags), so plain min/maxLength is enforced.
    """
    findings: list[str] = []
    for path, sub, _ in iter_subschemas(schema):
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
        if "multipleOf" in sub and not (sub.get("type") == "integer" and _is_int(sub["multipleOf"])):
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
        if isinstance(sub.get("$ref"), str) and _constraining_siblings(sub, "$ref"):
            findings.append(f"{path}: keywords next to $ref are dropped")
        missing = required_without_property(sub)
        if missing:
            findings.append(f"{path}: required {missing[:3]} not listed in properties is not enforced")
        if isinstance(sub.get("items"), list):
            findings.append(f"{path}: array-form items (draft 4 tuples) is not supported")
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            val = sub.get(key)
            if sub.get("type") == "integer" and isinstance(val, (int, float)) and not isinstance(val, bool):
                if not _is_int(val) or abs(val) > 2**53:
                    findings.append(f"{path}: integer bound {key}={val} is not supported")
        pattern = sub.get("pattern")
        if isinstance(pattern, str) and ("\\p{" in pattern or "\\P{" in pattern):
            findings.append(f"{path}: Unicode property classes in patterns are not supported")
        if isinstance(pattern, str) and unsafe_in_json_string(_positive_parts(pattern)):
            findings.append(f"{path}: pattern {pattern[:40]!r} can match a quote, backslash or control "
                            "character, which xgrammar admits raw (invalid JSON)")
    findings.extend(schema_pattern_hazards(schema, XGRAMMAR_REGEX_HAZARDS))
    return sorted(set(findings))


def _pattern_implies_lengths(sub: dict) -> bool:
    """Whether every string the anchored ``pattern`` matches already has a length within
    ``minLength``..``maxLength`` (``constr(pattern=r"^\\d{5}$", min_length=5, max_length=5)``), so
    xgrammar dropping the length drops nothing. Only ``^M$`` with no top-level ``|`` in M (search
    semantics then equal a full match of M); anything else answers False."""
    from .fsm.regex_ast import Alt, CharSet, Concat, Empty, Repeat
    from .fsm.regex_parser import parse_regex

    pattern, lo, hi = sub.get("pattern"), sub.get("minLength", 0), sub.get("maxLength")
    if not (isinstance(pattern, str) and _is_int(lo) and (hi is None or _is_int(hi))):
        return False
    if not (pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$")):
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
            i = _skip_class(pattern, i)
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
            j = i + 2
            if pattern[j: j + 1] == "]":  # a leading ']' is a literal
                j += 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            out.append("a")
            i = j + 1
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
    if (_is_int(min_props) and min_props > len(props) and "additionalProperties" not in sub
            and "patternProperties" not in sub):
        out.append(f"{path}: strict mode refuses minProperties above the listed properties")
    prefix = sub.get("prefixItems") if isinstance(sub.get("prefixItems"), list) else []
    min_items = sub.get("minItems")
    if _is_int(min_items) and min_items > len(prefix) and "items" not in sub:
        out.append(f"{path}: strict mode refuses minItems above the prefixItems without an items schema")
    return out


# Formats xgrammar 0.2.8 lowers more loosely than llguidance: its date grammar admits impossible
# days ("2020-02-31"; llguidance refuses them, though neither checks leap years). Measured, and
# used for routing only: xgrammar still compiles them when asked to (docs/semantics.md section 5).
XGRAMMAR_LOOSER_FORMATS: frozenset[str] = frozenset({"date", "date-time"})


def xgrammar_looser(schema: Any) -> list[str]:
    """Where xgrammar's language is an approximation llguidance makes tighter (routing only)."""
    return [f"{path}: format {sub['format']!r} admits impossible days"
            for path, sub, _ in iter_subschemas(schema)
            if isinstance(sub.get("format"), str) and sub["format"] in XGRAMMAR_LOOSER_FORMATS]


def xgrammar_stricter(schema: Any, strict: bool = True) -> list[str]:
    """Where xgrammar accepts *less* than JSON Schema allows (safe, but valid output refused).

    Used for routing only: such schemas go to llguidance first when it is installed. ``strict``:
    the spec's policy (xgrammar's ``strict_mode``); without it item-less arrays stay open.
    """
    findings: list[str] = []
    for path, sub, _ in iter_subschemas(schema):
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
        # policy, see schema_policy.py); xgrammar alone also closes item-less arrays with a bound.
        if strict and sub.get("type") == "array" and "items" not in sub and "prefixItems" not in sub and (
            "minItems" in sub or "maxItems" in sub
        ):
            findings.append(f"{path}: strict mode admits no items in a bounded array without an items schema")
    return sorted(set(findings))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) or (
        isinstance(value, float) and value.is_integer()
    )


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


# A client's pattern never runs on a backtracking engine here (``^(a+)+$`` against "aaa…a!" held
# the GIL for 0.85 s at 24 characters, doubling per character): it is decided on our own DFA,
# built under small bounds. Anything the bounds or the parser refuse counts as "may find".
_ANALYSIS_LIMITS = GuideLimits(max_dfa_states=2_000, max_repeat=200, max_regex_length=1_000,
                               compile_timeout_s=0.05)


def _pattern_may_find(pattern: Any, name: str) -> bool:
    """Does ``pattern`` (JSON Schema: unanchored search) find a match in ``name``? True when
    undecided, so a routing decision built on it errs on the refusing side."""
    if not isinstance(pattern, str):
        return True
    from .fsm.compiler import compile_regex

    start = pattern.startswith("^")
    end = pattern.endswith("$") and not pattern.endswith("\\$")
    body = pattern[1 if start else 0: len(pattern) - 1 if end else len(pattern)]
    search = ("" if start else "(?s:.*)") + f"(?:{body})" + ("" if end else "(?s:.*)")
    try:
        return compile_regex(search, _ANALYSIS_LIMITS).fullmatch(name.encode("utf-8", "surrogatepass"))
    except (GuideError, RecursionError, ValueError):
        return True


def allof_with_parts_or_siblings(sub: dict) -> bool:
    """``allOf`` with several parts or next to constraining keywords: neither xgrammar nor outlines
    intersects them (xgrammar drops parts; outlines keeps only the siblings)."""
    all_of = sub.get("allOf")
    return isinstance(all_of, list) and (len(all_of) > 1 or _constraining_siblings(sub, "allOf"))


def _constraining_siblings(sub: dict, key: str) -> bool:
    return any(k != key and k not in ANNOTATIONS for k in sub)


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


def json_key(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True)


def _is_string_schema(sub: dict) -> bool:
    t = sub.get("type")
    return t is None or t == "string" or (isinstance(t, list) and "string" in t)


def required_without_property(sub: dict) -> list:
    """Names in ``required`` with no ``properties`` entry (neither lowering enforces them)."""
    required = sub.get("required")
    if not isinstance(required, list) or not required:
        return []
    props = sub.get("properties") if isinstance(sub.get("properties"), dict) else {}
    return [name for name in required if name not in props]


def constrains_nothing(key: str, value: Any) -> bool:
    """Keyword values that constrain nothing, so a backend dropping them loses nothing.

    Shared by every backend's "would this be silently ignored" analysis. ``contains: {}`` is not
    here on purpose: it still demands a non-empty array."""
    if key == "uniqueItems":
        return value is False
    if key in ("minProperties", "minContains"):
        return value == 0
    if key in ("patternProperties", "dependentSchemas", "dependentRequired", "dependencies"):
        return value == {}
    if key in ("propertyNames", "contentSchema", "unevaluatedItems", "unevaluatedProperties"):
        return value is True or value == {}
    return False


_TAG_FANOUT_KEYS = ("structures", "tags", "triggers", "elements")


def check_structural_tag(tag: Any, limits: GuideLimits) -> None:
    """Every JSON schema and regex inside a structural tag gets the same checks as a top-level one.

    Schemas a backend would only partly enforce are refused (``UnsupportedGuideError``): a tag
    cannot fall back to another backend, so it must not silently drop a keyword either.
    """
    stack: list[Any] = [tag]
    seen = 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > 100_000:
            raise GuideLimitError("structural tag has too many nodes", limit="max_spec_bytes", value=seen)
        if isinstance(node, dict):
            for key in _TAG_FANOUT_KEYS:  # one alternative per tag: 3,000 tags compiled 17 s
                if isinstance(node.get(key), list):
                    _check_at(limits, "max_any_of", len(node[key]), f"structural tag {key!r}")
            for key, value in node.items():
                if key in ("schema", "json_schema") and isinstance(value, (dict, bool)):
                    schema = value if isinstance(value, dict) else ({} if value else {"not": {}})
                    check_schema_limits(schema, limits)
                    # JSON-style strings get exact lengths (backends/xgrammar_lengths.py); an XML-style
                    # value is raw text the parser trims, so its length stays unenforced there
                    dropped = xgrammar_unenforced(schema, exact_lengths=node.get("style") in (None, "json"))
                    if dropped:
                        raise UnsupportedGuideError(
                            "structural tag schema uses keywords xgrammar cannot enforce: "
                            + "; ".join(dropped[:3]), feature=dropped[0], backend="xgrammar")
                elif key in ("pattern", "regex") and isinstance(value, str):
                    limits.check("max_regex_length", len(value))
                    scan_repeat_bounds(value, limits)
                elif key in ("grammar", "ebnf") and isinstance(value, str):
                    limits.check("max_grammar_bytes", len(value.encode()))
                    scan_repeat_bounds(value, limits, grammar=True)
                else:
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)


# ---- lowering: rewrite keywords a backend lacks into ones it enforces ------------------------
_ALL_TYPES = ("string", "number", "integer", "boolean", "null", "array", "object")


def lower_dependencies(schema: Any) -> Any:
    """Copy of ``schema`` with ``dependencies``/``dependentRequired``/``dependentSchemas`` and
    simple ``not`` forms rewritten into ``anyOf``/``allOf``/``properties: {k: false}``.

    Exact rewrites (same instance set), used for llguidance, which enforces the results but not
    the originals:

    * ``dependentRequired {k: [r...]}`` → ``anyOf [{properties: {k: false}}, {required: [k, r...]}]``
    * ``dependentSchemas {k: S}`` → ``anyOf [{properties: {k: false}}, {allOf: [{required: [k]}, S]}]``
    * ``not {required: [a, b]}`` → ``anyOf [{type: object, properties: {a: false}}, ...b...]``
    * ``not {propertyNames: false}`` → ``{type: object, minProperties: 1}``
    * ``not {type: T}`` → ``type: <the other types>`` (unless that needs "non-integer number")

    Any other ``not`` is left alone (the backend then refuses it).
    """
    if isinstance(schema, list):
        return [lower_dependencies(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    extra: list[Any] = []
    for key, value in schema.items():
        if key in _MAP_KEYS and isinstance(value, dict) and key != "dependentSchemas":
            out[key] = {k: lower_dependencies(v) for k, v in value.items()}
        elif key in ("dependencies", "dependentRequired", "dependentSchemas") and isinstance(value, dict):
            for name, dep in value.items():
                absent = {"properties": {name: False}}
                if isinstance(dep, list):
                    extra.append({"anyOf": [absent, {"required": [name, *dep]}]})
                else:
                    extra.append({"anyOf": [absent, {"allOf": [{"required": [name]}, lower_dependencies(dep)]}]})
        elif key == "not":
            lowered = _lower_not(value)
            if lowered is None:
                out[key] = lower_dependencies(value)
            else:
                extra.append(lowered)
        elif key in _ONE_KEYS or key in _LIST_KEYS:
            out[key] = lower_dependencies(value)
        else:
            out[key] = value
    if extra:
        out["allOf"] = list(out.get("allOf", [])) + extra
    return out


def _lower_not(value: Any) -> Any:
    if value is True or value == {}:
        return False
    if value is False:
        return {}
    if not isinstance(value, dict):
        return None
    if set(value) == {"required"} and isinstance(value["required"], list) and value["required"]:
        names = value["required"]
        # required is vacuously true on non-objects, so its negation needs an object
        branches = [{"type": "object", "properties": {n: False}} for n in names]
        return branches[0] if len(branches) == 1 else {"anyOf": branches}
    if value == {"propertyNames": False}:  # "no property at all" negated: a non-empty object
        return {"type": "object", "minProperties": 1}
    if set(value) == {"type"}:
        t = value["type"]
        banned = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else None
        if banned is None or not banned <= set(_ALL_TYPES):
            return None
        if "number" in banned:
            banned.add("integer")
        elif "integer" in banned:
            return None  # "a number that is not an integer" has no type name
        return {"type": [x for x in _ALL_TYPES if x not in banned]}
    return None


# ---- regex constructs a backend misreads (measured on xgrammar 0.2.8 / llguidance 1.x) ------------
# Each entry was measured to be *accepted and mis-enforced*, not refused: xgrammar ignores ``^``/``$``
# inside a pattern (``a^b`` accepts "ab") and drops lookarounds and possessive quantifiers in schema
# patterns; llguidance reads ``a*+a`` as ``(a*)+a`` (accepts "aa"; Python's possessive reading matches
# nothing). Refusing them (``UnsupportedGuideError``) lets ``auto`` move on or fail: one spec, one
# language, whatever the routing.
XGRAMMAR_REGEX_HAZARDS = frozenset({"interior anchor", "lookaround", "backreference", "possessive quantifier",
                                    "atomic group", "lone surrogate"})
# a regex request (not a schema ``pattern``: measured at 0 ms masks there) also refuses nested quantifiers
XGRAMMAR_REGEX_KIND_HAZARDS = XGRAMMAR_REGEX_HAZARDS | {"nested quantifier"}
LLGUIDANCE_REGEX_HAZARDS = frozenset({"possessive quantifier", "lookaround", "backreference", "atomic group",
                                      "lone surrogate"})


def regex_hazards(pattern: str) -> set[str]:
    """Constructs of ``pattern`` (outside character classes, unescaped) that some backend misreads.

    A linear scan, no regex engine: anchors anywhere but the very start/end, lookarounds,
    backreferences, possessive quantifiers, atomic groups, lone surrogates (anywhere), and an
    unbounded quantifier on a group that holds a quantifier ("nested quantifier": ``(x*)+``,
    ``(a?)*``, ``((a|[^a]){1,}){3,}``), whose parses xgrammar's matcher keeps all of, so its mask
    time grows with every token (0.13 s to 3.7 s over 48 tokens, measured).
    """
    found: set[str] = set()
    if any("\ud800" <= c <= "\udfff" for c in pattern) or any(
            pattern[k + 1: k + 2] in ("u", "x") and _surrogate_escape(pattern, k + 2)
            for k in range(len(pattern) - 1) if pattern[k] == "\\"):
        found.add("lone surrogate")  # anywhere, classes included
    n = len(pattern)
    i = 0
    prev = "none"  # what precedes: "atom" (a quantifier may follow), "quant" (a ``+``/``?`` modifier may)
    while i < n:
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1: i + 2]
            if (nxt.isdigit() and nxt != "0") or nxt == "k":
                found.add("backreference")
            i, prev = i + 2, "atom"
            continue
        if c == "[":
            i, prev = class_end(pattern, i), "atom"
            continue
        if c in "*+?" or (c == "{" and _quantifier_at(pattern, i)):
            if prev == "quant":
                if c == "+":
                    found.add("possessive quantifier")
                prev = "none"
            elif prev == "atom":
                if c == "{":
                    i = pattern.index("}", i)
                prev = "quant"
            else:
                prev = "none"
            i += 1
            continue
        if c == "(":
            head = pattern[i + 1: i + 4]
            if head.startswith(("?=", "?!", "?<=", "?<!")):
                found.add("lookaround")
            elif head.startswith("?>"):
                found.add("atomic group")
            prev = "none"
            if head.startswith("?"):
                i += 1  # the group's ``?`` is syntax, not a quantifier
        elif (c == "^" and i != 0) or (c == "$" and i != n - 1):
            found.add("interior anchor")
            prev = "none"
        else:
            prev = "none" if c in "|^$" else "atom"
        i += 1
    if _ambiguous_repeat(pattern):
        found.add("nested quantifier")
    return found


class _Alt:
    """One open group while scanning for ambiguous repeats: what its alternatives can do."""

    __slots__ = ("prone", "nullable", "items", "all_nullable", "item_nullable", "item_unbounded", "item_prone")

    def __init__(self) -> None:
        self.prone = self.nullable = False  # over the finished alternatives
        self.items, self.all_nullable = 0, True  # the current alternative, items before the last
        self.item_nullable = self.item_unbounded = False  # its last item (unbounded: any variable count)
        self.item_prone = False  # its last item is a prone group (a wrapper group stays prone)

    def atom(self, nullable: bool = False, prone: bool = False) -> None:
        if self.items:
            self.all_nullable = self.all_nullable and self.item_nullable
        self.items += 1
        self.item_nullable, self.item_unbounded, self.item_prone = nullable, False, prone

    def end_alternative(self) -> None:
        nullable = self.items == 0 or (self.all_nullable and self.item_nullable)
        self.nullable = self.nullable or nullable
        self.prone = self.prone or nullable or (self.items == 1 and (self.item_unbounded or self.item_prone))
        self.items, self.all_nullable = 0, True


def _ambiguous_repeat(pattern: str) -> bool:
    r"""An unbounded quantifier on a group that can match the empty string, or whose alternative is a
    single repeat of variable count (``(x*)+``, ``(a?)*``, ``((a|b)+){3,}``, ``(a{2,5}){2,}``): the string splits into
    iterations in ever more ways, and xgrammar's matcher keeps every parse. Separated repeats like
    ``(-[a-z]+)*`` or an e-mail's ``(\.[a-z]+)*`` are not flagged."""
    stack = [_Alt()]
    last_group: _Alt | None = None  # the group just closed, while a quantifier may still follow
    n, i = len(pattern), 0
    while i < n:
        c = pattern[i]
        if c in "*+?{":
            if c == "{" and not _quantifier_at(pattern, i):
                stack[-1].atom()
                last_group, i = None, i + 1
                continue
            if c == "{":
                close = pattern.index("}", i)
                low, comma, high = pattern[i + 1: close].partition(",")
                minimum, unbounded = int(low or 0), bool(comma) and not high
                variable = unbounded or (bool(comma) and int(high) != minimum)
                repeats = unbounded or (variable and int(high) >= 2)  # ``{1,4}``: yes; ``{0,1}``: no
                i = close
            else:
                minimum, unbounded, variable = (0 if c in "*?" else 1), c in "*+", True
                repeats = unbounded
            if repeats and last_group is not None and last_group.prone:
                return True
            top = stack[-1]
            top.item_nullable = top.item_nullable or minimum == 0
            top.item_unbounded = top.item_unbounded or variable
            last_group = None
            i += 1
            if i < n and pattern[i] in "?+":  # lazy / possessive modifier
                i += 1
            continue
        last_group = None
        if c == "\\":
            stack[-1].atom()
            i += 2
        elif c == "[":
            stack[-1].atom()
            i = class_end(pattern, i)
        elif c == "(":
            stack.append(_Alt())
            i += 1
            if pattern[i: i + 1] == "?":  # (?:  (?P<name>  (?<name>  (?i)  (?i:  — syntax, not a quantifier
                if pattern[i + 1: i + 2] in ("P", "<"):
                    end = pattern.find(">", i)
                    i = end + 1 if end != -1 else i + 1
                else:
                    j = i + 1
                    while j < n and (pattern[j].isalpha() or pattern[j] == "-"):
                        j += 1
                    i = j + 1 if pattern[j: j + 1] == ":" else j
        elif c == "|":
            stack[-1].end_alternative()
            i += 1
        elif c == ")" and len(stack) > 1:
            group = stack.pop()
            group.end_alternative()
            stack[-1].atom(nullable=group.nullable, prone=group.prone)
            last_group = group
            i += 1
        else:
            if c not in "^$":
                stack[-1].atom()
            i += 1
    return False


def _surrogate_escape(pattern: str, j: int) -> bool:
    """``\\uD800``..``\\uDFFF`` or ``\\x{D800}``.. at ``j`` (just past ``\\u``/``\\x``): a lone
    surrogate has no UTF-8 encoding, so a backend admitting it would emit invalid UTF-8."""
    digits = pattern[j + 1: j + 5] if pattern[j: j + 1] == "{" else pattern[j: j + 4]
    try:
        return len(digits) == 4 and 0xD800 <= int(digits, 16) <= 0xDFFF
    except ValueError:
        return False


def class_end(pattern: str, i: int) -> int:
    """Index just past the character class opening at ``i`` (``[]a]`` and ``[^]a]`` included)."""
    j = i + 1
    if pattern[j: j + 1] == "^":
        j += 1
    if pattern[j: j + 1] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1


def _quantifier_at(pattern: str, i: int) -> bool:
    close = pattern.find("}", i)
    body = pattern[i + 1: close] if close > 0 else ""
    return bool(body) and all(ch.isdigit() or ch == "," for ch in body) and body[0] != ","


def schema_pattern_hazards(schema: Any, hazards: frozenset[str]) -> list[str]:
    """``pattern`` values and ``patternProperties`` keys of a schema holding one of ``hazards``."""
    findings = []
    for path, sub, _ in iter_subschemas(schema):
        patterns = [sub.get("pattern")]
        if isinstance(sub.get("patternProperties"), dict):
            patterns.extend(sub["patternProperties"])
        for pattern in patterns:
            if isinstance(pattern, str):
                bad = regex_hazards(pattern) & hazards
                if bad:
                    findings.append(f"{path}: pattern {pattern[:40]!r} uses {sorted(bad)[0]}")
    return findings


def refuse_regex_hazards(pattern: str, hazards: frozenset[str], backend: str) -> None:
    """``UnsupportedGuideError`` when ``pattern`` uses a construct ``backend`` misreads."""
    bad = regex_hazards(pattern) & hazards
    if bad:
        raise UnsupportedGuideError(
            f"{backend} does not enforce the {sorted(bad)[0]} in this pattern exactly",
            feature=sorted(bad)[0], backend=backend,
        )
