"""Per-state token masks: token t is allowed in DFA state s iff feeding all of t's bytes keeps the
DFA alive; EOS iff s accepts. Specials, empty tokens and padded ids are never allowed.

Masks are computed on first visit by walking the vocabulary's token trie level by level from the
state (numpy gathers over the transition table, dead prefixes pruned), packed into int32 rows in
xgrammar's layout and cached; identical rows are stored once. Decoding then only copies rows.
"""
from __future__ import annotations

import threading

import numpy as np
import torch

from ..vocabulary import Vocabulary
from .dfa import DEAD, DFA
from .token_trie import TokenTrie, token_trie

BATCH_STATES = 32  # states packed together by ``precompute``
SPARSE_OUTPUT_NODES = 1 << 15  # fewer alive nodes than this: set token bits directly
DENSE_FRACTION = 16  # walk a trie level densely once >= 1/16 of its nodes are alive


class _LevelClasses:
    """Byte class of every trie node, per level, computed on first use (most walks stop early)."""

    def __init__(self, cmap: np.ndarray, level_bytes: list[np.ndarray]):
        self._cmap = cmap
        self._bytes = level_bytes
        self._levels: list[np.ndarray | None] = [None] * len(level_bytes)

    def __getitem__(self, d: int) -> np.ndarray:
        out = self._levels[d]
        if out is None:
            out = self._levels[d] = self._cmap[self._bytes[d]]
        return out

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._levels if a is not None)


def _ragged_arange(starts: np.ndarray, counts: np.ndarray, total: int) -> np.ndarray:
    """Concatenation of ``arange(s, s + c)`` for every (s, c)."""
    shift = starts - (np.cumsum(counts) - counts)
    return np.repeat(shift, counts) + np.arange(total)


