"""Typed errors: every failure of a constraint is reported for that request only.

Callers (engines, servers) catch ``GuideError`` to fail one row of a batch with a 4xx-style
message; nothing ever falls back to unconstrained generation.
"""
from __future__ import annotations

import functools
from typing import Callable, TypeVar

_F = TypeVar("_F", bound=Callable)


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
    """Compiling the request, or one step's mask of it, took longer than the configured limit."""


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


def client_input_boundary(what: str) -> Callable[[_F], _F]:
    """Decorate an entry point that reads client input: any exception that is not a ``GuideError``
    (a ``KeyError`` from a malformed field, a ``TypeError`` from a wrongly typed keyword, a
    backend bug) becomes this request's ``InvalidGuideError`` naming the original type.

    The original is not chained (``from None``): its traceback would keep the client's parsed
    payload alive in every cache that stores the error. ``MemoryError`` and ``RecursionError``
    become ``GuideLimitError`` (the request was too big or too deep for this process).
    """

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except GuideError:
                raise
            except (MemoryError, RecursionError) as exc:
                error: GuideError = GuideLimitError(
                    f"{what}: the constraint is too large or too deep for this process ({type(exc).__name__})",
                    limit="process",
                )
            except Exception as exc:  # noqa: BLE001 - the boundary: nothing else may escape
                error = InvalidGuideError(f"{what}: {type(exc).__name__}: {str(exc)[:300]}")
            raise error from None

        return guarded  # type: ignore[return-value]

    return wrap


_KEPT_MESSAGE = 2000  # characters of a stored error's message; the rest is the client's payload echoed
_SCALARS = (str, int, float, bool, type(None))


def detached_copy(err: GuideError) -> GuideError:
    """A fresh instance of the same error type carrying only its message and scalar attributes.

    Caches keep and hand out these: an exception object keeps its traceback, the frames behind it
    and whatever it was chained to, so storing the original would keep the client's parsed payload
    alive (megabytes per refused spec, for as long as the cache keeps its error). Raising a copy
    also leaves the stored one untouched by the new traceback.
    """
    fresh = Exception.__new__(type(err))
    for name, value in err.__dict__.items():
        if isinstance(value, _SCALARS):
            fresh.__dict__[name] = value[:_KEPT_MESSAGE] if isinstance(value, str) else value
        else:
            fresh.__dict__[name] = repr(value)[:200]
    fresh.args = (str(err)[:_KEPT_MESSAGE],)
    return fresh
