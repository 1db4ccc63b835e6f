"""tokenrails for transformers: structured output on any machine (CPU included).

* ``GuidedLogitsProcessor`` — a ``transformers.LogitsProcessor`` for ``model.generate``; each
  row of the batch has its own ``GuideSpec`` or None.
* ``generate_guided`` — our own batched KV-cache decode loop with jump-forward.

Both drive the same ``GuidedDecodingManager`` (async compile cache, per-sequence matchers,
batched bitmask fill) and bitmask kernel as the LMDeploy integration. See docs/transformers.md.
"""
from __future__ import annotations

from .hf.decode import GenerationReport, GuidedResult, encode_prompts, generate_guided
from .hf.processor import GuidedLogitsProcessor, RowReport
from .hf.sampling import SamplingParams
from .hf.validate import Verdict, validate_output
from .hf.vocab import logits_width, manager_for, vocabulary_for

__all__ = [
    "GenerationReport",
    "GuidedLogitsProcessor",
    "GuidedResult",
    "RowReport",
    "SamplingParams",
    "Verdict",
    "encode_prompts",
    "generate_guided",
    "logits_width",
    "manager_for",
    "validate_output",
    "vocabulary_for",
]
