"""Operator policy for client-supplied constraints: which kinds are accepted at all, and whether a
grammar may name special (control) tokens.

Limits (``GuideLimits``) bound how *big* a request may be; the policy says what a client may ask
for. Call ``check_policy`` before compiling (the manager does it on ``prefetch``/``matcher_for``).
Special tokens are never produced by a guided row's free text whatever the policy says: every
backend sees them blanked (see ``Vocabulary.grammar_token_bytes``) and the llguidance matcher masks
them out; only where a tag or grammar literal spells a marker's text may the xgrammar backend
emit the marker itself (``backends/xgrammar_markers.py``).
The policy only decides whether a request that *tries* to name one is refused with a clear error
instead of compiling to a grammar that can never emit it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import GuidePolicyError
from .spec import KINDS, GuideSpec

# Grammar syntax that names a token by id or by special name: llguidance/Lark ``<[123]>`` and
# ``<|name|>``, and xgrammar-style token-id references ``<123>`` / ``<[123,456]>``.
_TOKEN_REF = re.compile(r"<\[\s*\d[\d\s,\-]*\]>|<\|[^|\s<>\"']{1,64}\|>(?=\s|$|[)|;*+?])")


@dataclass(frozen=True)
class GuidePolicy:
    """What clients may send. The default accepts every kind and refuses special-token refs."""

    allowed_kinds: frozenset[str] = frozenset(KINDS)
    allow_special_token_refs: bool = False

    @classmethod
    def json_schema_only(cls) -> "GuidePolicy":
        """Only JSON schemas and plain JSON objects: no client grammars, regexes or tags."""
        return cls(allowed_kinds=frozenset({"json_schema", "json_object"}))

    @classmethod
    def no_client_grammars(cls) -> "GuidePolicy":
        """Everything except free-form grammars and regexes (schemas, choices, structural tags)."""
        return cls(allowed_kinds=frozenset(KINDS) - {"grammar", "regex"})


DEFAULT_POLICY = GuidePolicy()


def check_policy(spec: GuideSpec, policy: GuidePolicy = DEFAULT_POLICY) -> None:
    """Raise ``GuidePolicyError`` (naming the rule) when ``policy`` refuses ``spec``."""
    if spec.kind not in policy.allowed_kinds:
        raise GuidePolicyError(
            f"policy refuses {spec.kind} constraints (allowed_kinds: {sorted(policy.allowed_kinds)})",
            rule="allowed_kinds",
        )
    if not policy.allow_special_token_refs and spec.kind == "grammar":
        ref = find_token_reference(spec.ebnf)
        if ref is not None:
            raise GuidePolicyError(
                f"policy refuses grammars that reference special tokens ({ref!r}); a guided row "
                "never emits control tokens — write the literal text as a quoted string instead",
                rule="allow_special_token_refs",
            )


def find_token_reference(grammar: str) -> str | None:
    """The first token-reference in ``grammar`` outside quoted literals, or None."""
    for segment in _unquoted_segments(grammar):
        m = _TOKEN_REF.search(segment)
        if m:
            return m.group(0)
    return None


def _unquoted_segments(text: str) -> list[str]:
    """Parts of a grammar outside "..." / '...' literals (escapes honoured)."""
    out: list[str] = []
    start, i, n = 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "\"'":
            out.append(text[start:i])
            j = i + 1
            while j < n and text[j] != ch:
                j += 2 if text[j] == "\\" else 1
            i = start = j + 1
            continue
        i += 1
    out.append(text[start:])
    return out
