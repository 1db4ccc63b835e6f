"""Whether the budget rule closed a request's output, carried from the model agent to the response.

The rule (guided/budget.py) runs in the model agent, another process than the api_server (and, with
TP, than the engine loop). So, like a row's typed error (agent.py, error_relay.py): each step's
budget rows' flags (``Budget.closed``: the rule removed a token the grammar allowed) ride on the
step's ``BatchedOutputs`` (``ATTR``); the engine loop notes them per session (``note``, a bounded
record); ``EngineInstance.async_stream_infer`` puts the flag on every ``EngineOutput`` of the
request and the server side notes it for the task iterating the stream (draft_usage.py carries
both); the api_server's ``usage`` and the pipeline's ``Response`` get ``budget_closed``. Absent
(None) for a request that did not ask for the budget rule.
"""
from __future__ import annotations

import contextvars
import threading
from collections import OrderedDict
from typing import Any, Hashable, Sequence

from ....guided.sequence import GuidedRow

ATTR = "tokenrails_budget_closed"
FIELD = "budget_closed"
MAX_TRACKED = 4096
CLOSED: contextvars.ContextVar[bool | None] = contextvars.ContextVar("tokenrails_budget_closed", default=None)

_LOCK = threading.Lock()
_SESSIONS: "OrderedDict[Hashable, bool]" = OrderedDict()

__all__ = ["ATTR", "FIELD", "CLOSED", "row_flags", "note", "session_closed", "forget"]


def row_flags(manager: Any, rows: Sequence[Any]) -> dict[int, bool]:
    """Agent side: ``{batch row: closed}`` for the budget rows of a step (``manager``: the
    agent's ``LMDeployGuidedManager``). Read straight from each row's budget state, every step:
    the flag only ever turns true, and a row may end at any step."""
    core = manager.view.core
    if core is None:
        return {}
    out: dict[int, bool] = {}
    for i, row in enumerate(rows):
        if isinstance(row, GuidedRow) and row.max_tokens is not None:
            state = core.sequence(row.session_id, row.seq_id)
            if state is not None and state.budget is not None:
                out[i] = state.budget.closed
    return out


def note(running: Sequence[Any], flags: dict[int, bool]) -> None:
    """Engine loop: remember each flagged row's flag under its session id (once true, true)."""
    with _LOCK:
        for row, closed in flags.items():
            if row >= len(running):
                continue
            sid = getattr(running[row], "session_id", None)
            if sid is None:
                continue
            _SESSIONS[sid] = bool(closed) or _SESSIONS.get(sid, False)
            _SESSIONS.move_to_end(sid)
            while len(_SESSIONS) > MAX_TRACKED:
                _SESSIONS.popitem(last=False)


def session_closed(session_id: Hashable) -> bool | None:
    with _LOCK:
        return _SESSIONS.get(session_id)


def forget(session_id: Hashable) -> None:
    """A new request on a reused session id starts unflagged."""
    with _LOCK:
        _SESSIONS.pop(session_id, None)
