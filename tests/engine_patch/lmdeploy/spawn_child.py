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
