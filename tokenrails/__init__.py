"""tokenrails: fast, correct, safe grammar-constrained decoding (public API only)."""
from .guided.backend import CompiledGuide, Matcher
from .guided.errors import (
    GuideError,
    GuideLimitError,
    GuideTimeoutError,
    InvalidGuideError,
    UnsupportedGuideError,
)
from .guided.limits import GuideLimits
from .guided.registry import compile_guide
from .guided.spec import GuideSpec
from .guided.vocabulary import Vocabulary
from .kernels import allocate_token_bitmask, apply_token_bitmask_inplace


def __getattr__(name: str):  # the manager pulls in threads/queues: import it on first use
    if name == "GuidedDecodingManager":
        from .guided.manager import GuidedDecodingManager

        return GuidedDecodingManager
    raise AttributeError(name)


__all__ = [
    "CompiledGuide",
    "GuideError",
    "GuideLimitError",
    "GuideLimits",
    "GuideSpec",
    "GuideTimeoutError",
    "GuidedDecodingManager",
    "InvalidGuideError",
    "Matcher",
    "UnsupportedGuideError",
    "Vocabulary",
    "allocate_token_bitmask",
    "apply_token_bitmask_inplace",
    "compile_guide",
]
__version__ = "0.1.0"
