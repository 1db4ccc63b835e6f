"""The backend contract: compile a ``GuideSpec`` once, then hand out cheap per-sequence matchers.

The manager and the batched step talk only to these three types; they never know which backend
is behind them. A backend owns nothing but its grammar and its per-vocabulary tables.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Sequence

import torch

from .errors import UnsupportedGuideError
from .limits import GuideLimits
from .spec import GuideSpec
from .vocabulary import Vocabulary


class Matcher(ABC):
    """Grammar state of one sequence. Bitmask rows use xgrammar's layout (bit 1 = allowed).

    Only the grammar: where a sequence stands around it (a thinking section first, the gap after
    its end marker) is the sequence's phase (``reasoning.ReasoningPhase``), never a backend's.
    ``is_accepting`` and ``validate_tokens`` are derived from accept / rollback; a backend may
    override them for speed.
    """

    vocab: Vocabulary

    @abstractmethod
    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> bool:
        """Write row ``index`` of the int32 ``bitmask``; return False iff every token is allowed."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) when the grammar forbids it."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens exactly."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once EOS was accepted; a terminated matcher allows only EOS."""

    @abstractmethod
    def reset(self) -> None:
        """Back to the start state, history cleared."""

    @abstractmethod
    def find_jump_forward_string(self) -> str:
        """The text every valid continuation starts with ('' when there is a choice)."""

    def forced_token_ids(self, max_tokens: int) -> Sequence[int] | None:
        """The tokens forced one by one from here, each the only token its position's mask allows,
        at most ``max_tokens``, when the backend knows them without filling masks (llguidance
        forces a forced text's canonical tokenization); [] when the next position forces no one
        token. None: this backend cannot say, the caller fills and sees. This default says None."""
        return None

    def jump_forward_probe(self) -> str | None:
        """What a caller needs to skip mask fills (``forced.forced_tokens``), or None: fill and see.

        '' only when no byte is forced next (two or more next bytes, or the end). A non-empty
        text only when it is the forced string and the mask there allows every token its bytes
        admit (so not where a backend narrows forced text to its own tokenization). None also
        where bytes are forced that are no whole character yet (a character begun by the last
        token, two characters sharing a lead byte) or the grammar names token ids itself. This
        default always says None."""
        return None

    def is_accepting(self) -> bool:
        """Whether the output so far is a complete match (EOS would be accepted now)."""
        eos = self.vocab.eos_ids[0]
        if self.is_terminated():
            return True
        ok = self.accept_token(eos)
        if ok:
            self.rollback(1)
        return ok

    @classmethod
    def batch_fill(cls, matchers: Sequence["Matcher"], bitmask: torch.Tensor, rows: Sequence[int],
                   threads: int = 1) -> None:
        """Fill ``bitmask[rows[i]]`` from ``matchers[i]``. Backends override this with a native
        fill that may use up to ``threads`` threads; the batched step groups matchers by class and
        calls it once per group (``threads`` > 1 only for groups past the manager's
        ``parallel_fill_threshold``)."""
        for m, r in zip(matchers, rows):
            m.fill_next_token_bitmask(bitmask, r)

    def validate_tokens(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar accepts, leaving the state unchanged."""
        n = 0
        for t in tokens:
            if not self.accept_token(int(t)):
                break
            n += 1
        if n:
            self.rollback(n)
        return n


class CompiledGuide(ABC):
    """Immutable result of compiling one spec for one vocabulary; shareable across threads."""

    backend: ClassVar[str]

    def __init__(self, spec: GuideSpec, vocab: Vocabulary, compile_s: float = 0.0):
        self.spec = spec
        self.vocab = vocab
        self.compile_s = compile_s

    @abstractmethod
    def matcher(self) -> Matcher:
        """A fresh matcher at the start state."""

    @property
    def memory_bytes(self) -> int:
        """Approximate bytes held, for the byte-bounded compile cache."""
        return 1024


class GuideBackend(ABC):
    """Compiles specs for one vocabulary. Instances are cached per (vocabulary, limits)."""

    name: ClassVar[str]
    kinds: ClassVar[frozenset[str]]

    def __init__(self, vocab: Vocabulary, limits: GuideLimits):
        self.vocab = vocab
        self.limits = limits

    def check(self, spec: GuideSpec) -> None:
        """Cheap analysis before compiling: raise ``UnsupportedGuideError``/``GuideLimitError``."""
        if spec.kind not in self.kinds:
            raise UnsupportedGuideError(
                f"backend {self.name!r} does not support {spec.kind} constraints",
                feature=spec.kind,
                backend=self.name,
            )

    def warm(self) -> None:
        """Per-vocabulary set-up the first compile would otherwise do inside its request's
        deadline (most backends do theirs when constructed: nothing left)."""

    @abstractmethod
    def compile(self, spec: GuideSpec) -> CompiledGuide:
        """Compile; raise a ``GuideError`` subclass for anything it cannot enforce exactly."""
