"""Locale-specific output types (``outlines.types.locale.us``)."""
from . import us

__all__ = ["us"]
