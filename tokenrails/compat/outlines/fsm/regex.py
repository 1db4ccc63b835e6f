"""outlines 0.0.x's ``outlines.fsm.regex``: the interegular automaton toolkit behind its token index.

Code written against outlines 0.0.x (and servers that embedded it, such as SGLang's jump-forward
decoding or vLLM's first outlines integration) imports these functions directly: a byte-level
view of a character automaton, deterministic state labels, unions that remember their parts, and
the state → token index. tokenrails' own guides never use them (they compile with tokenrails'
backends); they are here so that such code runs unchanged and gets the same automata, state
numbers included, because callers store and compare those numbers.

Implemented over interegular (the automaton library outlines used) and numpy; no numba. The
vocabulary scan walks every token at once, one character position at a time, so indexing a
50k-token vocabulary costs milliseconds per automaton state.
"""
from __future__ import annotations

from collections import namedtuple
from functools import lru_cache
from typing import Any, Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union

import numpy as np
from interegular.fsm import FSM, Alphabet, anything_else

from .._vocabulary import REPLACEMENT_TOKEN, gpt2_bytes_to_unicode, gpt2_unicode_to_bytes, partial_char_bytes

__all__ = [
    "BetterAlphabet", "BetterFSM", "FSMInfo", "byte_symbol", "make_byte_level_fsm",
    "make_byte_level_better_fsm", "make_deterministic_fsm", "walk_fsm", "_walk_fsm", "fsm_union",
    "get_sub_fsms_from_seq", "state_scan_tokens", "get_token_transition_keys",
    "get_vocabulary_transition_keys", "create_fsm_index_end_to_end", "gpt2_bytes_to_unicode",
    "gpt2_unicode_to_bytes", "reduced_vocabulary", "create_fsm_index_tokenizer",
]

FSMInfo = namedtuple("FSMInfo", ["initial", "finals", "transitions", "trans_key_to_states",
                                 "alphabet_anything_value", "alphabet_symbol_mapping"])

# Per-sub-automaton record of a union: (transitions (from, to), finals, old state → new states).
SubFSMRecord = Tuple[Set[Tuple[int, int]], Set[int], Dict[int, Set[int]]]

# UTF-8 lead/continuation byte ranges, by sequence length (1 = continuation bytes).
_UTF8_RANGES = {1: (0x80, 0xC0), 2: (0xC0, 0xE0), 3: (0xE0, 0xF0), 4: (0xF0, 0xF8)}


class BetterAlphabet(Alphabet):
    """An alphabet that maps unknown symbols to ``anything_else``'s key (it must have one)."""

    def __init__(self, symbol_mapping: Dict[Any, int]):
        super().__init__(symbol_mapping)
        if anything_else not in self._symbol_mapping:
            raise ValueError("BetterAlphabet needs an anything_else transition key")
        self.anything_value = self._symbol_mapping[anything_else]

    def __getitem__(self, item: Any) -> int:
        return self._symbol_mapping.get(item, self.anything_value)

    def copy(self) -> "BetterAlphabet":
        return BetterAlphabet(self._symbol_mapping.copy())


