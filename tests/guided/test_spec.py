import json

import pytest
from pydantic import BaseModel

from tokenrails import GuideSpec, InvalidGuideError
from tokenrails.requests import spec_from_request


class Person(BaseModel):
    name: str
    age: int


def test_equal_requests_have_equal_keys():
    a = GuideSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    b = GuideSpec.json_schema('{"properties": {"a": {"type": "integer"}}, "type": "object"}')
    assert a.key == b.key and a == b


def test_different_options_change_the_key():
    s = {"type": "string"}
    assert GuideSpec.json_schema(s).key != GuideSpec.json_schema(s, any_whitespace=False).key
    assert GuideSpec.regex("a").key != GuideSpec.choice(["a"]).key


def test_pydantic_model_is_accepted():
    spec = GuideSpec.json_schema(Person)
    assert spec.schema["required"] == ["name", "age"]
    assert spec.key == GuideSpec.json_schema(Person.model_json_schema()).key


def test_choice_keeps_order_and_rejects_empty():
    assert GuideSpec.choice(["b", "a"]).choices == ["b", "a"]
    with pytest.raises(InvalidGuideError):
        GuideSpec.choice([])
    with pytest.raises(InvalidGuideError):
        GuideSpec.choice("abc")


@pytest.mark.parametrize("bad", ["{not json", "[1, 2]", 42])
def test_bad_schemas_raise_invalid(bad):
    with pytest.raises(InvalidGuideError):
        GuideSpec.json_schema(bad)


def test_from_request_openai_and_lmdeploy_shapes():
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    assert spec_from_request({"type": "text"}) is None
    assert spec_from_request(None) is None
    a = spec_from_request({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}})
    assert a.key == GuideSpec.json_schema(schema).key
    assert spec_from_request({"type": "json_object"}).key == GuideSpec.json_object().key
    r = spec_from_request({"type": "regex_schema", "regex_schema": "[a-z]+"})
    assert r.key == GuideSpec.regex("[a-z]+").key
    tag = {"type": "structural_tag", "structures": [{"begin": "<f>", "schema": schema, "end": "</f>"}], "triggers": ["<f>"]}
    assert spec_from_request(tag).kind == "structural_tag"
    assert spec_from_request(json.dumps({"type": "json_object"})).kind == "json_object"
    with pytest.raises(InvalidGuideError):
        spec_from_request({"type": "json_schema"})
    with pytest.raises(InvalidGuideError):
        spec_from_request({"type": "yaml"})


