"""Hypothesis strategies: random patterns over the supported syntax, and strings to test them on."""
from __future__ import annotations

from hypothesis import strategies as st

# literal characters: ASCII, 2/3/4-byte UTF-8, a non-ASCII digit and space, newline
CHARS = ["a", "b", "c", "0", "7", " ", "\n", "é", "€", "😀", "٣", "\u3000", "_", "-"]
ESCAPED = [r"\.", r"\*", r"\+", r"\?", r"\(", r"\)", r"\[", r"\]", r"\{", r"\}", r"\|", r"\\", r"\^", r"\$", r"\-"]
CLASS_ESCAPES = [r"\d", r"\w", r"\s", r"\D", r"\W", r"\S", r"\n", r"\t", r"\x41", r"\u00e9"]
CLASSES = [
    "[abc]", "[^ab]", "[a-c]", "[^a-c\\n]", "[0-9]", "[^\"\\\\]", "[é€]", "[^é]", "[😀-😂]", "[^\\x00-\\x7f]",
    "[\\d_]", "[^\\w]", "[\\s,]", "[]a]", "[a-]", "[\\]x]",
]

atoms = st.one_of(
    st.sampled_from(CHARS),
    st.sampled_from(ESCAPED),
    st.sampled_from(CLASS_ESCAPES),
    st.sampled_from(CLASSES),
    st.just("."),
)


def _quantified(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    quant = st.sampled_from(["*", "+", "?", "{2}", "{1,3}", "{0,2}", "{2,}", "*?", "+?", "??", "{1,2}?"])
    return st.tuples(inner, quant).map(lambda t: t[0] + t[1])


def _group(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.tuples(st.sampled_from(["(", "(?:", "(?P<g>"]), inner).map(lambda t: t[0] + t[1] + ")")


def _extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    grouped = _group(inner)
    return st.one_of(
        st.lists(inner, min_size=2, max_size=4).map("".join),                  # concatenation
        st.lists(inner, min_size=2, max_size=3).map("|".join).map(lambda s: "(?:" + s + ")"),
        grouped,
        _quantified(grouped),
    )


units = st.one_of(atoms, _quantified(atoms))
regexes = st.recursive(units, _extend, max_leaves=8).map(lambda s: s if "P<g>" not in s or s.count("P<g>") == 1 else s.replace("(?P<g>", "("))
anchored = st.tuples(st.booleans(), regexes, st.booleans()).map(lambda t: ("^" if t[0] else "") + t[1] + ("$" if t[2] else ""))

text_chars = st.sampled_from(CHARS + ["A", "x", "\t", "\\", '"', ".", "1", "ÿ", "\x00", "\u2028"])
texts = st.lists(text_chars, max_size=8).map("".join)
