"""What ``activate(...)`` configured: one record (``Settings``) every process reads (``current()``).

A setting has one path: ``activate()``'s arguments (``configure``) over the environment. ``activate``
exports the record once (``inherit.export``: environment variables, inherited by the spawned engine
and TP processes, handed to Ray workers by ``child_env``), and a child reads the same record back
from its environment. Kept apart from ``rank_manager.py`` so the request front
(``request_parsing.py``, ``front_check.py``) reads the same limits without importing the manager,
which itself parses requests (``stock_calls.py``).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from typing import Any, Mapping

from ....guided.limits import DEFAULT_LIMITS, GuideLimits
from ...reasoning_settings import ENV_VAR as ENV_REASONING
from ...reasoning_settings import parse_setting

ENV_BACKEND = "TOKENRAILS_LMDEPLOY_BACKEND"
ENV_LIMITS = "TOKENRAILS_LMDEPLOY_LIMITS"
ENV_FILL_THREADS = "TOKENRAILS_LMDEPLOY_FILL_THREADS"
ENV_TOOL_CALLS = "TOKENRAILS_TOOL_CALLS"
ENV_DRAFTS = "TOKENRAILS_GRAMMAR_DRAFTS"
ENV_BUDGET = "TOKENRAILS_BUDGET"
ENV_LOOKUP = "TOKENRAILS_LOOKUP_DRAFTS"
BUDGET_VALUES = ("close", "off")
OFF_VALUES = ("0", "false", "off", "no")
logger = logging.getLogger("tokenrails.lmdeploy")


@dataclasses.dataclass(frozen=True)
class Settings:
    """``activate()``'s options; None: not set here (the environment, then the default, decides).

    ``reasoning`` is the setting's text or a ``ReasoningConfig`` (which stays in this process: its
    token ids need the vocabulary)."""

    backend: str | None = None
    limits: GuideLimits | None = None
    fill_threads: int | None = None
    reasoning: Any = None
    tool_calls: bool | None = None
    grammar_drafts: int | None = None
    budget: str | None = None
    lookup_drafts: bool | None = None

    def over(self, base: "Settings") -> "Settings":
        """This record's values, ``base``'s where this one has none."""
        return Settings(**{f.name: getattr(base, f.name) if getattr(self, f.name) is None else getattr(self, f.name)
                           for f in dataclasses.fields(self)})

    def environment(self) -> dict[str, str]:
        """The variables that carry this record to a child process (``from_environment`` reads them)."""
        text = {ENV_BACKEND: self.backend, ENV_BUDGET: self.budget,
                ENV_LIMITS: None if self.limits is None else json.dumps(dataclasses.asdict(self.limits)),
                ENV_FILL_THREADS: None if self.fill_threads is None else str(int(self.fill_threads)),
                ENV_REASONING: _reasoning_text(self.reasoning),
                ENV_TOOL_CALLS: None if self.tool_calls is None else "1" if self.tool_calls else "0",
                ENV_DRAFTS: None if self.grammar_drafts is None else str(int(self.grammar_drafts)),
                ENV_LOOKUP: None if self.lookup_drafts is None else "1" if self.lookup_drafts else "0"}
        return {name: value for name, value in text.items() if value is not None}

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """The record a parent exported (malformed limits, fill threads or budget fail loudly)."""
        env = os.environ if environ is None else environ
        return _parsed(tuple((name, env.get(name) or None) for name in ENV_NAMES))


ENV_NAMES = (ENV_BACKEND, ENV_LIMITS, ENV_FILL_THREADS, ENV_REASONING, ENV_TOOL_CALLS, ENV_DRAFTS, ENV_BUDGET,
             ENV_LOOKUP)
_ACTIVATED = Settings()  # activate()'s arguments in this process


def _reasoning_text(value: Any) -> str | None:
    """A reasoning setting as a child reads it back; None for an object (``ReasoningConfig``, dict)."""
    if isinstance(value, bool):
        return "auto" if value else "off"
    return value if isinstance(value, str) else None


@functools.lru_cache(maxsize=16)
def _parsed(raw: tuple[tuple[str, str | None], ...]) -> Settings:
    """``Settings`` of the variables' text (cached: the front reads the record on every request).
    Malformed limits or fill threads fail loudly, naming the variable; malformed drafts are ignored."""
    text = dict(raw)
    drafts = text[ENV_DRAFTS]
    if drafts is not None and not drafts.strip().isdigit():
        logger.warning("tokenrails: ignoring %s=%r (not a non-negative integer)", ENV_DRAFTS, drafts)
        drafts = None
    try:
        limits = None if text[ENV_LIMITS] is None else GuideLimits(**json.loads(text[ENV_LIMITS]))
        threads = None if text[ENV_FILL_THREADS] is None else int(text[ENV_FILL_THREADS])
    except (TypeError, ValueError) as exc:
        raise RuntimeError(f"tokenrails: {ENV_LIMITS} or {ENV_FILL_THREADS} is malformed: {exc}") from exc
    tool_calls = text[ENV_TOOL_CALLS]
    lookup = text[ENV_LOOKUP]
    return Settings(backend=text[ENV_BACKEND], limits=limits, fill_threads=threads if threads and threads > 0 else None,
                    reasoning=text[ENV_REASONING], budget=check_budget(text[ENV_BUDGET], ENV_BUDGET),
                    tool_calls=None if tool_calls is None else tool_calls.strip().lower() not in OFF_VALUES,
                    grammar_drafts=None if drafts is None else int(drafts),
                    lookup_drafts=None if lookup is None else lookup.strip().lower() not in OFF_VALUES)


def configure(**options: Any) -> Settings:
    """Record ``activate()``'s options (None: unchanged from an earlier call) and return the
    process's record. Values are checked here, so a bad one fails ``activate()`` at once."""
    global _ACTIVATED
    given = Settings(**options)
    parse_setting(given.reasoning)
    check_budget(given.budget, "budget")
    if given.grammar_drafts is not None and int(given.grammar_drafts) < 0:
        raise ValueError(f"grammar_drafts must be >= 0, got {given.grammar_drafts}")
    _ACTIVATED = given.over(_ACTIVATED)
    return _ACTIVATED