class BetterFSM(FSM):
    """An interegular FSM with flat transition tables and a cached :class:`FSMInfo`."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if not isinstance(self.alphabet, BetterAlphabet):
            self.__dict__["alphabet"] = BetterAlphabet(self.alphabet._symbol_mapping)
        flat: Dict[Tuple[int, int], int] = {}
        by_key: Dict[int, Set[int]] = {}
        for source, row in self.map.items():
            for key, target in row.items():
                flat[(source, key)] = target
                by_key.setdefault(key, set()).add(source)
        self.__dict__["flat_transition_map"] = flat
        self.__dict__["trans_key_to_states"] = by_key
        self.__dict__["_fsm_info"] = None

    def copy(self) -> "BetterFSM":
        return BetterFSM(alphabet=self.alphabet.copy(), states=set(self.states), initial=self.initial,
                         finals=set(self.finals), map=dict(self.map), __no_validation__=True)

    @property
    def fsm_info(self) -> FSMInfo:
        if self._fsm_info is None:
            symbols = {s: k for s, k in self.alphabet._symbol_mapping.items() if s is not anything_else}
            self.__dict__["_fsm_info"] = FSMInfo(
                initial=int(self.initial), finals=set(self.finals),
                transitions=dict(self.flat_transition_map),
                trans_key_to_states={k: sorted(v) for k, v in self.trans_key_to_states.items()},
                alphabet_anything_value=self.alphabet.anything_value, alphabet_symbol_mapping=symbols)
        return self._fsm_info


def byte_symbol(byte: int) -> str:
    """How byte-level automata spell a byte: ASCII as itself, others as ``"\\x00XX"``."""
    return f"\x00{byte:02X}" if byte >= 0x80 else chr(byte)


# ---------------------------------------------------------------------------------------------
# byte-level automata

_Trie = Dict[int, Any]  # key → sub-trie, target state, or None ("explicitly no transition")


def _trie_put(trie: _Trie, keys: Sequence[int], value: Optional[int], overwrite: bool) -> None:
    for key in keys[:-1]:
        trie = trie.setdefault(key, {})
    if overwrite or keys[-1] not in trie:
        trie[keys[-1]] = value


def _trie_fill(trie: _Trie, defaults: _Trie) -> None:
    """Add ``defaults``' paths that ``trie`` does not decide yet (explicit entries win).

    Default sub-tries are shared, not copied: only the state's own (explicit) sub-tries are ever
    filled into, and the finished trie is only read."""
    for key, value in defaults.items():
        mine = trie.get(key, _MISSING)
        if isinstance(mine, dict) and isinstance(value, dict):
            _trie_fill(mine, value)
        elif mine is _MISSING:
            trie[key] = value


_MISSING = object()


class _ByteStates:
    """Creates the intermediate states of multi-byte paths, shared when their futures are equal."""

    def __init__(self, first_free: int, states: List[int], table: Dict[int, Dict[int, int]]):
        self.next_state = first_free
        self.states = states
        self.table = table
        self.by_future: Dict[FrozenSet[Tuple[int, int]], int] = {}

    def transitions(self, trie: _Trie) -> Dict[int, int]:
        out: Dict[int, int] = {}
        for key, sub in trie.items():
            if isinstance(sub, dict):
                future = self.transitions(sub)
                if not future:
                    continue  # every path below is blocked: no state, no edge
                signature = frozenset(future.items())
                state = self.by_future.get(signature)
                if state is None:
                    state = self.next_state
                    self.next_state += 1
                    self.table[state] = future
                    self.by_future[signature] = state
                    self.states.append(state)
                out[key] = state
            elif sub is not None:
                out[key] = sub
        return out


def make_byte_level_fsm(fsm: FSM, keep_utf8: bool = False) -> FSM:
    """The automaton over UTF-8 bytes (``byte_symbol`` spelling) accepting the same text.

    Each multi-byte character becomes a path of byte transitions; ``anything_else`` becomes every
    well-formed multi-byte sequence not listed elsewhere. With ``keep_utf8`` the characters stay
    in the alphabet too, so a token may be walked by characters, by bytes, or mixed.
    """
    other_key = fsm.alphabet[anything_else]
    mapping: Dict[Any, int] = {}
    next_key = max(fsm.alphabet.values()) + 1
    paths_of: Dict[int, Set[Tuple[int, ...]]] = {}
    every_path: Set[Tuple[int, ...]] = set()
    for symbol, key in fsm.alphabet.items():
        if symbol is not anything_else and len(symbol) != 1:
            raise ValueError(f"byte-level conversion needs one-character symbols, got {symbol!r}")
        if symbol is anything_else or ord(symbol) < 0x80:
            mapping[symbol] = key
            continue
        if keep_utf8:
            mapping[symbol] = key
        path = []
        for byte in symbol.encode("utf-8"):
            name = byte_symbol(byte)
            if name not in mapping:
                mapping[name] = next_key
                next_key += 1
            path.append(mapping[name])
        paths_of.setdefault(key, set()).add(tuple(path))
        every_path.add(tuple(path))

    # remaining lead/continuation bytes, one key per range: they spell anything_else
    range_keys: Dict[int, Set[int]] = {}
    for length, (lo, hi) in _UTF8_RANGES.items():
        range_key = next_key
        next_key += 1
        range_keys[length] = {mapping.setdefault(byte_symbol(b), range_key) for b in range(lo, hi)}

    states: List[int] = list(fsm.states)
    table: Dict[int, Dict[int, int]] = {}
    builder = _ByteStates(max(fsm.states) + 1, states, table)
    for state, row in fsm.map.items():
        trie: _Trie = {}
        direct: Dict[int, int] = {}
        for key, target in row.items():
            if key in paths_of:
                if keep_utf8:
                    direct[key] = target
                for path in paths_of[key]:
                    _trie_put(trie, path, target, overwrite=True)
            else:
                direct[key] = target
        if other_key in row:
            # listed characters this state does not accept must not fall into anything_else
            for path in every_path:
                _trie_put(trie, path, None, overwrite=False)
            tail: Any = row[other_key]
            defaults: _Trie = {}
            for length in (2, 3, 4):
                tail = {k: tail for k in range_keys[1]}
                for lead in range_keys[length]:
                    defaults[lead] = tail
            _trie_fill(trie, defaults)
        direct.update(builder.transitions(trie))
        table[state] = direct
    return FSM(alphabet=Alphabet(mapping), states=states, initial=fsm.initial, finals=fsm.finals, map=table)


def make_byte_level_better_fsm(fsm: FSM, keep_utf8: bool = False) -> BetterFSM:
    byte_fsm = make_byte_level_fsm(fsm, keep_utf8)
    return BetterFSM(alphabet=BetterAlphabet(byte_fsm.alphabet._symbol_mapping), states=byte_fsm.states,
                     initial=byte_fsm.initial, finals=byte_fsm.finals, map=byte_fsm.map)


def _symbol_order(symbols: Iterable[Any]) -> List[Tuple[int, str]]:
    """Sort key of a symbol group: symbols in order, ``anything_else`` after every string."""
    return sorted((1, "") if s is anything_else else (0, s) for s in symbols)


def make_deterministic_fsm(fsm: FSM) -> Tuple[BetterFSM, Dict[int, int]]:
    """The same automaton with labels that depend only on its language's structure.

    Transition keys are renumbered by their sorted symbols; states by a depth-first walk from
    the initial state (0) that takes transitions in key order and labels a state when it is
    first reached. Returns the automaton and the old → new state labels.
    """
    groups = sorted(fsm.alphabet.by_transition.items(), key=lambda item: _symbol_order(item[1]))
    new_key = {old: i for i, (old, _) in enumerate(groups)}
    rows = {s: {new_key[k]: t for k, t in row.items()} for s, row in fsm.map.items()}

    label = {fsm.initial: 0}
    stack = [fsm.initial]
    while stack:
        for _, target in sorted(rows.get(stack.pop(), {}).items()):
            if target not in label:
                label[target] = len(label)
                stack.append(target)
    for state in sorted(fsm.states, key=repr):  # unreachable states keep distinct labels
        label.setdefault(state, len(label))

    table = {label[s]: dict(sorted((k, label[t]) for k, t in row.items())) for s, row in rows.items()}
    table = dict(sorted(table.items()))
    alphabet = BetterAlphabet({symbol: new_key[k] for symbol, k in fsm.alphabet._symbol_mapping.items()})
    finals = frozenset(label[s] for s in fsm.finals)
    return BetterFSM(alphabet, frozenset(label.values()), 0, finals, table), label


# ---------------------------------------------------------------------------------------------
# walking

def _walk_fsm(fsm_transitions: Dict[Tuple[int, int], int], fsm_initial: int, fsm_finals: Set[int],
              token_transition_keys: Sequence[int], start_state: int, full_match: bool = True) -> List[int]:
    """States visited reading the keys from ``start_state``; ``[]`` when the walk fails.

    ``full_match``: the whole sequence must be read and end in a final state. Otherwise a walk
    that gets stuck returns the states up to the last final one it passed (``[]`` if none).
    """
    state = start_state
    visited: List[int] = []
    last_final = 0
    for i, key in enumerate(token_transition_keys):
        nxt = fsm_transitions.get((state, int(key)))
        if nxt is None:
            return visited[:last_final] if not full_match and last_final > 0 else []
        state = nxt
        if state in fsm_finals:
            last_final = i + 1
        visited.append(state)
    if full_match and last_final != len(visited):
        return []
    return visited


def walk_fsm(fsm: BetterFSM, token_transition_keys: Sequence[int], start_state: int,
             full_match: bool = True) -> List[int]:
    return _walk_fsm(fsm.flat_transition_map, fsm.initial, fsm.finals, token_transition_keys, start_state,
                     full_match)


def get_token_transition_keys(alphabet_symbol_mapping: Dict[str, int], alphabet_anything_value: int,
                              token_str: str) -> np.ndarray:
    """A token's transition keys; ``"\\x00XX"`` groups are one byte symbol."""
    keys = []
    i, n = 0, len(token_str)
    while i < n:
        width = 3 if token_str[i] == "\x00" and i != n - 1 else 1
        keys.append(alphabet_symbol_mapping.get(token_str[i:i + width], alphabet_anything_value))
        i += width
    return np.asarray(keys, dtype=np.int64)


