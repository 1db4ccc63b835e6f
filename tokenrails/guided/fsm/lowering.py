"""outlines-core's JSON-Schema lowering, kept from killing the process.

``build_regex_from_schema`` writes every optional property's regex once per combination and every
array's item regex twice, so the regex grows geometrically with nesting, and a small schema can
make Rust's allocator abort the whole process (SIGABRT), which a Python ``try`` cannot catch.

So a schema whose lowered size cannot be shown small is lowered in a separate worker process
under an address-space limit and a deadline: an abort, an out-of-memory or a timeout there costs
the request (``GuideLimitError``), never the engine. Small schemas (the estimate below, an upper
bound by construction) are lowered in-process: the worker is off the common path.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from ..errors import GuideLimitError, GuideTimeoutError
from ..limits import GuideLimits

IN_PROCESS_ESTIMATE = 200_000  # characters: lowered in-process below this estimate
_LEAF = 64  # a generous bound on one leaf's regex (outlines' string/number regexes are ~30-60)

_WORKER = r"""
import json, resource, struct, sys
limit, max_out = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from outlines_core.json_schema import build_regex_from_schema
inp, out = sys.stdin.buffer, sys.stdout.buffer
while True:
    head = inp.read(4)
    if len(head) < 4:
        break
    req = json.loads(inp.read(struct.unpack("<I", head)[0]))
    try:
        regex = build_regex_from_schema(req["text"], req["ws"])
        resp = {"regex": regex} if len(regex) <= max_out else {"too_large": len(regex)}
    except Exception as exc:
        resp = {"error": type(exc).__name__, "message": str(exc)}
    data = json.dumps(resp).encode()
    out.write(struct.pack("<I", len(data)) + data)
    out.flush()
"""


def lowered_size_estimate(schema: Any, budget: int = 20_000) -> float:
    """An upper bound on the lowered regex's length (``inf`` when undecided: ``$ref``s, which
    outlines inlines, or more than ``budget`` schema nodes). Objects count every property's regex
    once per property (outlines' optional-property combinations), arrays twice."""
    seen = 0

    def size(node: Any, depth: int) -> float:
        nonlocal seen
        seen += 1
        if seen > budget or depth > 256:
            return float("inf")
        if not isinstance(node, dict):
            return _LEAF
        if "$ref" in node:
            return float("inf")
        total = _LEAF + sum(len(json.dumps(v)) for k, v in node.items() if k in ("enum", "const", "pattern"))
        props = node.get("properties")
        if isinstance(props, dict) and props:
            total += len(props) * sum(size(p, depth + 1) + len(str(k)) + 16 for k, p in props.items())
        for key in ("items", "additionalProperties", "contains"):
            if isinstance(node.get(key), dict):
                total += 2 * size(node[key], depth + 1)
        for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            if isinstance(node.get(key), list):
                total += 2 * sum(size(s, depth + 1) for s in node[key])
        return total

    return size(schema, 0)


class LoweringWorker:
    """One worker process, started on first use, restarted after it dies or is killed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._key: tuple[int, int] | None = None

    def lower(self, text: str, whitespace: str | None, limits: GuideLimits, timeout_s: float) -> dict:
        """The worker's answer: ``{"regex": ...}``, ``{"error": ..., "message": ...}`` or
        ``{"too_large": n}``; raises ``GuideLimitError``/``GuideTimeoutError`` when it died or ran late."""
        request = json.dumps({"text": text, "ws": whitespace}).encode()
        with self._lock:
            proc = self._ensure(limits)
            deadline = time.monotonic() + timeout_s
            try:
                proc.stdin.write(struct.pack("<I", len(request)) + request)
                proc.stdin.flush()
                size = struct.unpack("<I", self._read(proc, 4, deadline))[0]
                return json.loads(self._read(proc, size, deadline))
            except TimeoutError:
                self._kill()
                raise GuideTimeoutError(
                    f"limit compile_timeout_s={timeout_s:g} exceeded: lowering the schema did not finish",
                    limit="compile_timeout_s", value=timeout_s,
                ) from None
            except (OSError, EOFError, struct.error, ValueError):
                self._kill()
                raise GuideLimitError(
                    "lowering this schema exceeded lowering_memory_bytes="
                    f"{limits.lowering_memory_bytes} (the regex outlines-core builds grows geometrically with nesting)",
                    limit="lowering_memory_bytes", value=limits.lowering_memory_bytes,
                ) from None

    def close(self) -> None:
        with self._lock:
            self._kill()

    def _ensure(self, limits: GuideLimits) -> subprocess.Popen:
        key = (limits.lowering_memory_bytes, limits.max_lowered_regex_bytes)
        if self._proc is not None and (self._proc.poll() is not None or self._key != key):
            self._kill()
        if self._proc is None:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER, str(key[0]), str(key[1])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )
            self._key = key
        return self._proc

    @staticmethod
    def _read(proc: subprocess.Popen, n: int, deadline: float) -> bytes:
        fd = proc.stdout.fileno()
        chunks, got = [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                try:
                    stream.close()
                except OSError:  # a dead worker's pipe
                    pass
            self._proc = None


_WORKER_SINGLETON = LoweringWorker()
atexit.register(_WORKER_SINGLETON.close)  # the worker would exit on EOF anyway; this reaps it


def lower_in_worker(text: str, whitespace: str | None, limits: GuideLimits) -> dict:
    return _WORKER_SINGLETON.lower(text, whitespace, limits, limits.compile_timeout_s)
