"""outlines 1.x ``outlines.exceptions``: the provider-neutral API errors users catch around
API-client models. The shim runs no API clients (``models.providers``), so nothing raises these;
they exist so ``except outlines.exceptions.RateLimitError`` code imports and keeps working."""
from __future__ import annotations


class OutlinesError(Exception):
    """Base of outlines' errors."""


class APIError(OutlinesError):
    """An inference provider's API failed; ``provider``, ``status_code``, ``request_id`` say where."""

    def __init__(self, message: str = "", *, provider: str | None = None, status_code: int | None = None,
                 request_id: str | None = None, original_exception: Exception | None = None):
        super().__init__(message)
        self.provider = provider
        self.status_code = status_code
        self.request_id = request_id
        self.original_exception = original_exception


class AuthenticationError(APIError):
    """401: bad or missing credentials."""


class PermissionDeniedError(APIError):
    """403."""


class NotFoundError(APIError):
    """404: unknown model or endpoint."""


class RateLimitError(APIError):
    """429."""


class BadRequestError(APIError):
    """400: the provider refused the request."""


class ServerError(APIError):
    """5xx."""


class APITimeoutError(APIError):
    """The request timed out."""


class APIConnectionError(APIError):
    """The provider could not be reached."""


class ProviderResponseError(APIError):
    """The provider answered with something unusable."""


class GenerationError(APIError):
    """Generation failed on the provider's side."""


__all__ = ["APIConnectionError", "APIError", "APITimeoutError", "AuthenticationError", "BadRequestError",
           "GenerationError", "NotFoundError", "OutlinesError", "PermissionDeniedError", "ProviderResponseError",
           "RateLimitError", "ServerError"]