class TokenIndex:
    """DFA × vocabulary → cached packed masks (thread-safe; shared by all matchers of a guide)."""

    def __init__(self, dfa: DFA, vocab: Vocabulary, trie: TokenTrie | None = None):
        self.dfa = dfa
        self.vocab = vocab
        self.trie = trie if trie is not None else token_trie(vocab)
        self.words = (vocab.vocab_size + 31) // 32
        self._padded = self.words * 32
        self._k = dfa.num_classes
        # states are carried pre-multiplied by k ("scaled"): next = trans_k[scaled + class]; DEAD stays 0
        self._trans_flat = (dfa.trans.astype(np.int64) * self._k).reshape(-1).astype(np.int32)
        cmap = dfa.classmap.astype(np.int32)
        self._node_cls = _LevelClasses(cmap, self.trie.level_bytes)
        self._eos = np.asarray(vocab.eos_ids, dtype=np.int64)
        # token id -> global trie node (non-grammar and padded ids -> a sentinel that is never alive)
        self._token_node = self.trie.token_node_padded(self._padded)
        self._rows: dict[int, torch.Tensor] = {}
        self._unique: dict[bytes, torch.Tensor] = {}
        self._full: set[int] = set()  # states whose row allows every id below vocab_size
        self._lock = threading.Lock()
        eos_only = np.zeros(self._padded, dtype=bool)
        eos_only[self._eos] = True
        self.eos_row = torch.from_numpy(np.packbits(eos_only, bitorder="little").view("<i4").astype(np.int32))

    # ---- public -------------------------------------------------------------------------
    def row(self, state: int) -> torch.Tensor:
        """The packed int32 mask row of ``state`` (computed once)."""
        row = self._rows.get(state)
        if row is None:
            row = self._compute([state])[0]
        return row

    def precompute(self, states: list[int] | None = None) -> None:
        """Compute the rows of ``states`` (default: every live state) in batches."""
        todo = [s for s in (states if states is not None else range(1, self.dfa.num_states)) if s not in self._rows]
        for i in range(0, len(todo), BATCH_STATES):
            self._compute(todo[i : i + BATCH_STATES])

    def allows_everything(self, state: int) -> bool:
        """Whether ``state``'s row allows every token id (then a fill reports "nothing masked")."""
        return state in self._full

    @property
    def cached_states(self) -> int:
        return len(self._rows)

    @property
    def memory_bytes(self) -> int:
        return int(sum(r.numel() * 4 for r in self._unique.values()) + self._trans_flat.nbytes
                   + self._node_cls.nbytes)

    # ---- computation --------------------------------------------------------------------
    def allowed(self, state: int) -> np.ndarray:
        """Bool ``[padded_vocab]``: grammar tokens allowed from ``state`` (EOS not included)."""
        trie = self.trie
        trans = self._trans_flat
        cls = self._node_cls
        sparse_nodes: list[np.ndarray] = []          # global ids of alive nodes seen in sparse mode
        dense_levels: list[tuple[int, np.ndarray]] = []  # (level, live mask) seen in dense mode
        if trie.depth and state != DEAD:
            offsets = trie.level_offset
            st = trans[state * self._k + cls[0]]  # dense over the <= 256 depth-1 nodes
            nodes = None
            for d in range(trie.depth):
                if d:
                    if nodes is None:  # dense: every node at depth d from its parent's state
                        st = trans[st[trie.level_parent[d]] + cls[d]]
                    else:  # sparse: only children of alive nodes
                        cnt = trie.child_count[d - 1][nodes]
                        total = int(cnt.sum())
                        if not total:
                            break
                        child = _ragged_arange(trie.child_start[d - 1][nodes], cnt, total)
                        st = trans[np.repeat(st, cnt) + cls[d][child]]
                        nodes = child
                size = trie.level_bytes[d].size
                live = st != DEAD
                if nodes is None:
                    n_live = int(np.count_nonzero(live))
                    dense_levels.append((d, live))
                    if n_live * DENSE_FRACTION < size:  # few survivors: go sparse
                        nodes = np.flatnonzero(live)
                        st = st[nodes]
                else:
                    nodes, st = nodes[live], st[live]
                    n_live = int(nodes.size)
                    sparse_nodes.append(nodes + offsets[d])
                    if d + 1 < trie.depth and n_live * DENSE_FRACTION >= size:  # many survivors: go dense
                        full = np.zeros(size, dtype=np.int32)
                        full[nodes] = st
                        st, nodes = full, None
                if not n_live:
                    break
        out = np.zeros(self._padded, dtype=bool)
        dense_total = sum(int(m.size) for _, m in dense_levels)
        if dense_total > SPARSE_OUTPUT_NODES:  # many alive nodes: one gather over the vocabulary
            alive = np.zeros(trie.num_nodes + 1, dtype=bool)
            for d, mask in dense_levels:
                alive[trie.level_offset[d] : trie.level_offset[d] + mask.size] = mask
            for ids in sparse_nodes:
                alive[ids] = True
            return alive[self._token_node]
        for d, mask in dense_levels:
            sparse_nodes.append(np.flatnonzero(mask) + trie.level_offset[d])
        if sparse_nodes:  # few alive nodes: expand them to their tokens directly
            nodes_all = np.concatenate(sparse_nodes)
            ptr = trie.node_tok_ptr
            cnt = ptr[nodes_all + 1] - ptr[nodes_all]
            total = int(cnt.sum())
            if total:
                out[trie.node_tok_ids[_ragged_arange(ptr[nodes_all], cnt, total)]] = True
        return out

    def _compute(self, states: list[int]) -> list[torch.Tensor]:
        if len(states) == 1:
            allowed = self.allowed(states[0])[None]
        else:
            allowed = np.stack([self.allowed(s) for s in states])
        acc = self.dfa.accepting
        for i, s in enumerate(states):
            if acc[s]:
                allowed[i, self._eos] = True
        packed = np.packbits(allowed, axis=1, bitorder="little").view("<i4")
        full = allowed[:, : self.vocab.vocab_size].all(axis=1)
        result = []
        with self._lock:
            for i, s in enumerate(states):
                if full[i]:
                    self._full.add(s)
                data = packed[i]
                key = data.tobytes()
                row = self._unique.get(key)
                if row is None:
                    row = torch.from_numpy(data.astype(np.int32, copy=True))
                    self._unique[key] = row
                self._rows[s] = row
                result.append(row)
        return result
