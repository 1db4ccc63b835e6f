"""Reversible attribute patches with feature checks (never version strings).

Every patch point records the original attribute so ``deactivate()`` restores LMDeploy exactly;
a missing attribute or an unexpected signature raises ``UnsupportedLMDeployError`` naming it.

Each patched owner (module, class, field) carries a mark naming what tokenrails put there. The mark
lives on LMDeploy's objects, so it is process-wide: any ``Patcher`` (any copy of this module, any
path it was imported by) sees it and refuses to patch the same attribute again. A second apply
would wrap a wrapper (a lock taken twice, a check run twice); here it cannot happen.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable

_MISSING = object()


MARK = "__tokenrails_patched__"  # on a patched owner: {attribute name: _Mark}


class UnsupportedLMDeployError(RuntimeError):
    """The installed LMDeploy lacks a patch point tokenrails relies on (names which one)."""


class DoublePatchError(RuntimeError):
    """An attribute tokenrails already patched in this process was about to be patched again."""


def _slot_marks() -> dict[int, dict[str, Any]]:
    """Marks of owners that take no attributes (``__slots__``: pydantic's ``FieldInfo``), kept on
    the ``lmdeploy`` package (process-wide, like the other marks); keyed by ``id``: such owners
    belong to LMDeploy's classes and live as long as the process."""
    import lmdeploy

    table = lmdeploy.__dict__.get(MARK)
    if not isinstance(table, dict):
        table = {}
        setattr(lmdeploy, MARK, table)
    return table


def _own_marks(owner: Any, create: bool = False) -> dict[str, Any]:
    """The owner's own mark (a class's, not one inherited from a patched base class)."""
    attrs = getattr(owner, "__dict__", None)
    if attrs is None:
        table = _slot_marks()
        return table.setdefault(id(owner), {}) if create else table.get(id(owner), {})
    marks = attrs.get(MARK)
    if isinstance(marks, dict):
        return marks
    if not create:
        return {}
    marks = {}
    setattr(owner, MARK, marks)
    return marks


@dataclass(frozen=True)
class _Mark:
    value: Any  # what tokenrails put there (raw, as stored)
    patcher: int  # id of the Patcher that put it there
    kinds: tuple[str, ...]  # the tokenrails wrappers stacked on this attribute, innermost first


def _current(owner: Any, name: str) -> Any:
    return owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name, _MISSING)


def _kind(value: Any) -> str:
    """A wrapper's identity by its code (``functools.wraps`` copies the wrapped one's names)."""
    func = getattr(value, "__func__", value)  # staticmethod / classmethod
    code = getattr(func, "__code__", None)
    if code is not None:
        return f"{code.co_filename}:{code.co_firstlineno}:{code.co_name}"
    return f"{type(func).__module__}.{type(func).__qualname__}@{id(func)}"


def _live_mark(owner: Any, name: str) -> _Mark | None:
    mark = _own_marks(owner).get(name)
    return mark if isinstance(mark, _Mark) and _current(owner, name) is mark.value else None


def is_patched(owner: Any, name: str) -> bool:
    """``owner.name`` currently holds what a tokenrails ``Patcher`` put there (in this process)."""
    return _live_mark(owner, name) is not None


@dataclass
class _Record:
    owner: Any
    name: str
    original: Any
    mark: _Mark | None  # the attribute's mark before this patch


class Patcher:
    """Applies ``setattr`` patches and undoes them in reverse order."""

    def __init__(self) -> None:
        self._records: list[_Record] = []
        self._on_undo: list[Callable[[], None]] = []

    def on_undo(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` at the next ``undo`` (before the patches are reverted): for what a patch
        set up besides attributes, such as a pending import hook."""
        self._on_undo.append(callback)

    def set(self, owner: Any, name: str, value: Any) -> Any:
        """Replace ``owner.name`` by ``value``; return the original (raw, from ``__dict__`` when a class).

        Within one apply, different wrappers may stack on one attribute (each its own job); raises
        ``DoublePatchError`` when the attribute was patched by another ``Patcher`` (another apply,
        another copy of tokenrails) or already carries this same wrapper.
        """
        mark = _live_mark(owner, name)
        if mark is not None and (mark.patcher != id(self) or _kind(value) in mark.kinds):
            where = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", None) or type(owner).__name__
            raise DoublePatchError(f"tokenrails: {where}.{name} is already patched in this process")
        if isinstance(owner, type):
            original = owner.__dict__.get(name, _MISSING)
            if original is _MISSING and not hasattr(owner, name):
                raise UnsupportedLMDeployError(f"{owner.__module__}.{owner.__qualname__}.{name} not found")
        else:
            original = getattr(owner, name, _MISSING)
            if original is _MISSING:
                raise UnsupportedLMDeployError(f"{getattr(owner, '__name__', owner)}.{name} not found")
        self._records.append(_Record(owner, name, original, mark))
        setattr(owner, name, value)
        kinds = (mark.kinds if mark is not None else ()) + (_kind(value),)
        _own_marks(owner, create=True)[name] = _Mark(_current(owner, name), id(self), kinds)
        return original

    def undo(self) -> None:
        while self._on_undo:
            self._on_undo.pop()()
        while self._records:
            rec = self._records.pop()
            marks = _own_marks(rec.owner)
            if rec.mark is None:
                marks.pop(rec.name, None)
            else:
                marks[rec.name] = rec.mark
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
