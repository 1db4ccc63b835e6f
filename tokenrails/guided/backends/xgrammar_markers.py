"""Marker tokens on xgrammar: an added token is allowed exactly where the grammar spells its text.

Every added/special token is blanked in guided rows (vocabulary.py), so no free text can emit
``<tool_call>`` or ``<|im_start|>``. But tool-call formats *require* those markers (LMDeploy's
``tool_choice="required"`` tag for Qwen starts with the literal ``<tool_call>``), and the model
emits them as single tokens: blanking them there would force it to spell its marker out of plain
tokens, which stock xgrammar never asks. So, without changing the language of any free text:

* the compile sees a *marker view* of the vocabulary where every added token decodes to a
  sentinel ``\x1f\x1e<id>\x1f``: JSON strings refuse control characters, every ``TagDispatch``
  gets ``"\x1f\x1e"`` added to its excludes, and a grammar with any other character class that
  would accept them keeps the blanked view;
* the grammar is xgrammar's own, printed as EBNF; each structural literal holding a marker's text
  (a tag's ``begin``/``end``/``const_string``/trigger, placeholders put there before printing so a
  JSON enum value equal to ``<tool_call>`` is never one; an EBNF grammar's literal equal to a
  marker) becomes ``("<text>" | Token(id))``;
* a marker that starts or continues a dispatch trigger (``<tool_call>\n<function=``; ``｜DSML｜``
  after ``<``) is allowed in that free text and fed to the matcher as its *text*, so the
  dispatcher constrains what follows exactly as if it had been spelled out.

docs/lmdeploy.md ("Marker tokens") has the measured comparison with stock.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch
import xgrammar as xgr

from ..vocabulary import Vocabulary
from .xgrammar_lengths import exact_string_lengths

SENTINEL_PREFIX = b"\x1f\x1e"  # dispatch view: control characters, excluded from every dispatch
BYTE_SENTINEL_PREFIX = b"\xff\xfe"  # plain view: invalid UTF-8, which no character class matches
SENTINEL_EXCLUDE = '"\\x1f\\x1e"'  # the prefix as a printed EBNF literal, added to dispatch excludes
FREE_TEXT_PROBE = b"\xff\xfd"  # invalid UTF-8: only dispatch free text (raw bytes) accepts it
PLACEHOLDER_BASE = 0xF0000  # Unicode plane 15 private use: never in LMDeploy's tags
_MAX_MARKERS = 0xFFFD


@dataclass(frozen=True)
class MarkerSet:
    """The vocabulary's added tokens that can be markers: non-EOS special ids with visible text."""

    texts: dict[int, str]  # id -> text
    by_text: dict[str, int]  # text -> id (first id wins when two tokens share a text)
    finder: re.Pattern[str] | None  # longest-first alternation of the texts
    words: torch.Tensor  # int32 bitmask row with exactly the marker bits set

    def find_in(self, text: str) -> bool:
        return self.finder is not None and self.finder.search(text) is not None


def marker_set(vocab: Vocabulary) -> MarkerSet:
    return vocab.cached("xgrammar_marker_set", lambda: _build_marker_set(vocab))


