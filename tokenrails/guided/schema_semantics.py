"""The JSON-Schema language every backend compiles: objects and tuples are *closed* unless the schema
says otherwise (xgrammar's ``strict_mode``, OpenAI strict mode, outlines, vLLM's
``disable-additional-properties`` for guidance).

llguidance follows plain JSON Schema (extra properties allowed when ``additionalProperties`` is
absent) and ``backend="auto"`` may send a schema to it or to xgrammar, so the llguidance backend
compiles ``close_schema(schema)``, which makes the implicit strictness explicit. Closing happens
only where the instance is evaluated as a whole (the root, every ``properties``/``items``/
``$defs``/... value), never in parts intersected with it: closing each ``allOf`` part separately
would make ``allOf [{properties a}, {properties b}]`` unsatisfiable, so the names every part
declares are hoisted to the closure point, which gets ``additionalProperties: false``. A single
``anyOf``/``oneOf`` next to declared members is closed per branch (discriminated unions stay
exact); ``$ref`` targets intersected with something are inlined open, because ``$defs`` entries
are closed in place. ``not``, ``if``/``then``/``else``, ``propertyNames``, values and anything under
an explicit ``additionalProperties``/``unevaluatedProperties`` decision are not touched.

Two more parts of the one policy, applied for every backend through ``policy_schema(spec)``:
``infer_types`` (type-specific keywords at a node without ``type`` mean that type) and
``is_strict(spec)`` (``GuideSpec.json_schema(..., strict=False)``: no closing). The rules and
their measured effect per backend: docs/semantics.md section 5.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from .errors import GuideLimitError, UnsupportedGuideError
from .ecma_patterns import spell_out_schema_patterns
from .limits import DEFAULT_LIMITS
from .schema_walk import resolve_pointer

if TYPE_CHECKING:
    from .limits import GuideLimits
    from .spec import GuideSpec

# Keys whose value is one value schema / a list / a map of value schemas (closure points).
_VALUE_ONE = ("items", "additionalProperties", "contains", "additionalItems", "unevaluatedItems",
              "unevaluatedProperties", "contentSchema")
_VALUE_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_ALTS = ("anyOf", "oneOf")
_OPEN_PROPS = ("additionalProperties", "unevaluatedProperties")
_OPEN_ITEMS = ("items", "additionalItems", "unevaluatedItems")
# Siblings of a $ref that make it an intersection the closure must see through (inline).
_FORCE_INLINE = ("properties", "patternProperties", "additionalProperties", "unevaluatedProperties",
                 "allOf", "anyOf", "oneOf", "prefixItems", "items", "additionalItems",
                 "unevaluatedItems")
_MAX_GROWTH = 8  # rewritten schema may be this many times the original (inlined $refs) ...
_MAX_EXTRA_NODES = 200_000  # ... and never more than this many extra nodes


@dataclass
class _Decl:
    """What a group of intersected schema parts declares about objects and tuples."""

    declares: bool = False           # some part has ``properties``/``patternProperties``
    names: dict[str, None] = field(default_factory=dict)     # ordered set
    patterns: dict[str, None] = field(default_factory=dict)
    explicit: bool = False           # some part decides extra properties itself
    alts: list[list[Any]] = field(default_factory=list)     # anyOf/oneOf lists in the group
    longest_prefix: int | None = None
    explicit_items: bool = False

    def merged(self, other: "_Decl") -> "_Decl":
        return _Decl(self.declares or other.declares, {**self.names, **other.names},
                     {**self.patterns, **other.patterns})


def close_schema(schema: Any, max_visits: int | None = None) -> Any:
    """A copy of ``schema`` with the strict policy made explicit (see the module docstring).

    Raises ``UnsupportedGuideError`` for a ``$ref`` cycle through intersected parts (nothing to
    close: the schema would recurse without nesting a value) and ``GuideLimitError`` when inlining
    would blow the schema up or the walk visits more than ``max_visits`` nodes
    (``GuideLimits.max_schema_visits``: every ``allOf`` part and ``$ref`` target counts each time
    it is followed, so a chain whose parts repeat a reference cannot double the work per level
    unbounded).
    """
    if not isinstance(schema, dict):
        return schema
    return _Closer(schema, max_visits).point(schema, None)


class VisitBudget:
    """A count of schema nodes visited by one walk, refused past ``limit`` (``GuideLimitError``).

    Depth bounds alone do not bound a walk that follows ``$ref``/``allOf``: n levels whose parts
    both reference the next level are 2^n visits."""

    __slots__ = ("limit", "used", "what")

    PER_NODE = 8  # visits every document node may take on top of the limit (a walk visits a node
    #               2-3 times; a 1 MiB schema of 100k nodes must not be refused for its size alone)

    def __init__(self, limit: int | None, what: str, root: Any = None) -> None:
        base = DEFAULT_LIMITS.max_schema_visits if limit is None else limit
        self.limit = base + self.PER_NODE * (_count(root) if root is not None else 0)
        self.used = 0
        self.what = what

    def spend(self, n: int = 1) -> None:
        self.used += n
        if self.used > self.limit:
            raise GuideLimitError(
                f"limit max_schema_visits exceeded while {self.what}: the schema's $ref/allOf "
                f"structure expands to more than {self.limit} node visits (a reference followed "
                "from several places counts each time)", limit="max_schema_visits", value=self.used)


class _Closer:
    def __init__(self, root: dict, max_visits: int | None = None):
        self.root = root
        self.visits = VisitBudget(max_visits, "closing the schema", root)
        self.inlining: list[str] = []  # $ref targets being inlined (cycle guard)
        self.budget = max(_MAX_GROWTH * _count(root), 10_000)
        self.budget = min(self.budget, _count(root) + _MAX_EXTRA_NODES)
        self.made = 0

    # ---- analysis ------------------------------------------------------------------------
    def collect(self, node: dict, decl: _Decl | None = None) -> _Decl:
        """Declarations of ``node`` and every part intersected with it (allOf, merged $ref)."""
        self.visits.spend()
        d = decl if decl is not None else _Decl()
        if "properties" in node or "patternProperties" in node:
            d.declares = True
        if isinstance(node.get("properties"), dict):
            d.names.update(dict.fromkeys(node["properties"]))
        if isinstance(node.get("patternProperties"), dict):
            d.patterns.update(dict.fromkeys(node["patternProperties"]))
        if isinstance(node.get("required"), list):
            d.names.update(dict.fromkeys(r for r in node["required"] if isinstance(r, str)))
        if any(k in node for k in _OPEN_PROPS):
            d.explicit = True
        if isinstance(node.get("prefixItems"), list):
            n = len(node["prefixItems"])
            d.longest_prefix = n if d.longest_prefix is None else max(d.longest_prefix, n)
        if any(k in node for k in _OPEN_ITEMS):
            d.explicit_items = True
        for key in _ALTS:
            if isinstance(node.get(key), list):
                d.alts.append(node[key])
        for part in node.get("allOf", []) if isinstance(node.get("allOf"), list) else []:
            if isinstance(part, dict):
                self.collect(part, d)
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = self.enter(ref)
            try:
                if isinstance(target, dict):
                    self.collect(target, d)
            finally:
                self.inlining.pop()
        return d

    def alt_union(self, lists: list[list[Any]]) -> _Decl:
        """Everything any branch of ``lists`` (recursively) declares."""
        out = _Decl()
        for branches in lists:
            for b in branches:
                if isinstance(b, dict):
                    d = self.collect(b)
                    out = out.merged(d).merged(self.alt_union(d.alts))
        return out

    def enter(self, ref: str) -> Any:
        if not ref.startswith("#"):
            raise UnsupportedGuideError(f"$ref {ref[:100]!r} is not local", feature="remote $ref",
                                        backend="llguidance")
        if ref in self.inlining:
            raise UnsupportedGuideError(
                f"$ref {ref[:100]!r} would be inlined inside itself (recursion through a $ref with "
                "sibling keywords or allOf): cannot close it", feature="recursive $ref with siblings",
                backend="llguidance")
        self.inlining.append(ref)
        return resolve_pointer(self.root, ref)

    # ---- rewriting -----------------------------------------------------------------------
    def point(self, node: Any, inherited: _Decl | None) -> Any:
        """``node`` evaluated as a whole; ``inherited``: what the schema it is intersected with
        declares (set for a branch of a distributed anyOf/oneOf)."""
        if not isinstance(node, dict):
            return node
        self.visits.spend()
        if inherited is None and _is_alias(node):
            # its target is closed where it is defined; siblings (minLength...) are copied
            return self.rewrite(node, alt_mode="point", dist=None, inline=False)
        d = self.collect(node)
        if inherited is not None:
            m = inherited.merged(d)  # enclosing names first: llguidance keeps listed order
            d.declares, d.names, d.patterns = m.declares, m.names, m.patterns
        close_obj, dist, alt_mode = False, None, "point"
        if d.explicit:
            alt_mode = "part"  # this schema decides extra properties itself: branches stay open
        elif _may_be_object(node):
            if len(d.alts) == 1 and d.declares:
                alt_mode, dist = "dist", d  # each branch closed with its names plus these
            elif len(d.alts) > 1:
                u = self.alt_union(d.alts)
                if d.declares or u.declares:
                    d = _Decl(True, {**d.names, **u.names}, {**d.patterns, **u.patterns},
                              longest_prefix=d.longest_prefix, explicit_items=d.explicit_items)
                    close_obj, alt_mode = True, "part"
            elif d.declares:
                close_obj = True
        out = self.rewrite(node, alt_mode=alt_mode, dist=dist, inline=inherited is not None)
        if close_obj:
            self.close_object(out, d)
        if d.longest_prefix is not None and not d.explicit_items:
            own = out.get("prefixItems")
            if isinstance(own, list) and len(own) == d.longest_prefix:
                out["items"] = False
            else:
                out["maxItems"] = min(out.get("maxItems", d.longest_prefix), d.longest_prefix)
        return out

    def rewrite(self, node: dict, *, alt_mode: str, dist: _Decl | None, inline: bool) -> dict:
        """Copy of ``node``: value schemas closed as points, allOf parts open, anyOf/oneOf
        branches per ``alt_mode`` ("point": on their own, "dist": with ``dist``, "part": open);
        a ``$ref`` with siblings (or any, when ``inline``) replaced by its open target."""
        self.visits.spend()
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _VALUE_MAPS and isinstance(value, dict):
                out[key] = {k: self.point(v, None) for k, v in value.items()}
            elif key in _VALUE_ONE:
                out[key] = self.point(value, None)
            elif key == "prefixItems" and isinstance(value, list):
                out[key] = [self.point(v, None) for v in value]
            elif key == "allOf" and isinstance(value, list):
                out[key] = [self.part(v, alt_mode, dist) for v in value]
            elif key in _ALTS and isinstance(value, list):
                if alt_mode == "part":
                    out[key] = [self.part(v, "part", None) for v in value]
                else:
                    out[key] = [self.point(v, dist) for v in value]
            else:
                out[key] = value
        ref = node.get("$ref")
        if isinstance(ref, str) and (inline or not _is_alias(node)):
            target = self.enter(ref)
            try:
                inlined = self.part(target, alt_mode, dist)
            finally:
                self.inlining.pop()
            del out["$ref"]
            self.spend(inlined)
            out["allOf"] = list(out.get("allOf", [])) + [inlined]
        return out

    def part(self, node: Any, alt_mode: str, dist: _Decl | None) -> Any:
        """An allOf part or inlined $ref target: open itself, its values closed."""
        if not isinstance(node, dict):
            return node
        out = self.rewrite(node, alt_mode=alt_mode, dist=dist, inline=True)
        out.pop("$defs", None)  # refs resolve against the root; copies of $defs are dead weight
        out.pop("definitions", None)
        return out

    @staticmethod
    def close_object(out: dict, d: _Decl) -> None:
        """Every declared name listed (in declaration order: llguidance fixes property order),
        every declared pattern kept, nothing else."""
        own = out.get("properties", {})
        if not isinstance(own, dict):
            return
        props = {name: own.get(name, {}) for name in d.names}
        props.update(own)
        pats = out.get("patternProperties", {})
        if not isinstance(pats, dict):
            return
        pats = {**{p: {} for p in d.patterns}, **pats}
        if props or "properties" in out:
            out["properties"] = props
        if pats or "patternProperties" in out:
            out["patternProperties"] = pats
        out["additionalProperties"] = False

    def spend(self, inlined: Any) -> None:
        self.made += _count(inlined)
        if self.made > self.budget:
            raise GuideLimitError(
                "closing the schema would inline too many $ref targets "
                f"({self.made} nodes, budget {self.budget})", limit="max_schema_nodes", value=self.made)


def _is_alias(node: dict) -> bool:
    """A ``$ref`` whose siblings neither declare members nor combine schemas: its target, closed
    where it is defined, can stay a reference (recursive schemas keep working)."""
    return isinstance(node.get("$ref"), str) and not any(k in node for k in _FORCE_INLINE)


def _may_be_object(node: dict) -> bool:
    t = node.get("type")
    return t is None or t == "object" or (isinstance(t, list) and "object" in t)


def _count(node: Any) -> int:
    n, stack = 0, [node]
    while stack:
        x = stack.pop()
        n += 1
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return n


# ---- keyword-implied types ---------------------------------------------------------------
# JSON Schema applies type-specific keywords only to instances of that type: {"properties": ...}
# alone admits 5 and "x". xgrammar, outlines and OpenAI read it as an object schema (what users
# mean); llguidance follows JSON Schema. One rule for every backend: keywords of type T at a node
# without ``type`` (nor a ``type`` in what it is intersected with) mean ``type: T``.
IMPLIED_TYPES: dict[str, str] = {
    **dict.fromkeys(("properties", "patternProperties", "additionalProperties",
                     "unevaluatedProperties", "required", "minProperties", "maxProperties",
                     "propertyNames", "dependentRequired", "dependentSchemas", "dependencies"),
                    "object"),
    **dict.fromkeys(("items", "prefixItems", "additionalItems", "unevaluatedItems", "contains",
                     "minContains", "maxContains", "minItems", "maxItems", "uniqueItems"), "array"),
    **dict.fromkeys(("minLength", "maxLength", "pattern", "format"), "string"),
    **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
                    "number"),
}
_TYPE_ORDER = ("object", "array", "string", "number")
# Where a subschema is evaluated as a whole (an inference point) / intersected with its parent.
_POINT_ONE = ("items", "additionalProperties", "contains", "additionalItems", "unevaluatedItems",
              "unevaluatedProperties", "propertyNames")
_POINT_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_PART_ONE = ("then", "else")
_PART_MAPS = ("dependentSchemas",)


def infer_types(schema: Any, max_visits: int | None = None) -> Any:
    """A copy of ``schema`` where every node evaluated as a whole that has no ``type`` but uses
    type-specific keywords gets ``type`` = the types those keywords imply (``["object",
    "array"]`` when both kinds are present); the input is not mutated.

    * The node's ``allOf`` parts count as the node: their keywords add to the implied types, and a
      ``type`` in the node, in any part or in a ``$ref`` target it is intersected with means the
      schema already decides its type (nothing is added: JSON Schema semantics there).
    * ``anyOf``/``oneOf`` branches, ``properties``/``items``/... values and ``$defs`` entries are
      points of their own (a definition means what it says wherever it is referenced).
    * ``not``, ``if``, ``const``/``enum``/``default``/``examples`` values are never touched: under
      ``not`` and ``if`` an added type would change the meaning of the negation/condition.
    """
    if not isinstance(schema, dict):
        return schema
    return _Typer(schema, max_visits).point(schema)


class _Typer:
    def __init__(self, root: dict, max_visits: int | None = None):
        self.root = root
        self.visits = VisitBudget(max_visits, "inferring implied types", root)

    def point(self, node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        self.visits.spend()
        out = self.copy(node)
        if "type" not in node and not self.typed(node, []):
            found = self.group_implied(node, {})
            if found:
                types = [t for t in _TYPE_ORDER if t in found]
                out["type"] = types[0] if len(types) == 1 else types
        return out

    def part(self, node: Any) -> Any:
        return self.copy(node) if isinstance(node, dict) else node

    def copy(self, node: dict) -> dict:
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _POINT_MAPS and isinstance(value, dict):
                out[key] = {k: self.point(v) for k, v in value.items()}
            elif key in _PART_MAPS and isinstance(value, dict):
                out[key] = {k: self.part(v) for k, v in value.items()}
            elif key == "dependencies" and isinstance(value, dict):
                out[key] = {k: self.part(v) for k, v in value.items()}
            elif key in _POINT_ONE or key == "prefixItems":
                out[key] = ([self.point(v) for v in value] if isinstance(value, list)
                            else self.point(value))
            elif key in _ALTS and isinstance(value, list):
                out[key] = [self.point(v) for v in value]
            elif key == "allOf" and isinstance(value, list):
                out[key] = [self.part(v) for v in value]
            elif key in _PART_ONE:
                out[key] = self.part(value)
            else:  # not, if, const, enum, default, examples, $ref, scalars...
                out[key] = value
        return out

    def typed(self, node: dict, seen: list[str]) -> bool:
        """Does ``node`` or anything intersected with it (allOf parts, $ref targets) have a
        ``type`` (a target that will get an implied one counts: it is a point of its own)?"""
        self.visits.spend()
        if "type" in node:
            return True
        for part in node.get("allOf", []) if isinstance(node.get("allOf"), list) else []:
            if isinstance(part, dict) and self.typed(part, seen):
                return True
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#") and ref not in seen:
            try:
                target = resolve_pointer(self.root, ref)
            except Exception:  # a bad pointer is reported by the backend that compiles it
                return False
            if isinstance(target, dict):
                seen.append(ref)
                return self.typed(target, seen) or bool(self.group_implied(target, {}))
        return False

    def group_implied(self, node: dict, acc: dict[str, None], depth: int = 0) -> dict[str, None]:
        """Implied types of ``node`` and its ``allOf`` parts (recursively; $refs not followed:
        their targets are points with their own type)."""
        self.visits.spend()
        acc.update(dict.fromkeys(IMPLIED_TYPES[k] for k in node if k in IMPLIED_TYPES))
        if depth < 64:
            for part in node.get("allOf", []) if isinstance(node.get("allOf"), list) else []:
                if isinstance(part, dict):
                    self.group_implied(part, acc, depth + 1)
        return acc


# ---- per-spec entry points (every backend goes through these) -----------------------------
def is_strict(spec: "GuideSpec") -> bool:
    """The spec's unlisted-property policy: strict (closed objects/tuples) unless the request
    said ``strict=False`` (then JSON Schema's open objects, see ``GuideSpec.json_schema``)."""
    return spec.option("strict", True) is not False


_CACHED_PAYLOAD_CHARS = 8 * 1024  # memo only small schemas: ≤ 256 × 2 × 8 KiB held (4 MiB)


def _typed_text(payload: str, max_visits: int) -> str | None:
    """JSON text of ``infer_types(json.loads(payload))``, or None when nothing changes; memoised
    (route, check and compile each ask for it) for all but very large schemas."""
    if len(payload) <= _CACHED_PAYLOAD_CHARS:
        return _typed_text_cached(payload, max_visits)
    return _typed_text_uncached(payload, max_visits)


def _typed_text_uncached(payload: str, max_visits: int) -> str | None:
    schema = json.loads(payload)
    try:
        typed = infer_types(json.loads(payload), max_visits)
        spell_out_schema_patterns(typed)  # ECMA-262 shorthand classes (ecma_patterns.py)
    except RecursionError as exc:
        raise GuideLimitError("JSON schema is nested too deeply to analyse", limit="max_json_depth",
                              value="recursion") from exc
    if typed == schema:
        return None
    return json.dumps(typed, ensure_ascii=False, separators=(",", ":"))


_typed_text_cached = lru_cache(maxsize=256)(_typed_text_uncached)


def policy_payload(spec: "GuideSpec", limits: "GuideLimits | None" = None) -> str:
    """The schema text every backend compiles for a json_schema ``spec``: the payload with
    keyword-implied types made explicit and pattern shorthand classes spelled out as ECMA-262
    defines them (the payload itself when nothing changes, so
    compile caches keyed by text keep hitting)."""
    text = _typed_text(spec.payload, (limits or DEFAULT_LIMITS).max_schema_visits)
    return spec.payload if text is None else text


def policy_schema(spec: "GuideSpec", limits: "GuideLimits | None" = None) -> dict:
    """``policy_payload(spec)`` as a fresh dict (callers may keep or mutate it)."""
    return json.loads(policy_payload(spec, limits))


def already_closed(schema: Any) -> bool:
    """True when closing changes nothing: the strict and the JSON-Schema (``strict=False``)
    languages of ``schema`` are the same, so a backend that only implements the strict one
    enforces either exactly."""
    try:
        return close_schema(schema) == schema
    except (UnsupportedGuideError, GuideLimitError):
        return False
