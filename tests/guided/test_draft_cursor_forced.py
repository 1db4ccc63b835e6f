"""``DraftCursor.forced``: the grammar's forced run from where a draft walk stands (peek only)."""
from __future__ import annotations

import json

from tokenrails import GuideSpec
from tokenrails.guided.manager import GuidedDecodingManager
from tokenrails.guided.sequence import GuidedRow

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def _enc(tok):
    return lambda s: tok.encode(s, add_special_tokens=False)


def test_forced_follows_the_walk_and_leaves_it_where_it_was(vocab, smollm2_tokenizer):
    mgr = GuidedDecodingManager(vocab)
    spec = GuideSpec.json_schema(json.dumps(PERSON), any_whitespace=False)
    row = GuidedRow("s", 0, spec)
    cur = mgr.draft_cursor(row)
    encode = _enc(smollm2_tokenizer)
    first = cur.forced(8, encode=encode)
    assert smollm2_tokenizer.decode(list(first.tokens)).startswith('{"name":')
    for t in first.tokens[:2]:  # walk two drafts: the next run starts where the walk stands
        cur.advance(t)
    again = cur.forced(8, encode=encode)
    assert again.tokens and again.tokens[: len(first.tokens) - 2] == first.tokens[2:2 + len(again.tokens)]
    assert cur.forced(8, encode=encode) == again  # peek only: asking twice changes nothing
    cur.rollback()
    assert cur.forced(8, encode=encode) == first  # the rollback is exact


def test_nothing_forced_while_thinking_nor_on_a_dead_walk(vocab, smollm2_tokenizer):
    from tokenrails.guided.reasoning import ReasoningConfig

    mgr = GuidedDecodingManager(vocab)
    spec = GuideSpec.json_schema(json.dumps(PERSON), any_whitespace=False)
    encode = _enc(smollm2_tokenizer)
    think = ReasoningConfig.from_markers("</think>", "<think>")
    cur = mgr.draft_cursor(GuidedRow("t", 0, spec, reasoning=think))
    assert cur.forced(8, encode=encode).tokens == ()
    for t in encode("hmm</think>"):
        cur.advance(t)
    after = cur.forced(8, encode=encode)
    assert smollm2_tokenizer.decode(list(after.tokens)).startswith('{"name":'), after
    cur.rollback()
    assert cur.forced(8, encode=encode).tokens == ()  # back inside the thinking section

    plain = mgr.draft_cursor(GuidedRow("p", 0, spec))
    plain.advance(encode("x")[0])  # refused by the grammar: the walk is dead
    assert plain.dead and plain.forced(8, encode=encode).tokens == ()
