"""outlines 0.0.x's ``outlines.fsm.regex`` automaton toolkit on the shim, against oracles.

Byte-level automata must accept exactly the UTF-8 encodings of what the character automaton
accepts (hypothesis); relabelling and unions must keep languages; the vectorised token index must
equal a one-token-at-a-time walk; and walking the index with a random token picker must only ever
spell strings ``re.fullmatch`` accepts."""
from __future__ import annotations

import random
import re

import interegular
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenrails.compat.outlines.fsm.regex import (
    create_fsm_index_end_to_end,
    create_fsm_index_tokenizer,
    fsm_union,
    get_sub_fsms_from_seq,
    get_token_transition_keys,
    get_vocabulary_transition_keys,
    make_byte_level_better_fsm,
    make_byte_level_fsm,
    make_deterministic_fsm,
    reduced_vocabulary,
    state_scan_tokens,
    walk_fsm,
)
from tokenrails.compat.outlines.integrations.utils import adapt_tokenizer
from tokenrails.compat.outlines.models.transformers import TransformerTokenizer

PATTERNS = [
    "[^a]é",            # a state with an explicit multi-byte edge *and* anything_else
    "(é|ü)+[^x]?",
    "[^😀-😍]{2}",
    "[😀-🙌]+a",
    "a.b",
    "[^a-c]*😀",
    "(?:x|[^xé])*é",
    "[Ā-ſ]{1,3}",
]
ALPHABET = st.sampled_from(list("abcxé üĀſ€😀😈😍🙌🙏一\n"))


def to_byte_symbols(text: str) -> list:
    return [chr(b) if b < 0x80 else f"\x00{b:02X}" for b in text.encode("utf-8")]


def char_fsm(pattern: str):
    return interegular.parse_pattern(pattern).to_fsm().reduce()


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(ALPHABET, max_size=5))
def test_byte_level_fsm_accepts_the_utf8_of_the_same_strings(pattern, text):
    chars = char_fsm(pattern)
    expected = chars.accepts(text)
    assert make_byte_level_fsm(chars).accepts(to_byte_symbols(text)) == expected
    mixed = make_byte_level_fsm(chars, keep_utf8=True)
    assert mixed.accepts(to_byte_symbols(text)) == expected
    assert mixed.accepts(text) == expected


def test_explicit_multibyte_edge_survives_next_to_anything_else():
    """``[^a]é``: é is both listed and covered by [^a]; its byte path must stay open."""
    byte_fsm = make_byte_level_fsm(char_fsm("[^a]é"))
    assert byte_fsm.accepts(to_byte_symbols("éé"))
    assert byte_fsm.accepts(to_byte_symbols("€é"))
    assert not byte_fsm.accepts(to_byte_symbols("aé"))


@pytest.mark.parametrize("pattern", PATTERNS + ["0|[1-9][0-9]*", "(ab|cd)*e?"])
@settings(max_examples=60, deadline=None)
@given(text=st.text(st.sampled_from(list("0129abcdeé😀x")), max_size=6))
def test_deterministic_labels_keep_the_language(pattern, text):
    original = char_fsm(pattern)
    relabelled, old_to_new = make_deterministic_fsm(original)
    assert relabelled.accepts(text) == original.accepts(text)
    assert relabelled.initial == 0 and sorted(relabelled.states) == list(range(len(original.states)))
    again, identity = make_deterministic_fsm(relabelled)
    assert identity == {s: s for s in relabelled.states}  # labels are a fixed point
    assert again.map == relabelled.map


def test_walk_fsm_full_and_partial_matches():
    fsm, _ = make_deterministic_fsm(char_fsm("0|[1-9][0-9]*"))
    info = fsm.fsm_info

    def keys(text):
        return get_token_transition_keys(info.alphabet_symbol_mapping, info.alphabet_anything_value, text)

    walked = walk_fsm(fsm, keys("12"), 0)
    assert len(walked) == 2 and walked[0] == walked[1] and walked[1] in fsm.finals
    assert walk_fsm(fsm, keys("01"), 0) == []                      # stuck after a final
    assert walk_fsm(fsm, keys("01"), 0, full_match=False) == walk_fsm(fsm, keys("0"), 0)
    assert walk_fsm(fsm, keys("x"), 0, full_match=False) == []


@settings(max_examples=80, deadline=None)
@given(text=st.text(st.sampled_from(list("abdefmt+=1 ")), min_size=1, max_size=6))
def test_union_accepts_what_some_part_accepts_and_names_it(text):
    patterns = ["def", "match", "[a-z]+[0-9]*", r"\+=", r"\+"]
    parts = [make_deterministic_fsm(char_fsm(p))[0] for p in patterns]
    union, records = fsm_union(parts)
    accepted_by = [i for i, p in enumerate(parts) if p.accepts(text)]
    assert union.accepts(text) == bool(accepted_by)
    if accepted_by:
        info = union.fsm_info
        seq = [union.initial] + walk_fsm(union, get_token_transition_keys(
            info.alphabet_symbol_mapping, info.alphabet_anything_value, text), union.initial)
        finals = {part for part, _, final in get_sub_fsms_from_seq(seq, records) if final}
        assert finals == set(accepted_by)


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer):
    return TransformerTokenizer(smollm2_tokenizer)


