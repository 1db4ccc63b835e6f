"""Size checks of every client constraint against ``GuideLimits``, before any compiler runs.

xgrammar compiles in C++ and cannot be interrupted, and every compiler recurses on nesting: depth,
``$ref`` chains and loops, enum size, fan-out, literal sizes and ``{m,n}`` repetition bounds in
patterns and grammars are bounded here, on the text, so an oversized request costs one linear
walk and a typed ``GuideLimitError``.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable

from .errors import GuideLimitError, UnsupportedGuideError
from .limits import GuideLimits, repeat_count
from .regex_hazards import class_end
from .schema_walk import iter_subschemas, json_key, resolve_pointer

if TYPE_CHECKING:
    from .spec import GuideSpec

# Keys under which a subschema describes a nested *value* (so recursion through them produces
# output and terminates); refs reached through anything else are chained without progress.
_NESTING_KEYS = ("properties", "patternProperties", "items", "additionalProperties", "contains",
                 "additionalItems", "prefixItems", "unevaluatedItems", "unevaluatedProperties",
                 "dependentSchemas", "propertyNames")


def check_spec_limits(spec: "GuideSpec", limits: GuideLimits) -> None:
    """The size checks of ``spec``'s kind, the same for every backend (each adds what it alone
    cannot enforce); structural tags are checked by the one backend that compiles them."""
    if spec.kind == "json_schema":
        check_schema_limits(spec.schema, limits)
    elif spec.kind == "regex":
        limits.check("max_regex_length", len(spec.pattern))
        scan_repeat_bounds(spec.pattern, limits)
    elif spec.kind == "choice":
        limits.check("max_enum_values", len(spec.choices))
        check_literals(spec.choices, limits)
    elif spec.kind == "grammar":
        limits.check("max_grammar_bytes", len(spec.ebnf.encode()))
        scan_repeat_bounds(spec.ebnf, limits, grammar=True)
        check_grammar_literals(spec.ebnf, limits)


def check_schema_limits(schema: Any, limits: GuideLimits) -> None:
    """Depth, ``$ref`` chains/loops, enum size, fan-out, pattern bounds — before any compiler."""
    _check_json_depth(schema, limits.max_json_depth)
    for path, sub in iter_subschemas(schema):
        enum = sub.get("enum")
        if isinstance(enum, list):
            limits.check("max_enum_values", len(enum), path)
            for value in enum:
                _check_literal(limits, value, path)
        if "const" in sub:
            _check_literal(limits, sub["const"], path)
        for key in ("anyOf", "oneOf", "allOf"):
            if isinstance(sub.get(key), list):
                limits.check("max_any_of", len(sub[key]), path)
        if isinstance(sub.get("properties"), dict):
            limits.check("max_object_properties", len(sub["properties"]), path)
        pattern = sub.get("pattern")
        if isinstance(pattern, str):
            limits.check("max_regex_length", len(pattern), path)
            scan_repeat_bounds(pattern, limits)
        for name in (sub.get("patternProperties") or {}) if isinstance(sub.get("patternProperties"), dict) else ():
            limits.check("max_regex_length", len(name), path)
            scan_repeat_bounds(name, limits)
    check_refs(schema, limits)


def _check_literal(limits: GuideLimits, value: Any, path: str) -> None:
    size = len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else (
        len(json_key(value)) if isinstance(value, (dict, list)) else 0)
    limits.check("max_literal_bytes", size, path)


def check_literals(texts: Any, limits: GuideLimits) -> None:
    """Each choice option / literal within ``max_literal_bytes``."""
    for t in texts:
        _check_literal(limits, t, "choice")


def check_grammar_literals(grammar: str, limits: GuideLimits) -> None:
    """Quoted literals in an EBNF/Lark grammar: each within ``max_literal_bytes``, all together
    within ``max_grammar_literal_bytes`` (xgrammar's compile cost grows with every long literal)."""
    i, n = 0, len(grammar)
    total = 0
    while i < n:
        if grammar[i] in "\"'":
            end = _skip_quoted(grammar, i)
            size = len(grammar[i + 1:end - 1].encode("utf-8", "surrogatepass"))
            limits.check("max_literal_bytes", size, f"grammar offset {i}")
            total += size
            limits.check("max_grammar_literal_bytes", total, f"grammar offset {i} (all literals so far)")
            i = end
        else:
            i += 1


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
    targets: dict[str, Any] = {"#": schema}
    for path, sub in iter_subschemas(schema):
        ref = sub.get("$ref")
        if isinstance(ref, str):
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
            i = class_end(text, i)
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
            hi_txt = m.group(3)
            lo = repeat_count(m.group(1), bound, f"at offset {i}")
            hi = repeat_count(hi_txt, bound, f"at offset {i}") if hi_txt else lo
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


_TAG_FANOUT_KEYS = ("structures", "tags", "triggers", "elements")


def check_structural_tag(tag: Any, limits: GuideLimits,
                         check_schema: Callable[[dict, dict], None] | None = None) -> None:
    """Every JSON schema and regex inside a structural tag gets the same checks as a top-level one.

    ``check_schema(schema, node)``: the compiling backend's coverage rule, called with each schema
    and the tag node that holds it. A tag cannot fall back to another backend, so a schema the
    backend would only partly enforce must be refused there, not silently narrowed.
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
                    limits.check("max_any_of", len(node[key]), f"structural tag {key!r}")
            for key, value in node.items():
                if key in ("schema", "json_schema") and isinstance(value, (dict, bool)):
                    schema = value if isinstance(value, dict) else ({} if value else {"not": {}})
                    check_schema_limits(schema, limits)
                    if check_schema is not None:
                        check_schema(schema, node)
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
