"""Is a length-capped JSON output the beginning of some document valid against its schema?

An oracle independent of xgrammar, llguidance and tokenrails' own grammar backends, for judging
outputs that stopped at the token cap: such an output is *valid* iff some completion of it is a
JSON document that ``jsonschema`` accepts (format keywords not asserted, as for finished outputs).

Three verdicts, never a silent pass:

* ``invalid`` -- proved: the text is not a JSON prefix, or a part of the partial value already
  contradicts the schema for every completion (a finished sub-value that fails its subschema, a
  partial value of the wrong type, an ``enum``/``const`` no completion can equal, a key that
  ``additionalProperties: false`` forbids, ``not``/``allOf``/``anyOf``/``oneOf``/``if`` over what
  is known, ``$ref`` resolved with jsonschema's own ``referencing`` resolver). Each rule only
  refutes what no completion can repair, so a valid prefix is never called invalid.
* ``valid`` -- proved by a witness: one of a small set of schema-guided completions (close the
  open string/number/literal, finish the open member, add required keys and minimum items with
  example values, close the containers) makes a document jsonschema accepts.
* ``undecided`` -- neither: counted and printed by the bench, never counted as valid.

JSON here is RFC 8259 without NaN/Infinity, and an object may not repeat a member name (RFC 8259
leaves repeated names undefined; Python's json keeps the last). Text the model cut in the middle of
a UTF-8 character (trailing U+FFFD) is dropped first.
"""
from __future__ import annotations

import decimal
import itertools
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterator

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema

from harness.json_prefix_parse import (LITERALS, NUMBER, Complete, PArray, PEmpty, PLiteral, PNumber, PObject,
                                     PrefixError, PString, loads_strict, parse_prefix)

__all__ = ["INVALID", "UNDECIDED", "VALID", "PrefixError", "PrefixOracle", "Verdict", "loads_strict", "parse_prefix"]

VALID, INVALID, UNDECIDED = "valid", "invalid", "undecided"
MAX_DEPTH = 40          # $ref / nesting depth the refuter and the example generator follow
MAX_WITNESSES = 200     # completions tried per prefix before "undecided"
PER_LEVEL = 8           # completions of an inner value tried per enclosing level


@dataclass(frozen=True)
class Verdict:
    status: str                 # VALID | INVALID | UNDECIDED
    reason: str = ""            # why invalid / undecided
    witness: str | None = None  # for VALID: the completion (suffix) jsonschema accepted


