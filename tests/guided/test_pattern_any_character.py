"""``[\\s\\S]`` (and ``[\\d\\D]``, ``[\\w\\W]``) inside a schema ``pattern``: served and exact.

The classic ECMA-262 "any character" idiom has a negated shorthand inside a class; the policy
spells the complement out, so every JSON-Schema backend reads it. Oracles: jsonschema, and the
matcher's own acceptance of hand-written JSON texts.
"""
import json

import jsonschema
import pytest

from tokenrails import GuideSpec, UnsupportedGuideError, compile_guide

from .helpers import adversarial_decode, decode_text

PATTERNS = [r"^[\s\S]{1,12}$", r"^a[\s\S]*$", r"^[\S\s]+$", r"^[\w\W]{2,}$", r"^[\d\D]+b$"]


def _accepts(guide, vocab, tok, text: str) -> bool:
    m = guide.matcher()
    ids = tok.encode(text, add_special_tokens=False)
    return all(m.accept_token(i) for i in ids) and m.accept_token(next(iter(vocab.eos_ids)))


@pytest.mark.parametrize("backend", ["auto", "llguidance"])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_any_character_pattern_is_served_and_outputs_validate(vocab, backend, pattern):
    schema = {"type": "string", "pattern": pattern}
    guide = compile_guide(GuideSpec.json_schema(schema), vocab, backend=backend)
    for seed in range(3):
        ids, ended = adversarial_decode(guide.matcher(), vocab, seed=seed, max_steps=80, worst=seed != 1)
        if ended:
            jsonschema.validate(json.loads(decode_text(vocab, ids)), schema)


@pytest.mark.parametrize("backend", ["auto", "llguidance", "xgrammar"])
def test_any_character_accepts_escapes_and_refuses_raw_controls(vocab, smollm2_tokenizer, backend):
    """What a backend serves is exact: escaped newline/quote accepted, raw control characters
    never (they are invalid JSON). xgrammar admits them raw, so it must refuse (typed)."""
    schema = {"type": "string", "pattern": r"^[\s\S]{1,6}$"}
    try:
        guide = compile_guide(GuideSpec.json_schema(schema), vocab, backend=backend)
    except UnsupportedGuideError:
        assert backend == "xgrammar"
        return
    for text in ['"a\\nb"', '"a\\"b"', '"\\\\"', '"é\\t"']:
        jsonschema.validate(json.loads(text), schema)
        assert _accepts(guide, vocab, smollm2_tokenizer, text), text
    for text in ['"a\nb"', '"a\x01"', '"\t"']:
        assert not _accepts(guide, vocab, smollm2_tokenizer, text), repr(text)


@pytest.mark.parametrize("pattern", [r"^\t$", r'^["\\]$', r"^a\sb$"])
def test_xgrammar_never_admits_raw_controls_from_a_pattern(vocab, smollm2_tokenizer, pattern):
    """A pattern naming a control character, quote or backslash: xgrammar 0.2.8 put it into the
    JSON string raw (invalid JSON); it is refused there and auto serves it exactly elsewhere."""
    schema = {"type": "string", "pattern": pattern}
    with pytest.raises(UnsupportedGuideError):
        compile_guide(GuideSpec.json_schema(schema), vocab, backend="xgrammar")
    guide = compile_guide(GuideSpec.json_schema(schema), vocab, backend="auto")
    for text in ['"\t"', '"""', '"\\"', '"a\nb"']:
        assert not _accepts(guide, vocab, smollm2_tokenizer, text), repr(text)


def _tag(pattern: str) -> dict:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}, "required": ["s"]}
    return {"type": "structural_tag", "format": {"type": "tag", "begin": "<f>", "end": "</f>",
                                                 "content": {"type": "json_schema", "json_schema": schema}}}


def test_structural_tag_patterns_use_xgrammars_own_safe_classes(vocab, smollm2_tokenizer):
    """Inside a structural tag (xgrammar's alone) a pattern is read by xgrammar itself, whose
    ``\\s`` / ``[\\s\\S]`` never admit a raw control character: served; a pattern naming one
    explicitly (``\\t``) would be emitted raw: refused with the reason."""
    guide = compile_guide(GuideSpec.structural_tag(_tag(r"^[\s\S]{1,6}$")), vocab, backend="auto")
    assert _accepts(guide, vocab, smollm2_tokenizer, '<f>{"s": "a b"}</f>')
    for raw in ("a\tb", "a\nb", "\x01"):
        assert not _accepts(guide, vocab, smollm2_tokenizer, '<f>{"s": "' + raw + '"}</f>'), repr(raw)
    with pytest.raises(UnsupportedGuideError):
        compile_guide(GuideSpec.structural_tag(_tag(r"^a\tb$")), vocab, backend="auto")
