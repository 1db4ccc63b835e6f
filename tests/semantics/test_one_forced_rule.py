"""One forced-token rule: jump-forward and the grammar-draft proposer read the same forced run.

``forced.forced_tokens`` decides which tokens the grammar forces; ``compute_jump_forward`` takes
that run's text and only retokenizes it with the sequence's last tokens. On the same states the
two must agree: the jump's text is the run's text, and without rollback the jump appends the
run's tokens (all but the last one, which is left to the model, unless they end the output).
"""
import pytest
import torch

from tokenrails import GuideSpec
from tokenrails.guided.jump_forward import compute_jump_forward, text_encoder
from tokenrails.guided.manager import GuidedRow

from .helpers import BACKENDS, RECORD_REGEX, make_manager, text_of, worst_step


@pytest.mark.parametrize("backend", BACKENDS)
def test_jump_forward_and_drafts_agree(vocab, smollm2_tokenizer, backend):
    mgr = make_manager(vocab, backend)
    encode = text_encoder(smollm2_tokenizer)
    spec = GuideSpec.regex(RECORD_REGEX)
    jumped = 0
    for seed in range(4):
        sid = ("one-rule", seed)
        row = GuidedRow(sid, 0, spec)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(120):
            mgr.fill_and_apply(torch.zeros((1, vocab.vocab_size)), [row])  # the row's state exists
            run = mgr.forced_tokens(row, 256, encode=encode)
            st = mgr.sequence(sid, 0)
            before = list(st.history)
            jf = compute_jump_forward(st, vocab, encode, max_rollback=0)
            assert list(st.history) == before  # a peek
            run_text = text_of(vocab, run.tokens)
            assert jf.text == run_text or (not run.tokens and jf.token_ids is None)
            if jf.token_ids:
                jumped += 1
                n = len(jf.token_ids)
                assert jf.rollback_tokens == 0 and tuple(run.tokens[:n]) == jf.token_ids
                assert n in (len(run.tokens) - 1, len(run.tokens))
            worst_step(mgr, vocab, row, gen)
            if st.error is not None or st.resolve().is_terminated():
                break
    assert jumped > 0