def _build_marker_set(vocab: Vocabulary) -> MarkerSet:
    texts: dict[int, str] = {}
    for i in sorted(vocab.special_ids):
        if i in vocab.eos_ids or not 0 <= i < vocab.num_tokens:
            continue
        raw = vocab.token_bytes[i]
        if len(raw) < 2 or raw.startswith((SENTINEL_PREFIX, BYTE_SENTINEL_PREFIX)):
            continue
        try:
            texts[i] = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
    by_text: dict[str, int] = {}
    for i, t in texts.items():
        by_text.setdefault(t, i)
    finder = None
    if by_text:
        alts = sorted(by_text, key=len, reverse=True)
        finder = re.compile("|".join(re.escape(t) for t in alts))
    words = torch.zeros((vocab.vocab_size + 31) // 32, dtype=torch.int32)
    for i in texts:
        words[i // 32] |= _bit(i % 32)
    return MarkerSet(texts=texts, by_text=by_text, finder=finder, words=words)


def marker_view_tokens(vocab: Vocabulary, markers: MarkerSet, dispatch: bool) -> list[bytes]:
    """The grammar view with every marker decoded to its own sentinel. Grammars with a dispatch
    need control-character sentinels (a dispatch scans raw bytes, so only its excludes can keep
    sentinels out); the others get invalid UTF-8, which no class, string or pattern matches."""
    view = vocab.grammar_token_bytes()
    for i in markers.texts:
        view[i] = sentinel(i, dispatch)
    return view


def sentinel(token_id: int, dispatch: bool = True) -> bytes:
    if dispatch:
        return SENTINEL_PREFIX + str(token_id).encode() + b"\x1f"
    return BYTE_SENTINEL_PREFIX + str(token_id).encode() + b"\xff"


def has_dispatch(pieces: list[tuple[str, str, bool]]) -> bool:
    return any(in_dispatch for _, _, in_dispatch in pieces)


def _bit(i: int) -> int:
    return -(1 << 31) if i == 31 else 1 << i


# ---------------------------------------------------------------- structural tags

_STRUCTURAL_STRING_KEYS = ("begin", "end", "value", "separator", "triggers")
_SCHEMA_KEYS = frozenset({"json_schema", "schema"})
_OPAQUE_KEYS = frozenset({"pattern", "grammar", "excludes", "exclude_tokens"})
_TOKEN_FORMATS = frozenset({"token", "exclude_token", "any_tokens", "token_triggered_tags", "token_dispatch"})


@dataclass
class Placeholders:
    """Private-use characters standing for markers while xgrammar builds and prints the grammar:
    ``token`` ones sit in structural strings (they become ``Token(id)`` alternatives), ``text``
    ones in schema values and names (they go back to plain text: free text never admits markers)."""

    markers: MarkerSet
    by_char: dict[str, tuple[int, bool]]  # char -> (token id, structural)
    chars: dict[tuple[int, bool], str]

    def char(self, token_id: int, structural: bool) -> str:
        key = (token_id, structural)
        ch = self.chars.get(key)
        if ch is None:
            if len(self.chars) >= _MAX_MARKERS:
                raise ValueError("too many distinct markers in one tag")
            ch = chr(PLACEHOLDER_BASE + len(self.chars))
            self.chars[key] = ch
            self.by_char[ch] = key
        return ch

    def sub(self, text: str, structural: bool) -> str:
        m = self.markers
        return m.finder.sub(lambda hit: self.char(m.by_text[hit.group(0)], structural), text)


def substitute_tag(tag: Any, markers: MarkerSet) -> tuple[Any, Placeholders]:
    """A copy of the tag with placeholders for every marker text: structural ones in tag strings,
    plain-text ones in every string of a JSON schema (keys, enum/const values)."""
    ph = Placeholders(markers, {}, {})

    def schema(node: Any) -> Any:
        if isinstance(node, dict):
            return {ph.sub(k, False): schema(v) for k, v in node.items()}
        if isinstance(node, list):
            return [schema(v) for v in node]
        return ph.sub(node, False) if isinstance(node, str) else node

    def walk(node: Any, key: str | None) -> Any:
        if isinstance(node, dict):
            out = {}
            for k, v in node.items():
                if k in _SCHEMA_KEYS:
                    out[k] = json.dumps(schema(json.loads(v))) if isinstance(v, str) else schema(v)
                elif k in _OPAQUE_KEYS:
                    out[k] = v
                else:
                    out[k] = walk(v, k)
            return out
        if isinstance(node, list):
            return [walk(v, key) for v in node]
        if isinstance(node, str) and key in _STRUCTURAL_STRING_KEYS:
            return ph.sub(node, True)
        return node

    return walk(tag, None), ph


def _names_tokens(node: Any) -> bool:
    """Whether a tag uses token-level formats: those name ids directly, so the marker view (where
    every marker is a real token) must not compile them; the blanked view refuses them instead."""
    if isinstance(node, dict):
        if node.get("type") in _TOKEN_FORMATS:
            return True
        return any(_names_tokens(v) for k, v in node.items() if k not in _OPAQUE_KEYS | _SCHEMA_KEYS)
    if isinstance(node, list):
        return any(_names_tokens(v) for v in node)
    return False


def _escaped_marker_in_patterns(node: Any, markers: MarkerSet) -> bool:
    """A regex (``pattern`` anywhere) spelling a marker with escapes (``<\\|im_start\\|>``) compiles to
    its plain text, which the rewrite would take for structure: such tags keep the blanked view."""
    if isinstance(node, dict):
        return any((k == "pattern" and isinstance(v, str) and markers.find_in(v.replace("\\", "")))
                   or _escaped_marker_in_patterns(v, markers) for k, v in node.items())
    if isinstance(node, list):
        return any(_escaped_marker_in_patterns(v, markers) for v in node)
    if isinstance(node, str) and node.lstrip().startswith("{"):
        try:
            return _escaped_marker_in_patterns(json.loads(node), markers)
        except ValueError:
            return False
    return False


def tag_uses_placeholders(text: str) -> bool:
    return any(PLACEHOLDER_BASE <= ord(c) < PLACEHOLDER_BASE + _MAX_MARKERS for c in text)


def structural_tag_grammar(tag: dict, markers: MarkerSet) -> tuple[str, dict[int, list[str]]] | None:
    """EBNF for ``tag`` with its structural markers as ``Token(id)`` alternatives, plus the
    marker texts that start a dispatch trigger; None when the tag gives no marker a place."""
    if markers.finder is None:
        return None
    blob = json.dumps(tag, ensure_ascii=False)
    if not markers.find_in(blob) or tag_uses_placeholders(blob) or _names_tokens(tag):
        return None  # no marker text; private-use text of the client's own; token formats
    if _escaped_marker_in_patterns(tag, markers):
        return None
    subst, ph = substitute_tag(tag, markers)
    return rewrite_literals(exact_string_lengths(str(tag_grammar(subst))), ph)


def tag_grammar(tag: dict) -> xgr.Grammar:
    """xgrammar's grammar for a structural tag in either shape: the legacy OpenAI/LMDeploy
    ``structures`` + ``triggers``, or a format tree."""
    if "structures" in tag:
        items = [
            xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s.get("schema", {})), end=s["end"])
            for s in tag["structures"]
        ]
        return xgr.Grammar.from_structural_tag(items, list(tag.get("triggers", [])))
    return xgr.Grammar.from_structural_tag(json.dumps(tag))


