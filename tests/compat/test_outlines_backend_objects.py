"""outlines 1.x's backend classes built from the libraries' own objects (an
``xgrammar.CompiledGrammar``, an ``llguidance`` grammar and ``LLTokenizer``), driven with random
logits and checked with ``re.fullmatch``; plus the backends' model check and refusals."""
from __future__ import annotations

import re

import pytest
import torch

from tokenrails.compat.outlines.backends.llguidance import LLGuidanceBackend, LLGuidanceLogitsProcessor
from tokenrails.compat.outlines.backends.xgrammar import XGrammarBackend, XGrammarLogitsProcessor
from tokenrails.compat.outlines.models.transformers import TransformerTokenizer
from tokenrails.guided.errors import UnsupportedGuideError

REGEX = r"[0-9]{3}-[a-c]{2}"


class _Model:
    """The parts of an outlines 1.x Transformers model a backend reads."""

    tensor_library_name = "torch"

    def __init__(self, hf_tokenizer):
        self.hf_tokenizer = hf_tokenizer
        self.tokenizer = TransformerTokenizer(hf_tokenizer)


@pytest.fixture(scope="module")
def model(smollm2_tokenizer):
    return _Model(smollm2_tokenizer)


def _generate(processor, hf_tokenizer, seed: int, steps: int = 16) -> str:
    """Random logits, greedy pick of the masked row, until EOS (outlines' own test harness shape)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = len(hf_tokenizer)
    ids = torch.randint(0, vocab, (1, 5), generator=gen)
    out = []
    for _ in range(steps):
        logits = processor(ids, torch.randn((1, vocab), generator=gen))
        token = int(torch.argmax(logits, dim=-1))
        if token == hf_tokenizer.eos_token_id:
            break
        out.append(token)
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return hf_tokenizer.decode(out)


@pytest.mark.parametrize("seed", range(3))
def test_xgrammar_processor_from_a_compiled_grammar(model, seed):
    backend = XGrammarBackend(model)
    compiled = backend.grammar_compiler.compile_regex(REGEX)
    text = _generate(XGrammarLogitsProcessor(compiled, "torch"), model.hf_tokenizer, seed)
    assert re.fullmatch(REGEX, text), text


def test_processors_from_compiled_grammars_share_one_vocabulary_and_mask_like_xgrammar(model):
    """Per-request processors over compiled grammars reuse the vocabulary read back from
    xgrammar (same grammar: remembered on it; same TokenizerInfo content: by digest), and the
    first mask equals xgrammar's own matcher's, bit for bit."""
    import xgrammar as xgr

    compiler = XGrammarBackend(model).grammar_compiler
    a, b = compiler.compile_regex(REGEX), compiler.compile_regex("[a-c]+")
    procs = [XGrammarLogitsProcessor(g, "torch") for g in (a, a, b)]
    assert procs[0].guide.vocabulary_ is procs[1].guide.vocabulary_ is procs[2].guide.vocabulary_
    vocab = len(model.hf_tokenizer)
    for grammar, proc in ((a, procs[0]), (b, procs[2])):
        logits = proc(torch.tensor([[1, 2, 3]]), torch.zeros((1, vocab)))
        bitmask = xgr.allocate_token_bitmask(1, vocab)
        xgr.GrammarMatcher(grammar).fill_next_token_bitmask(bitmask)
        expected = torch.zeros((1, vocab))
        xgr.apply_token_bitmask_inplace(expected, bitmask)
        assert torch.equal(torch.isinf(logits), torch.isinf(expected))


@pytest.mark.parametrize("seed", range(3))
def test_llguidance_processor_from_a_grammar_and_tokenizer(model, seed):
    import llguidance
    import llguidance.hf

    grammar = llguidance.grammar_from("regex", REGEX)
    ours = LLGuidanceBackend(model).llg_tokenizer
    theirs = llguidance.hf.from_tokenizer(model.hf_tokenizer)  # an LLTokenizer the shim did not make
    for llg_tokenizer in (ours, theirs):
        text = _generate(LLGuidanceLogitsProcessor(grammar, llg_tokenizer, "torch"), model.hf_tokenizer, seed)
        assert re.fullmatch(REGEX, text), text


def test_backends_check_the_model_and_refuse_what_they_cannot_enforce(model):
    with pytest.raises(ValueError, match="only supports Transformers"):
        XGrammarBackend(object())
    backend = XGrammarBackend(model)
    with pytest.raises(NotImplementedError, match="whitespace_pattern") as err:
        backend.get_json_schema_logits_processor('{"type": "object"}', whitespace_pattern=r"[ ]?")
    assert isinstance(err.value, UnsupportedGuideError)  # also tokenrails' typed refusal


@pytest.mark.parametrize("make", [lambda: XGrammarLogitsProcessor('root ::= "a"', "torch"),
                                  lambda: LLGuidanceLogitsProcessor("start: /a/", "torch")])
def test_processors_given_the_wrong_objects_say_what_they_take(make):
    """A grammar string where a compiled grammar / tokenizer goes is a clear TypeError at
    construction (it used to surface as an AttributeError at the first step)."""
    with pytest.raises(TypeError, match="takes .*tensor_library_name"):
        make()
