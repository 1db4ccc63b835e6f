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
