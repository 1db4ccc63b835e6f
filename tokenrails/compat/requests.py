"""Deprecated alias: request parsing moved to :mod:`tokenrails.requests` (beside the core)."""
from .._deprecated import warn_moved
from ..requests import NormalizedRequest, normalize_request, parse_request, spec_from_request  # noqa: F401

warn_moved("tokenrails.compat.requests", "tokenrails.requests")  # points at the importing line
