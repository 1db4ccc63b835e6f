"""Legacy request surfaces (OpenAI/LMDeploy ``response_format``, vLLM ``guided_*``, outlines)."""
from .requests import normalize_request

__all__ = ["normalize_request"]
