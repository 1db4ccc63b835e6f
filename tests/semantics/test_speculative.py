"""Speculative decoding: per-draft masks equal one-token-at-a-time masks; exact rollback."""
import random

import pytest
import torch

from tokenrails import GuideSpec
from tokenrails.guided.manager import GuidedRow, ReasoningConfig, StepStatus

from .helpers import BACKENDS, RECORD_REGEX, allowed_set, make_manager, mask_row, reference_matcher, worst_allowed

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}, "b": {"enum": ["x", "yz"]}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


def specs_for(backend):
    out = [GuideSpec.regex(RECORD_REGEX)]
    if backend == "xgrammar":
        out.append(GuideSpec.json_schema(SCHEMA, any_whitespace=True))
    return out


def legal_path(vocab, matcher, seed, max_steps=200):
    """A full legal token path (ending with EOS) chosen adversarially from random logits."""
    gen = torch.Generator().manual_seed(seed)
    path = []
    words = (vocab.vocab_size + 31) // 32
    mask = torch.zeros((1, words), dtype=torch.int32)
    for _ in range(max_steps):
        logits = torch.randn(vocab.vocab_size, generator=gen)
        matcher.fill_next_token_bitmask(mask, 0)
        logits[~allowed_set(mask[0], vocab.vocab_size)] = -torch.inf
        t = worst_allowed(logits)
        assert matcher.accept_token(t)
        path.append(t)
        if t in vocab.eos_ids:
            break
    matcher.rollback(len(path))
    return path


def reference_rows(vocab, ref, prefix, drafts):
    """Masks of each verification position, advancing one token at a time; drafts < first
    illegal one. Positions after an illegal draft are EOS-only. Returns (rows, n_valid)."""
    eos_only = torch.zeros(vocab.vocab_size, dtype=torch.bool)
    eos_only[list(vocab.eos_ids)] = True
    for t in prefix:
        assert ref.accept_token(t)
    rows, valid, dead, advanced = [], 0, False, 0
    for j in range(len(drafts) + 1):
        if dead:
            rows.append(eos_only)
            continue
        rows.append(allowed_set(mask_row(ref, vocab), vocab.vocab_size))
        if j < len(drafts):
            if not ref.is_terminated() and ref.accept_token(drafts[j]):
                valid += 1
                advanced += 1
            else:
                dead = True
    ref.rollback(advanced + len(prefix))
    return rows, valid


def make_trial(rng, vocab, path):
    p = rng.randrange(0, len(path))
    k = rng.randrange(0, 7)
    drafts = list(path[p: p + k])
    while len(drafts) < k:  # past the end of the path: any tokens
        drafts.append(rng.randrange(vocab.vocab_size))
    if drafts and rng.random() < 0.6:  # corrupt one draft
        drafts[rng.randrange(len(drafts))] = rng.randrange(vocab.vocab_size)
    return path[:p], drafts


