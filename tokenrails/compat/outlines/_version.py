"""The outlines API version this shim follows (outlines' cache keys include it)."""
__version__ = "1.3.3+tokenrails"
