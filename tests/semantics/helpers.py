"""Shared helpers of the semantics tests: backends, reference masks, adversarial picks."""
from __future__ import annotations

import pytest
import torch

from tokenrails import GuidedDecodingManager, GuideSpec, UnsupportedGuideError, compile_guide
from tokenrails.guided.registry import available_backends

BACKENDS = ["xgrammar", "fsm"]

# A regex every backend supports, with forced literal parts and choices in between.
RECORD_REGEX = r'\{"id": [0-9]{1,3}, "tag": "(red|green|blue)", "ok": (true|false)\}'


def make_manager(vocab, backend: str) -> GuidedDecodingManager:
    if backend not in available_backends():
        pytest.skip(f"backend {backend} not installed yet")
    return GuidedDecodingManager(vocab, backend=backend, fill_threads=2, parallel_fill_threshold=2)


def reference_matcher(vocab, spec: GuideSpec, backend: str):
    """An independent matcher (own compile) used as the one-token-at-a-time oracle."""
    try:
        return compile_guide(spec, vocab, backend).matcher()
    except UnsupportedGuideError as exc:
        pytest.skip(str(exc))


def mask_row(matcher, vocab) -> torch.Tensor:
    words = (vocab.vocab_size + 31) // 32
    m = torch.zeros((1, words), dtype=torch.int32)
    matcher.fill_next_token_bitmask(m, 0)
    return m[0]


def allowed_set(row_bits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool[vocab_size] of the tokens a packed int32 row allows."""
    bits = (row_bits.to(torch.int64).unsqueeze(-1) >> torch.arange(32)) & 1
    return bits.reshape(-1)[:vocab_size].bool()


def finite(logits_row: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(logits_row)


def worst_allowed(logits_row: torch.Tensor) -> int:
    """The lowest-scored allowed token (adversarial sampler)."""
    ok = torch.isfinite(logits_row)
    assert ok.any(), "no token allowed"
    return int(torch.where(ok, logits_row, torch.inf).argmin())


def worst_step(mgr, vocab, row, generator: torch.Generator | None = None):
    """One adversarial decoding step of ``row``: random logits, masked, the worst allowed token
    accepted. Returns that token's status."""
    logits = torch.randn((1, vocab.vocab_size), generator=generator)
    mgr.fill_and_apply(logits, [row])
    (status,) = mgr.accept_tokens([worst_allowed(logits[0])], [row])
    return status


def tok(vocab, text: str | bytes) -> int:
    data = text.encode() if isinstance(text, str) else text
    return vocab.token_bytes.index(data)


def text_of(vocab, ids) -> str:
    return b"".join(vocab.token_bytes[i] for i in ids).decode("utf-8")
