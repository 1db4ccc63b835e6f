"""A parser for the regular subset of Python ``re`` syntax, with ``re.fullmatch`` semantics on str.

Written to agree with CPython's ``sre_parse`` on everything it accepts (escapes, classes, brace
quantifiers that fall back to literals, octal escapes, lazy quantifiers), so users' patterns mean
here what they mean in Python. Non-regular or engine-specific constructs (backreferences,
lookaround, ``\\b``, possessive/atomic, conditionals, case-insensitive/verbose flags) raise
``UnsupportedGuideError`` naming the construct; malformed patterns raise ``RegexSyntaxError``
(an ``InvalidGuideError``) carrying the position.

This is the FSM backend's only regex parser: the C module (csrc/dfa_native/) starts from the AST
it builds (walked there by ``compile_tree``), so there is one place that decides what a pattern
means. Parsing is a compile's only per-character Python work, so repeated pieces (classes,
escapes, quantifier bounds, repetitions, groups) are served from bounded caches keyed by their
text and whatever else decides their meaning.
"""
from __future__ import annotations

import re
import unicodedata

from ..errors import GuideLimitError, InvalidGuideError, UnsupportedGuideError
from ..limits import repeat_count
from .charset import MAX_CODE_POINT, Ranges, negate, normalize, union
from .regex_ast import EMPTY, Alt, Anchor, CharSet, Concat, Empty, Node, Repeat
from .unicode_classes import class_ranges

_HEX = "0123456789abcdefABCDEF"
_OCT = "01234567"
_DIGITS = "0123456789"
_SIMPLE_ESCAPES = {"a": 7, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}  # escape letter -> its hex digits
_FLAG_LETTERS = "aiLmsux"
MAX_NESTING = 200  # group nesting depth; deeper patterns raise GuideLimitError (no recursion blow-up)
_UNSUPPORTED_FLAGS = {"i": "case-insensitive flag (?i)", "x": "verbose flag (?x)", "L": "locale flag (?L)"}
# Characters atom()/quantifier() treat specially; any other character is a literal (no flag changes
# that: case-insensitive and verbose modes are refused), parsed by a fast path in sequence().
_META = frozenset("\\()[]{}|.*+?^$")
_QUANTIFIER_START = frozenset("*+?{")
_BRACE = re.compile(r"\{([0-9]*)(?:(,)([0-9]*))?\}")  # {m} {m,} {,n} {m,n} {,}; "{}" is a literal
# Bounds of brace quantifiers by their text ("{2,5}" -> (2, 5)), up to _BRACE_TEXT_MAX characters:
# patterns repeat the same few counts. Bounded like the other caches.
_BRACES: dict[str, tuple[int, int | None]] = {}
_BRACE_TEXT_MAX = 16
_LITERALS: dict[str, CharSet] = {}  # literal character -> its (immutable, shared) CharSet node
# Parsed character classes by their exact text and the ASCII flag (the only flag they depend on):
# JSON-lowered regexes repeat the same few classes dozens of times. Indexed by the first 3
# characters (every class is at least "[x]" long). Bounded: parsing continues uncached when full.
_CLASSES: dict[tuple[str, bool], CharSet] = {}
# Two-character escapes whose meaning depends on nothing else (\. \" \n \d ...), by the escaped
# character, one table per value of the ASCII flag (it changes \d \w \s).
_ESCAPES: tuple[dict[str, CharSet], dict[str, CharSet]] = ({}, {})
_ESCAPE_CONTEXTUAL = frozenset("AZ0123456789")  # anchors, octal escapes and group references
# Repetitions of cached nodes ("[ ]?", "[0-9]{4}", "\d+"), by (id of the item, min, max); a hit
# is checked to hold that very item, which the entry keeps alive, so an id is never mistaken.
_REPEATS: dict[tuple[int, int, int | None], Repeat] = {}
_CLASS_TEXTS: dict[str, list[str]] = {}
CACHE_MAX = 4096
# Parsed plain groups "(...)" and "(?:...)" by their exact text, the flags and max_repeat they were
# parsed under: JSON-lowered regexes repeat the same string, number and whitespace groups within a
# pattern and across schemas. Value: (node, nesting depth inside the group). Groups holding anchors
# are not kept (anchors are checked against the whole pattern). Indexed by the first 8 characters;
# bounded by the total text kept (~100 bytes of nodes per character at most: a few MB), a group's
# text length and the number of texts per prefix; parsing continues uncached beyond.
_GROUPS: dict[tuple[str, bool, bool, int], tuple[Node, int]] = {}
_GROUP_TEXTS: dict[str, list[str]] = {}
GROUP_TEXT_MAX = 512
GROUP_CHARS_MAX = 1 << 16
_GROUP_PREFIX = 8
_GROUP_PER_PREFIX = 16
_group_chars = 0