def reset() -> None:
    """``deactivate()``: no option recorded any more (the environment is restored by ``inherit``)."""
    global _ACTIVATED
    _ACTIVATED = Settings()


def activated() -> Settings:
    """What ``activate()`` was given in this process (what it exports)."""
    return _ACTIVATED


def current() -> Settings:
    """The settings this process runs with: ``activate()``'s, else its environment's."""
    return _ACTIVATED.over(Settings.from_environment())


def check_budget(value: Any, where: str) -> str | None:
    """``"close"``, ``"off"`` or None; anything else is refused (``ValueError``)."""
    if value is None or value in BUDGET_VALUES:
        return value
    raise ValueError(f"{where} must be \"close\" or \"off\", got {value!r}")


def lookup_drafts() -> bool:
    """Whether grammar drafts continue with prompt-lookup tokens (``activate(lookup_drafts=)``,
    ``$TOKENRAILS_LOOKUP_DRAFTS``; on unless set off)."""
    return current().lookup_drafts is not False


def budget_default() -> str | None:
    """The engine-wide budget setting (``activate(budget=...)``, ``--budget``); None: off."""
    return current().budget


def configured_limits() -> GuideLimits:
    """The limits the engine's manager compiles with: the api_server's front-end check judges
    requests by the same bounds."""
    return current().limits or DEFAULT_LIMITS


def manager_limits() -> GuideLimits | None:
    return current().limits


def manager_fill_threads() -> int | None:
    return current().fill_threads


FRONT_WORKERS = 2  # the api_server's probe compiles at once (a few cores; a hostile flood queues)
COMPILE_PROCESSES = 2  # default worker processes per manager for large compiles (compile_procs.py)


def _count_setting(name: str, default: int, floor: int) -> int:
    """The integer in environment variable ``name``, at least ``floor``; ``default`` when it is
    unset, blank or not an integer."""
    raw = os.environ.get(name, "")
    try:
        return max(floor, int(raw)) if raw.strip() else default
    except ValueError:
        return default


def compile_processes() -> int:
    """Worker processes for large compiles (``TOKENRAILS_COMPILE_PROCESSES``; 0: in-process,
    where a compile past its deadline cannot be stopped)."""
    return _count_setting("TOKENRAILS_COMPILE_PROCESSES", COMPILE_PROCESSES, 0)


ENGINE_PER_CLIENT = 4  # an engine's compiles one client may run at once (its others queue behind them)


def compile_per_client() -> int:
    """``TOKENRAILS_COMPILE_PER_CLIENT``: compiles one api_server client may run at once in the
    engine (the others share the rest; compiles with no client named are not capped)."""
    return _count_setting("TOKENRAILS_COMPILE_PER_CLIENT", ENGINE_PER_CLIENT, 1)


def handles_per_client(pool_size: int) -> int:
    """``TOKENRAILS_HANDLES_PER_CLIENT``: distinct new specs one api_server client's requests may
    hold request handles for; by default the engine's compiles per client (more of one client's
    requests waiting for compiles would only wait in the engine), at most half the pool."""
    return _count_setting("TOKENRAILS_HANDLES_PER_CLIENT", max(1, min(compile_per_client(), pool_size // 2)), 1)


def compile_cache_dir() -> str | None:
    """Where the engine keeps compiled guides across restarts (``TOKENRAILS_COMPILE_CACHE_DIR``;
    unset: memory only)."""
    return os.environ.get("TOKENRAILS_COMPILE_CACHE_DIR") or None


def backend() -> str:
    return current().backend or "auto"


def reasoning_default() -> Any:
    return current().reasoning


def pop_budget_option(argv: list[str]) -> tuple[list[str], str | None]:
    """``--budget close|off`` / ``--budget=...`` taken out of an LMDeploy command line."""
    out: list[str] = []
    value: str | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--budget":
            if i + 1 >= len(argv):
                raise SystemExit("--budget needs a value: close or off")
            value, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--budget="):
            value = arg.split("=", 1)[1]
        else:
            out.append(arg)
        i += 1
    if value is not None and value not in BUDGET_VALUES:
        raise SystemExit(f"--budget takes close or off, got {value!r}")
    return out, value
