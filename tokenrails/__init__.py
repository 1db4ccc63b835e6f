"""tokenrails: fast, correct, safe grammar-constrained decoding (public API only)."""
from .guided.backend import CompiledGuide, Matcher
from .guided.errors import (
    GuideError,
    GuideLimitError,
    GuidePolicyError,
    GuideTimeoutError,
    InvalidGuideError,
    TokenRejectedError,
    UnsupportedGuideError,
)
from .guided.limits import GuideLimits
from .guided.policy import GuidePolicy
from .guided.registry import compile_guide, get_backend
from .guided.spec import GuideSpec
from .guided.vocabulary import Vocabulary, shared_vocabulary
from .kernels import allocate_token_bitmask, apply_token_bitmask_inplace
from ._deprecated import install as _install_deprecated

_install_deprecated()


# The manager pulls in thread pools and the decoding-semantics modules: import on first use.
_LAZY = {
    "GuidedDecodingManager": "tokenrails.guided.manager",
    "GuidedRow": "tokenrails.guided.sequence",
    "RowStatus": "tokenrails.guided.sequence",
    "StepStatus": "tokenrails.guided.sequence",
    "ReasoningConfig": "tokenrails.guided.reasoning",
    "JumpForward": "tokenrails.guided.jump_forward",
    "Finalization": "tokenrails.guided.sequence",
    "spec_from_request": "tokenrails.requests",
    "parse_request": "tokenrails.requests",
    "outlines_unenforced": "tokenrails.guided.fsm.schema",
    "spell_shorthands": "tokenrails.guided.ecma_patterns",
    "start_native_thread": "tokenrails.guided.native_threads",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tokenrails' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "CompiledGuide",
    "GuideError",
    "GuideLimitError",
    "GuideLimits",
    "GuidePolicy",
    "GuidePolicyError",
    "GuideSpec",
    "GuideTimeoutError",
    "GuidedDecodingManager",
    "GuidedRow",
    "Finalization",
    "JumpForward",
    "ReasoningConfig",
    "RowStatus",
    "StepStatus",
    "TokenRejectedError",
    "InvalidGuideError",
    "Matcher",
    "UnsupportedGuideError",
    "Vocabulary",
    "allocate_token_bitmask",
    "apply_token_bitmask_inplace",
    "compile_guide",
    "get_backend",
    "outlines_unenforced",
    "parse_request",
    "shared_vocabulary",
    "spec_from_request",
    "spell_shorthands",
    "start_native_thread",
]
__version__ = "0.1.0"
