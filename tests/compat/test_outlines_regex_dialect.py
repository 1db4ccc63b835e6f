"""outlines' regex dialect in the shim, proven against outlines-core 0.2 itself (what outlines 1.x
runs): for each pattern, the set of first tokens outlines-core's ``Index`` allows over a
vocabulary of single characters (ASCII, Unicode digits, letters, marks and spaces) equals the
shim's ``RegexGuide`` on the same vocabulary, after every prefix of a probe text too; random
strings are accepted by both or by neither (the languages); and the shim's table of Rust's
``\\w \\d \\s`` equals outlines-core's over every code point. POSIX bracket classes and a leading
``(?i)`` are spelled out by the shim, and so are ``\\w \\d \\s``: Python's Unicode tables differ
from Rust's (combining marks, superscript digits, newer digits, ``\\x1c``)."""
from __future__ import annotations

import pytest

oc = pytest.importorskip("outlines_core")

from tokenrails.compat.outlines.fsm.guide import RegexGuide  # noqa: E402
from tokenrails.compat.outlines.fsm.states import FINAL  # noqa: E402

# ASCII, and characters where Python's and Rust's Unicode classes disagree: a combining mark (Rust
# \w), superscript two / vulgar half (Python \w), information separators (Python \s), a circled
# letter (Rust \w: Alphabetic), a Kawi digit (Unicode 15: Rust \d)
CHARS = [chr(c) for c in range(0x20, 0x7F)] + ["\t", "\n", "٣", "٤", "é", "Ω", "ß", "\u0301", "\u00a0", "\u2003", "_",
                                               "\u00b2", "\u00bd", "\x1c", "\x1f", "\u24b6", "\U00011f50"]
EOS = len(CHARS) + 1

PATTERNS = [
    (r"\d+", "12"), (r"\w+", "ab"), (r"\s+\d", " \u00a01"), (r"\s?x", " x"), (r"[[:alpha:]]+[[:digit:]]", "ab1"),
    (r"[[:xdigit:][:space:]]+", "a 1"), (r"(?i)yes|no", "Ye"), (r"(?i)[a-c]x", "B"),
    (r"[^a-z]\W", "1"), (r"[\w\s]+", "a b"), (r"[^\d\s]x", "ax"), (r"[^a-z]\D", "1"), (r"\S\D", "x"), (r"a{2,3}b?", "aa"),
]


class CharTokenizer:
    """outlines' tokenizer interface over single characters (id = position + 1)."""

    vocabulary = {c: i + 1 for i, c in enumerate(CHARS)}
    special_tokens: set = set()
    eos_token_id = EOS

    def convert_token_to_string(self, token):
        return token


def _oc_allowed(guide) -> set[int]:
    return {t for t in guide.get_tokens() if t != EOS}


def _ours_allowed(guide, state) -> set[int]:
    instruction = guide.get_next_instruction(state)
    tokens = instruction.tokens
    return {int(t) for t in (tokens.tolist() if hasattr(tokens, "tolist") else tokens)} - {EOS}


@pytest.mark.parametrize("pattern,probe", PATTERNS)
def test_first_token_sets_equal_outlines_core(pattern, probe):
    vocab = oc.Vocabulary(EOS, {c: [i] for c, i in CharTokenizer.vocabulary.items()})
    theirs = oc.Guide(oc.Index(pattern, vocab))
    ours = RegexGuide.from_regex(pattern, CharTokenizer())
    state = ours.initial_state
    for ch in [None] + list(probe):
        if ch is not None:
            tid = CharTokenizer.vocabulary[ch]
            theirs.advance(tid)
            state = ours.get_next_state(state, tid)
            assert state != FINAL
        assert _ours_allowed(ours, state) == _oc_allowed(theirs), (pattern, ch)


