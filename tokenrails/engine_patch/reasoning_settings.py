"""Which rows think first: the engine-wide default and per-request settings, for both adapters.

A *setting* says how to find a request's thinking section; it is resolved against the engine's
``Vocabulary`` into a ``ReasoningConfig`` (or None: constrained from the first token, exactly as
without reasoning support). Accepted forms (``parse_setting``):

* ``"auto"`` (the default): if the vocabulary has the single added tokens ``<think>`` and
  ``</think>`` (qwen3, DeepSeek-R1, QwQ...), optional thinking with those markers — the prompt
  and then the model decide (docs/semantics.md section 1). Otherwise None: no markers, no change.
* ``"off"`` (also ``False``, ``"none"``, ``"0"``): never.
* ``"START,END[,optional][,max=N][,ws=N]"``: explicit markers. Each marker that is exactly one token of
  the vocabulary (both, for id matching) is matched by id, otherwise both are matched as text;
  ``optional``: the model may answer directly; ``max=N``: ``max_thinking_tokens``; ``ws=N``:
  ``whitespace_after_end``. Markers that contain a comma need the Python form.
* a dict ``{"start": ..., "end": ..., "optional": bool, "max_thinking_tokens": N,
  "whitespace_after_end": N}``, or a ``ReasoningConfig`` (Python API only, taken as is).

Settings (not a ``ReasoningConfig`` given as is) let the model write up to
``DEFAULT_WHITESPACE_AFTER_END`` (2) bytes of whitespace-only tokens between ``</think>`` and the
answer, as Qwen3-style models do (``</think>\n\n<tool_call>``); never more than the configured
bound, and nothing but whitespace bypasses the grammar (guided/reasoning.py).

``TOKENRAILS_REASONING`` (environment) sets the engine-wide default; an adapter option
(``activate(reasoning=...)``, ``reasoning=`` of the HF entry points) overrides it; a request's own
setting overrides both.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

from ..guided.errors import GuideError, InvalidGuideError
from ..guided.reasoning import DEFAULT_WHITESPACE_AFTER_END, ReasoningConfig
from ..requests.response_format import REASONING_KEY
from ..guided.vocabulary import Vocabulary

__all__ = [
    "ENV_VAR", "REQUEST_KEY", "ReasoningSetting", "default_setting", "parse_setting",
    "prompt_for_reading", "resolve",
]

ENV_VAR = "TOKENRAILS_REASONING"
REQUEST_KEY = REASONING_KEY  # response_format key of the per-request setting
AUTO_START, AUTO_END = "<think>", "</think>"
_OFF = frozenset({"off", "none", "false", "0", "no"})
_AUTO = frozenset({"auto", "true", "1", "yes", "on"})


@dataclass(frozen=True)
class ReasoningSetting:
    """A parsed setting; ``kind`` is "auto", "off", "markers" or "config"."""

    kind: str
    start: str | None = None
    end: str | None = None
    optional: bool = False
    max_thinking_tokens: int | None = None
    config: ReasoningConfig | None = None
    whitespace_after_end: int = DEFAULT_WHITESPACE_AFTER_END


AUTO = ReasoningSetting("auto")
OFF = ReasoningSetting("off")


def parse_setting(value: Any) -> ReasoningSetting | None:
    """The setting ``value`` names; None for None ("use the default"). Raises InvalidGuideError."""
    if value is None:
        return None
    if isinstance(value, ReasoningSetting):
        return value
    if isinstance(value, ReasoningConfig):
        return ReasoningSetting("config", config=value)
    if isinstance(value, bool):
        return AUTO if value else OFF
    if isinstance(value, dict):
        return _from_dict(value)
    if not isinstance(value, str):
        raise InvalidGuideError(f"reasoning setting must be a string, bool or object, got {type(value).__name__}")
    text = value.strip()
    if text.lower() in _OFF:
        return OFF
    if text.lower() in _AUTO:
        return AUTO
    parts = [p.strip() for p in text.split(",")]
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise InvalidGuideError(
            f"reasoning setting {value!r}: expected 'auto', 'off' or 'START,END[,optional][,max=N]'")
    optional, cap, ws = False, None, DEFAULT_WHITESPACE_AFTER_END
    for extra in parts[2:]:
        if extra.lower() == "optional":
            optional = True
        elif extra.lower().startswith("max="):
            cap = _cap(extra[4:], value)
        elif extra.lower().startswith("ws="):
            ws = _cap(extra[3:], value)
        else:
            raise InvalidGuideError(f"reasoning setting {value!r}: unknown option {extra!r}")
    return ReasoningSetting("markers", parts[0], parts[1], optional, cap, whitespace_after_end=ws)


def _from_dict(d: dict) -> ReasoningSetting:
    unknown = set(d) - {"start", "end", "optional", "max_thinking_tokens", "whitespace_after_end"}
    if unknown:
        raise InvalidGuideError(f"reasoning setting has unknown keys {sorted(unknown)}")
    start, end = d.get("start"), d.get("end")
    if not isinstance(end, str) or not end or (start is not None and not isinstance(start, str)):
        raise InvalidGuideError("reasoning setting needs 'end' (and optionally 'start') as strings")
    optional = d.get("optional", False)
    if not isinstance(optional, bool):
        raise InvalidGuideError("reasoning setting 'optional' must be a boolean")
    cap = d.get("max_thinking_tokens")
    ws = d.get("whitespace_after_end", DEFAULT_WHITESPACE_AFTER_END)
    return ReasoningSetting("markers", start or None, end, optional, None if cap is None else _cap(cap, d),
                            whitespace_after_end=_cap(ws, d))


def _cap(raw: Any, whole: Any) -> int:
    try:
        cap = int(raw)
    except (TypeError, ValueError):
        cap = -1
    if isinstance(raw, bool) or cap < 0:
        raise InvalidGuideError(f"reasoning setting {whole!r}: max and ws must be non-negative integers")
    return cap


def default_setting(explicit: Any = None) -> ReasoningSetting:
    """The engine-wide default: ``explicit`` (an adapter option), else ``$TOKENRAILS_REASONING``,
    else "auto". Read on every call (tests and child processes see the current environment)."""
    chosen = parse_setting(explicit)
    if chosen is None:
        chosen = parse_setting(os.environ.get(ENV_VAR) or None)
    return chosen or AUTO


def resolve(setting: ReasoningSetting, vocab: Vocabulary) -> ReasoningConfig | None:
    """The ``ReasoningConfig`` of ``setting`` for this vocabulary (memoized on it); None = none.

    Raises ``InvalidGuideError`` for explicit markers the vocabulary cannot express.
    """
    if setting.kind == "off":
        return None
    if setting.kind == "config":
        return setting.config
    return vocab.cached_lru("tokenrails:reasoning-settings", repr(setting), lambda: _resolve(setting, vocab))


def _resolve(setting: ReasoningSetting, vocab: Vocabulary) -> ReasoningConfig | None:
    if setting.kind == "auto":
        start = _single_id(vocab, AUTO_START, special_only=True)
        end = _single_id(vocab, AUTO_END, special_only=True)
        if start is None or end is None:
            return None
        return ReasoningConfig(end_ids=(end,), end_text=AUTO_END, start_ids=(start,), start_text=AUTO_START,
                               match="ids", optional=True, whitespace_after_end=setting.whitespace_after_end)
    assert setting.end is not None
    end = _single_id(vocab, setting.end)
    start = _single_id(vocab, setting.start) if setting.start else None
    by_ids = end is not None and (setting.start is None or start is not None)
    try:
        if by_ids:
            return ReasoningConfig(end_ids=(end,), end_text=setting.end,
                                   start_ids=(start,) if start is not None else (), start_text=setting.start,
                                   match="ids", optional=setting.optional,
                                   max_thinking_tokens=setting.max_thinking_tokens,
                                   whitespace_after_end=setting.whitespace_after_end)
        return ReasoningConfig(end_text=setting.end, start_text=setting.start, match="text",
                               optional=setting.optional, max_thinking_tokens=setting.max_thinking_tokens,
                               whitespace_after_end=setting.whitespace_after_end)
    except GuideError:
        raise
    except Exception as exc:  # noqa: BLE001 - report a bad setting as a bad request
        raise InvalidGuideError(f"reasoning markers {setting.start!r}/{setting.end!r}: {exc}") from exc


def _single_id(vocab: Vocabulary, text: str | None, *, special_only: bool = False) -> int | None:
    """The one token whose bytes are exactly ``text`` (added tokens preferred); None otherwise.

    ``special_only`` (auto-detection): only added/special tokens count — a marker the tokenizer
    would split, or a plain merge that happens to spell it, is not a reasoning marker.
    """
    if not text:
        return None
    first, more = vocab.cached("tokenrails:reasoning-token-index", lambda: _token_index(vocab))
    data = text.encode("utf-8")
    ids = more.get(data) or ([first[data]] if data in first else [])
    special = [t for t in ids if t in vocab.special_ids]
    plain = [t for t in ids if t not in vocab.special_ids]
    if len(special) == 1:
        return special[0]
    if special_only or special or len(plain) != 1:
        return None
    return plain[0]


def _token_index(vocab: Vocabulary) -> tuple[dict[bytes, int], dict[bytes, list[int]]]:
    """(bytes → the first id spelling them, bytes → every id for the few bytes several ids
    spell), EOS and empty tokens excluded. Built on a request's path over every token, so
    nothing is allocated per token."""
    eos = set(vocab.eos_ids)
    first: dict[bytes, int] = {}
    more: dict[bytes, list[int]] = {}
    for t, data in enumerate(vocab.token_bytes):
        if not data or t in eos:
            continue
        if data in first:
            more.setdefault(data, [first[data]]).append(t)
        else:
            first[data] = t
    return first, more


def prompt_for_reading(prompt_ids: Any, config: ReasoningConfig) -> list[int]:
    """The part of the prompt ``ReasoningTracker.initial`` needs, as a list (exactly the same result).

    Long prompts: with single-id markers the answer only depends on the last start and end
    markers and the last few tokens, so the prompt is cut (vectorized) just before the earlier of
    the two last markers, or to its last token when it has neither. Other configs get it all.
    """
    import numpy as np

    arr = np.asarray(prompt_ids, dtype=np.int64).reshape(-1)
    if config.match != "ids" or len(config.end_ids) != 1 or len(config.start_ids) > 1 or arr.size < 64:
        return arr.tolist()
    cut = []
    for marker in (config.end_ids, config.start_ids):
        if marker:
            hits = np.flatnonzero(arr == marker[0])
            if hits.size:
                cut.append(int(hits[-1]))
    # no marker at all: only the last token matters (a partial one-token marker cannot exist)
    lo = min(cut) if cut else arr.size - 1
    return arr[lo:].tolist()


def split_request_setting(obj: Any) -> tuple[Any, Any]:
    """(``obj`` without the ``tokenrails_reasoning`` key, its value or None) for a dict request."""
    if isinstance(obj, dict) and REQUEST_KEY in obj:
        rest = {k: v for k, v in obj.items() if k != REQUEST_KEY}
        return rest, obj[REQUEST_KEY]
    return obj, None


def configs_for_rows(settings: Sequence[Any] | Any, n: int, vocab: Vocabulary,
                     default: Any = None) -> list[ReasoningConfig | None]:
    """Per row: the resolved config of its setting (one for all, or a list of ``n``); None → default."""
    if isinstance(settings, (list, tuple)):
        if len(settings) != n:
            raise ValueError(f"{len(settings)} reasoning settings for {n} rows")
        items = list(settings)
    else:
        items = [settings] * n
    base = default_setting(default)
    return [resolve(parse_setting(s) or base, vocab) for s in items]
