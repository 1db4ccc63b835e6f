"""Backends behind the contract in ``guided/backend.py`` (one module each)."""