# ---- JSON Schema equality and the kinds a partial value can still become -----------------------
def json_equal(a: Any, b: Any) -> bool:
    """JSON Schema equality: 1 == 1.0, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


_ALL_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


def kinds(node: Any) -> frozenset[str]:
    """JSON Schema types some completion of ``node`` may have."""
    if isinstance(node, PEmpty):
        return _ALL_TYPES
    if isinstance(node, PString):
        return frozenset({"string"})
    if isinstance(node, PNumber):
        return frozenset({"number", "integer"})
    if isinstance(node, PLiteral):
        return frozenset({"null"} if node.text[0] == "n" else {"boolean"})
    if isinstance(node, PArray):
        return frozenset({"array"})
    if isinstance(node, PObject):
        return frozenset({"object"})
    raise TypeError(node)


def _sure_kind(node: Any) -> str | None:
    """The type every completion of ``node`` has (``number`` for numbers), if one."""
    k = kinds(node)
    if k == {"number", "integer"}:
        return "number"
    return next(iter(k)) if len(k) == 1 else None


def compatible(node: Any, v: Any) -> bool:
    """Some completion of ``node`` equals ``v`` (JSON Schema equality)."""
    if isinstance(node, Complete):
        return json_equal(node.value, v)
    if isinstance(node, PEmpty):
        return True
    if isinstance(node, PString):
        return isinstance(v, str) and v.startswith(node.chars)
    if isinstance(node, PNumber):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        return number_may_equal(node.text, v)
    if isinstance(node, PLiteral):
        return any(v is value and word.startswith(node.text) for word, value in LITERALS.items())
    if isinstance(node, PArray):
        if not isinstance(v, list) or len(v) < len(node.items) + (node.tail is not None):
            return False
        if not all(json_equal(a, b) for a, b in zip(node.items, v)):
            return False
        return node.tail is None or compatible(node.tail, v[len(node.items)])
    if isinstance(node, PObject):
        if not isinstance(v, dict):
            return False
        if any(k not in v or not json_equal(val, v[k]) for k, val in node.members):
            return False
        free = [k for k in v if k not in node.keys()]
        if node.key is not None:
            return node.key in v and (node.tail is None or compatible(node.tail, v[node.key]))
        if node.pkey is not None:
            return any(k.startswith(node.pkey.chars) for k in free)
        return bool(free) if node.need_member else True
    raise TypeError(node)


def number_may_equal(text: str, v: float) -> bool:
    """Some completion of the number prefix ``text`` parses (Python's json: exact int, or the
    nearest float) to ``v``. Only the sign is used, and for a prefix of digits alone also its
    leading digits: every completion then has those as its first significant digits, at any
    scale (more digits, a fraction, an exponent), so it equals ``v`` only if a decimal starting
    with them lies in the interval of reals that round to ``v``."""
    negative = text.startswith("-")
    if (v < 0 and not negative) or (v > 0 and negative):
        return False
    digits = text.lstrip("-")
    if v == 0 or not digits or not digits.isdigit() or digits == "0":
        return True  # 0 (also 2e-400 underflows to 0.0), "-", "0.", fractions, exponents: not analysed
    with decimal.localcontext() as ctx:
        ctx.prec = 1200  # exact for the midpoints of doubles
        return _leading_digits_reach(digits, abs(v))


def _leading_digits_reach(digits: str, a: float) -> bool:
    exact = decimal.Decimal(a)
    lo = hi = exact
    if isinstance(a, float) or a < 2 ** 1023:
        f = float(a)
        lo = (decimal.Decimal(f) + decimal.Decimal(math.nextafter(f, 0.0))) / 2
        hi = (decimal.Decimal(f) + decimal.Decimal(math.nextafter(f, math.inf))) / 2
        lo, hi = min(lo, exact), max(hi, exact)
    t = decimal.Decimal(int(digits))
    j0 = exact.adjusted() - (len(digits) - 1)  # the scale where t's leading digits meet v's
    for j in range(j0 - 2, j0 + 3):
        start = t.scaleb(j)
        end = (t + 1).scaleb(j)
        if start <= hi and end >= lo:
            return True
    return False


# keywords that constrain only one type: vacuous for a value that cannot have it
_KEYWORD_TYPE = {
    **dict.fromkeys(("properties", "patternProperties", "additionalProperties", "required", "minProperties",
                     "maxProperties", "propertyNames", "dependencies", "dependentRequired", "dependentSchemas",
                     "unevaluatedProperties"), "object"),
    **dict.fromkeys(("items", "prefixItems", "additionalItems", "contains", "minItems", "maxItems", "uniqueItems",
                     "unevaluatedItems", "minContains", "maxContains"), "array"),
    **dict.fromkeys(("minLength", "maxLength", "pattern"), "string"),
    **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"), "number"),
}
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "$schema", "$id", "id",
                          "definitions", "$defs", "format", "deprecated", "readOnly", "writeOnly",
                          "contentMediaType", "contentEncoding", "contentSchema", "$anchor", "$vocabulary",
                          "$dynamicAnchor", "$recursiveAnchor"})


def _kind_applies(keyword: str, ks: frozenset[str]) -> bool:
    t = _KEYWORD_TYPE.get(keyword)
    return t is None or t in ks or (t == "number" and "integer" in ks)


# ---- the oracle ---------------------------------------------------------------------------------
class PrefixOracle:
    """Judges prefixes of JSON documents against one schema (build once per schema)."""

    def __init__(self, schema: Any) -> None:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        self.schema = schema
        self.validator = cls(schema)
        self._spec = referencing.jsonschema.specification_with(
            cls.ID_OF(cls.META_SCHEMA) or "urn:unknown-dialect", default=referencing.Specification.OPAQUE)
        self._prefix_items = "prefixItems" in cls.VALIDATORS  # 2020-12 array keywords
        self._known = frozenset(cls.VALIDATORS)   # keywords this dialect asserts (others are ignored)
        self._ref_alone = cls in (jsonschema.Draft3Validator, jsonschema.Draft4Validator,
                                  jsonschema.Draft6Validator, jsonschema.Draft7Validator)  # $ref hides siblings
        self._root = self.validator._resolver  # jsonschema's own referencing resolver
        self._active: set[tuple[str, int, int]] = set()  # (check, schema, node) on the stack: cycles

    # -- public
    def judge(self, text: str) -> Verdict:
        """The verdict on ``text`` as the beginning of a document valid against the schema."""
        text = text.rstrip("\ufffd")
        try:
            node = parse_prefix(text)
        except PrefixError as exc:
            return Verdict(INVALID, f"not a JSON prefix: {exc}")
        try:
            why = self._refute(node, self.schema, self._root, 0)
        except (referencing.exceptions.Unresolvable, jsonschema.exceptions._WrappedReferencingError) as exc:
            return Verdict(UNDECIDED, f"unresolvable $ref: {exc}")
        if why is not None:
            return Verdict(INVALID, why)
        tried = 0
        for suffix in self._suffixes(node, self.schema, self._root, 0):
            tried += 1
            if self.accepts(text + suffix):
                return Verdict(VALID, witness=suffix)
            if tried >= MAX_WITNESSES:
                break
        return Verdict(UNDECIDED, f"not refuted, no completion among {tried} tried validates")

    def accepts(self, document: str) -> bool:
        """``document`` is (this oracle's) JSON and jsonschema accepts it."""
        try:
            value = loads_strict(document)
        except ValueError:
            return False
        try:
            return self.validator.is_valid(value)
        except (referencing.exceptions.Unresolvable, jsonschema.exceptions._WrappedReferencingError):
            return False

    # -- schema plumbing
    def _enter(self, schema: Any, resolver: Any) -> Any:
        """The resolver inside ``schema`` (a subschema with its own $id moves the base URI)."""
        if isinstance(schema, dict) and ("$id" in schema or "id" in schema):
            return resolver.in_subresource(self._spec.create_resource(schema))
        return resolver

    def _asserted(self, schema: dict) -> dict:
        """The keywords of ``schema`` jsonschema asserts in this dialect (draft <= 7: ``$ref`` alone)."""
        if self._ref_alone and "$ref" in schema:
            return {"$ref": schema["$ref"]}
        known = self._known | ({"then", "else"} if "if" in self._known else set())  # read by "if"
        return {k: v for k, v in schema.items() if k in known}

    def _valid(self, value: Any, schema: Any, resolver: Any) -> bool:
        if schema is True:
            return True
        if schema is False:
            return False
        return self.validator.evolve(schema=schema, _resolver=resolver).is_valid(value)

    def _lookup(self, ref: str, resolver: Any) -> tuple[Any, Any]:
        resolved = resolver.lookup(ref)
        return resolved.contents, resolved.resolver

    # -- refutation: a reason no completion of ``node`` satisfies ``schema``, or None
    def _refute(self, node: Any, schema: Any, resolver: Any, depth: int) -> str | None:
        if schema is True or depth > MAX_DEPTH:
            return None
        if schema is False:
            return "false schema"
        if not isinstance(schema, dict):
            return None
        resolver = self._enter(schema, resolver)
        if isinstance(node, Complete):
            return None if self._valid(node.value, schema, resolver) else \
                f"finished value {json.dumps(node.value)[:60]} fails {json.dumps(schema)[:80]}"
        frame = ("refute", id(schema), id(node))
        if frame in self._active:
            return None  # a recursive schema met again on the same value: no claim
        self._active.add(frame)
        try:
            ks = kinds(node)
            asserted = self._asserted(schema)
            for handler in (self._refute_type, self._refute_enum, self._refute_applicators, self._refute_string,
                            self._refute_number, self._refute_object, self._refute_array):
                why = handler(node, asserted, resolver, depth, ks)
                if why is not None:
                    return why
            return None
        finally:
            self._active.discard(frame)

    def _refute_type(self, node, schema, resolver, depth, ks) -> str | None:
        t = schema.get("type")
        if t is None:
            return None
        if isinstance(t, list) and not all(isinstance(x, str) for x in t):
            return None  # draft 3 schemas in type: not analysed
        allowed = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else _ALL_TYPES
        if not (allowed & ks or ("number" in allowed and "integer" in ks)):
            if allowed - _ALL_TYPES:
                return None  # a type name this oracle does not know
            return f"a {'/'.join(sorted(ks))} where type {t} is required"
        return None

    def _refute_enum(self, node, schema, resolver, depth, ks) -> str | None:
        if "const" in schema and not compatible(node, schema["const"]):
            return f"cannot become const {json.dumps(schema['const'])[:60]}"
        enum = schema.get("enum")
        if isinstance(enum, list) and not any(compatible(node, v) for v in enum):
            return f"cannot become any of enum {json.dumps(enum)[:60]}"
        return None

    def _refute_applicators(self, node, schema, resolver, depth, ks) -> str | None:
        if isinstance(schema.get("$ref"), str):
            try:
                sub, r = self._lookup(schema["$ref"], resolver)
            except referencing.exceptions.Unresolvable:
                sub = None
            if sub is not None:
                why = self._refute(node, sub, r, depth + 1)
                if why is not None:
                    return f"$ref {schema['$ref']}: {why}"
        for sub in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
            why = self._refute(node, sub, resolver, depth + 1)
            if why is not None:
                return f"allOf: {why}"
        for kw in ("anyOf", "oneOf"):
            subs = schema.get(kw)
            if isinstance(subs, list) and subs:
                whys = [self._refute(node, sub, resolver, depth + 1) for sub in subs]
                if all(w is not None for w in whys):
                    return f"{kw}: every branch refuted ({whys[0]})"
                if kw == "oneOf" and sum(self._must(node, sub, resolver, depth + 1) for sub in subs) >= 2:
                    return "oneOf: two branches hold for every completion"
        if "not" in schema and self._must(node, schema["not"], resolver, depth + 1):
            return f"not: every completion satisfies {json.dumps(schema['not'])[:60]}"
        if "if" in schema:
            if self._must(node, schema["if"], resolver, depth + 1):
                why = self._refute(node, schema.get("then", True), resolver, depth + 1)
                if why is not None:
                    return f"then: {why}"
            elif self._refute(node, schema["if"], resolver, depth + 1) is not None:
                why = self._refute(node, schema.get("else", True), resolver, depth + 1)
                if why is not None:
                    return f"else: {why}"
        return None

    def _refute_string(self, node, schema, resolver, depth, ks) -> str | None:
        if not isinstance(node, PString):
            return None
        m = schema.get("maxLength")
        if isinstance(m, (int, float)) and not isinstance(m, bool) and len(node.chars) > m:
            return f"string longer than maxLength {m} already"
        p = schema.get("pattern")
        if isinstance(p, str) and not node.pending and not pattern_prefix_possible(p, node.chars):
            return f"no extension of {node.chars[:40]!r} matches pattern {p!r}"
        return None

    def _refute_number(self, node, schema, resolver, depth, ks) -> str | None:
        if not isinstance(node, PNumber):
            return None  # only the sign of an open number is known (1 -> 1e-9 or 1e9)
        negative = node.text.startswith("-")

        def num(k: str) -> float | None:
            v = schema.get(k)
            return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        hi, xhi, lo, xlo = num("maximum"), num("exclusiveMaximum"), num("minimum"), num("exclusiveMinimum")
        if not negative and ((hi is not None and hi < 0) or (xhi is not None and xhi <= 0)):
            return f"a number >= 0 where the maximum is {hi if hi is not None else xhi}"
        if negative and ((lo is not None and lo > 0) or (xlo is not None and xlo >= 0)):
            return f"a number <= 0 where the minimum is {lo if lo is not None else xlo}"
        return None

    def _member_schemas(self, schema: dict, key: str) -> list[Any]:
        """The subschemas that apply to member ``key`` (properties, patternProperties, else additional)."""
        out = []
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        if key in props:
            out.append(props[key])
        pats = schema.get("patternProperties") if isinstance(schema.get("patternProperties"), dict) else {}
        for pat, sub in pats.items():
            try:
                if re.search(pat, key):
                    out.append(sub)
            except re.error:
                continue
        if not out and "additionalProperties" in schema:
            out.append(schema["additionalProperties"])
        return out

    def _refute_object(self, node, schema, resolver, depth, ks) -> str | None:
        if not isinstance(node, PObject):
            return None
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        for key, value in node.members:
            for sub in self._member_schemas(schema, key):
                why = self._refute(Complete(value), sub, resolver, depth + 1)
                if why is not None:
                    return f"member {key!r}: {why}"
            if "propertyNames" in schema and not self._valid(key, schema["propertyNames"], resolver):
                return f"member name {key!r} fails propertyNames"
        if node.key is not None:
            open_value = node.tail if node.tail is not None else PEmpty()
            for sub in self._member_schemas(schema, node.key):
                why = self._refute(open_value, sub, resolver, depth + 1)
                if why is not None:
                    return f"member {node.key!r}: {why}"
            if "propertyNames" in schema and not self._valid(node.key, schema["propertyNames"], resolver):
                return f"member name {node.key!r} fails propertyNames"
        used = node.keys()
        closed = schema.get("additionalProperties") is False and not schema.get("patternProperties")
        free_names = [k for k in props if k not in used]
        if node.pkey is not None:
            if closed and not node.pkey.pending and not any(k.startswith(node.pkey.chars) for k in free_names):
                return f"no allowed member name starts with {node.pkey.chars!r}"
            if "propertyNames" in schema:
                why = self._refute(node.pkey, schema["propertyNames"], resolver, depth + 1)
                if why is not None:
                    return f"member name: {why}"
        if node.need_member and closed and not free_names:
            return "a further member where additionalProperties is false and every property is used"
        required = [k for k in schema.get("required", []) if isinstance(k, str)] \
            if isinstance(schema.get("required"), list) else []
        for k in required:
            if k in used:
                continue
            subs = self._member_schemas(schema, k) or [True]
            if any(self._refute(PEmpty(), sub, resolver, depth + 1) is not None for sub in subs):
                return f"required member {k!r} cannot be added"
        mx = schema.get("maxProperties")
        if isinstance(mx, int) and not isinstance(mx, bool):
            missing = [k for k in required if k not in used]
            # an open name (or the member a comma asks for) is one more only if it cannot be a missing required one
            if node.pkey is not None:
                extra = not node.pkey.pending and not any(k.startswith(node.pkey.chars) for k in missing)
            else:
                extra = node.need_member and not missing
            at_least = len(set(used) | set(required)) + extra
            if at_least > mx:
                return f"more than maxProperties {mx} members"
        deps = dict(schema.get("dependentSchemas") or {}) if isinstance(schema.get("dependentSchemas"), dict) else {}
        if isinstance(schema.get("dependencies"), dict):
            deps.update({k: v for k, v in schema["dependencies"].items() if isinstance(v, (dict, bool))})
        for k, sub in deps.items():
            if k in used:
                why = self._refute(node, sub, resolver, depth + 1)
                if why is not None:
                    return f"dependentSchemas {k!r}: {why}"
        return None

    def _item_schema(self, schema: dict, index: int) -> Any:
        """The subschema of item ``index`` (True when none applies)."""
        items = schema.get("items")
        if self._prefix_items:
            prefix = schema.get("prefixItems") if isinstance(schema.get("prefixItems"), list) else []
            if index < len(prefix):
                return prefix[index]
            return items if items is not None else True
        if isinstance(items, list):
            if index < len(items):
                return items[index]
            return schema.get("additionalItems", True)
        return items if items is not None else True

    def _refute_array(self, node, schema, resolver, depth, ks) -> str | None:
        if not isinstance(node, PArray):
            return None
        for i, value in enumerate(node.items):
            why = self._refute(Complete(value), self._item_schema(schema, i), resolver, depth + 1)
            if why is not None:
                return f"item {i}: {why}"
        if node.tail is not None:
            why = self._refute(node.tail, self._item_schema(schema, len(node.items)), resolver, depth + 1)
            if why is not None:
                return f"item {len(node.items)}: {why}"
        mx = schema.get("maxItems")
        if isinstance(mx, int) and not isinstance(mx, bool) and len(node.items) + (node.tail is not None) > mx:
            return f"more than maxItems {mx} items"
        if schema.get("uniqueItems") is True:
            for a, b in itertools.combinations(node.items, 2):
                if json_equal(a, b):
                    return f"repeated item {json.dumps(a)[:40]} where uniqueItems"
        return None

    # -- must: True only if every completion of ``node`` satisfies ``schema``
    def _must(self, node: Any, schema: Any, resolver: Any, depth: int) -> bool:
        if schema is True:
            return True
        if schema is False or depth > MAX_DEPTH or not isinstance(schema, dict):
            return False
        resolver = self._enter(schema, resolver)
        if isinstance(node, Complete):
            return self._valid(node.value, schema, resolver)
        frame = ("must", id(schema), id(node))
        if frame in self._active:
            return False
        self._active.add(frame)
        try:
            return self._must_keywords(node, self._asserted(schema), resolver, depth)
        finally:
            self._active.discard(frame)

    def _must_keywords(self, node: Any, schema: dict, resolver: Any, depth: int) -> bool:
        ks = kinds(node)
        for k, v in schema.items():
            if k in _ANNOTATIONS or not _kind_applies(k, ks):
                continue
            if k == "type":
                allowed = {x for x in ([v] if isinstance(v, str) else v if isinstance(v, list) else [])
                           if isinstance(x, str)}
                sure = _sure_kind(node)
                if sure is None or sure not in allowed:
                    return False
            elif k == "not":
                if self._refute(node, v, resolver, depth + 1) is None:
                    return False
            elif k == "allOf":
                if not (isinstance(v, list) and all(self._must(node, s, resolver, depth + 1) for s in v)):
                    return False
            elif k == "anyOf":
                if not (isinstance(v, list) and any(self._must(node, s, resolver, depth + 1) for s in v)):
                    return False
            elif k == "$ref":
                try:
                    sub, r = self._lookup(v, resolver)
                except referencing.exceptions.Unresolvable:
                    return False
                if not self._must(node, sub, r, depth + 1):
                    return False
            else:
                return False  # a keyword an open value may still violate, or one not analysed here
        return True

    # -- completions (witness candidates)
    def _alternatives(self, schema: Any, resolver: Any, depth: int, hops: int = 0) -> list[tuple[dict, Any]]:
        """Flattened views of ``schema`` for generating values: $ref followed, allOf merged,
        one view per anyOf/oneOf branch (``hops`` bounds the expansion of recursive schemas).
        Heuristic: jsonschema judges every candidate."""
        if schema is True or not isinstance(schema, dict) or depth > MAX_DEPTH or hops > 4:
            return [({}, resolver)]
        if schema is False:
            return []
        resolver = self._enter(schema, resolver)
        base: dict = {k: v for k, v in schema.items() if k not in ("$ref", "allOf", "anyOf", "oneOf")}
        views = [(base, resolver)]
        if isinstance(schema.get("$ref"), str):
            try:
                sub, r = self._lookup(schema["$ref"], resolver)
            except referencing.exceptions.Unresolvable:
                sub, r = True, resolver
            views = [(_merge(b, v), vr) for b, _ in views for v, vr in self._alternatives(sub, r, depth, hops + 1)][:4]
        for sub in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
            views = [(_merge(b, v), vr) for b, br in views for v, vr in self._alternatives(sub, br, depth, hops + 1)][:4]
        for kw in ("anyOf", "oneOf"):
            if isinstance(schema.get(kw), list) and schema[kw]:
                views = [(_merge(b, v), vr) for b, br in views for s in schema[kw]
                         for v, vr in self._alternatives(s, br, depth, hops + 1)][:6]
        if "if" in schema:  # a view with then's keywords and one with else's
            views = [(_merge(b, v), vr) for b, br in views for kw in ("then", "else") if kw in schema
                     for v, vr in self._alternatives(schema[kw], br, depth, hops + 1)][:6] or views
        return views

    def examples(self, schema: Any, resolver: Any = None, depth: int = 0) -> list[Any]:
        """A few values meant to satisfy ``schema`` (not guaranteed: candidates for jsonschema)."""
        resolver = self._root if resolver is None else resolver
        out: list[Any] = []
        for view, r in self._alternatives(schema, resolver, depth):
            for v in self._view_examples(view, r, depth):
                if not any(json_equal(v, o) and type(v) is type(o) for o in out):
                    out.append(v)
        return out[:8]

    def _view_examples(self, s: dict, resolver: Any, depth: int) -> list[Any]:
        if "const" in s:
            return [s["const"]]
        if isinstance(s.get("enum"), list) and s["enum"]:
            return list(s["enum"][:4])
        out: list[Any] = []
        for k in ("default",):
            if k in s:
                out.append(s[k])
        if isinstance(s.get("examples"), list):
            out += s["examples"][:2]
        types = s.get("type")
        types = [types] if isinstance(types, str) else list(types) if isinstance(types, list) else \
            sorted({t for kw, t in _KEYWORD_TYPE.items() if kw in s}) or ["null", "string", "integer", "object", "array"]
        for t in types:
            if t == "object":
                out.append(self._object_example(s, resolver, depth))
            elif t == "array":
                out += self._array_examples(s, resolver, depth)
            elif t == "string":
                out += _string_examples(s)
            elif t in ("integer", "number"):
                out += _number_examples(s, integer=t == "integer")
            elif t == "boolean":
                out += [True, False]
            elif t == "null":
                out.append(None)
        return out

    def _first_example(self, schema: Any, resolver: Any, depth: int) -> Any:
        if depth > 8:
            return None
        ex = self.examples(schema, resolver, depth + 1)
        for v in ex:
            try:
                if self._valid(v, schema, resolver):
                    return v
            except Exception:  # noqa: BLE001 - an unresolvable $ref: any candidate
                break
        return ex[0] if ex else None

    def _object_example(self, s: dict, resolver: Any, depth: int) -> dict:
        props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
        need = [k for k in s.get("required", []) if isinstance(k, str)] if isinstance(s.get("required"), list) else []
        mn = s.get("minProperties") if isinstance(s.get("minProperties"), int) else 0
        for k in props:
            if len(need) >= mn:
                break
            if k not in need:
                need.append(k)
        out = {}
        for k in need:
            subs = self._member_schemas(s, k) or [True]
            out[k] = self._first_example(subs[0], resolver, depth)
        return out

    def _array_examples(self, s: dict, resolver: Any, depth: int) -> list[list]:
        mn = s.get("minItems") if isinstance(s.get("minItems"), int) else 0
        prefix = s.get("prefixItems") if self._prefix_items else s.get("items")
        n = max(mn, len(prefix) if isinstance(prefix, list) else 0)
        full = [self._first_example(self._item_schema(s, i), resolver, depth) for i in range(max(n, 1))]
        out = [full[:n]] if n or "contains" not in s else []
        if "contains" in s:
            out.append(full[:n] + [self._first_example(s["contains"], resolver, depth)])
        out.append(full)
        return out

    def _suffixes(self, node: Any, schema: Any, resolver: Any, depth: int) -> Iterator[str]:
        """Texts that complete ``node`` to a whole value, meant to satisfy ``schema``."""
        if isinstance(node, Complete):
            yield ""
            return
        if isinstance(node, PEmpty):
            for v in self.examples(schema, resolver, depth):
                yield json.dumps(v, ensure_ascii=False)
            return
        if isinstance(node, PLiteral):
            yield next(w for w in LITERALS if w.startswith(node.text))[len(node.text):]
            return
        views = self._alternatives(schema, resolver, depth) or [({}, resolver)]
        seen: set[str] = set()
        for view, r in views:
            targets = [view["const"]] if "const" in view else []
            targets += view["enum"][:8] if isinstance(view.get("enum"), list) else []
            for v in targets:
                suf = toward(node, v) if compatible(node, v) else None
                if suf is not None and suf not in seen:
                    seen.add(suf)
                    yield suf
            if isinstance(node, PNumber):
                gen: Iterator[str] = _number_suffixes(node.text, view)
            elif isinstance(node, PString):
                gen = _string_suffixes(node, view)
            elif isinstance(node, PArray):
                gen = self._array_suffixes(node, view, r, depth)
            else:
                gen = self._object_suffixes(node, view, r, depth)
            for suf in gen:
                if suf not in seen:
                    seen.add(suf)
                    yield suf

    def _array_suffixes(self, node: PArray, s: dict, resolver: Any, depth: int) -> Iterator[str]:
        n = len(node.items) + (node.tail is not None)
        inner = [""] if node.tail is None else \
            list(itertools.islice(self._suffixes(node.tail, self._item_schema(s, n - 1), resolver, depth + 1),
                                  PER_LEVEL))
        mn = s.get("minItems") if isinstance(s.get("minItems"), int) else 0
        prefix = s.get("prefixItems") if self._prefix_items else s.get("items")
        want = max(mn, len(prefix) if isinstance(prefix, list) else 0)
        extra = [self._first_example(self._item_schema(s, i), resolver, depth + 1) for i in range(n, max(want, n))]
        tails = [extra]
        if "contains" in s:
            tails.append(extra + [self._first_example(s["contains"], resolver, depth + 1)])
        for suf in inner:
            for more in tails:
                text = "".join(("," if n or j else "") + json.dumps(v, ensure_ascii=False) for j, v in enumerate(more))
                yield suf + text + "]"

    def _object_suffixes(self, node: PObject, s: dict, resolver: Any, depth: int) -> Iterator[str]:
        props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
        used = node.keys()

        def value_schema(key: str) -> Any:
            subs = self._member_schemas(s, key)
            return subs[0] if subs else True

        # 1. finish the open member: (suffix, its name)
        opens: list[tuple[str, str | None]] = []
        if node.pkey is not None:
            if node.pkey.pending:  # an escape cut in the name: finish it, the name is then unknown here
                cands: list[tuple[str, str | None]] = [(_finish_escape(node.pkey.pending), None)]
            else:
                required = [k for k in s.get("required", []) if isinstance(k, str)] \
                    if isinstance(s.get("required"), list) else []
                names = list(dict.fromkeys([*required, *props]))  # a missing required name first
                cands = [(_json_chars(k[len(node.pkey.chars):]), k) for k in names
                         if k not in used and k.startswith(node.pkey.chars)]
                if node.pkey.chars not in used:
                    cands.append(("", node.pkey.chars))
            for rest, name in cands[:PER_LEVEL]:
                key = name if name is not None else None
                for v in self.examples(value_schema(key) if key is not None else True, resolver, depth + 1)[:2]:
                    opens.append((rest + '":' + json.dumps(v, ensure_ascii=False), key))
        elif node.key is not None:
            sub = value_schema(node.key)
            if not node.colon:
                for v in self.examples(sub, resolver, depth + 1)[:3]:
                    opens.append((":" + json.dumps(v, ensure_ascii=False), node.key))
            else:
                for suf in itertools.islice(self._suffixes(node.tail, sub, resolver, depth + 1), PER_LEVEL):
                    opens.append((suf, node.key))
        else:
            opens.append(("", None))
        for suf, name in opens:
            have = used | ({name} if name else set())
            need = [k for k in s.get("required", []) if isinstance(k, str) and k not in have] \
                if isinstance(s.get("required"), list) else []
            deps = s.get("dependentRequired") if isinstance(s.get("dependentRequired"), dict) else {}
            if isinstance(s.get("dependencies"), dict):
                deps = {**deps, **{k: v for k, v in s["dependencies"].items() if isinstance(v, list)}}
            for k in list(have):
                need += [d for d in deps.get(k, []) if isinstance(d, str) and d not in have and d not in need]
            mn = s.get("minProperties") if isinstance(s.get("minProperties"), int) else 0
            for k in props:
                if len(have) + len(need) >= mn:
                    break
                if k not in have and k not in need:
                    need.append(k)
            if node.need_member and not need:
                spare = [k for k in props if k not in have]
                need = spare[:1] or [_fresh_name(have)]
            sep = bool(node.members) or node.pkey is not None or node.key is not None
            parts = []
            for k in need:
                parts.append(("," if sep else "") + json.dumps(k, ensure_ascii=False) + ":" +
                             json.dumps(self._first_example(value_schema(k), resolver, depth + 1), ensure_ascii=False))
                sep = True
            if node.need_member and parts:
                parts[0] = parts[0].lstrip(",")
            yield suf + "".join(parts) + "}"


def toward(node: Any, v: Any) -> str | None:
    """A completion of ``node`` to exactly the value ``v`` (None where this does not construct one)."""
    dumps = lambda x: json.dumps(x, ensure_ascii=False)  # noqa: E731
    if isinstance(node, Complete):
        return "" if json_equal(node.value, v) else None
    if isinstance(node, PEmpty):
        return dumps(v)
    if isinstance(node, PLiteral):
        return next(w for w in LITERALS if w.startswith(node.text))[len(node.text):]
    if isinstance(node, PNumber):
        t = dumps(v)
        return t[len(node.text):] if t.startswith(node.text) else None
    if isinstance(node, PString):
        return None if node.pending or not v.startswith(node.chars) else _json_chars(v[len(node.chars):]) + '"'
    if isinstance(node, PArray):
        n = len(node.items)
        head = "" if node.tail is None else toward(node.tail, v[n])
        if head is None:
            return None
        done = n + (node.tail is not None)
        more = [("," if done or j else "") + dumps(x) for j, x in enumerate(v[done:])]
        return head + "".join(more) + "]"
    if isinstance(node, PObject):
        have = {k for k, _ in node.members}
        head, name = "", None
        if node.pkey is not None:
            if node.pkey.pending:
                return None
            name = next((k for k in v if k not in have and k.startswith(node.pkey.chars)), None)
            if name is None:
                return None
            head = _json_chars(name[len(node.pkey.chars):]) + '":' + dumps(v[name])
        elif node.key is not None:
            name = node.key
            inner = (":" + dumps(v[name])) if not node.colon else toward(node.tail, v[name])
            if inner is None:
                return None
            head = inner
        have |= {name} if name is not None else set()
        sep = bool(node.members) or name is not None
        rest = []
        for k in v:
            if k not in have:
                rest.append(("," if sep and not (node.need_member and not rest) else "") + dumps(k) + ":" + dumps(v[k]))
                sep = True
        return head + "".join(rest) + "}"
    return None


# ---- small helpers --------------------------------------------------------------------------------
def _merge(a: dict, b: dict) -> dict:
    """A shallow conjunction of two schema views (properties and required combined)."""
    out = dict(a)
    for k, v in b.items():
        if k == "properties" and isinstance(out.get(k), dict) and isinstance(v, dict):
            out[k] = {**out[k], **v}
        elif k == "required" and isinstance(out.get(k), list) and isinstance(v, list):
            out[k] = out[k] + [x for x in v if x not in out[k]]
        elif k not in out:
            out[k] = v
    return out


def _json_chars(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)[1:-1]


def _fresh_name(used: set[str]) -> str:
    return next(f"x{i}" for i in itertools.count() if f"x{i}" not in used)


def _finish_escape(pending: str) -> str:
    """Text that completes an escape sequence cut at the end ("\\" -> "\\n", "\\u00" -> "\\u0041")."""
    if pending == "\\":
        return "n"
    digits = pending[2:]
    if 0xD8 <= int((digits + "00")[:2], 16) <= 0xDB and len(digits) >= 2:
        return "0" * (4 - len(digits)) + "\\udc00"  # a high surrogate: pair it
    target = "0041"
    return target[len(digits):] if target.startswith(digits) else "0" * (4 - len(digits))


def _string_examples(s: dict) -> list[str]:
    mn = s.get("minLength") if isinstance(s.get("minLength"), int) else 0
    return ["a" * mn, "x" * max(mn, 1)]


def _number_examples(s: dict, integer: bool) -> list[float]:
    def num(k: str) -> float | None:
        v = s.get(k)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    lo, hi, xlo, xhi, mult = num("minimum"), num("maximum"), num("exclusiveMinimum"), num("exclusiveMaximum"), \
        num("multipleOf")
    if s.get("exclusiveMinimum") is True and lo is not None:  # draft 4
        xlo, lo = lo, None
    if s.get("exclusiveMaximum") is True and hi is not None:
        xhi, hi = hi, None
    cands: list[float] = [0, 1]
    for b in (lo, hi):
        if b is not None:
            cands.append(b)
    if xlo is not None:
        cands.append(math.floor(xlo) + 1 if integer else xlo + (1 if xhi is None or xhi - xlo > 1 else (xhi - xlo) / 2))
    if xhi is not None:
        cands.append(math.ceil(xhi) - 1 if integer else xhi - (1 if xlo is None or xhi - xlo > 1 else (xhi - xlo) / 2))
    if lo is not None and hi is not None:
        cands.append((lo + hi) / 2)
    if mult:
        base = lo if lo is not None else xlo if xlo is not None else 0
        cands.append(math.ceil(base / mult) * mult)
    out = []
    for c in cands:
        if integer or (isinstance(c, float) and c.is_integer() and abs(c) < 2 ** 53):
            c = int(math.ceil(c)) if integer else int(c)
        if c not in out:
            out.append(c)
    return out


def _number_suffixes(text: str, s: dict) -> Iterator[str]:
    targets = [""]
    for v in (s.get("const"), *(s.get("enum") or []), *(_number_examples(s, integer=s.get("type") == "integer"))):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            t = json.dumps(v)
            if t.startswith(text):
                targets.append(t[len(text):])
    targets += ["0", "e-400", ".5", "e3", "1", "5", "00", "000", "e0", "e1", "e2", "e-1", "e-3", "0e0", "1e0"]
    for suf in targets:
        if NUMBER.fullmatch(text + suf):
            yield suf


def _string_suffixes(node: PString, s: dict) -> Iterator[str]:
    esc = ""
    chars = node.chars
    if node.pending:
        esc = _finish_escape(node.pending)
        try:
            chars += json.loads('"' + node.pending + esc + '"')
        except ValueError:
            return
    targets: list[str] = []
    for v in (s.get("const"), *(s.get("enum") or []), s.get("default"), *(s.get("examples") or [])):
        if isinstance(v, str) and v.startswith(chars):
            targets.append(v)
    mn = s.get("minLength") if isinstance(s.get("minLength"), int) else 0
    targets.append(chars)
    if len(chars) < mn:
        targets.append(chars + "a" * (mn - len(chars)))
    if isinstance(s.get("pattern"), str):
        targets += pattern_completions(s["pattern"], chars, mn, s.get("maxLength"))
    for fill in ("a", "0", "A", " ", "aaaa", "0000", "a0"):
        targets.append(chars + fill * max(1, mn - len(chars)) if mn > len(chars) else chars + fill)
    for t in targets:
        yield esc + _json_chars(t[len(chars):]) + '"'


_UNSAFE_PATTERN = re.compile(r"\(\?<?[=!]|\\[bBZ1-9]|\(\?P=|\(\?[a-zA-Z]*m|\|")


def pattern_prefix_possible(pattern: str, chars: str) -> bool:
    """False only when no string starting with ``chars`` can match ``pattern`` (``re.search``, as
    jsonschema matches it). Search semantics means an extension can always append a match, so only
    a pattern anchored at the start (``^``/``\\A``) without alternation, lookaround, backreferences,
    word boundaries or multiline mode is checked, by a partial match of the ``regex`` module on
    printable ASCII text (where ``re`` and ``regex`` agree on character classes)."""
    if not (pattern.startswith("^") or pattern.startswith("\\A")) or _UNSAFE_PATTERN.search(pattern):
        return True
    if not all(" " <= c <= "~" for c in chars):
        return True
    try:
        import regex
        re.compile(pattern)
        compiled = regex.compile(pattern)
    except Exception:  # noqa: BLE001 - a pattern either engine rejects: not refuted here
        return True
    return compiled.match(chars, partial=True) is not None


def pattern_completions(pattern: str, chars: str, min_length: int = 0, max_length: Any = None,
                        budget: int = 3000) -> list[str]:
    """Up to two strings starting with ``chars`` that ``re.search(pattern)`` matches, found by a
    breadth-first search over a small alphabet (printable characters of the pattern and a few
    others), pruned by the ``regex`` module's partial matching. Heuristic: candidates only."""
    try:
        import regex
        compiled = regex.compile(pattern)
        final = re.compile(pattern)
    except Exception:  # noqa: BLE001
        return []
    alphabet = sorted(set("a0A -_.@/:") | {c for c in pattern if " " <= c <= "~" and c not in "\\^$|()[]{}*+?"})
    cap = max_length if isinstance(max_length, int) and not isinstance(max_length, bool) else len(chars) + 40
    found: list[str] = []
    level, calls = [chars], 0
    while level and calls < budget and len(found) < 2:
        nxt: list[str] = []
        for text in level:
            if len(text) >= min_length and final.search(text) and text not in found:
                found.append(text)
                if len(found) == 2:
                    break
            if len(text) >= cap:
                continue
            for c in alphabet:
                calls += 1
                if compiled.search(text + c, partial=True) is not None:
                    nxt.append(text + c)
                if len(nxt) >= 64 or calls >= budget:
                    break
            if len(nxt) >= 64 or calls >= budget:
                break
        level = nxt
    return found
