"""Per-state token masks: token t is allowed in DFA state s iff feeding all of t's bytes keeps the
DFA alive; EOS iff s accepts. Specials, empty tokens and padded ids are never allowed.

Masks are computed on first visit and cached; identical rows are stored once. Two walkers give
bit-identical rows:

* native (``tokenrails._fsm_native``): one pre-order pass over the vocabulary's flat trie in C,
  skipping the subtree under every dead transition. The C object also owns the row cache (rows
  with few allowed ids kept as id lists, the rest packed; both de-duplicated), writes a row
  straight into the caller's bitmask (``fill_into``) and steps the DFA over a token's bytes
  (``advance``): a decoding step is two C calls, with no Python-side row objects;
* numpy (fallback): level by level with gathers over the transition table, dead prefixes pruned,
  then ``packbits`` into xgrammar's int32 layout; rows cached as tensors here.

Decoding then only copies rows.
"""
from __future__ import annotations

import threading
import weakref
from typing import NamedTuple
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ... import native
from ..._env import env_lookup
from ...kernels._common import eos_only_row
from ..vocabulary import Vocabulary
from .dfa import DEAD, DFA, START
from .token_trie import TokenTrie, token_trie

BATCH_STATES = 32  # states packed together by the numpy ``precompute``
SPARSE_OUTPUT_NODES = 1 << 15  # fewer alive nodes than this: set token bits directly
DENSE_FRACTION = 16  # walk a trie level densely once >= 1/16 of its nodes are alive
# Background warm-up (opt-in): after the first row, the rows of a small DFA are computed on one
# shared daemon thread (the C walk releases the GIL), so decoding rarely meets a first visit.
# Bounded by the bytes the rows could take, so large DFAs (long JSON lowerings) stay lazy. Off by
# default: in a tight loop with no model forward between steps (bench/fsm_vs_peers.py, 2 cores) it
# is slower than computing rows on first visit (GIL hand-offs, rows computed twice); it pays only
# when steps are separated by forward passes that leave the CPU idle (GPU engines).
# Eager rows at compile (native walker): the id-list rows of the first states (the DFA numbers them
# breadth-first from the start) within a small time budget, so a tight regex's first visits are
# already cached when decoding starts, as xgrammar's are (it computes every mask at compile).
# Packed (permissive) rows are skipped and stay lazy: one can cost ~1 ms on 150k tokens.
EAGER_BUDGET_S = 30e-6
EAGER_MAX_STATES = 128
PRECOMPUTE_MAX_BYTES = 2 << 20
PRECOMPUTE_ENV = "TOKENRAILS_FSM_PRECOMPUTE"  # "1" turns the warm-up on
_precompute_env = env_lookup(PRECOMPUTE_ENV)  # read on every compile
WARM_BATCH = 64  # rows per GIL-free warm-up call
_WARMUP_POOL: list[ThreadPoolExecutor] = []
_WARMUP_LOCK = threading.Lock()


def _warmup_pool() -> ThreadPoolExecutor:
    with _WARMUP_LOCK:
        if not _WARMUP_POOL:
            _WARMUP_POOL.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenrails-fsm-warmup"))
        return _WARMUP_POOL[0]


def _warm(ref: "weakref.ref[TokenIndex]") -> None:
    """Compute the missing rows, breadth-first from the start state, in batched C calls (a per-row
    loop would contend for the GIL with the decoding thread once per row); hold the index only
    between batches, and stop if it is gone (its guide was evicted)."""
    index = ref()
    if index is None:
        return
    todo = [s for s in index.reachable_states() if not index.is_cached(s)]
    del index
    for i in range(0, len(todo), WARM_BATCH):
        index = ref()
        if index is None:
            return
        index._walker.precompute(np.asarray(todo[i : i + WARM_BATCH], dtype=np.int32))
        del index


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


class _VocabTables(NamedTuple):
    """What every index over one vocabulary shares (one memo lookup per compile)."""

    trie: TokenTrie
    eos64: np.ndarray
    eos32: np.ndarray
    eos_set: frozenset
    eos_row: torch.Tensor


def _vocab_tables(vocab: Vocabulary) -> _VocabTables:
    def build() -> _VocabTables:
        eos = np.asarray(vocab.eos_ids, dtype=np.int64)
        return _VocabTables(token_trie(vocab), eos, eos.astype(np.int32), frozenset(vocab.eos_ids), eos_row(vocab))

    tables = vocab.backend_cache.get("fsm:index_tables")  # lock-free hit; built once under the memo lock
    return tables if tables is not None else vocab.cached("fsm:index_tables", build)


