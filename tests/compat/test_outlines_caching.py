"""outlines.caching in the shim: disk memoization, disabling, version invalidation."""
from __future__ import annotations

from tokenrails.compat.outlines import _version, caching


def test_cache_memoizes_until_disabled_and_is_dropped_on_a_new_version(tmp_path, monkeypatch):
    monkeypatch.setenv("OUTLINES_CACHE_DIR", str(tmp_path))
    caching.get_cache.cache_clear()
    calls = []

    @caching.cache()
    def square(x):
        calls.append(x)
        return x * x

    assert square(3) == 9 and square(3) == 9 and calls == [3]
    with caching.cache_disabled():
        square(3)
    assert calls == [3, 3]
    monkeypatch.setattr(_version, "__version__", "other")
    caching.get_cache.cache_clear()

    @caching.cache()
    def square(x):  # noqa: F811 - same name, same key space
        calls.append(x)
        return x * x

    square(3)
    assert calls == [3, 3, 3]  # the old version's entries were dropped
    caching.get_cache.cache_clear()
