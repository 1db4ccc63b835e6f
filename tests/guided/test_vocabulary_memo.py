"""One tokenizer -> ``Vocabulary`` memo for every adapter (``shared_vocabulary``): bounded however
many tokenizers the process holds or drops."""
from __future__ import annotations

import gc
import weakref

import pytest

from tokenrails.compat.outlines._vocabulary import vocabulary_for as outlines_vocabulary
from tokenrails.engine_patch.hf.vocab import vocabulary_for as hf_vocabulary
from tokenrails.engine_patch.lmdeploy.tokenizer_vocab import build_vocabulary as lmdeploy_vocabulary
from tokenrails.guided import vocabulary as core

MEMO_SIZE = getattr(core, "MEMO_SIZE", 8)  # the bound the adapters' own memos had

ADAPTERS = {
    "outlines": outlines_vocabulary,
    "transformers": hf_vocabulary,
    "lmdeploy": lambda tok: lmdeploy_vocabulary(tok, None),
}


def tiny(n: int):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(n)} | {"</s>": n, "<unk>": n + 1}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(words, unk_token="<unk>")),
                                   eos_token="</s>", unk_token="<unk>")


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_live_tokenizers_keep_at_most_the_memo_size(adapter):
    build = ADAPTERS[adapter]
    tokenizers = [tiny(20 + k) for k in range(3 * MEMO_SIZE)]  # all alive: a weak memo alone is unbounded
    vocabs = [weakref.ref(build(tok)) for tok in tokenizers]
    gc.collect()
    kept = sum(v() is not None for v in vocabs)
    assert kept <= MEMO_SIZE, f"{adapter}: {kept} vocabularies of {len(vocabs)} kept"
    assert build(tokenizers[-1]) is vocabs[-1]()  # the most recent one is still shared


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_dropped_tokenizers_are_let_go(adapter):
    """A process loading tokenizer after tokenizer: the memo pins the last few, not every one
    (a vocabulary holds its tokenizer, so a weakly keyed memo alone would pin them all)."""
    build = ADAPTERS[adapter]
    alive = []
    for k in range(3 * MEMO_SIZE):
        tok = tiny(20 + k)
        assert build(tok) is build(tok)  # shared while it is recent
        alive.append(weakref.ref(tok))
        del tok
    gc.collect()
    kept = sum(r() is not None for r in alive)
    assert kept <= MEMO_SIZE, f"{adapter}: the memo pins {kept} of {len(alive)} tokenizers"