@pytest.mark.parametrize("pattern", [r"[0-9]{1,4}(\.[0-9]+)?", r"(é|ü|[a-z])+ ?😀?", r'"[^"\\]{0,12}"'])
def test_vectorised_index_equals_token_by_token_walk(tokenizer, pattern):
    fsm = make_byte_level_better_fsm(make_deterministic_fsm(char_fsm(pattern))[0], keep_utf8=True)
    info = fsm.fsm_info
    vocabulary, _ = reduced_vocabulary(tokenizer)
    keys = get_vocabulary_transition_keys(info.alphabet_symbol_mapping, info.alphabet_anything_value, vocabulary)
    index = create_fsm_index_end_to_end(info, vocabulary)
    assert index, "the initial state must be indexed"
    for state in sorted(index)[:4]:
        scalar = state_scan_tokens(info.transitions, info.alphabet_symbol_mapping, info.alphabet_anything_value,
                                   info.initial, info.finals, vocabulary, keys, state)
        assert index[state] == scalar


def _raw_bytes(tokenizer, token_id: int) -> bytes:
    from tokenrails.compat.outlines.fsm.regex import gpt2_unicode_to_bytes

    table = gpt2_unicode_to_bytes()
    return bytes(table[c] for c in tokenizer.tokenizer.convert_ids_to_tokens(token_id))


