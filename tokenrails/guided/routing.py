"""How ``backend="auto"`` orders backends for a request (see docs/backends.md)."""
from __future__ import annotations

from .limits import GuideLimits
from .spec import GuideSpec
from .vocabulary import Vocabulary


def auto_ladder(spec: GuideSpec, vocab: Vocabulary, limits: GuideLimits) -> list[str]:
    """Backends to try, best first. Each refuses (UnsupportedGuideError) what it cannot enforce."""
    if spec.kind in ("regex", "choice"):
        return ["fsm", "xgrammar", "llguidance"]
    return ["xgrammar", "llguidance", "fsm"]
