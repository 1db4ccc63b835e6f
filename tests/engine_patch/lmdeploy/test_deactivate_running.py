"""``deactivate()`` while an engine built upgraded is alive: its later steps run LMDeploy's stock
code against the upgrade's manager (stock_calls.py). They must keep enforcing the constraint, from
the state the request had reached, and never kill the engine (before: ``AttributeError:
'LMDeployGuidedManager' object has no attribute 'get_processors'`` in the step)."""
from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.slow

PATTERN = r"[0-9]{3}-[a-z]{4}-[0-9]{2}"


def _gen(tokens: int):
    from lmdeploy import GenerationConfig

    return GenerationConfig(max_new_tokens=tokens, top_k=1,
                            response_format={"type": "regex_schema", "regex_schema": PATTERN})


def test_a_request_after_deactivate_on_the_upgraded_engine_is_still_enforced(pipe):
    from tokenrails.engine_patch.lmdeploy import activate, deactivate

    first = pipe(["Say hello to the world."], gen_config=[_gen(24)])[0]
    assert re.fullmatch(PATTERN, first.text), first.text
    deactivate()
    try:
        outs = pipe(["Say hello to the world.", "Write a poem about the sea."], gen_config=[_gen(24), _gen(24)])
    finally:
        activate()
    for out in outs:
        assert re.fullmatch(PATTERN, out.text), out.text
        assert out.finish_reason == "stop"


def test_a_request_running_across_deactivate_continues_from_its_state(pipe):
    from tokenrails.engine_patch.lmdeploy import activate, deactivate

    text, deactivated = "", False
    try:
        for chunk in pipe.stream_infer(["Write a poem about the sea."], gen_config=[_gen(24)]):
            text += chunk.text
            if not deactivated and text:
                deactivate()  # the remaining steps run stock code
                deactivated = True
    finally:
        activate()
    assert deactivated
    assert re.fullmatch(PATTERN, text), text


@pytest.mark.parametrize("fmt", [
    {"type": "regex_schema", "regex_schema": "([a-z]"},  # does not parse
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}},
])
def test_a_bad_format_through_the_stock_calls_fails_its_row_closed(smollm2_tokenizer, vocab, fmt):
    """The stock calls never leave a row unconstrained: a format that does not parse or compile
    gets EOS only, and the other rows of the batch keep their own masks."""
    import torch

    from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager

    def allowed(row):
        bits = (row.unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1
        return set(bits.reshape(-1)[:vocab.vocab_size].nonzero().flatten().tolist())

    mgr = LMDeployGuidedManager(smollm2_tokenizer, vocab.vocab_size, vocab=vocab)
    good = {"type": "regex_schema", "regex_schema": "[0-9]{3}"}
    ctx = [{"session_id": 1, "seq_id": 0}, {"session_id": 2, "seq_id": 0}]
    handles = mgr.get_processors(ctx, (fmt, good))
    bitmask = mgr.allocate_batched_bitmap(2)
    for i, handle in handles.items():
        mgr.fill_bitmap(handle, bitmask, i)
    assert allowed(bitmask[0]) == set(vocab.eos_ids)
    digits = allowed(bitmask[1])
    assert digits and all(smollm2_tokenizer.decode([t]).isdigit() for t in digits)
    logits = torch.zeros(2, vocab.vocab_size)
    mgr.apply_batched_bitmap(logits, bitmask)
    assert int(logits[0].argmax()) in vocab.eos_ids