def _excludes_state(piece: str, in_excludes: bool) -> bool:
    """Whether the dispatch strings after this piece are excludes (not triggers)."""
    if "excludes=(" in piece:
        return ")" not in piece.split("excludes=(", 1)[1]
    return in_excludes and ")" not in piece


def rewrite_literals(ebnf: str, ph: Placeholders) -> tuple[str, dict[int, list[str]]] | None:
    """Literals outside dispatches: structural placeholders and marker text spelled by a content
    style's own syntax (DeepSeek's ``<｜DSML｜parameter``, GLM's ``<arg_key>``) become
    ``("<text>" | Token(id))``; plain-text placeholders go back to text. Dispatch arguments are
    scanned text: every placeholder goes back to text there, and a trigger starting with a marker
    is recorded. None when no marker got a place (or a class would admit sentinels)."""
    pieces = list(scan_ebnf(ebnf))
    if has_dispatch(pieces) and not classes_refuse_sentinels(pieces):
        return None
    markers = ph.markers
    out: list[str] = []
    triggers: dict[int, list[str]] = {}
    placed = False
    in_excludes = False
    for kind, piece, in_dispatch in pieces:
        if kind == "other" and in_dispatch:
            in_excludes = _excludes_state(piece, in_excludes)
            out.append(exclude_sentinels(piece))
            continue
        if kind != "str":
            out.append(piece)
            continue
        text = decode_literal(piece)
        if in_dispatch:
            plain_parts: list[str] = []
            starts: list[tuple[int, int]] = []  # (token id, offset of its text in the trigger)
            for c in text:
                hit = ph.by_char.get(c)
                if hit is not None and hit[1]:
                    starts.append((hit[0], sum(map(len, plain_parts))))
                plain_parts.append(markers.texts[hit[0]] if hit is not None else c)
            plain = "".join(plain_parts)
            if not in_excludes:
                for tid, offset in starts:  # the marker and the rest of the trigger after it
                    triggers.setdefault(tid, []).append(plain[offset:])
            out.append(ebnf_string_literal(plain))
            continue
        parts = _split_markers(text, ph)
        if all(isinstance(p, str) for p in parts):
            out.append(ebnf_string_literal("".join(parts)))
            continue
        placed = True
        seq = [ebnf_string_literal(p) if isinstance(p, str)
               else f"({ebnf_string_literal(markers.texts[p])} | Token({p}))" for p in parts if p != ""]
        out.append("(" + " ".join(seq) + ")")
    if not placed and not triggers:
        return None
    return "".join(out), triggers


