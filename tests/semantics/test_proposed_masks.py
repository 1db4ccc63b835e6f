"""Verification of a proposed forced run reuses the proposer's masks and equals a fresh fill.

A grammar proposer (``forced_tokens(propose=True)``) fills the mask at the positions of its run
where it must to know what is forced; the verification of those drafts from the same state must give
exactly the masks a fresh walk fills at positions 0..len(run) (one-hot where one token was
allowed, the copied row where it filled one that allowed several, a fill of its own where the
proposer knew the answer without a mask), with fewer fills; positions past
the run (fillers, which the engine cuts) are left unmasked. Oracle: the same ``fill_and_apply_spec``
without a proposal noted.
"""
import pytest
import torch

from tokenrails import GuideSpec
from tokenrails.guided import sequence
from tokenrails.guided.jump_forward import text_encoder
from tokenrails.guided.manager import GuidedRow

from .helpers import BACKENDS, RECORD_REGEX, make_manager, worst_step

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "kind": {"enum": ["alpha", "beta"]}, "n": {"type": "integer"}},
          "required": ["name", "kind", "n"], "additionalProperties": False}


def _verify(mgr, vocab, row, drafts):
    logits = torch.zeros((len(drafts) + 1, vocab.vocab_size))
    (status,) = mgr.fill_and_apply_spec(logits, [row], [drafts])
    return torch.isfinite(logits), status


@pytest.mark.parametrize("backend", BACKENDS)
def test_proposed_run_verifies_with_the_same_masks_and_fewer_fills(vocab, smollm2_tokenizer, backend, monkeypatch):
    specs = [GuideSpec.regex(RECORD_REGEX)]
    if backend == "xgrammar":
        specs.append(GuideSpec.json_schema(SCHEMA))
    fills = [0]
    real_fill = sequence.SequenceState.fill

    def counting(self, *args, **kwargs):
        fills[0] += 1
        return real_fill(self, *args, **kwargs)

    monkeypatch.setattr(sequence.SequenceState, "fill", counting)
    mgr = make_manager(vocab, backend)
    encode = text_encoder(smollm2_tokenizer)
    fresh = reused = forced = verified = 0
    for n, spec in enumerate(specs):
        for seed in range(3):
            row = GuidedRow(("proposed", n, seed), 0, spec)
            gen = torch.Generator().manual_seed(seed)
            for _ in range(80):
                mgr.fill_and_apply(torch.zeros((1, vocab.vocab_size)), [row])  # the row's state exists
                st = mgr.sequence(row.session_id, 0)
                for k in (1, 4):
                    run = mgr.forced_tokens(row, k, encode=encode)
                    forced += len(run.tokens)
                    n = len(run.tokens)
                    # the engine's block: the row's last token as filler past its run, up to width k
                    drafts = list(run.tokens) + [st.history[-1] if st.history else 0] * (k - n)
                    fills[0] = 0
                    ref, ref_status = _verify(mgr, vocab, row, drafts)
                    fresh += fills[0]
                    assert mgr.forced_tokens(row, k, encode=encode, propose=True) == run
                    fills[0] = 0
                    got, status = _verify(mgr, vocab, row, drafts)
                    reused += fills[0]
                    verified += 1
                    assert torch.equal(got[: n + 1], ref[: n + 1]), (k, drafts)
                    assert bool(got[n + 1:].all())  # past the run: cut by the engine, left unmasked
                    assert status.valid_drafts == n <= ref_status.valid_drafts
                    assert status.error is None and ref_status.error is None
                    # a proposal is verified once: the next verification fills afresh
                    fills[0] = 0
                    again, _ = _verify(mgr, vocab, row, drafts)
                    assert torch.equal(again, ref) and fills[0] >= 1
                if worst_step(mgr, vocab, row, gen).failed or st.resolve().is_terminated():
                    break
    assert forced > 0
    # at most the run's own positions (1 + len(run)), against every position (1 + k) fresh
    assert reused <= verified + forced < fresh, (reused, verified, forced, fresh)


def test_a_stale_proposal_is_not_reused(vocab, smollm2_tokenizer):
    """Once the row accepted a token, the proposal made before it is never read."""
    mgr = make_manager(vocab, "xgrammar")
    encode = text_encoder(smollm2_tokenizer)
    row = GuidedRow(("stale",), 0, GuideSpec.json_schema(SCHEMA))
    mgr.fill_and_apply(torch.zeros((1, vocab.vocab_size)), [row])
    old = mgr.forced_tokens(row, 4, encode=encode, propose=True)
    assert old.tokens  # '{"name":"' is forced
    mgr.accept_tokens([old.tokens[0]], [row])
    drafts = list(old.tokens)  # the same drafts, one token later: the masks they saw no longer apply
    got, status = _verify(mgr, vocab, row, drafts)
    plain = make_manager(vocab, "xgrammar")
    plain.fill_and_apply(torch.zeros((1, vocab.vocab_size)), [row])
    plain.accept_tokens([old.tokens[0]], [row])
    ref, _ = _verify(plain, vocab, row, drafts)
    assert torch.equal(got, ref)
    assert status.valid_drafts < len(drafts)
