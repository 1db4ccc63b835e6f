"""Typed errors: every failure of a constraint is reported for that request only.

Callers (engines, servers) catch ``GuideError`` to fail one row of a batch with a 4xx-style
message; nothing ever falls back to unconstrained generation.
"""
from __future__ import annotations


class GuideError(Exception):
    """Base class of every error tokenrails raises about a constraint."""


class InvalidGuideError(GuideError, ValueError):
    """The request is malformed (bad schema, bad regex, conflicting fields)."""


class UnsupportedGuideError(GuideError):
    """The request is valid but the chosen backend cannot enforce it; the message names the feature."""

    def __init__(self, message: str, *, feature: str | None = None, backend: str | None = None):
        super().__init__(message)
        self.feature = feature
        self.backend = backend


class GuideLimitError(GuideError):
    """The request exceeds a configured limit (size, depth, states...); names the limit and value."""

    def __init__(self, message: str, *, limit: str | None = None, value: object = None):
        super().__init__(message)
        self.limit = limit
        self.value = value


class GuideTimeoutError(GuideLimitError):
    """Compiling the request took longer than the configured time limit."""


class TokenRejectedError(GuideError):
    """A sampled token was not allowed by the grammar: the sequence must end with an error.

    Raised (or reported in a row status) instead of silently continuing unconstrained.
    """

    def __init__(self, message: str, *, token_id: int | None = None):
        super().__init__(message)
        self.token_id = token_id


class GuidePolicyError(GuideError):
    """The operator's ``GuidePolicy`` refuses this request (a kind not allowed, special tokens...).

    ``rule`` names the policy field that refused it.
    """

    def __init__(self, message: str, *, rule: str | None = None):
        super().__init__(message)
        self.rule = rule
