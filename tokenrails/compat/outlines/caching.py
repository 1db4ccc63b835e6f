"""``outlines.caching``: a disk cache for expensive pure functions (outlines cached compiled
indexes this way). ``diskcache`` under ``$OUTLINES_CACHE_DIR`` (default
``~/.cache/outlines``), values pickled with ``cloudpickle``; entries of another outlines version
are dropped when the cache opens. Written from outlines' documented behaviour and tests."""
from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Callable, Iterator

_caching_enabled = True


def _disk_class():
    import cloudpickle
    import diskcache

    class CloudpickleDisk(diskcache.Disk):
        """diskcache storage of arbitrary Python values (functions, closures) via cloudpickle."""

        def __init__(self, directory: str, compress_level: int = 1, **kwargs: Any):
            self.compress_level = compress_level
            super().__init__(directory, **kwargs)

        def put(self, key: Any):
            return super().put(cloudpickle.dumps(key))

        def get(self, key: Any, raw: bool):
            return cloudpickle.loads(super().get(key, raw))

        def store(self, value: Any, read: bool, key: Any = diskcache.UNKNOWN):
            if not read:
                value = cloudpickle.dumps(value)
            return super().store(value, read, key=key)

        def fetch(self, mode: int, filename: str, value: Any, read: bool):
            data = super().fetch(mode, filename, value, read)
            return data if read else cloudpickle.loads(data)

    return CloudpickleDisk


def __getattr__(name: str) -> Any:
    if name == "CloudpickleDisk":
        globals()["CloudpickleDisk"] = _disk_class()
        from . import _identity

        _identity.adopt("caching:CloudpickleDisk")  # reads as outlines.caching.CloudpickleDisk
        return globals()["CloudpickleDisk"]
    raise AttributeError(name)


@functools.lru_cache(1)
def get_cache():
    """The process's disk cache (one per process; ``get_cache.cache_clear()`` reopens it)."""
    import diskcache

    from . import _version

    home = os.path.expanduser("~")
    directory = os.environ.get("OUTLINES_CACHE_DIR") or os.path.join(home, ".cache", "outlines")
    memory = diskcache.Cache(directory, eviction_policy="none", cull_limit=0, disk=__getattr__("CloudpickleDisk"))
    version = _version.__version__
    if memory.get("__version__") != version:
        memory.clear()
    memory["__version__"] = version
    return memory


def cache(expire: float | None = None, typed: bool = False, ignore: tuple = ()) -> Callable:
    """Decorator: memoize a function on disk (keys: its qualified name and arguments)."""

    def decorator(fn: Callable) -> Callable:
        memory = get_cache()
        base = f"{fn.__module__}.{fn.__qualname__}"

        def key_of(args: tuple, kwargs: dict) -> tuple:
            kw = {k: v for k, v in kwargs.items() if k not in ignore}
            parts = (base, args, tuple(sorted(kw.items())))
            if typed:
                parts += (tuple(type(a) for a in args),)
            return parts

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not _caching_enabled:
                return fn(*args, **kwargs)
            key = key_of(args, kwargs)
            hit = memory.get(key, default=_MISSING)
            if hit is not _MISSING:
                return hit
            value = fn(*args, **kwargs)
            memory.set(key, value, expire=expire)
            return value

        wrapper.__memory__ = memory  # type: ignore[attr-defined]
        return wrapper

    return decorator


class _Missing:
    pass


_MISSING = _Missing()


def disable_cache() -> None:
    """Turn the cache off for this process."""
    global _caching_enabled
    _caching_enabled = False


def clear_cache() -> None:
    """Drop every entry."""
    get_cache().clear()


@contextlib.contextmanager
def cache_disabled() -> Iterator[None]:
    """The cache off inside a ``with`` block."""
    global _caching_enabled
    before = _caching_enabled
    _caching_enabled = False
    try:
        yield
    finally:
        _caching_enabled = before
