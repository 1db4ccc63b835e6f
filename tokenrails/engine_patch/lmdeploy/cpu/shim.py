"""A module-local stand-in for ``torch`` inside LMDeploy modules that hard-code CUDA.

LMDeploy 0.18's model agent calls ``torch.cuda.Stream()/Event()/stream()/synchronize()`` and creates
tensors with ``device='cuda'`` unconditionally. On a CPU-only torch those calls raise. Rather than
editing LMDeploy, we rebind the name ``torch`` in the few LMDeploy modules that do this to a proxy:
``proxy.cuda`` is a namespace of no-op streams/events, and every other attribute is the real torch,
with callables' ``device='cuda'`` rewritten to ``'cpu'``. Nothing outside those modules sees it.
"""
from __future__ import annotations

import contextlib
import functools
import types
from typing import Any

import torch


class NoopEvent:
    """CPU work is synchronous: an event is always complete."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class NoopStream:
    """One implicit CPU 'stream'; waits and syncs have nothing to wait for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event: Any = None) -> NoopEvent:
        return event or NoopEvent()

    def query(self) -> bool:
        return True


_STREAM = NoopStream()


def _cuda_namespace() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        Stream=NoopStream,
        Event=NoopEvent,
        stream=lambda s=None: contextlib.nullcontext(),
        current_stream=lambda *a, **k: _STREAM,
        default_stream=lambda *a, **k: _STREAM,
        synchronize=lambda *a, **k: None,
        empty_cache=lambda: None,
        is_available=lambda: False,
        current_device=lambda: 0,
        set_device=lambda *a, **k: None,
        device_count=lambda: 1,
        mem_get_info=lambda *a, **k: (0, 0),
        graphs=types.SimpleNamespace(),
    )


def _cpu_device(dev: Any) -> Any:
    if isinstance(dev, str) and dev.startswith("cuda"):
        return "cpu"
    if isinstance(dev, torch.device) and dev.type == "cuda":
        return torch.device("cpu")
    return dev


def _wrap(fn: Any) -> Any:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        return fn(*args, **kwargs)

    return call


class TorchProxy(types.ModuleType):
    """``torch`` with ``cuda`` replaced by no-ops and ``device='cuda'`` mapped to CPU."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _cuda_namespace()

    def __getattr__(self, name: str) -> Any:
        value = getattr(torch, name)
        if name == "device":
            return lambda d, *a: torch.device(_cpu_device(d), *a) if a or isinstance(d, str) else torch.device(d)
        if callable(value) and not isinstance(value, type) and not isinstance(value, types.ModuleType):
            return _wrap(value)
        return value


PROXY = TorchProxy()


def rebind(module: types.ModuleType) -> None:
    """Make ``module``'s global ``torch`` the CPU proxy (idempotent)."""
    if getattr(module, "torch", None) is torch:
        module.torch = PROXY
