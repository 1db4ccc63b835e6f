"""Runs inside spawned children (keep imports light: the point is what the child sees)."""
from __future__ import annotations

import sys


def report_after_engine_import() -> dict:
    before = {"tokenrails": "tokenrails" in sys.modules, "torch": "torch" in sys.modules}
    import lmdeploy.pytorch.engine  # noqa: F401  (what the engine / TP processes import)

    import tokenrails.engine_patch.lmdeploy as patch
    from lmdeploy.pytorch.engine.logits_process import FusedLogitsProcessor
    from lmdeploy.pytorch.engine.model_agent import agent

    return {
        "before": before,
        "active": patch.is_active(),
        "logits_patched": hasattr(FusedLogitsProcessor.__init__, "__wrapped__"),
        "manager": agent.GuidedDecodingManager.__name__,
    }


def report_without_lmdeploy() -> dict:
    return {"tokenrails": "tokenrails" in sys.modules, "torch": "torch" in sys.modules,
            "lmdeploy": "lmdeploy" in sys.modules,
            "hook": any(type(f).__name__ == "LMDeployImportHook" for f in sys.meta_path)}


def report_settings_after_agent_import() -> dict:
    """What a spawned engine/TP process sees after a plain ``activate(...)`` in its parent."""
    from lmdeploy.pytorch.engine.model_agent import agent  # noqa: F401  (what builds the manager)

    import tokenrails.engine_patch.lmdeploy as patch
    from tokenrails.engine_patch.lmdeploy.boot import settings
    from tokenrails.engine_patch.reasoning_settings import default_setting

    limits = settings.current().limits
    return {"active": patch.is_active(), "backend": settings.backend(),
            "max_enum_values": None if limits is None else limits.max_enum_values,
            "reasoning": default_setting().kind}


def report_in_ray_worker() -> dict:
    """The same report from inside a Ray worker process, plus its pid."""
    import os

    return dict(report_settings_after_agent_import(), pid=os.getpid())


def report_cpu_backend_after_engine_import() -> dict:
    """What a spawned TP worker resolves for ``device_type='cpu'`` (the parent only set the flag)."""
    import lmdeploy.pytorch.engine  # noqa: F401  (what the engine / TP processes import)
    from lmdeploy.pytorch.backends.selector import get_backend

    import tokenrails.engine_patch.lmdeploy as patch

    backend = get_backend("cpu")
    return {"backend": backend.get_name(), "ccl": backend.ccl_backend(), "active": patch.is_active()}


def report_fill_threads_after_agent_import() -> dict:
    """The fill-thread count a spawned engine/TP process's guided manager gets from its parent."""
    from pathlib import Path

    from lmdeploy.pytorch.engine.model_agent import agent
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(Path(__file__).resolve().parents[2] / "fixtures" / "smollm2"))
    mgr = agent.GuidedDecodingManager(tok, len(tok))
    return {"manager": type(mgr).__name__, "fill_threads": mgr.core().step.fill_threads}


def report_settings_record():
    """The settings record a spawned child reads (no LMDeploy import: the environment alone)."""
    from tokenrails.engine_patch.lmdeploy.boot import settings

    return settings.current()