def get_vocabulary_transition_keys(alphabet_symbol_mapping: Dict[str, int], alphabet_anything_value: int,
                                   vocabulary: Iterable[Tuple[str, Any]]) -> List[np.ndarray]:
    return [get_token_transition_keys(alphabet_symbol_mapping, alphabet_anything_value, token)
            for token, _ in vocabulary]


# ---------------------------------------------------------------------------------------------
# unions of automata (a lexer's terminals)

def fsm_union(fsms: Sequence[FSM]) -> Tuple[BetterFSM, Dict[int, SubFSMRecord]]:
    """The union automaton, plus for each part the transitions, finals and states it owns there.

    Built breadth-first over the joint alphabet (states numbered as found, then relabelled by
    :func:`make_deterministic_fsm`), so a walk through the union can later be attributed to the
    terminals that could have produced it (:func:`get_sub_fsms_from_seq`).
    """
    alphabet, new_to_old = Alphabet.union(*[f.alphabet for f in fsms])
    joint: List[Dict[int, Any]] = [{i: f.initial for i, f in enumerate(fsms)}]
    index: Dict[FrozenSet[Tuple[int, Any]], int] = {frozenset(joint[0].items()): 0}
    finals: Set[int] = set()
    table: Dict[int, Dict[int, int]] = {}
    records: Dict[int, SubFSMRecord] = {}

    def step(current: Dict[int, Any], key: int) -> Dict[int, Any]:
        out = {}
        for i, f in enumerate(fsms):
            if i in current:
                target = f.map.get(current[i], {}).get(new_to_old[i][key])
                if target is not None:
                    out[i] = target
        return out

    pos = 0
    while pos < len(joint):
        current = joint[pos]
        if any(current.get(i) in f.finals for i, f in enumerate(fsms) if i in current):
            finals.add(pos)
        table[pos] = {}
        for key in alphabet.by_transition:
            nxt = step(current, key)
            if not nxt:
                continue
            signature = frozenset(nxt.items())
            if signature not in index:
                index[signature] = len(joint)
                joint.append(nxt)
            target = index[signature]
            table[pos][key] = target
            for part, part_state in nxt.items():
                transitions, part_finals, old_to_new = records.setdefault(part, (set(), set(), {}))
                old_to_new.setdefault(current[part], set()).add(pos)
                old_to_new.setdefault(part_state, set()).add(target)
                transitions.add((pos, target))
                if part_state in fsms[part].finals:
                    part_finals.add(target)
        pos += 1

    union = FSM(alphabet=alphabet, states=range(len(joint)), initial=0, finals=finals, map=table,
                __no_validation__=True)
    union, relabel = make_deterministic_fsm(union)
    renamed = {
        part: ({(relabel[a], relabel[b]) for a, b in transitions}, {relabel[s] for s in part_finals},
               {old: {relabel[s] for s in new} for old, new in old_to_new.items()})
        for part, (transitions, part_finals, old_to_new) in sorted(records.items())
    }
    return union, renamed


