"""Legacy request surfaces (OpenAI/LMDeploy ``response_format``, vLLM ``guided_*``, outlines).

The request parser lives in ``tokenrails.requests``; its names are re-exported here for code
written against ``tokenrails.compat``. ``tokenrails.compat.outlines`` is imported on demand (it
pulls in transformers).
"""
from ..requests import NormalizedRequest, normalize_request, parse_request

__all__ = ["NormalizedRequest", "normalize_request", "parse_request"]