def _walk_accepts(pattern: str, text: str) -> tuple[bool, bool]:
    """(outlines-core accepts ``text``, the shim accepts it), one character token at a time."""
    vocab = oc.Vocabulary(EOS, {c: [i] for c, i in CharTokenizer.vocabulary.items()})
    theirs = oc.Guide(oc.Index(pattern, vocab))
    ours = RegexGuide.from_regex(pattern, CharTokenizer())
    state, theirs_ok = ours.initial_state, True
    for ch in text:
        tid = CharTokenizer.vocabulary[ch]
        if theirs_ok and tid in theirs.get_tokens():
            theirs.advance(tid)
        else:
            theirs_ok = False
        state = ours.get_next_state(state, tid) if state != FINAL else FINAL
    theirs_final = theirs_ok and EOS in theirs.get_tokens()
    ours_final = state != FINAL and EOS in _ours_allowed_with_eos(ours, state)
    return theirs_final, ours_final


def _ours_allowed_with_eos(guide, state) -> set[int]:
    tokens = guide.get_next_instruction(state).tokens
    return {int(t) for t in (tokens.tolist() if hasattr(tokens, "tolist") else tokens)}


LANGUAGE_PATTERNS = [r"\w+", r"\d{1,3}", r"[^\s]\s?", r"\W\D", r"[[:alpha:]_]\w*", r"(?i)ab\d"]


@pytest.mark.parametrize("pattern", LANGUAGE_PATTERNS)
def test_languages_equal_outlines_core_on_random_strings(pattern):
    """The same strings accepted and refused (hypothesis over the probe alphabet)."""
    from hypothesis import given, settings, strategies as st

    @settings(max_examples=120, deadline=None, database=None)
    @given(st.text(alphabet=CHARS, max_size=4))
    def same(text):
        theirs, ours = _walk_accepts(pattern, text)
        assert theirs == ours, (pattern, text, theirs, ours)

    same()


def test_shorthand_table_equals_outlines_core_over_every_code_point():
    """``regex_classes.py`` (what the shim spells ``\\w \\d \\s`` as) is exactly what the installed
    outlines-core matches; regenerate it with scripts/gen_outlines_regex_classes.py if not."""
    from tokenrails.compat.outlines import regex_classes

    chars = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    vocab = oc.Vocabulary(len(chars) + 1, {chr(c): [i] for i, c in enumerate(chars)})
    for name, pattern in (("WORD", r"\w"), ("DIGIT", r"\d"), ("SPACE", r"\s")):
        index = oc.Index(pattern, vocab)
        theirs = {chars[i] for i in index.get_allowed_tokens(index.get_initial_state()) if i < len(chars)}
        ours = {c for a, b in getattr(regex_classes, name) for c in range(a, b + 1)}
        assert ours == theirs, (name, sorted(ours ^ theirs)[:10])


# Repetitions of repetitions, which Rust's parser (so outlines-core) reads as nested repetition
# and Python's refuses. (outlines-core's index gives ``a{2}+`` only "aa", not (aa)+: its automaton
# stops after some matches, see docs/migrating-from-outlines.md; the shim keeps nested repetition.)
STACKED = [r"a+{1,2}", r"a{2}{3}", r"(a|b){2}{2}", r"a?{2}", r"a**", r"a*+a", r"a{1,2}+a"]


@pytest.mark.parametrize("pattern", STACKED)
def test_stacked_repetitions_mean_what_outlines_core_reads(pattern):
    """Every string over {a, b} up to 7 characters: accepted by the shim exactly when by outlines-core."""
    import itertools

    for n in range(8):
        for chars in itertools.product("ab", repeat=n):
            text = "".join(chars)
            theirs, ours = _walk_accepts(pattern, text)
            assert theirs == ours, (pattern, text, theirs, ours)


@pytest.mark.parametrize("pattern,nested", [(r"[ab]+{2}b", r"(?:[ab]+){2}b"), (r"(ab)+{2}", r"(?:(ab)+){2}"),
                                            (r"a{2}+", r"(?:a{2})+")])
def test_stacked_repetitions_keep_their_whole_language(pattern, nested):
    """Where outlines-core's index stops early (it refuses "aabab" for ``[ab]+{2}b``), the shim
    keeps the language of the nested repetition, judged by ``re.fullmatch``."""
    import itertools
    import re

    for n in range(8):
        for chars in itertools.product("ab", repeat=n):
            text = "".join(chars)
            _, ours = _walk_accepts(pattern, text)
            assert ours == bool(re.fullmatch(nested, text)), (pattern, text)