def get_sub_fsms_from_seq(state_seq: Sequence[int],
                          fsms_to_trans_finals: Dict[int, SubFSMRecord]) -> Iterator[Tuple[int, bool, bool]]:
    """Parts of a union that can explain a walk: ``(part, can continue, ends final)``."""
    steps = set(zip(state_seq[:-1], state_seq[1:]))
    last = state_seq[-1]
    for part, (transitions, finals, _) in fsms_to_trans_finals.items():
        if steps.issubset(transitions):
            yield part, any(source == last for source, _ in transitions), last in finals


# ---------------------------------------------------------------------------------------------
# the state → token index

def _vocabulary_keys(fsm_info: FSMInfo, texts: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
    """Every text's transition keys, flat, and each text's key count.

    Texts without byte symbols (almost all) are mapped in one numpy lookup over their code
    points; the few with ``"\\x00XX"`` symbols go through :func:`get_token_transition_keys`."""
    mapping, other = fsm_info.alphabet_symbol_mapping, fsm_info.alphabet_anything_value
    plain = np.fromiter(("\x00" not in t for t in texts), dtype=bool, count=len(texts))
    lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    chars = [(ord(sym), key) for sym, key in mapping.items() if len(sym) == 1]
    cps_known = np.asarray(sorted(c for c, _ in chars), dtype=np.int64)
    keys_known = np.asarray([k for _, k in sorted(chars)], dtype=np.int64)
    joined = "".join(t for t, p in zip(texts, plain) if p)
    cps = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.int64)
    slot = np.clip(np.searchsorted(cps_known, cps), 0, max(len(cps_known) - 1, 0))
    plain_keys = np.where((cps_known[slot] == cps) if len(cps_known) else np.zeros(len(cps), bool),
                          keys_known[slot] if len(keys_known) else 0, other)
    parts, start = [], 0
    plain_list = plain.tolist()
    for i, text in enumerate(texts):
        if plain_list[i]:
            parts.append(plain_keys[start:start + lengths[i]])
            start += lengths[i]
        else:
            keys = get_token_transition_keys(mapping, other, text)
            parts.append(keys)
            lengths[i] = len(keys)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return flat, lengths


