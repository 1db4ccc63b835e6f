"""Reversible attribute patches with feature checks (never version strings).

Every patch point records the original attribute so ``deactivate()`` restores LMDeploy exactly;
a missing attribute or an unexpected signature raises ``UnsupportedLMDeployError`` naming it.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable

_MISSING = object()


class UnsupportedLMDeployError(RuntimeError):
    """The installed LMDeploy lacks a patch point tokenrails relies on (names which one)."""


@dataclass
class _Record:
    owner: Any
    name: str
    original: Any


class Patcher:
    """Applies ``setattr`` patches and undoes them in reverse order."""

    def __init__(self) -> None:
        self._records: list[_Record] = []

    def set(self, owner: Any, name: str, value: Any) -> Any:
        """Replace ``owner.name`` by ``value``; return the original (raw, from ``__dict__`` when a class)."""
        if isinstance(owner, type):
            original = owner.__dict__.get(name, _MISSING)
            if original is _MISSING and not hasattr(owner, name):
                raise UnsupportedLMDeployError(f"{owner.__module__}.{owner.__qualname__}.{name} not found")
        else:
            original = getattr(owner, name, _MISSING)
            if original is _MISSING:
                raise UnsupportedLMDeployError(f"{getattr(owner, '__name__', owner)}.{name} not found")
        self._records.append(_Record(owner, name, original))
        setattr(owner, name, value)
        return original

    def undo(self) -> None:
        while self._records:
            rec = self._records.pop()
            if rec.original is _MISSING:
                try:
                    delattr(rec.owner, rec.name)
                except AttributeError:
                    pass
            else:
                setattr(rec.owner, rec.name, rec.original)

    def __len__(self) -> int:
        return len(self._records)


def require_params(func: Callable, names: Iterable[str], where: str) -> None:
    """Fail clearly when ``func`` does not take the parameters a patch relies on."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError) as exc:  # pragma: no cover - builtins
        raise UnsupportedLMDeployError(f"cannot inspect {where}: {exc}") from exc
    missing = [n for n in names if n not in params]
    if missing:
        raise UnsupportedLMDeployError(
            f"{where} has an unexpected signature (missing {missing}); "
            "this LMDeploy version is not supported by tokenrails.engine_patch.lmdeploy"
        )


def require_attrs(owner: Any, names: Iterable[str], where: str) -> None:
    missing = [n for n in names if not hasattr(owner, n)]
    if missing:
        raise UnsupportedLMDeployError(
            f"{where} lacks {missing}; this LMDeploy version is not supported by tokenrails"
        )
