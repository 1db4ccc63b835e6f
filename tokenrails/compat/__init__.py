"""Legacy request surfaces (OpenAI/LMDeploy ``response_format``, vLLM ``guided_*``, outlines).

``tokenrails.compat.outlines`` is imported on demand (it pulls in transformers).
"""
from .requests import NormalizedRequest, normalize_request, parse_request

__all__ = ["NormalizedRequest", "normalize_request", "parse_request"]