def eos_row(vocab: Vocabulary) -> torch.Tensor:
    """The packed row allowing exactly the EOS ids (per vocabulary; read-only, shared)."""

    def build() -> torch.Tensor:
        row = torch.zeros((vocab.vocab_size + 31) // 32, dtype=torch.int32)
        eos_only_row(row, vocab.eos_ids)
        return row

    return vocab.cached("fsm:eos_row", build)


class TokenIndex:
    """DFA × vocabulary → cached packed masks (thread-safe; shared by all matchers of a guide).

    ``use_native``: None = the C walker when it is built and enabled, else numpy; True/False force
    one (True raises if the C module is unavailable).
    """

    def __init__(self, dfa: DFA, vocab: Vocabulary, trie: TokenTrie | None = None, use_native: bool | None = None):
        tables = _vocab_tables(vocab)
        self.dfa = dfa
        self.vocab = vocab
        self.trie = trie if trie is not None else tables.trie
        self.words = (vocab.vocab_size + 31) // 32
        self._padded = self.words * 32
        self._k = dfa.num_classes
        self._eos = tables.eos64
        self._rows: dict[int, torch.Tensor] = {}  # numpy walker: state -> row
        self._unique: dict[object, list[tuple[np.ndarray, torch.Tensor]]] = {}  # key -> distinct rows
        self._full: set[int] = set()  # states whose row allows every id below vocab_size
        self._tensors: dict[int, torch.Tensor] = {}  # native: distinct row index -> tensor made by row()
        self._lock = threading.Lock()
        self._np_tables = None  # numpy walker tables, built on first use
        self.eos_row = tables.eos_row
        self.eos_set = tables.eos_set
        self.warmup = None  # Future of the background warm-up, if one was queued
        self._walker = self._make_walker(tables.eos32) if use_native is not False else None
        if use_native and self._walker is None:
            raise RuntimeError("the native FSM walker (tokenrails._fsm_native) is not available")

    def _make_walker(self, eos32: np.ndarray):
        ntrie = self.trie.native()
        if ntrie is None:
            return None
        mod = native.load("fsm")
        dfa = self.dfa
        s = dfa.num_states
        accepting = dfa.accepting
        accepting = accepting.view(np.uint8) if accepting.dtype == np.bool_ else accepting.astype(np.uint8)
        return mod.Walker(
            ntrie, np.ascontiguousarray(dfa.trans, dtype=np.int32), s, self._k,
            np.ascontiguousarray(dfa.classmap, dtype=np.int32), np.ascontiguousarray(accepting),
            eos32, self.vocab.vocab_size,
        )

    @property
    def native(self) -> bool:
        """Whether rows come from the C walker."""
        return self._walker is not None

    @property
    def walker(self):
        """The C walker (``_fsm_native.Walker``: row cache, ``fill_into``, ``advance``), or None."""
        return self._walker

    # ---- public -------------------------------------------------------------------------
    def row(self, state: int) -> torch.Tensor:
        """The packed int32 mask row of ``state`` (computed once; equal rows are the same tensor).

        Decoding does not need this with the native walker (``fill_into`` writes the bitmask).
        """
        walker = self._walker
        if walker is not None:
            return self._native_row(walker, state)
        row = self._rows.get(state)
        if row is None:
            row = self._compute([state])[0]
        return row

    def ensure(self, state: int) -> None:
        """Compute ``state``'s row now if it is not cached (e.g. the start state right after compile)."""
        if self._walker is not None:
            self._walker.row_index(state)
        else:
            self.row(state)

    def prime(self, budget_s: float | None = None, max_states: int | None = None) -> int:
        """Native only (else 0): cache the cheap rows of the first ``max_states`` states within
        ``budget_s``; returns how many were added. Skipped when the start row is packed: a
        permissive pattern's other states are mostly packed too, and each would cost a wasted
        id-list attempt."""
        if self._walker is None or self._walker.is_packed(START):
            return 0
        budget_s = EAGER_BUDGET_S if budget_s is None else budget_s
        max_states = EAGER_MAX_STATES if max_states is None else max_states
        states = np.arange(1, min(self.dfa.num_states, max_states + 1), dtype=np.int32)
        return self._walker.precompute(states, budget_s, True)

    def is_cached(self, state: int) -> bool:
        """Whether ``state``'s row has been computed."""
        if self._walker is not None:
            return self._walker.is_cached(state)
        return state in self._rows

    def warm_in_background(self) -> bool:
        """Queue the rows of every reachable state on the warm-up thread (native walker and small
        DFAs only; returns whether it was queued). Matchers never wait for it."""
        if self._walker is None or _precompute_env() != "1":
            return False
        if (self.dfa.num_states - 1) * self.words * 4 > PRECOMPUTE_MAX_BYTES:
            return False
        if self.cached_states >= self.dfa.num_states - 1:
            return False
        self.warmup = _warmup_pool().submit(_warm, weakref.ref(self))
        return True

    def reachable_states(self) -> list[int]:
        """Live states in breadth-first order from the start state (the likely visiting order)."""
        trans = self.dfa.trans
        seen = {START}
        order = [START]
        for state in order:
            for nxt in set(trans[state].tolist()):
                if nxt != DEAD and nxt not in seen:
                    seen.add(nxt)
                    order.append(nxt)
        return order

    def cached_row(self, state: int) -> torch.Tensor:
        """``row(state)`` with the cache hit inlined (the numpy walker's per-token fill path)."""
        row = self._rows.get(state)
        return row if row is not None else self.row(state)

    def precompute(self, states: list[int] | None = None) -> None:
        """Compute the rows of ``states`` (default: every live state)."""
        todo = [s for s in (states if states is not None else range(1, self.dfa.num_states)) if not self.is_cached(s)]
        if self._walker is not None:
            self._walker.precompute(np.asarray(todo, dtype=np.int32))
            return
        for i in range(0, len(todo), BATCH_STATES):
            self._compute(todo[i : i + BATCH_STATES])

    def allows_everything(self, state: int) -> bool:
        """Whether ``state``'s row allows every token id (then a fill reports "nothing masked")."""
        if self._walker is not None:
            return self._walker.allows_everything(state)
        return state in self._full

    @property
    def cached_states(self) -> int:
        if self._walker is not None:
            return self._walker.cached_states
        return len(self._rows)

    @property
    def memory_bytes(self) -> int:
        """Bytes held now; with a warm-up queued, what the rows will take once it is done (caches
        size guides when they are inserted, before the warm-up has run)."""
        with self._lock:  # the warm-up thread adds rows concurrently
            total = sum(r.nbytes for bucket in self._unique.values() for r, _ in bucket)
            total += sum(t.nbytes for t in self._tensors.values())
        walker = self._walker
        if walker is not None:
            total += walker.row_bytes
        if self.warmup is not None:
            total = max(total, (self.dfa.num_states - 1) * self.words * 4)
        if walker is not None:
            total += walker.nbytes - walker.row_bytes
        if self._np_tables is not None:
            total += self._np_tables[0].nbytes + self._np_tables[1].nbytes
        return int(total)

    # ---- storage ------------------------------------------------------------------------
    def _store(self, state: int, data: np.ndarray, key: object, full: bool) -> torch.Tensor:
        """Numpy walker: cache ``data`` as ``state``'s row, sharing the tensor of an identical earlier row."""
        with self._lock:
            row = self._rows.get(state)
            if row is not None:  # another thread got there first
                return row
            bucket = self._unique.setdefault(key, [])
            for arr, tensor in bucket:
                if np.array_equal(arr, data):
                    row = tensor
                    break
            else:
                row = torch.from_numpy(data)
                bucket.append((data, row))
            if full:
                self._full.add(state)
            self._rows[state] = row
            return row

    def _native_row(self, walker, state: int) -> torch.Tensor:
        key = walker.row_index(state)
        row = self._tensors.get(key)
        if row is None:
            made = torch.empty(self.words, dtype=torch.int32)
            walker.fill_into(state, made.data_ptr(), self.words)
            with self._lock:
                row = self._tensors.setdefault(key, made)
        return row

    # ---- computation --------------------------------------------------------------------
    def allowed(self, state: int) -> np.ndarray:
        """Bool ``[padded_vocab]``: grammar tokens allowed from ``state`` (EOS not included)."""
        trie = self.trie
        trans, cls, _ = self._numpy_tables()
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
            return alive[self._numpy_tables()[2]]
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

    def end_states(self, state: int) -> np.ndarray:
        """Int32 ``[padded_vocab]``: the state each grammar token leads to from ``state`` (DEAD =
        0 when it is not allowed; EOS and specials are never grammar tokens). One dense pass per
        trie level (the numpy path of the budget rule's table; the C walker does it natively)."""
        trie = self.trie
        trans, cls, token_node = self._numpy_tables()
        ends = np.zeros(trie.num_nodes + 1, dtype=np.int32)  # scaled states; the sentinel stays DEAD
        if trie.depth and state != DEAD:
            st = trans[state * self._k + cls[0]]
            for d in range(trie.depth):
                if d:
                    st = trans[st[trie.level_parent[d]] + cls[d]]
                off = int(trie.level_offset[d])
                ends[off : off + st.size] = st
        return ends[token_node] // self._k

    def _numpy_tables(self) -> tuple[np.ndarray, _LevelClasses, np.ndarray]:
        """(scaled flat transitions, per-level node classes, token id -> node) for the numpy walker."""
        tables = self._np_tables
        if tables is None:
            # states are carried pre-multiplied by k ("scaled"): next = trans_k[scaled + class]; DEAD stays 0
            trans = (self.dfa.trans.astype(np.int64) * self._k).reshape(-1).astype(np.int32)
            cls = _LevelClasses(self.dfa.classmap.astype(np.int32), self.trie.level_bytes)
            # token id -> global trie node (non-grammar and padded ids -> a sentinel that is never alive)
            tables = self._np_tables = (trans, cls, self.trie.token_node_padded(self._padded))
        return tables

    def _compute(self, states: list[int]) -> list[torch.Tensor]:
        """Numpy rows for ``states`` (packed together)."""
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
        for i, s in enumerate(states):
            data = packed[i].astype(np.int32, copy=True)
            result.append(self._store(s, data, data.tobytes(), bool(full[i])))
        return result
