"""Grammars compiled where the scheduler lives, for ranks that run in other processes.

With LMDeploy's multi-process executor (TP on the CPU path, Ray) the model agents - and their
guided managers - run in worker processes; the engine process, where the prefill scheduler decides
which sequences join the batch, has none. Without a manager there, the scheduler could not know
whether a grammar was compiled, every sequence joined at once, and the sampling rank compiled
inside its step while every row of the batch waited.

Here the engine process gets its own manager (same tokenizer, backend and limits as the ranks; the
tokenizer object its ``AsyncEngine`` already loaded, as for an in-process model agent: never a
second load, ``lent_tokenizer``): the scheduler polls it (waiting_rows.py), so a sequence waits
outside the batch until its grammar is compiled in the engine process. The compiled guide then
travels to the ranks with the row on its first steps (its portable form, ``export_guide``, as
compile workers return it; a failure travels as the row's error), and each sampling rank keeps that
guide instead of compiling: every rank decodes the row with the same grammar from its first token,
and none of them compiles.
"""
from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from collections import OrderedDict
from typing import Any, Callable

from ....guided.backend import CompiledGuide
from ....guided.compile_procs import export_guide
from ....guided.errors import GuideError, detached_copy
from ....guided.spec import GuideSpec

logger = logging.getLogger("tokenrails.lmdeploy")

ATTR = "_tokenrails_grammars"  # on the engine's prefill scheduler and sampling strategy
EXPORTS_KEPT = 16  # exported guides kept for the rows' next first steps (chunked prefill, same spec)
# LMDeploy's ``Tokenizer`` of the ``AsyncEngine`` whose engine is being built (set around its build)
_HELD_TOKENIZER: contextvars.ContextVar[Any] = contextvars.ContextVar("tokenrails_held_tokenizer", default=None)


class EngineGrammars:
    """The engine process's compiles for ranks in other processes (see the module doc)."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager  # an LMDeployGuidedManager: the vocabulary builds in its thread
        self._exports: OrderedDict[str, tuple[str, Any, float]] = OrderedDict()

    def handover(self, spec: GuideSpec) -> GuideError | tuple[str, Any, float] | None:
        """What a rank needs to decode ``spec`` without compiling: the compile's error, or the
        guide's portable form (None: not compiled here, or not portable; the rank compiles)."""
        core = self.manager.core(wait=False) if self.manager.ready else None
        done = core.settled(spec) if core is not None else None
        if isinstance(done, GuideError):
            return detached_copy(done)
        if not isinstance(done, CompiledGuide):
            return None
        hit = self._exports.get(spec.key)
        if hit is None:
            try:
                hit = export_guide(done)
            except Exception:  # noqa: BLE001 - a backend without a portable form: the rank compiles
                return None
            self._exports[spec.key] = hit
            while len(self._exports) > EXPORTS_KEPT:
                self._exports.popitem(last=False)
        else:
            self._exports.move_to_end(spec.key)
        return hit


def for_engine(engine: Any, model_path: str, trust_remote_code: bool) -> EngineGrammars | None:
    """An ``EngineGrammars`` when ``engine``'s model agent runs in other processes (no
    ``executor.model_agent`` here), else None (the agent's manager is polled in this process)."""
    executor = getattr(engine, "executor", None)
    if executor is None or getattr(executor, "model_agent", None) is not None:
        return None
    from .rank_manager import LMDeployGuidedManager

    from lmdeploy.tokenizer import Tokenizer

    tokenizer = lent_tokenizer(Tokenizer)(model_path, trust_remote_code=trust_remote_code).model.model
    return EngineGrammars(LMDeployGuidedManager(tokenizer, engine.model_config.vocab_size))


def lent_tokenizer(original: Callable) -> Callable:
    """LMDeploy's ``Tokenizer(model_path, ...)`` that, while an ``AsyncEngine`` builds its engine,
    returns the tokenizer that engine already loaded (same model) instead of reading it again."""

    def Tokenizer(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - stands in for the class
        held = _HELD_TOKENIZER.get()
        return held if held is not None else original(*args, **kwargs)

    return Tokenizer


def patched_build_pytorch(original: Callable) -> Callable:
    """``AsyncEngine._build_pytorch`` that lends the engine it builds the tokenizer it holds."""

    @functools.wraps(original)
    def _build_pytorch(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _HELD_TOKENIZER.set(getattr(self, "tokenizer", None))
        try:
            return original(self, *args, **kwargs)
        finally:
            _HELD_TOKENIZER.reset(token)

    return _build_pytorch


def patched_engine_init(original: Callable) -> Callable:
    sig = inspect.signature(original)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        bound = sig.bind_partial(self, *args, **kwargs).arguments
        try:
            grammars = for_engine(self, str(bound.get("model_path")), bool(bound.get("trust_remote_code", False)))
        except Exception as exc:  # noqa: BLE001 - the ranks compile in their step, as without this
            logger.warning("tokenrails: no grammar compiles in the engine process: %r", exc)
            grammars = None
        if grammars is not None:
            setattr(self.scheduler._prefill_scheduler, ATTR, grammars)
            setattr(self.sampling_strategy, ATTR, grammars)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


def install(patcher: Any, engine_module: Any, async_engine: Any, agent_module: Any) -> None:
    """Called by ``activate()`` (reverted by ``deactivate()``)."""
    patcher.set(engine_module.Engine, "__init__", patched_engine_init(engine_module.Engine.__init__))
    patcher.set(async_engine, "_build_pytorch", patched_build_pytorch(async_engine._build_pytorch))
    patcher.set(agent_module, "Tokenizer", lent_tokenizer(agent_module.Tokenizer))  # an in-process agent
