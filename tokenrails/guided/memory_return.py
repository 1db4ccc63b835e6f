"""Give freed heap memory back to the operating system after large compiled guides go.

A compiled grammar for a large spec (a 10,000-object enum in a tool's parameters, compiled by
xgrammar on a 49k vocabulary) holds hundreds of MB in many native allocations; when the compile
cache evicts it, glibc keeps most of those pages in its arenas, so the process's RSS stays at its
peak long after the guide is gone. ``malloc_trim`` returns them. It walks the heap (milliseconds to
tens of milliseconds on a large one, outside the GIL), so ``trim_soon`` runs it on a background
thread at most once per ``MIN_INTERVAL_S``: an eviction or a finished request only asks for it.

Elsewhere than glibc (musl, macOS) there is no ``malloc_trim`` and every call here does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from pathlib import Path

MIN_INTERVAL_S = 2.0

_lock = threading.Lock()
_wanted = threading.Event()
_thread: threading.Thread | None = None
_trim = None
_loaded = False


def _malloc_trim():
    global _trim, _loaded
    if not _loaded:
        _loaded = True
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _trim = libc.malloc_trim
            _trim.argtypes = [ctypes.c_size_t]
            _trim.restype = ctypes.c_int
        except (OSError, AttributeError):
            _trim = None
    return _trim


def trim() -> bool:
    """Return the heap's free pages to the OS now; False where the C library has no malloc_trim."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True


def trim_soon() -> None:
    """Ask for a ``trim`` on the background thread (coalesced, at most once per MIN_INTERVAL_S)."""
    global _thread
    if _malloc_trim() is None:
        return
    with _lock:
        _wanted.set()
        if _thread is None:
            _thread = threading.Thread(target=_run, daemon=True, name="tokenrails-malloc-trim")
            _thread.start()


def _run() -> None:
    global _thread
    while True:
        if not _wanted.wait(60.0):
            with _lock:
                if not _wanted.is_set():  # idle: the thread ends; the next request starts one
                    _thread = None
                    return
            continue
        _wanted.clear()
        trim()
        time.sleep(MIN_INTERVAL_S)


def rss_mb(pid: int) -> float:
    """Resident set size of process ``pid`` in MB; NaN when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")