@pytest.mark.parametrize("pattern", [r"(0|[1-9][0-9]*)\.[0-9]{2}", r"[a-zé]{2,6}( [a-zé]{2,6}){0,2}",
                                     r"(yes|no|maybe)!?"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_walks_over_the_token_index_spell_the_language(tokenizer, pattern, seed):
    byte_fsm = make_byte_level_fsm(char_fsm(pattern), keep_utf8=True)
    fsm, _ = make_deterministic_fsm(byte_fsm)
    index, empty = create_fsm_index_tokenizer(fsm, tokenizer)
    assert not empty
    rng = random.Random(seed)
    state, out = fsm.initial, b""
    for _ in range(40):
        choices = sorted(index.get(state, {}).items())
        if not choices:
            break
        token_id, state = rng.choice(choices)
        if token_id == tokenizer.eos_token_id:
            break
        out += _raw_bytes(tokenizer, token_id)
    if state in fsm.finals:
        assert re.fullmatch(pattern, out.decode("utf-8")), out
    else:  # stopped early: what was spelled is still a prefix of the language
        assert len(out) > 0


def test_eos_only_in_final_states(tokenizer):
    fsm, _ = make_deterministic_fsm(make_byte_level_fsm(char_fsm("ab?"), keep_utf8=True))
    index, _ = create_fsm_index_tokenizer(fsm, tokenizer)
    for state, row in index.items():
        assert (tokenizer.eos_token_id in row) == (state in fsm.finals)


def test_reduced_vocabulary_is_shared_by_equal_tokenizers_and_spells_partial_bytes(smollm2_tokenizer):
    one, two = TransformerTokenizer(smollm2_tokenizer), TransformerTokenizer(smollm2_tokenizer)
    assert reduced_vocabulary(one) is reduced_vocabulary(two)
    vocabulary, empty = reduced_vocabulary(one)
    texts = {text for text, _ in vocabulary}
    assert not empty
    assert any("\x00" in t for t in texts)  # partial UTF-8 tokens are spelled as byte symbols
    assert not any("\ufffd" in t for t in texts)
    ids = sorted(int(i) for _, group in vocabulary for i in group)
    assert len(ids) == len(set(ids))


def test_adapt_tokenizer_and_rare_replacement_tokens(smollm2_tokenizer):
    from transformers import AutoTokenizer

    hf = adapt_tokenizer(AutoTokenizer.from_pretrained(smollm2_tokenizer.name_or_path))
    assert hf.vocabulary == hf.get_vocab() and hf.convert_token_to_string("a") == "a"
    hf.vocabulary["\ufffd\ufffd"] = max(hf.vocabulary.values()) + 1  # a token that *is* U+FFFD
    vocabulary, _ = reduced_vocabulary(hf)
    assert ("\ufffd\ufffd", [hf.vocabulary["\ufffd\ufffd"]]) in [(t, list(i)) for t, i in vocabulary]


@pytest.mark.parametrize("pattern", ["[0-9]{2,3}", "(ab|cd)e?", "[😁-😎]", " [a-c]+x", r"(yes|no)\.?"])
def test_regex_guide_states_are_outlines_own_numbers(tokenizer, pattern):
    """The shim's RegexGuide hands out the state numbers outlines' pipeline gives (interegular
    byte automaton, deterministic labels, token index): the whole ``states_to_token_maps``
    must equal the index built by outlines' algorithm."""
    from tokenrails.compat.outlines.fsm.guide import RegexGuide

    guide = RegexGuide(pattern, tokenizer)
    fsm, _ = make_deterministic_fsm(make_byte_level_fsm(char_fsm(pattern), keep_utf8=True))
    index, _ = create_fsm_index_tokenizer(fsm, tokenizer)
    expected = {s: {t: e for t, e in row.items() if t != tokenizer.eos_token_id} for s, row in index.items()}
    assert guide.states_to_token_maps == {s: row for s, row in expected.items() if row}
    for state in fsm.finals & set(index):  # resuming from any number outlines would have handed out
        assert guide.copy().is_final_state(state)


def test_regex_guide_without_outlines_numbers_still_walks(tokenizer):
    from tokenrails.compat.outlines.fsm.guide import RegexGuide

    pattern = "(" + "|".join(f"k{i:04d}" for i in range(250)) + ")"  # past MAX_REGEX_CHARS: own numbering
    guide = RegexGuide(pattern, tokenizer)
    assert guide._state_labels() is None
    state = guide.initial_state
    for token in tokenizer.tokenizer.encode("k0042", add_special_tokens=False):
        state = guide.get_next_state(state, token)
    assert state > 0 and guide.is_final_state(state)


class _ByteLevelMock:
    """An outlines-interface tokenizer whose partial-character tokens are GPT-2 byte strings
    (their text is U+FFFD): guides must read their bytes, as outlines did."""

    vocabulary = {"1": 1, "a": 2, "eos": 3, "😍": 4, " ": 5, "\ufffd": 6, "ðŁĺ": 8, "Ī": 9, "Ġð": 10, "ŁĺĪ": 11,
                  "ðŁĺį": 12}
    special_tokens = {"eos"}
    eos_token_id = 3

    def convert_token_to_string(self, token):
        return "\ufffd" if self.vocabulary[token] in (8, 9, 10, 11) else ("😍" if token == "ðŁĺį" else token)


@pytest.mark.parametrize("pattern", [" [😁-😎]", "[😁-😎]+", " ?😍"])
def test_partial_character_tokens_of_outlines_tokenizers_are_bytes(pattern):
    from tokenrails.compat.outlines.fsm.guide import RegexGuide

    tokenizer = _ByteLevelMock()
    guide = RegexGuide(pattern, tokenizer)
    fsm, _ = make_deterministic_fsm(make_byte_level_fsm(char_fsm(pattern), keep_utf8=True))
    index, _ = create_fsm_index_tokenizer(fsm, tokenizer)
    expected = {s: {t: e for t, e in row.items() if t != tokenizer.eos_token_id} for s, row in index.items()}
    assert guide.states_to_token_maps == {s: row for s, row in expected.items() if row}
    assert any(8 in row or 10 in row for row in expected.values())  # the byte tokens take part


def _regexes(atoms):
    """Small random regexes: concatenation, alternation, ?, +, *, {m,n} over ``atoms``."""
    return st.recursive(atoms, lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda t: t[0] + t[1]),
        st.tuples(inner, inner).map(lambda t: f"({t[0]}|{t[1]})"),
        inner.map(lambda r: f"({r})?"), inner.map(lambda r: f"({r})+"), inner.map(lambda r: f"({r})*"),
        st.tuples(inner, st.integers(0, 2), st.integers(0, 2)).map(lambda t: f"({t[0]}){{{t[1]},{t[1] + t[2]}}}")),
        max_leaves=6)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(pattern=_regexes(st.sampled_from(["a", "b", "é", "😀", "[ab]", "[a-c]", " ", "\\.", "x", "[é-ü]"])))
def test_random_regexes_get_outlines_index_exactly(tokenizer, pattern):
    """Fuzzed: without negated classes (where outlines admits ill-formed UTF-8) the guide's
    whole ``states_to_token_maps`` is the index outlines' algorithm builds."""
    from tokenrails.compat.outlines.fsm.guide import RegexGuide

    guide = RegexGuide(pattern, tokenizer)
    assert guide._state_labels() is not None, pattern
    fsm, _ = make_deterministic_fsm(make_byte_level_fsm(char_fsm(pattern), keep_utf8=True))
    index, _ = create_fsm_index_tokenizer(fsm, tokenizer)
    expected = {s: {t: e for t, e in row.items() if t != tokenizer.eos_token_id} for s, row in index.items()}
    assert guide.states_to_token_maps == {s: row for s, row in expected.items() if row}, pattern