@pytest.mark.parametrize("backend", BACKENDS)
def test_draft_masks_equal_stepwise_masks_and_accept_prefix(vocab, backend):
    mgr = make_manager(vocab, backend)
    rng = random.Random(0)
    for si, spec in enumerate(specs_for(backend)):
        ref = reference_matcher(vocab, spec, backend)
        paths = [legal_path(vocab, ref, seed) for seed in range(4)]
        for batch in range(6):
            trials = [make_trial(rng, vocab, paths[rng.randrange(len(paths))]) for _ in range(4)]
            rows = []
            for b, (prefix, _) in enumerate(trials):
                row = GuidedRow((si, batch), b, spec)
                if prefix:
                    (acc,) = mgr.accept_tokens_spec([prefix], [row])
                    assert acc.state in (StepStatus.OK, StepStatus.TERMINATED) and acc.accepted == len(prefix)
                rows.append(row)
            rows.insert(2, None)  # an unguided row with its own drafts in the middle
            drafts = [d for _, d in trials]
            drafts.insert(2, [5, 6])
            total = sum(1 + len(d) for d in drafts)
            logits = torch.randn((total, vocab.vocab_size), generator=torch.Generator().manual_seed(batch))
            before = logits.clone()
            statuses = mgr.fill_and_apply_spec(logits, rows, drafts)
            off = 0
            for i, (row, d) in enumerate(zip(rows, drafts)):
                block = logits[off: off + 1 + len(d)]
                if row is None:
                    assert torch.equal(block.view(torch.int32), before[off: off + 1 + len(d)].view(torch.int32))
                else:
                    prefix = trials[i if i < 2 else i - 1][0]
                    expect, valid = reference_rows(vocab, ref, prefix, d)
                    assert statuses[i].valid_drafts == valid
                    assert mgr.validate_drafts(row.session_id, row.seq_id, spec, d) == valid
                    for j in range(len(d) + 1):
                        assert torch.equal(torch.isfinite(block[j]), expect[j]), (backend, i, j)
                off += 1 + len(d)
            # rollback was exact, then accept a verified prefix + a bonus token
            for i, row in enumerate(rows):
                if row is None:
                    continue
                prefix, d = trials[i if i < 2 else i - 1]
                expect, valid = reference_rows(vocab, ref, prefix, d)
                m = mgr.matcher_for(row.session_id, row.seq_id, spec)
                assert torch.equal(allowed_set(mask_row(m, vocab), vocab.vocab_size), expect[0])
                a = rng.randint(0, valid)
                scores = torch.randn(vocab.vocab_size, generator=torch.Generator().manual_seed(i))
                scores[~expect[a]] = -torch.inf
                bonus = worst_allowed(scores)
                accepted = list(d[:a]) + [bonus]
                (acc,) = mgr.accept_tokens_spec([accepted], [row])
                assert not acc.failed and acc.accepted == len(accepted)
                fed = 0
                for t in prefix + accepted:
                    if ref.is_terminated():  # EOS again after the end: the manager allows it
                        assert t in vocab.eos_ids and acc.state is StepStatus.TERMINATED
                        continue
                    assert ref.accept_token(t)
                    fed += 1
                assert torch.equal(mask_row(m, vocab), mask_row(ref, vocab))
                assert m.is_terminated() == ref.is_terminated()
                ref.rollback(fed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_accepting_an_illegal_token_fails_closed(vocab, backend):
    mgr = make_manager(vocab, backend)
    spec = GuideSpec.regex("[0-9]{2,4}")
    row = GuidedRow("z", 0, spec)
    digit = vocab.token_bytes.index(b"7")
    letter = vocab.token_bytes.index(b"q")
    (acc,) = mgr.accept_tokens_spec([[digit, letter, digit]], [row])
    assert acc.state is StepStatus.REJECTED and acc.accepted == 1 and acc.error.token_id == letter
    logits = torch.zeros((3, vocab.vocab_size))
    (st,) = mgr.fill_and_apply_spec(logits, [row], [[digit, digit]])
    assert st.state is StepStatus.REJECTED or st.failed
    for j in range(3):
        assert torch.isfinite(logits[j]).nonzero().reshape(-1).tolist() == list(vocab.eos_ids)


def test_drafts_through_a_thinking_end_marker(vocab, smollm2_tokenizer):
    """Positions before the marker are free, positions after it follow the grammar."""
    mgr = make_manager(vocab, "xgrammar")
    end_ids = smollm2_tokenizer.encode("</think>", add_special_tokens=False)
    spec = GuideSpec.regex("[0-9]+")
    cfg = ReasoningConfig.from_markers(end_ids)
    row = GuidedRow("t", 0, spec, reasoning=cfg)
    digit = vocab.token_bytes.index(b"4")
    letter = vocab.token_bytes.index(b"q")
    drafts = [letter, *end_ids, digit, letter, digit]
    logits = torch.zeros((1 + len(drafts), vocab.vocab_size))
    (st,) = mgr.fill_and_apply_spec(logits, [row], [drafts])
    assert st.valid_drafts == 1 + len(end_ids) + 1
    ref = reference_matcher(vocab, spec, "xgrammar")
    free = torch.isfinite(logits[: 1 + len(end_ids)]).sum(-1)
    assert (free >= vocab.num_tokens - len(vocab.eos_ids)).all()
    start = allowed_set(mask_row(ref, vocab), vocab.vocab_size)
    assert torch.equal(torch.isfinite(logits[1 + len(end_ids)]), start)
    ref.accept_token(digit)
    assert torch.equal(torch.isfinite(logits[2 + len(end_ids)]), allowed_set(mask_row(ref, vocab), vocab.vocab_size))
    for j in range(3 + len(end_ids), len(drafts) + 1):  # after the illegal letter: EOS only
        assert torch.isfinite(logits[j]).nonzero().reshape(-1).tolist() == list(vocab.eos_ids)
    state = mgr.sequence("t", 0)
    assert not state.phase.think.done and state.phase.think.count == 0 and state.phase.answer == []


def test_shape_mismatch_is_a_programming_error(vocab):
    mgr = make_manager(vocab, "xgrammar")
    row = GuidedRow("s", 0, GuideSpec.regex("a+"))
    with pytest.raises(ValueError):
        mgr.fill_and_apply_spec(torch.zeros((2, vocab.vocab_size)), [row], [[1, 2]])
    with pytest.raises(ValueError):
        mgr.accept_tokens_spec([[1], [2]], [row])
