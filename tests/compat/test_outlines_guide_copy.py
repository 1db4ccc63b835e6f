"""A guide's copy goes on from a state id its original handed out (outlines' 0.x loop copies each
row's guide mid-walk in ``reorder_fsms``). Found by bench/outlines_doc_examples.py: a batch of
0.0.46 ``generate.choice(model, ["URGENT", "STANDARD"])`` stopped after one token ("ST")."""
from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from tokenrails.compat.outlines.fsm.guide import TokenrailsGuide
from tokenrails.compat.outlines.models.transformer_tokenizer import TransformerTokenizer
from tokenrails.guided.spec import GuideSpec

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "smollm2"


def test_copy_continues_from_the_originals_state_ids():
    hf = AutoTokenizer.from_pretrained(str(FIXTURE))
    guide = TokenrailsGuide.from_spec(GuideSpec.choice(["URGENT", "STANDARD"]), TransformerTokenizer(hf))
    tokens = hf("STANDARD", add_special_tokens=False)["input_ids"]
    assert len(tokens) > 1
    state = guide.get_next_state(guide.initial_state if hasattr(guide, "initial_state") else 0, tokens[0])
    assert state >= 0 and not guide.is_final_state(state)
    copy = guide.copy()
    for token in tokens[1:]:
        state = copy.get_next_state(state, token)
        assert state >= 0, "the copy did not know the original's state"
    assert copy.is_final_state(state)
