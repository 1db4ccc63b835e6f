"""Compiled guides kept on disk across restarts (optional: off unless a directory is given).

Each entry is one ``.npz`` file named by a digest of a *versioned* key: tokenrails' and the
backend libraries' versions, the vocabulary's fingerprint, the backend setting, the limits and the
spec's canonical key. A library upgrade changes the key, so a stale entry is never loaded; it
ages out by the directory's byte bound (oldest first).

The files hold no pickles: the backends' portable forms (``export``: xgrammar's JSON, llguidance's
grammar text, the fsm DFA's arrays) as numpy arrays and one JSON header, read with
``allow_pickle=False``, so a file someone else could write cannot run code here. A file that does
not read back is deleted and compiled again.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import tempfile
import threading
from typing import Any

import numpy as np

from .backend import CompiledGuide
from .limits import GuideLimits
from .spec import GuideSpec
from .vocabulary import Vocabulary

FORMAT = 1  # bump when the file layout changes
_LIBRARIES = ("tokenrails", "xgrammar", "llguidance", "numpy")


def _versions() -> str:
    out = []
    for name in _LIBRARIES:
        try:
            out.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{name}=-")
    return ";".join(out)


class CompileStore:
    """On-disk compiled guides of one (vocabulary, backend setting, limits)."""

    def __init__(self, directory: str, vocab: Vocabulary, backend: str, limits: GuideLimits,
                 max_bytes: int = 1 << 30):
        self.directory = directory
        self.vocab = vocab
        self.limits = limits
        self.max_bytes = max_bytes
        os.makedirs(directory, exist_ok=True)
        self._prefix = f"{FORMAT}|{_versions()}|{vocab.fingerprint}|{backend}|{limits!r}|"
        self._lock = threading.Lock()
        self.counters = {"hits": 0, "writes": 0, "unreadable": 0}

    def path(self, spec: GuideSpec) -> str:
        digest = hashlib.sha256((self._prefix + spec.key).encode("utf-8", "surrogatepass")).hexdigest()
        return os.path.join(self.directory, digest[:40] + ".npz")

    def get(self, spec: GuideSpec) -> CompiledGuide | None:
        path = self.path(spec)
        try:
            with np.load(path, allow_pickle=False) as data:
                header = json.loads(bytes(data["header"]).decode())
                arrays = {k: data[k] for k in data.files if k != "header"}
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 - truncated, foreign or corrupt: compile again
            self._drop(path, unreadable=True)
            return None
        if header.get("key") != spec.key:  # a digest collision or a foreign file
            return None
        try:
            from .registry import get_backend

            state = _state_from(header, arrays)
            guide = get_backend(header["backend"], self.vocab, self.limits).restore(spec, state)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001
            self._drop(path, unreadable=True)
            return None
        with self._lock:
            self.counters["hits"] += 1
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        return guide

    def put(self, spec: GuideSpec, guide: CompiledGuide) -> None:
        from .registry import _load_class

        export = getattr(_load_class(guide.backend), "export", None)
        if export is None:
            return
        header, arrays = _split(export(guide))
        header.update(key=spec.key, backend=guide.backend)
        buf = io.BytesIO()
        np.savez(buf, header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), **arrays)
        path = self.path(spec)
        fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(buf.getbuffer())
            os.replace(tmp, path)  # readers never see half a file
        except OSError:
            self._drop(tmp)
            return
        with self._lock:
            self.counters["writes"] += 1
        self._trim()

    def _trim(self) -> None:
        """Oldest entries out while the directory holds more than ``max_bytes``."""
        try:
            entries = [(e.stat().st_mtime, e.stat().st_size, e.path) for e in os.scandir(self.directory)
                       if e.name.endswith(".npz")]
        except OSError:
            return
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            self._drop(path)
            total -= size

    def _drop(self, path: str, unreadable: bool = False) -> None:
        if unreadable:
            with self._lock:
                self.counters["unreadable"] += 1
        try:
            os.unlink(path)
        except OSError:
            pass


def _split(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A backend's portable state as a JSON header plus its numpy arrays."""
    header: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    for name, value in state.items():
        if isinstance(value, np.ndarray):
            arrays["a_" + name] = value
        elif name == "triggers" and isinstance(value, dict):
            header[name] = {str(k): v for k, v in value.items()}
        else:
            header[name] = value
    return {"state": header}, arrays


def _state_from(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    state = dict(header["state"])
    if isinstance(state.get("triggers"), dict):
        state["triggers"] = {int(k): v for k, v in state["triggers"].items()}
    for name, value in arrays.items():
        state[name[2:]] = value
    return state