class RegexSyntaxError(InvalidGuideError):
    """An invalid pattern; ``position`` is the 0-based offset of the problem in the pattern."""

    def __init__(self, message: str, pattern: str, position: int):
        super().__init__(f"invalid regex at position {position}: {message} (pattern {_clip(pattern)!r})")
        self.position = position
        self.pattern = pattern


def _clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _unsupported(feature: str, pos: int) -> UnsupportedGuideError:
    return UnsupportedGuideError(
        f"the fsm backend does not support {feature} (at position {pos}): not a regular language "
        "construct it can enforce exactly",
        feature=feature,
        backend="fsm",
    )


def parse_regex(pattern: str, max_repeat: int = 1000) -> Node:
    """Parse ``pattern`` into an anchor-free AST for full-match semantics."""
    if not isinstance(pattern, str):
        raise InvalidGuideError(f"regex must be a str, got {type(pattern).__name__}")
    parser = _Parser(pattern, max_repeat)
    node = parser.parse()
    if not parser.anchors:
        return node
    outer = _strip_outer_anchors(node, parser.anchor_count)
    return outer if outer is not None else _strip_anchors(node, True, True)


class _Parser:
    def __init__(self, pattern: str, max_repeat: int):
        self.p = pattern
        self.n = len(pattern)
        self.i = 0
        self.max_repeat = max_repeat
        self.dotall = False
        self.ascii = False
        self.depth = 0
        self.peak = 0  # deepest nesting reached so far (a cached group's depth must still fit)
        self.anchors = False  # any ^ $ \A \Z seen (then anchors are checked and removed)
        self.anchor_count = 0  # how many in the whole pattern
        self._global_flags_end = 0  # where a leading (?flags) ended: a group there may set flags

    # ---- helpers ------------------------------------------------------------------------
    def error(self, message: str, pos: int | None = None) -> RegexSyntaxError:
        return RegexSyntaxError(message, self.p, self.i if pos is None else pos)

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.p[j] if j < self.n else ""

    # ---- grammar ------------------------------------------------------------------------
    def parse(self) -> Node:
        node = self.alternation(top=True)
        if self.i < self.n:  # only a stray ')' stops the top-level alternation early
            raise self.error("unbalanced parenthesis")
        return node

    def alternation(self, top: bool = False) -> Node:
        branches = [self.sequence(top)]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.sequence(False))
        return branches[0] if len(branches) == 1 else Alt(tuple(branches))

    def sequence(self, top: bool) -> Node:
        items: list[Node] = []
        last_repeat = False
        p, n = self.p, self.n
        literals = _LITERALS
        last_shared = False  # the last item is a node held by a cache (its repetitions are cached)
        i = self.i
        while i < n:
            c = p[i]
            if c not in _META:  # a literal: what atom() returns, without quantifier()/atom() calls
                node = literals.get(c)
                if node is None:
                    node = CharSet(((ord(c), ord(c)),))
                    if len(literals) < CACHE_MAX:
                        literals[c] = node
                items.append(node)
                i += 1
                last_repeat = False
                last_shared = True
                continue
            if c == "|" or c == ")":
                break
            self.i = start = i
            if c == "[":  # what atom() would do, without its call
                items.append(self.char_class())
                i = self.i
                last_repeat = False
                last_shared = True
                continue
            if c == "\\" and i + 1 < n:
                node = _ESCAPES[self.ascii].get(p[i + 1])
                if node is not None:
                    items.append(node)
                    i += 2
                    last_repeat = False
                    last_shared = True
                    continue
            if c in _QUANTIFIER_START:
                quant = self.quantifier()
                if quant is not None:
                    lo, hi = quant
                    if not items or isinstance(items[-1], Anchor):
                        raise self.error("nothing to repeat", start)
                    if last_repeat:
                        raise self.error("multiple repeat", start)
                    items[-1] = _repeat(items[-1], lo, hi) if last_shared else Repeat(items[-1], lo, hi)
                    last_repeat = True
                    last_shared = False
                    i = self.i
                    continue
            if c == "(":
                atom = self.group(top and start == self._global_flags_end)
            else:
                atom = self.atom(False)
            i = self.i
            if atom is None:  # comment or global flags: produces nothing
                continue
            items.append(atom)
            last_repeat = False
            last_shared = False
            if c == "\\" and i == start + 2 and p[start + 1] not in _ESCAPE_CONTEXTUAL:
                escapes = _ESCAPES[self.ascii]
                if len(escapes) < CACHE_MAX:
                    escapes[p[start + 1]] = atom
        self.i = i
        if not items:
            return EMPTY
        return items[0] if len(items) == 1 else Concat(tuple(items))

    def quantifier(self) -> tuple[int, int | None] | None:
        """Parse a quantifier at the cursor (with its lazy ``?``), or return None (cursor kept)."""
        p, i = self.p, self.i
        c = p[i] if i < self.n else ""
        if c == "*":
            lo, hi = 0, None
            i += 1
        elif c == "+":
            lo, hi = 1, None
            i += 1
        elif c == "?":
            lo, hi = 0, 1
            i += 1
        elif c == "{":
            parsed = self._brace()
            if parsed is None:
                return None
            lo, hi = parsed
            i = self.i
        else:
            return None
        if i < self.n:
            c = p[i]
            if c == "?":
                i += 1  # lazy: same language under full match
            elif c == "+":
                raise _unsupported("possessive quantifier", i)
        self.i = i
        return lo, hi

    def _brace(self) -> tuple[int, int | None] | None:
        """``{m}``, ``{m,}``, ``{,n}``, ``{m,n}``; None (nothing consumed) when it is a literal '{'."""
        start = self.i
        p = self.p
        end = p.find("}", start, start + _BRACE_TEXT_MAX)  # a quantifier ends at its first '}'
        bounds = _BRACES.get(p[start:end + 1]) if end >= 0 else None
        if bounds is None:
            m = _BRACE.match(p, start)
            if m is None:
                return None
            lo_txt, comma, hi_txt = m.groups()
            if comma is None:
                if not lo_txt:
                    return None
                hi_txt = lo_txt
            where = f"at position {start}"
            bounds = (repeat_count(lo_txt, self.max_repeat, where),
                      repeat_count(hi_txt, self.max_repeat, where) if hi_txt else None)
            if bounds[1] is not None and bounds[1] < bounds[0]:
                raise self.error("min repeat greater than max repeat", start + 1)
            end = m.end() - 1
            if len(_BRACES) < CACHE_MAX and end - start < _BRACE_TEXT_MAX:
                _BRACES[m.group()] = bounds
        self.i = end + 1
        lo, hi = bounds
        over = lo if lo > self.max_repeat else hi if hi is not None and hi > self.max_repeat else None
        if over is not None:
            raise GuideLimitError(
                f"limit max_repeat={self.max_repeat} exceeded: repetition bound {over} at position {start}",
                limit="max_repeat",
                value=over,
            )
        return bounds

    def atom(self, at_start: bool) -> Node | None:
        c = self.p[self.i]
        if c == "(":
            return self.group(at_start)
        if c == "[":
            return self.char_class()
        if c == ".":
            self.i += 1
            if self.dotall:
                return CharSet(((0, MAX_CODE_POINT),))
            return CharSet(((0, 9), (11, MAX_CODE_POINT)))
        if c == "^":
            self.i += 1
            self.anchors = True
            self.anchor_count += 1
            return Anchor("start", self.i - 1)
        if c == "$":
            self.i += 1
            self.anchors = True
            self.anchor_count += 1
            return Anchor("end", self.i - 1)
        if c == "\\":
            return self.escape()
        self.i += 1
        return CharSet(((ord(c), ord(c)),))

    # ---- groups -------------------------------------------------------------------------
    def group(self, at_start: bool) -> Node | None:
        start = self.i
        # a group without extensions, capturing or not: cached by its text
        plain = self.peek(1) != "?" or self.p.startswith("?:", start + 1)
        if plain:
            flags = (self.dotall, self.ascii, self.max_repeat)
            for text in _GROUP_TEXTS.get(self.p[start:start + _GROUP_PREFIX], ()):
                hit = _GROUPS.get((text, *flags)) if self.p.startswith(text, start) else None
                if hit is not None and self.depth + hit[1] <= MAX_NESTING:
                    self.i = start + len(text)
                    return hit[0]
            outer_anchors, outer_peak = self.anchors, self.peak
            self.anchors, self.peak = False, self.depth
        self.i += 1
        saved = (self.dotall, self.ascii)
        if self.peek() == "?":
            self.i += 1
            c = self.peek()
            if c == "":
                raise self.error("unexpected end of pattern")
            if c == ":":
                self.i += 1
            elif c == "P":
                self.i += 1
                nxt = self.peek()
                if nxt == "<":
                    self.i += 1
                    self._group_name()
                elif nxt == "=":
                    raise _unsupported("named backreference (?P=name)", start)
                else:
                    raise self.error(f"unknown extension ?P{nxt}", start + 1)
            elif c == "#":
                end = self.p.find(")", self.i)
                if end < 0:
                    raise self.error("missing ), unterminated comment", start)
                self.i = end + 1
                return None
            elif c in "=!":
                raise _unsupported("lookahead assertion", start)
            elif c == "<":
                nxt = self.peek(1)
                if nxt in ("=", "!"):
                    raise _unsupported("lookbehind assertion", start)
                self.i += 1
                self._group_name()  # (?<name>...) accepted as a named group (PCRE/Rust syntax)
            elif c == "(":
                raise _unsupported("conditional group (?(...)...)", start)
            elif c == ">":
                raise _unsupported("atomic group (?>...)", start)
            elif c in _FLAG_LETTERS or c == "-":
                if self._flags(start, at_start):
                    return None  # global flags
            else:
                raise self.error(f"unknown extension ?{c}", start + 1)
        self.depth += 1
        if self.depth > self.peak:
            self.peak = self.depth
        if self.depth > MAX_NESTING:
            raise GuideLimitError(
                f"regex nests groups deeper than {MAX_NESTING} (at position {start})",
                limit="regex_nesting", value=self.depth,
            )
        body = self.alternation()
        self.depth -= 1
        if self.peek() != ")":
            raise self.error("missing ), unterminated subpattern", start)
        self.i += 1
        self.dotall, self.ascii = saved
        if plain:
            inner, had_anchors = self.peak - self.depth, self.anchors
            self.anchors, self.peak = outer_anchors or had_anchors, max(outer_peak, self.peak)
            text = self.p[start:self.i]
            if not had_anchors and len(text) <= GROUP_TEXT_MAX:
                _remember_group(text, flags, body, inner)
        return body

    def _group_name(self) -> None:
        end = self.p.find(">", self.i)
        if end < 0:
            raise self.error("missing >, unterminated name")
        name = self.p[self.i : end]
        if not name:
            raise self.error("missing group name")
        if not name.isidentifier():
            raise self.error(f"bad character in group name {name!r}")
        self.i = end + 1

    def _flags(self, start: int, at_start: bool) -> bool:
        """Parse ``(?flags)`` (global, returns True) or ``(?flags-flags:`` (scoped, returns False)."""
        on = ""
        while self.peek() in _FLAG_LETTERS and self.peek():
            on += self.p[self.i]
            self.i += 1
        off = ""
        if self.peek() == "-":
            self.i += 1
            while self.peek() in _FLAG_LETTERS and self.peek():
                off += self.p[self.i]
                self.i += 1
            if not off:
                raise self.error("missing flag", self.i)
        end = self.peek()
        if end not in (")", ":"):
            raise self.error("missing -, : or )" if end else "missing flag", self.i)
        if end == ")" and off:
            raise self.error("missing :", self.i)
        for f in on + off:
            if f in _UNSUPPORTED_FLAGS:
                raise _unsupported(_UNSUPPORTED_FLAGS[f], start)
        if "a" in on and "u" in on:
            raise self.error("bad inline flags: flags 'a', 'u' and 'L' are incompatible", start)
        if "a" in off or "u" in off:
            raise self.error("bad inline flags: cannot turn off flags 'a', 'u' and 'L'", start)
        self.i += 1
        if end == ")":
            if not at_start:
                raise self.error("global flags not at the start of the expression", start)
            self._global_flags_end = self.i
        if "s" in on:
            self.dotall = True
        if "s" in off:
            self.dotall = False
        if "a" in on:
            self.ascii = True
        if "u" in on:
            self.ascii = False
        return end == ")"

    # ---- escapes ------------------------------------------------------------------------
    def _hex(self, start: int, count: int, letter: str) -> int:
        digits = self.p[self.i : self.i + count]
        if len(digits) != count or any(d not in _HEX for d in digits):
            raise self.error(f"incomplete escape \\{letter}{digits}", start)
        self.i += count
        value = int(digits, 16)
        if value > MAX_CODE_POINT:
            raise self.error(f"bad escape \\{letter}{digits}", start)
        return value

    def _named_char(self, start: int) -> int:
        if self.peek() != "{":
            raise self.error("missing {", self.i)
        end = self.p.find("}", self.i)
        if end < 0:
            raise self.error("missing }, unterminated name", self.i)
        name = self.p[self.i + 1 : end]
        if not name:
            raise self.error("missing character name", self.i)
        try:
            ch = unicodedata.lookup(name)
        except KeyError:
            raise self.error(f"undefined character name {name!r}", start) from None
        self.i = end + 1
        return ord(ch)

    def _common_escape(self, c: str, start: int) -> int | Ranges | None:
        """Escapes valid both in and out of classes: a code point, a class's ranges, or None."""
        if c in _SIMPLE_ESCAPES:
            self.i += 1
            return _SIMPLE_ESCAPES[c]
        if c in "dDwWsS":
            self.i += 1
            ranges, negated = class_ranges(c, self.ascii)
            return negate(ranges) if negated else ranges
        if c in _HEX_ESCAPES:
            self.i += 1
            return self._hex(start, _HEX_ESCAPES[c], c)
        if c == "N":
            self.i += 1
            return self._named_char(start)
        return None

    def _escape_head(self, at_end: str) -> tuple[int, str, int | Ranges | None]:
        """Step over a backslash: (its position, the escaped character, ``_common_escape`` of it);
        ``at_end`` is the error when the pattern ends there."""
        start = self.i
        self.i += 1
        c = self.peek()
        if c == "":
            raise self.error(at_end, start)
        return start, c, self._common_escape(c, start)

    def escape(self) -> Node:
        start, c, common = self._escape_head("bad escape (end of pattern)")
        if isinstance(common, int):
            return CharSet(((common, common),))
        if common is not None:
            return CharSet(common)
        if c == "A":
            self.i += 1
            self.anchors = True
            self.anchor_count += 1
            return Anchor("start", start)
        if c == "Z":
            self.i += 1
            self.anchors = True
            self.anchor_count += 1
            return Anchor("end", start)
        if c in "bB":
            raise _unsupported("word boundary \\" + c, start)
        if c == "0":
            value = self._octal(start)
            return CharSet(((value, value),))
        if c in _DIGITS:
            # three octal digits → octal escape; otherwise a group reference
            if c in _OCT and self.peek(1) in _OCT and self.peek(1) and self.peek(2) in _OCT and self.peek(2):
                value = int(self.p[self.i : self.i + 3], 8)
                if value > 0o377:
                    raise self.error(f"octal escape value \\{self.p[self.i:self.i + 3]} outside of range 0-0o377", start)
                self.i += 3
                return CharSet(((value, value),))
            raise _unsupported("backreference \\" + c, start)
        if c.isascii() and c.isalpha():
            raise self.error(f"bad escape \\{c}", start)
        self.i += 1
        return CharSet(((ord(c), ord(c)),))

    def _octal(self, start: int) -> int:
        """Up to three octal digits at the cursor (the first is known to be octal)."""
        j = self.i
        while j < self.n and j - self.i < 3 and self.p[j] in _OCT:
            j += 1
        value = int(self.p[self.i : j], 8)
        if value > 0o377:
            raise self.error(f"octal escape value \\{self.p[self.i:j]} outside of range 0-0o377", start)
        self.i = j
        return value

    # ---- character classes --------------------------------------------------------------
    def char_class(self) -> Node:
        start = self.i
        texts = _CLASS_TEXTS.get(self.p[start:start + 3])
        if texts:
            for text in texts:
                if self.p.startswith(text, start):
                    node = _CLASSES.get((text, self.ascii))
                    if node is not None:
                        self.i = start + len(text)
                        return node
        node = self._parse_class()
        if len(_CLASSES) < CACHE_MAX:
            text = self.p[start:self.i]
            if (text, self.ascii) not in _CLASSES:
                _CLASSES[(text, self.ascii)] = node
                _CLASS_TEXTS.setdefault(text[:3], []).append(text)
        return node

    def _parse_class(self) -> Node:
        start = self.i
        self.i += 1
        negated = False
        if self.peek() == "^":
            negated = True
            self.i += 1
        first = self.i
        parts: list[tuple[int, int]] = []
        while True:
            if self.i >= self.n:
                raise self.error("unterminated character set", start)
            c = self.p[self.i]
            if c == "]" and self.i != first:
                self.i += 1
                break
            item_pos = self.i
            code1 = self._class_item()
            if self.peek() == "-" and self.i + 1 < self.n and self.p[self.i + 1] != "]":
                self.i += 1
                code2 = self._class_item()
                if not isinstance(code1, int) or not isinstance(code2, int):
                    raise self.error(f"bad character range {self.p[item_pos:self.i]}", item_pos)
                if code2 < code1:
                    raise self.error(f"bad character range {self.p[item_pos:self.i]}", item_pos)
                parts.append((code1, code2))
            else:
                if self.peek() == "-" and self.i + 1 >= self.n:
                    raise self.error("unterminated character set", start)
                if isinstance(code1, int):
                    parts.append((code1, code1))
                else:
                    parts.extend(code1)
        ranges = normalize(parts)
        return CharSet(negate(ranges) if negated else ranges)

    def _class_item(self) -> int | Ranges:
        c = self.p[self.i]
        if c != "\\":
            self.i += 1
            return ord(c)
        start, c, common = self._escape_head("unterminated character set")
        if common is not None:
            return common
        if c == "b":
            self.i += 1
            return 8
        if c in _OCT:
            return self._octal(start)
        if c in _DIGITS:
            raise self.error(f"bad escape \\{c}", start)
        if c.isascii() and c.isalpha():
            raise self.error(f"bad escape \\{c}", start)
        self.i += 1
        return ord(c)


