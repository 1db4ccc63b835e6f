"""How many times each tokenrails wrapper sits on LMDeploy's patch points (run in any process).

A wrapper keeps the function it wraps as ``__wrapped__``; walking that chain and counting each
tokenrails wrapper (by module and name) tells whether an attribute was patched once or twice.
Used by the idempotence tests in fresh interpreters and by the user scripts they start.
"""
from __future__ import annotations

import collections
import importlib
import json
import os
from typing import Any

POINTS = [  # (module, owner attribute or "", name)
    ("lmdeploy.pytorch.engine.executor.base_worker", "", "build_model_agent"),
    ("lmdeploy.pytorch.engine.logits_process", "FusedLogitsProcessor", "__init__"),
    ("lmdeploy.pytorch.engine.logits_process", "FusedLogitsProcessor", "__call__"),
    ("lmdeploy.pytorch.engine.model_agent.agent", "BaseModelAgent", "__init__"),
    ("lmdeploy.pytorch.engine.model_agent.agent", "BaseModelAgent", "_async_step"),
    ("lmdeploy.pytorch.engine.model_agent.agent", "BaseModelAgent", "_step_postprocess_with_output"),
    ("lmdeploy.pytorch.engine.model_agent.agent", "BaseModelAgent", "_get_inputs_from_delta"),
    ("lmdeploy.serve.core.async_engine", "AsyncEngine", "preprocess"),
    ("lmdeploy.serve.core.async_engine", "AsyncEngine", "__init__"),
    ("lmdeploy.pytorch.engine.mp_engine.zmq_engine", "ZMQMPEngine", "_mp_proc"),
    ("lmdeploy.pytorch.backends.selector", "", "_get_backend"),
]


def _chain(func: Any) -> list[str]:
    """The tokenrails wrappers down ``func``'s ``__wrapped__`` chain, by code (``functools.wraps``
    copies the wrapped function's names, not its code)."""
    names = []
    seen = set()
    while func is not None and id(func) not in seen:
        seen.add(id(func))
        func = getattr(func, "__func__", func)  # staticmethod / bound method
        code = getattr(func, "__code__", None)
        if code is not None and "tokenrails" in code.co_filename:
            names.append(f"{code.co_filename}:{code.co_firstlineno}")
        func = getattr(func, "__wrapped__", None)
    return names


def layers() -> dict[str, int]:
    """Patch point → the largest number of times one tokenrails wrapper appears on it."""
    out: dict[str, int] = {}
    for module, owner, name in POINTS:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        obj = getattr(mod, owner) if owner else mod
        raw = obj.__dict__.get(name) if isinstance(obj, type) else getattr(obj, name, None)
        counts = collections.Counter(_chain(raw))
        out[f"{module}:{owner}.{name}"] = max(counts.values(), default=0)
    return out


def report(path: str | None = None) -> dict:
    """``layers()`` plus the patcher's records; appended as one JSON line to ``path`` if given."""
    import tokenrails.engine_patch.lmdeploy as patch

    doubled = []
    for rec in patch._PATCHER._records:  # every attribute the upgrade patched
        raw = rec.owner.__dict__.get(rec.name) if isinstance(rec.owner, type) else getattr(rec.owner, rec.name, None)
        if max(collections.Counter(_chain(raw)).values(), default=0) > 1:
            doubled.append(rec.name)
    rep = {"pid": os.getpid(), "active": patch.is_active(), "layers": layers(),
           "records": len(patch._PATCHER._records), "doubled_records": doubled}
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rep) + "\n")
    return rep


def assert_patched_once(reports: list[dict], processes: int) -> None:
    """``reports`` (``report()`` lines) come from at least ``processes`` processes, each active
    with every patch point and every patched attribute wrapped once."""
    assert len({r["pid"] for r in reports}) >= processes, reports
    for rep in reports:
        assert rep["active"], rep
        doubled = {k: n for k, n in rep["layers"].items() if n > 1}
        assert not doubled and not rep["doubled_records"], rep