def test_property_order_is_kept_because_it_decides_output_order():
    a = GuideSpec.json_schema({"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "string"}}})
    b = GuideSpec.json_schema({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}})
    assert list(a.schema["properties"]) == ["b", "a"]
    assert a.key != b.key
    # a property literally named "properties" keeps its own subschema canonical
    c = GuideSpec.json_schema({"properties": {"properties": {"type": "object", "properties": {"y": {}, "x": {}}}}})
    assert list(c.schema["properties"]["properties"]["properties"]) == ["y", "x"]


# ---- key recipe, choice normalization and errors, checked against independent oracles --------
import copy
import dataclasses
import hashlib
import pickle

from hypothesis import given, settings
from hypothesis import strategies as st


def recipe_key(spec: GuideSpec) -> str:
    """The documented key: kind + ':' + sha256(canonical JSON of [kind, payload, options])[:32].

    Constructors only put strings and scalars in ``payload``/``options``, so canonical JSON is
    plain compact ``json.dumps`` here (no maps to sort)."""
    text = json.dumps([spec.kind, spec.payload, [list(p) for p in spec.options]],
                      separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return f"{spec.kind}:{hashlib.sha256(text.encode('utf-8')).hexdigest()[:32]}"


def reference_choice(options):
    """``GuideSpec.choice`` as specified: (payload, strings) or the InvalidGuideError message."""
    if isinstance(options, (str, bytes)) or not hasattr(type(options), "__iter__"):
        return "choice needs a list of strings"
    values = [o if isinstance(o, str) else str(o) for o in options]
    if not values:
        return "choice list is empty"
    text = json.dumps(values, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"value is not JSON-serializable: {exc}"
    return text, [str.__str__(v) for v in values]


def outcome(options):
    try:
        spec = GuideSpec.choice(options)
    except InvalidGuideError as exc:
        return str(exc)
    assert spec.kind == "choice" and spec.options == ()
    return spec.payload, spec.choices


SPECS = [
    lambda: GuideSpec.regex(r"\d{4}-\d{2}-\d{2}"),
    lambda: GuideSpec.regex('a"b\\c\u00e9\u2028\x00'),
    lambda: GuideSpec.choice(["apple", "banana", 'say "hi"', "back\\slash", "tab\t", "\u00fc\u00df", "", "\U0001f600"]),
    lambda: GuideSpec.choice(["x", 1, None, 2.5]),
    lambda: GuideSpec.json_schema({"type": "object", "properties": {"b": {}, "a": {}}}, whitespace_pattern=r"[ ]?"),
    lambda: GuideSpec.json_schema({"type": "string"}, any_whitespace=False),
    lambda: GuideSpec.json_object(),
    lambda: GuideSpec.grammar('root ::= "a"'),
    lambda: GuideSpec.structural_tag({"type": "structural_tag", "structures": [], "triggers": ["<f>"]}),
    lambda: GuideSpec("regex", "a+", (("flag", True), ("n", 3), ("none", None), ("s", "\u00e9"))),
]


@pytest.mark.parametrize("make", SPECS)
def test_key_follows_the_documented_recipe(make):
    spec = make()
    assert spec.key == recipe_key(spec)
    assert make().key == spec.key and make() == spec and hash(make()) == hash(spec)


@pytest.mark.parametrize("make", SPECS)
def test_pickle_copy_and_replace_keep_spec_identity(make):
    fresh, used = make(), make()
    _ = used.key, used.choices if used.kind == "choice" else None  # fill the lazy caches
    for spec in (fresh, used):
        for clone in (pickle.loads(pickle.dumps(spec)), copy.copy(spec), copy.deepcopy(spec)):
            assert clone == spec and hash(clone) == hash(spec) and clone.key == recipe_key(spec)
            if spec.kind == "choice":
                assert clone.choices == json.loads(spec.payload)
    changed = dataclasses.replace(used, payload=used.payload + " ")
    assert changed.key == recipe_key(changed) != used.key
    assert [f.name for f in dataclasses.fields(GuideSpec)] == ["kind", "payload", "options"]


@pytest.mark.parametrize("options", [
    "abc", b"abc", 42, None, 3.5, [], (), iter([]), (x for x in []), {},
    ["a", "b"], ("a", "b"), iter(["a", "b"]), (x for x in ["a", 7]), {"k": 1, "j": 2}, ["a", 1, None, 2.5, True],
    ['q"uote', "back\\slash", "ctl\x01\x1f", "nl\n", "\u00e9\u4e2d\U0001f600", "del\x7f", ""],
    ["ok", "lone \ud800 surrogate"], ("\udfff",), [1, "\ud800"], ['a","b', "c"], ['","'], ["", ""],
])
def test_choice_normalization_and_errors_match_the_reference(options):
    if hasattr(options, "__next__"):  # an iterator: give each side its own copy
        items = list(options)
        assert outcome(iter(items)) == reference_choice(iter(items))
    else:
        assert outcome(options) == reference_choice(options)


class Tagged(str):
    """A str subclass: encoded by its content, returned by ``choices`` as a plain str."""

    def __str__(self):
        return "not this"


def test_choice_of_str_subclasses_equals_the_plain_strings():
    plain = GuideSpec.choice(["a", "b"])
    for options in ([Tagged("a"), "b"], (Tagged("a"), Tagged("b"))):
        spec = GuideSpec.choice(options)
        assert spec == plain and spec.key == plain.key
        assert spec.choices == ["a", "b"] and all(type(c) is str for c in spec.choices)


def test_choices_is_a_fresh_list_each_call():
    spec = GuideSpec.choice(["a", "b"])
    spec.choices.append("c")
    spec.choices[0] = "z"
    assert spec.choices == ["a", "b"]
    hand = GuideSpec("choice", '["a","b"]')  # built without the constructor: parsed from the payload
    assert hand == spec and hand.choices == ["a", "b"] and hand.key == spec.key
    odd = GuideSpec("choice", '[{"x":1}]')  # not strings: parsed every call, never shared
    odd.choices[0]["x"] = 2
    assert odd.choices == [{"x": 1}]


def test_unencodable_direct_construction_still_fails_at_construction():
    with pytest.raises(InvalidGuideError, match="not JSON-serializable"):
        GuideSpec.regex("a\ud800")
    with pytest.raises(InvalidGuideError, match="not JSON-serializable"):
        GuideSpec("regex", "a", (("x", object()),))
    with pytest.raises(InvalidGuideError, match="not JSON-serializable"):
        GuideSpec("regex", "a", (("x", float("nan")),))
    with pytest.raises(InvalidGuideError, match="not JSON-serializable"):
        GuideSpec("regex", "a", (("x", "\udc80"),))
    with pytest.raises(InvalidGuideError, match="unknown guide kind"):
        GuideSpec("yaml", "a")
    # a non-str payload or non-scalar options take the general path, and still get the recipe key
    spec = GuideSpec("regex", "a", (("nested", ("x", 1)),))
    text = json.dumps(["regex", "a", [["nested", ["x", 1]]]], separators=(",", ":"), ensure_ascii=False)
    assert spec.key == f"regex:{hashlib.sha256(text.encode()).hexdigest()[:32]}"


chars = st.characters(codec=None, categories=None) | st.sampled_from(['"', "\\", "\x00", "\x1f", "\ud800", ","])
items = st.text(chars, max_size=8) | st.integers() | st.none() | st.booleans()


@settings(max_examples=300, deadline=None)
@given(options=st.lists(items, max_size=8), as_tuple=st.booleans())
def test_choice_matches_the_reference_on_random_lists(options, as_tuple):
    options = tuple(options) if as_tuple else options
    got, want = outcome(options), reference_choice(options)
    assert got == want
    if isinstance(want, tuple):
        spec = GuideSpec.choice(options)
        assert spec.key == recipe_key(spec) == GuideSpec.choice(iter(options)).key