def _case_sample() -> list[str]:
    """Letters whose case classes are unusual (Kelvin and Angstrom signs, long s, sharp s, final
    sigma, dotless i, title-case digraphs, micro sign), ASCII, and 200 seeded cased letters."""
    import random

    from tokenrails.compat.outlines.regex_dialect import _case_classes

    table = _case_classes()
    tricky = "kKsSß\u1e9eσςΣéÉǅǆǄθϑΘµμΜåÅ\u212a\u212b\u017fiIİı"
    picked = random.Random(7).sample(sorted(table), 200)
    return sorted(set(tricky) | {chr(c) for c in range(ord("a"), ord("z") + 1)} | {chr(c) for c in picked})


def test_case_insensitive_letters_match_what_outlines_core_matches():
    """``(?i)`` + one letter, and ``(?i)`` classes and ranges: the first tokens the shim allows
    over a vocabulary of every letter of the sample and all its case variants are outlines-core's."""
    import re

    from tokenrails.compat.outlines.regex_dialect import _case_classes

    table = _case_classes()
    letters = _case_sample()
    chars = sorted({chr(m) for ch in letters for m in table.get(ord(ch), (ord(ch),))} | set(letters) | set("19-_ "))
    eos = len(chars)

    class Chars:
        vocabulary = {c: i for i, c in enumerate(chars)}
        special_tokens: set = set()
        eos_token_id = eos

        def convert_token_to_string(self, token):
            return token

    vocab = oc.Vocabulary(eos, {c: [i] for c, i in Chars.vocabulary.items()})
    patterns = [re.escape(ch) for ch in letters] + ["[é-ü]", "[^a-z]", "[a-f0-9]", "[^é]", "[ǅ-ǆ]", "[ß-ÿ]"]
    for body in patterns:
        pattern = "(?i)" + body
        theirs = {t for t in oc.Guide(oc.Index(pattern, vocab)).get_tokens() if t != eos}
        ours_guide = RegexGuide.from_regex(pattern, Chars())
        ours = {int(t) for t in ours_guide.get_next_instruction(ours_guide.initial_state).tokens} - {eos}
        assert ours == theirs, pattern


def test_posix_classes_outlines_core_refuses_are_typed_errors():
    from tokenrails import InvalidGuideError, UnsupportedGuideError
    from tokenrails.compat.outlines.regex_dialect import outlines_dialect

    with pytest.raises(InvalidGuideError, match="bogus"):
        outlines_dialect("[[:bogus:]]")
    with pytest.raises(UnsupportedGuideError, match="negated POSIX class"):
        outlines_dialect("[[:^alpha:]]")


def test_case_folded_ranges_equal_the_code_point_walk_and_stay_cheap():
    """A class range under ``(?i)`` gains exactly the letters folding adds to its code points
    (against walking every code point, on random ranges), and a hostile pattern of 3,000
    full-range classes (16k characters, the regex length limit) is rewritten in seconds."""
    import random
    import time

    from tokenrails.compat.outlines.regex_dialect import UNICODE_FOLDING, outlines_dialect

    rng = random.Random(3)
    for _ in range(300):
        lo = rng.choice([0, 0x41, 0xC0, 0x370, 0x400, 0x1E00, 0x2100, 0xFF00, 0x10400]) + rng.randrange(64)
        hi = lo + rng.randrange(0, 700)
        assert UNICODE_FOLDING.extras_of_range(lo, hi) == UNICODE_FOLDING.extras(range(lo, hi + 1)), (lo, hi)
    ranges = "".join(f"[{chr(k + 0x100)}-\U0010ffff]" for k in range(3000))  # 3,000 distinct ranges
    started = time.thread_time()  # its own CPU time: other jobs on the machine stretch wall time only
    outlines_dialect("(?i)" + ranges)
    assert time.thread_time() - started < 10
