"""Test helpers shared by the guided tests: bit reading and adversarial decoding."""
from __future__ import annotations

import torch

from tokenrails import Vocabulary, allocate_token_bitmask, apply_token_bitmask_inplace
from tokenrails.guided.backend import Matcher


def allowed_ids(bitmask_row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Ids whose bit is set in one int32 bitmask row."""
    bits = (bitmask_row.to(torch.int64).unsqueeze(-1) >> torch.arange(32)) & 1
    return torch.nonzero(bits.reshape(-1)[:vocab_size]).reshape(-1)


def adversarial_decode(
    matcher: Matcher, vocab: Vocabulary, *, seed: int, max_steps: int = 600, worst: bool = True
) -> tuple[list[int], bool]:
    """Random logits, mask, then take the *lowest-scored* allowed token (or the highest).

    Returns the generated ids (without EOS) and whether EOS ended the output.
    """
    gen = torch.Generator().manual_seed(seed)
    bitmask = allocate_token_bitmask(1, vocab.vocab_size)
    out: list[int] = []
    for _ in range(max_steps):
        logits = torch.randn((1, vocab.vocab_size), generator=gen)
        matcher.fill_next_token_bitmask(bitmask, 0)
        apply_token_bitmask_inplace(logits, bitmask)
        finite = torch.isfinite(logits[0])
        assert finite.any(), "grammar left no token allowed"
        if worst:
            tok = int(torch.where(finite, logits[0], torch.inf).argmin())
        else:
            tok = int(logits[0].argmax())
        assert matcher.accept_token(tok), f"mask allowed token {tok} the matcher rejects"
        if tok in vocab.eos_ids:
            return out, True
        out.append(tok)
    return out, False


def decode_text(vocab: Vocabulary, ids: list[int]) -> str:
    return b"".join(vocab.token_bytes[i] for i in ids).decode("utf-8")