class _BytePieceTokenizer:
    """An outlines-interface tokenizer with whole characters and single-byte pieces (GPT-2
    spelling, text U+FFFD): lead bytes E0/E1/ED/F0/F4/C3 and continuation bytes 80/8F/90/9F/A0/A9/BF
    reach every kind of mid-character state, and the vocabulary is small enough to list."""

    def __init__(self):
        from tokenrails.compat.outlines.fsm.regex import gpt2_bytes_to_unicode

        table = gpt2_bytes_to_unicode()
        self.pieces = {table[b]: b for b in (0xE0, 0xE1, 0xED, 0xF0, 0xF4, 0xC3, 0x80, 0x8F, 0x90, 0x9F, 0xA0,
                                             0xA9, 0xBF, 0x98)}
        whole = ["a", "b", " ", "x", "ab", "é", "😀", "ü", "aé", "€"]
        self.vocabulary = {t: i + 1 for i, t in enumerate(whole + list(self.pieces))}
        self.vocabulary["<eos>"] = 0
        self.special_tokens = {"<eos>"}
        self.eos_token_id = 0

    def convert_token_to_string(self, token):
        return "\ufffd" if token in self.pieces else token


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(pattern=_regexes(st.sampled_from(["a", "é", "😀", "[^a]", ".", "[^é]", " ", "[😀-😍]"])))
def test_every_state_number_resumes_to_the_same_automaton_state(pattern):
    """Fuzzed, negated classes included: outlines merges mid-character states that tokenrails
    keeps apart (it admits only well-formed UTF-8); every number must still name one state, so
    resuming from it on a fresh guide allows exactly the tokens listed for it and leads to the
    same numbers."""
    from tokenrails.compat.outlines.fsm.guide import RegexGuide

    tokenizer = _BytePieceTokenizer()
    maps = RegexGuide(pattern, tokenizer).states_to_token_maps
    fresh = RegexGuide(pattern, tokenizer)
    for state, row in maps.items():
        allowed = set(fresh.copy().get_next_instruction(state).tokens.tolist()) - {tokenizer.eos_token_id}
        assert allowed == set(row), pattern
        for token, nxt in row.items():
            assert fresh.copy().get_next_state(state, token) == nxt, pattern


@pytest.mark.parametrize("seed", range(4))
def test_states_agree_with_outlines_on_shared_text_when_dialects_differ(tokenizer, seed):
    """``\\d`` is ASCII for outlines 0.0's interegular and Unicode for outlines-core (the shim's
    dialect): the automata differ, yet on text both accept the guide's state after every token is
    outlines' own (what SGLang's jump-forward map, keyed by those numbers, relies on)."""
    from tokenrails.compat.outlines.fsm.guide import RegexGuide

    pattern = r"IP: ((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"
    rng = random.Random(seed)
    text = "IP: " + ".".join(str(rng.randrange(256)) for _ in range(4))
    theirs, _ = make_deterministic_fsm(make_byte_level_fsm(char_fsm(pattern), keep_utf8=True))
    info = theirs.fsm_info
    guide = RegexGuide(pattern, tokenizer)
    state, label = guide.initial_state, theirs.initial
    for token in tokenizer.tokenizer.encode(text, add_special_tokens=False):
        state = guide.get_next_state(state, token)
        piece = tokenizer.tokenizer.decode([token])
        label = walk_fsm(theirs, get_token_transition_keys(info.alphabet_symbol_mapping,
                                                           info.alphabet_anything_value, piece), label, False)[-1]
        assert state == label, (text, piece)
    assert guide.is_final_state(state) and label in theirs.finals


def test_states_outlines_lacks_are_numbered_and_replay_from_a_labelled_ancestor(tokenizer):
    """outlines-core's ``\\d`` reads Arabic-Indic digits, outlines 0.0's did not: those states have
    no outlines number, get the guide's own, and still replay exactly after their matcher is
    evicted (from the nearest state outlines does number)."""
    from tokenrails.compat.outlines.fsm.guide import RegexGuide

    guide = RegexGuide(r"n=\d{3}", tokenizer)
    guide.states.max_live = 1  # every revisit replays
    states = [guide.initial_state]
    for token in tokenizer.tokenizer.encode("n=٣٤٥", add_special_tokens=False):
        states.append(guide.get_next_state(states[-1], token))
    assert all(s >= 0 for s in states) and guide.is_final_state(states[-1])
    labels = guide._state_labels()
    assert labels is not None and any(s not in labels.values() for s in states)  # some are the guide's own
    for state in states[:-1]:  # revisit every state: allowed tokens are recomputed by replay
        assert guide.get_next_instruction(state).tokens.numel() > 0
    assert guide.get_next_state(states[0], tokenizer.tokenizer.encode("n", add_special_tokens=False)[0]) == states[1]