def _split_markers(text: str, ph: Placeholders) -> list[str | int]:
    """``text`` as plain chunks and marker ids (structural placeholders and raw marker text);
    plain-text placeholders are restored inside the chunks."""
    markers = ph.markers
    parts: list[str | int] = []
    buf: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        hit = ph.by_char.get(c)
        if hit is not None:
            if hit[1]:
                parts.append("".join(buf))
                buf = []
                parts.append(hit[0])
            else:
                buf.append(markers.texts[hit[0]])
            i += 1
            continue
        m = markers.finder.match(text, i)
        if m is not None:
            parts.append("".join(buf))
            buf = []
            parts.append(markers.by_text[m.group(0)])
            i = m.end()
            continue
        buf.append(c)
        i += 1
    parts.append("".join(buf))
    return parts


# ---------------------------------------------------------------- EBNF grammars

_TOKEN_SYNTAX = re.compile(r"\b(?:Token|ExcludeToken|TokenTagDispatch|AnyTokens)\s*\(")


def names_token_ids(pieces: Iterable[tuple[str, str, bool]]) -> bool:
    """Whether a printed grammar (``scan_ebnf`` pieces) names token ids outside its string literals."""
    return any(kind == "other" and _TOKEN_SYNTAX.search(text) for kind, text, _ in pieces)


def ebnf_grammar(ebnf: str, markers: MarkerSet) -> tuple[str, dict[int, list[str]]] | None:
    """A client EBNF grammar whose string literals equal to a marker's text also admit the token;
    None when no literal is a marker."""
    if markers.finder is None or not markers.find_in(ebnf):
        return None
    printed = str(xgr.Grammar.from_ebnf(ebnf))
    pieces = list(scan_ebnf(printed))
    if names_token_ids(pieces):
        return None  # the client names tokens itself: only the blanked view may compile that
    if has_dispatch(pieces) and not classes_refuse_sentinels(pieces):
        return None
    out: list[str] = []
    changed = False
    triggers: dict[int, list[str]] = {}
    in_excludes = False
    for kind, piece, in_dispatch in pieces:
        tid = markers.by_text.get(decode_literal(piece)) if kind == "str" else None
        if kind == "other" and in_dispatch:
            in_excludes = _excludes_state(piece, in_excludes)
            out.append(exclude_sentinels(piece))
        elif tid is None:
            out.append(piece)
        elif in_dispatch:
            if not in_excludes:
                triggers.setdefault(tid, []).append(markers.texts[tid])
            out.append(piece)
        else:
            out.append(f"({piece} | Token({tid}))")
            changed = True
    if not changed and not triggers:
        return None
    return "".join(out), triggers


# ---------------------------------------------------------------- printed-EBNF scanning

_EXCLUDES = re.compile(r"excludes=\(")


def exclude_sentinels(piece: str) -> str:
    """Add the sentinel prefix to a dispatch's excludes: its free text then refuses markers."""
    if "excludes=()" in piece:
        return piece.replace("excludes=()", f"excludes=({SENTINEL_EXCLUDE})", 1)
    return _EXCLUDES.sub(lambda m: m.group(0) + SENTINEL_EXCLUDE + ", ", piece, count=1)