def _repeat(item: Node, lo: int, hi: int | None) -> Repeat:
    """``Repeat(item, lo, hi)``, shared through ``_REPEATS`` (``item`` is held by a cache)."""
    key = (id(item), lo, hi)
    node = _REPEATS.get(key)
    if node is None or node.item is not item:
        node = Repeat(item, lo, hi)
        if len(_REPEATS) < CACHE_MAX:
            _REPEATS[key] = node
    return node


def _remember_group(text: str, flags: tuple[bool, bool, int], node: Node, inner: int) -> None:
    """Cache a parsed plain group while the budget allows (see ``_GROUPS``)."""
    global _group_chars
    key = (text, *flags)
    if key in _GROUPS or _group_chars + len(text) > GROUP_CHARS_MAX:
        return
    texts = _GROUP_TEXTS.setdefault(text[:_GROUP_PREFIX], [])
    if len(texts) >= _GROUP_PER_PREFIX:
        return
    _GROUPS[key] = (node, inner)
    if text not in texts:
        texts.append(text)
    _group_chars += len(text)


def _empty_like(node: Node) -> bool:
    return isinstance(node, (Anchor, Empty))


def _strip_outer_anchors(node: Node, count: int) -> Node | None:
    """``_strip_anchors(node, True, True)`` when all ``count`` anchors open or close the pattern or
    one of its top-level branches (``^...$``, ``\\A...\\Z``, ``^a|b$``), else None: the anchors
    become Empty and the rest of the tree is kept as it is, instead of being rebuilt node by node."""
    branches = node.items if type(node) is Alt else (node,)
    out: list[Node] = []
    seen = 0
    for branch in branches:
        if type(branch) is Anchor:  # a branch that is only ^ or $: at both ends at once
            out.append(EMPTY)
            seen += 1
        elif type(branch) is Concat:
            items = list(branch.items)
            first, last = items[0], items[-1]
            if type(first) is Anchor and first.kind == "start":
                items[0] = EMPTY
                seen += 1
            if type(last) is Anchor and last.kind == "end":
                items[-1] = EMPTY
                seen += 1
            out.append(Concat(tuple(items)))
        else:
            out.append(branch)
    if seen != count:
        return None
    return Alt(tuple(out)) if type(node) is Alt else out[0]


def _strip_anchors(node: Node, at_start: bool, at_end: bool) -> Node:
    """Replace anchors that are trivially satisfied under full match by Empty; refuse the rest."""
    if isinstance(node, Anchor):
        if node.kind == "start" and at_start:
            return EMPTY
        if node.kind == "end" and at_end:
            return EMPTY
        where = "start" if node.kind == "start" else "end"
        raise _unsupported(f"anchor not at the {where} of the pattern", node.pos)
    if isinstance(node, Alt):
        return Alt(tuple(_strip_anchors(i, at_start, at_end) for i in node.items))
    if isinstance(node, Concat):
        items = node.items
        out = []
        for k, item in enumerate(items):
            s = at_start and all(_empty_like(x) for x in items[:k])
            e = at_end and all(_empty_like(x) for x in items[k + 1 :])
            out.append(_strip_anchors(item, s, e))
        return Concat(tuple(out))
    if isinstance(node, Repeat):
        inherit = node.max is not None and node.max <= 1
        return Repeat(_strip_anchors(node.item, at_start and inherit, at_end and inherit), node.min, node.max)
    return node


__all__ = ["RegexSyntaxError", "parse_regex", "union"]
