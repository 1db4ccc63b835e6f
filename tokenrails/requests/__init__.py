"""Client request shapes → ``GuideSpec`` (plus the hints and settings that ride along).

OpenAI/LMDeploy ``response_format``, vLLM ``guided_*`` fields, ``GuidedDecodingParams`` and
``structured_outputs``, whole request bodies. Parsed once per request into a
``NormalizedRequest``. This package sits beside the core: it imports ``tokenrails.guided`` and is
never imported by it (tests/test_layering.py).
"""
from __future__ import annotations

from typing import Any

from ..guided.spec import GuideSpec
from .normalize import NormalizedRequest, normalize_request, parse_request
from .schema_transforms import disable_additional_properties


def spec_from_request(obj: Any) -> GuideSpec | None:
    """Any supported request shape → its ``GuideSpec`` (None for ``{"type": "text"}`` / None)."""
    return normalize_request(obj)


__all__ = ["NormalizedRequest", "disable_additional_properties", "normalize_request", "parse_request", "spec_from_request"]