def classes_refuse_sentinels(pieces: list[tuple[str, str, bool]]) -> bool:
    """Whether no character class of the grammar accepts the sentinel's first character."""
    probe = SENTINEL_PREFIX.decode()[0]
    for kind, text, _ in pieces:
        if kind != "class":
            continue
        try:
            if re.fullmatch(text, probe):
                return False
        except re.error:
            return False  # a class Python cannot read: do not guess
    return True


def scan_ebnf(text: str) -> Iterator[tuple[str, str, bool]]:
    """Split xgrammar's printed EBNF into ("str" | "class" | "other", text, inside a dispatch)."""
    i, n = 0, len(text)
    depth = 0  # parenthesis depth inside a TagDispatch(...) argument list; 0 = outside
    start = 0
    while i < n:
        c = text[i]
        if c == '"' or c == "[":
            if start < i:
                yield "other", text[start:i], depth > 0
            close = '"' if c == '"' else "]"
            j = i + 1
            while j < n and text[j] != close:
                j += 2 if text[j] == "\\" else 1
            yield ("str" if c == '"' else "class"), text[i:j + 1], depth > 0
            i = start = j + 1
            continue
        if depth == 0 and text.startswith("TagDispatch(", i):
            i += len("TagDispatch(")
            depth = 1
            continue
        if depth:
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:  # the dispatch's own text ends here, flagged as inside it
                    yield "other", text[start:i + 1], True
                    start = i + 1
        i += 1
    if start < n:
        yield "other", text[start:], depth > 0


_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "'": "'", "0": "\0", "]": "]", "[": "[", "-": "-"}


def decode_literal(piece: str) -> str:
    """The text of a printed EBNF string literal (with its quotes)."""
    body, out, i = piece[1:-1], [], 0
    while i < len(body):
        c = body[i]
        if c != "\\" or i + 1 >= len(body):
            out.append(c)
            i += 1
            continue
        e = body[i + 1]
        width = {"x": 2, "u": 4, "U": 8}.get(e)
        if width:
            out.append(chr(int(body[i + 2:i + 2 + width], 16)))
            i += 2 + width
        else:
            out.append(_ESCAPES.get(e, e))
            i += 2
    return "".join(out)


def ebnf_string_literal(text: str) -> str:
    """An EBNF double-quoted literal for ``text`` (escapes quotes, backslashes, controls)."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


# ---------------------------------------------------------------- matcher support

def in_byte_free_text(m: xgr.GrammarMatcher) -> bool:
    """Whether the matcher sits in dispatch free text (the only place raw bytes are accepted)."""
    if m.accept_string(FREE_TEXT_PROBE):
        m.rollback(1)
        return True
    return False


def allowed_dispatch_markers(m: xgr.GrammarMatcher, triggers: dict[int, list[str]]) -> list[int]:
    """Markers that continue a trigger of the dispatch the matcher is in: the marker's text plus
    the rest of the trigger is accepted and leaves free text (the tag began) — at a trigger's
    start, or after its first part was written (``<`` before DeepSeek's ``｜DSML｜``). Other
    dispatches (an XML argument value...) take the same text as free text and stay there, so
    they never admit the marker."""
    return [tid for tid, texts in triggers.items() if starts_trigger(m, texts)]


def starts_trigger(m: xgr.GrammarMatcher, texts: list[str]) -> bool:
    """Whether one of ``texts`` (a marker's text + the rest of its trigger) fires a dispatch."""
    for text in texts:
        if m.accept_string(text.encode()):
            fired = not in_byte_free_text(m)
            m.rollback(1)
            if fired:
                return True
    return False


def add_trigger_markers(m: xgr.GrammarMatcher, row: torch.Tensor, triggers: dict[int, list[str]]) -> None:
    """Post-fill: ``Token(id)`` literals are already in the row (free text refuses sentinels);
    in dispatch free text, a marker that starts one of its triggers is allowed too."""
    if not triggers or not in_byte_free_text(m):
        return
    for tid in allowed_dispatch_markers(m, triggers):
        row[tid // 32] |= _bit(tid % 32)
