"""Cheap reads of environment switches that hot paths consult on every call."""
from __future__ import annotations

import os


def env_lookup(name: str):
    """A function returning ``os.environ.get(name)`` for a fixed ``name``, minus its cost.

    ``os.environ.get`` of an unset variable takes ~1 us (a ``KeyError`` raised and caught inside
    ``os._Environ``), a visible share of a batch-1 apply that is called every decoding step. The
    returned function looks the encoded key up in the dict behind ``os.environ`` (kept in sync by
    every ``os.environ`` write, e.g. pytest's ``monkeypatch.setenv``) and decodes only when set.
    """
    data = getattr(os.environ, "_data", None)
    encodekey = getattr(os.environ, "encodekey", None)
    if not isinstance(data, dict) or encodekey is None:  # not CPython's os._Environ
        return lambda: os.environ.get(name)
    key = encodekey(name)

    def lookup():
        return None if key not in data else os.environ.get(name)

    return lookup