class _VocabularyWalk:
    """Every token's key sequence in one padded matrix (longest first) for vectorised walks."""

    def __init__(self, fsm_info: FSMInfo, vocabulary: Sequence[Tuple[str, Any]]):
        flat_keys, lengths = _vocabulary_keys(fsm_info, [text for text, _ in vocabulary])
        self.order = np.argsort(-lengths, kind="stable")
        self.lengths = lengths[self.order]
        width = int(self.lengths[0]) if len(lengths) else 0
        self.keys = np.zeros((len(lengths), width), dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else lengths
        rows = np.repeat(np.argsort(self.order), lengths)  # sorted row of each flat key
        cols = np.arange(len(flat_keys)) - np.repeat(starts, lengths)
        self.keys[rows, cols] = flat_keys
        # active[j] = how many tokens are longer than j (a prefix, thanks to the order)
        self.active = np.searchsorted(-self.lengths, -np.arange(width), side="left")
        ids = [np.asarray(token_ids, dtype=np.int64).reshape(-1) for _, token_ids in vocabulary]
        # every token id with the (sorted) row of its text, flat, so results gather in one step
        per_row = [ids[i] for i in self.order.tolist()]
        self.flat_ids = np.concatenate(per_row) if per_row else np.zeros(0, dtype=np.int64)
        self.flat_row = np.repeat(np.arange(len(per_row)), [len(x) for x in per_row])

        states = sorted({s for s, _ in fsm_info.transitions} | set(fsm_info.transitions.values())
                        | {fsm_info.initial} | set(fsm_info.finals))
        self.state_of = np.asarray(states, dtype=np.int64)
        self.row_of = {s: r for r, s in enumerate(states)}
        dead = len(states)
        n_keys = max([k for _, k in fsm_info.transitions] + list(fsm_info.alphabet_symbol_mapping.values())
                     + [fsm_info.alphabet_anything_value]) + 1
        self.table = np.full((dead + 1, n_keys), dead, dtype=np.int64)
        for (source, key), target in fsm_info.transitions.items():
            self.table[self.row_of[source], key] = self.row_of[target]
        self.dead = dead

    def scan(self, start_state: int) -> Tuple[Set[Tuple[int, int]], List[int]]:
        """(token id, end state) for every token readable whole from ``start_state``, and the
        distinct end states."""
        n = len(self.lengths)
        current = np.full(n, self.row_of.get(start_state, self.dead), dtype=np.int64)
        for j, count in enumerate(self.active.tolist()):
            current[:count] = self.table[current[:count], self.keys[:count, j]]
        ok = (current != self.dead) & (self.lengths > 0)
        picked = ok[self.flat_row]
        ends = self.state_of[current[self.flat_row[picked]]]
        return set(zip(self.flat_ids[picked].tolist(), ends.tolist())), np.unique(ends).tolist()


def state_scan_tokens(fsm_transitions: Dict[Tuple[int, int], int], alphabet_symbol_mapping: Dict[str, int],
                      alphabet_anything_value: int, fsm_initial: int, fsm_finals: Set[int],
                      vocabulary: Sequence[Tuple[str, Any]], vocabulary_transition_keys: Sequence[Sequence[int]],
                      start_state: int) -> Set[Tuple[int, int]]:
    """(token id, end state) for every token whose whole text can be read from ``start_state``."""
    out: Set[Tuple[int, int]] = set()
    for (_, token_ids), keys in zip(vocabulary, vocabulary_transition_keys):
        seq = _walk_fsm(fsm_transitions, fsm_initial, fsm_finals, keys, start_state, False)
        if len(keys) == 0 or len(seq) < len(keys):
            continue
        out.update((int(t), seq[-1]) for t in np.asarray(token_ids).reshape(-1))
    return out


def create_fsm_index_end_to_end(fsm_info: FSMInfo,
                                vocabulary: Sequence[Tuple[str, Any]]) -> Dict[int, Set[Tuple[int, int]]]:
    """state → {(token id, end state)} over the states reachable from the initial one by tokens."""
    vocabulary = list(vocabulary)
    walk = _VocabularyWalk(fsm_info, vocabulary)
    index: Dict[int, Set[Tuple[int, int]]] = {}
    seen: Set[int] = set()
    pending = [fsm_info.initial]
    while pending:
        state = pending.pop()
        if state in seen:
            continue
        seen.add(state)
        pairs, ends = walk.scan(state)
        if pairs:
            index[state] = pairs
        pending.extend(end for end in ends if end not in seen)
    return index


# ---------------------------------------------------------------------------------------------
# tokenizer vocabularies

def _token_text(tokenizer: Any, token: str) -> str:
    """A token as index text: its string, or its bytes when it holds part of a character."""
    text = tokenizer.convert_token_to_string(token)
    raw = partial_char_bytes(token, text) if text else None
    if raw is not None:
        return "".join(byte_symbol(b) for b in raw)
    if "\ufffd" in text and not REPLACEMENT_TOKEN.match(token):
        raise RuntimeError(f"Cannot convert token `{token}` to bytes: {text}")
    return text


@lru_cache(maxsize=32)
def reduced_vocabulary(tokenizer: Any) -> Tuple[List[Tuple[str, np.ndarray]], Set[int]]:
    """(text, token ids) for every distinct non-special token text, and the ids of empty tokens.

    Cached per tokenizer (equal tokenizers share the result); bounded so tokenizers are not kept
    alive forever.
    """
    empty: Set[int] = set()
    by_text: Dict[str, List[int]] = {}
    for token, token_id in tokenizer.vocabulary.items():
        if token in tokenizer.special_tokens:
            continue
        text = _token_text(tokenizer, token)
        if text:
            by_text.setdefault(text, []).append(token_id)
        else:
            empty.add(int(token_id))
    return [(text, np.asarray(ids, dtype=np.int64)) for text, ids in by_text.items()], empty


def create_fsm_index_tokenizer(fsm: BetterFSM, tokenizer: Any) -> Tuple[Dict[int, Dict[int, int]], Set[int]]:
    """state → {token id: next state} for a tokenizer (EOS allowed in final states), and empty ids."""
    vocabulary, empty = reduced_vocabulary(tokenizer)
    index = create_fsm_index_end_to_end(fsm.fsm_info, vocabulary)
    for state in fsm.fsm_info.finals:
        if state in index:
            index[state].add((tokenizer.eos_token_id, state))
    return {state: dict(pairs) for state, pairs in index.items()}, empty


TransitionTrie = Dict[int, Union["TransitionTrie", int, None]]
