"""How a guided sequence ended, and whether its output may be reported as a valid result.

An engine that stops a sequence for its own reasons (``max_tokens``, abort, stop string) may stop
it mid-structure: such output is *not* a match and must never be returned as a valid result.
``finalize_state`` tells the two cases apart from the matcher itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import GuideError

if TYPE_CHECKING:
    from .manager import SequenceState

__all__ = ["Finalization", "finalize_state"]


@dataclass(frozen=True)
class Finalization:
    """``finish_reason``: "stop" (grammar accepted EOS), "error", the engine's reason when the
    output is still a complete match, or ``f"{reason}_incomplete"`` when it is not.
    ``complete``: the output (after the thinking section) is a full match of the constraint."""

    finish_reason: str
    complete: bool
    error: GuideError | None = None
    thinking: bool = False  # still inside the thinking section when it ended


def finalize_state(state: "SequenceState", reason: str = "length") -> Finalization:
    if state.error is not None:
        return Finalization("error", False, state.error)
    if state.think is not None and not state.think.done:
        return Finalization(f"{reason}_incomplete", False, thinking=True)
    matcher = state.matcher
    if matcher is None:  # never compiled, never used
        return Finalization(f"{reason}_incomplete", False)
    if matcher.is_terminated():
        return Finalization("stop", True)
    if matcher.is_accepting():
        return Finalization(reason, True)
    return Finalization(f"{reason}_incomplete", False)
