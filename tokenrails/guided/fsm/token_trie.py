"""Per-vocabulary token trie, stored two ways as numpy arrays (built once per Vocabulary).

Grammar tokens (non-special, non-empty) are sorted by bytes; a trie node is a distinct prefix.

* Level order (the numpy walker): nodes of depth ``d`` are numbered in sorted order, so the
  children of one node form a contiguous range at depth ``d + 1``; walking from a DFA state is a
  few numpy gathers per level, touching only prefixes that are still alive.
* Pre-order (the C walker, ``tokenrails._fsm_native``): the sorted tokens *are* a depth-first
  traversal, token ``i`` adding the nodes of depths ``lcp(i-1, i) + 1 .. len(i)``. Per node: edge
  byte, depth, one token id ending there; ids with identical bytes are chained in ``dfs_tok_next``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import native
from ..vocabulary import Vocabulary


@dataclass
class TokenTrie:
    num_tokens: int
    vocab_size: int
    level_bytes: list[np.ndarray]     # [d-1]: uint8 byte on the edge into each depth-d node
    level_parent: list[np.ndarray]    # [d-1]: index of the parent at depth d-1 (0 = root for d=1)
    child_start: list[np.ndarray]     # [d-1]: first child (at depth d+1) of each depth-d node
    child_count: list[np.ndarray]     # [d-1]: number of children
    level_offset: np.ndarray          # global node id of the first depth-d node, [d-1]
    node_tok_ptr: np.ndarray          # CSR: global node -> token ids ending there
    node_tok_ids: np.ndarray
    grammar_ids: np.ndarray           # ids of all grammar tokens (sorted)
    dfs_byte: np.ndarray              # uint8 [N]: pre-order nodes' edge bytes
    dfs_depth: np.ndarray             # int32 [N]: 1-based depth
    dfs_tok: np.ndarray               # int32 [N]: smallest id ending at the node, or -1
    dfs_tok_next: np.ndarray          # int32 [num_tokens]: next larger id with the same bytes, or -1

    def native(self):
        """The validated C copy of the pre-order trie (``_fsm_native.Trie``), or None without the C module."""
        mod = native.load("fsm")
        if mod is None:
            return None
        cache = self.__dict__.setdefault("_native_cache", {})
        obj = cache.get(mod)
        if obj is None:
            padded = (self.vocab_size + 31) // 32 * 32
            obj = cache[mod] = mod.Trie(self.dfs_byte, self.dfs_depth, self.dfs_tok, self.dfs_tok_next, padded)
        return obj

    def token_node_padded(self, padded: int) -> np.ndarray:
        """Token id -> global node id for ``padded`` ids; the rest map to ``num_nodes`` (sentinel)."""
        cache = self.__dict__.setdefault("_token_node_cache", {})
        if padded not in cache:
            cache[padded] = self._token_node_padded(padded)
        return cache[padded]

    def _token_node_padded(self, padded: int) -> np.ndarray:
        out = np.full(padded, self.num_nodes, dtype=np.int64)
        ptr = self.node_tok_ptr
        nodes = np.repeat(np.arange(self.num_nodes), ptr[1:] - ptr[:-1])
        out[self.node_tok_ids] = nodes
        return out

    @property
    def depth(self) -> int:
        return len(self.level_bytes)

    @property
    def num_nodes(self) -> int:
        return int(self.node_tok_ptr.shape[0] - 1)

    @property
    def memory_bytes(self) -> int:
        arrays = self.level_bytes + self.level_parent + self.child_start + self.child_count
        arrays += [self.level_offset, self.node_tok_ptr, self.node_tok_ids, self.grammar_ids]
        arrays += [self.dfs_byte, self.dfs_depth, self.dfs_tok, self.dfs_tok_next]
        return int(sum(a.nbytes for a in arrays))


def build_token_trie(vocab: Vocabulary) -> TokenTrie:
    """Build the level-ordered trie of ``vocab``'s grammar tokens (vectorized, ~0.1-0.5 s for 150k)."""
    tb = vocab.token_bytes
    special = vocab.special_ids
    ids = [i for i, b in enumerate(tb) if b and i not in special]
    ids.sort(key=tb.__getitem__)
    n = len(ids)
    order = np.asarray(ids, dtype=np.int64)
    lens = np.fromiter((len(tb[i]) for i in ids), dtype=np.int64, count=n)
    maxlen = int(lens.max()) if n else 0
    if n:
        buf = b"".join(tb[i].ljust(maxlen, b"\0") for i in ids)
        mat = np.frombuffer(buf, dtype=np.uint8).reshape(n, maxlen)
        lcp = np.zeros(n, dtype=np.int64)
        if n > 1:
            diff = mat[1:] != mat[:-1]
            first = np.where(diff.any(axis=1), diff.argmax(axis=1), maxlen)
            lcp[1:] = np.minimum(first, np.minimum(lens[1:], lens[:-1]))
            del diff
    level_bytes: list[np.ndarray] = []
    level_parent: list[np.ndarray] = []
    token_node = np.full(n, -1, dtype=np.int64)
    prev_node = np.zeros(n, dtype=np.int64)  # node index of each token at the previous depth
    offsets = []
    total = 0
    active = np.arange(n)
    for d in range(1, maxlen + 1):
        active = active[lens[active] >= d]
        if not active.size:
            break
        new = lcp[active] < d
        local = np.cumsum(new) - 1
        creators = active[new]
        level_bytes.append(mat[creators, d - 1].copy())
        level_parent.append(prev_node[creators].astype(np.int32) if d > 1 else np.zeros(creators.size, np.int32))
        offsets.append(total)
        ends = lens[active] == d
        token_node[active[ends]] = total + local[ends]
        prev_node[active] = local
        total += int(creators.size)
    child_start: list[np.ndarray] = []
    child_count: list[np.ndarray] = []
    for d in range(len(level_bytes)):
        count_here = level_bytes[d].size
        if d + 1 < len(level_bytes):
            parents = level_parent[d + 1]
            lo = np.searchsorted(parents, np.arange(count_here), side="left")
            hi = np.searchsorted(parents, np.arange(count_here), side="right")
        else:
            lo = hi = np.zeros(count_here, dtype=np.int64)
        child_start.append(lo.astype(np.int32))
        child_count.append((hi - lo).astype(np.int32))
    dfs = _preorder(order, lens, lcp if n else np.zeros(0, np.int64), mat if n else None, vocab.num_tokens)
    # CSR node -> tokens (several ids can share the same bytes)
    node_of_tok = token_node
    srt = np.argsort(node_of_tok, kind="stable")
    counts = np.bincount(node_of_tok, minlength=total) if n else np.zeros(total, np.int64)
    ptr = np.zeros(total + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return TokenTrie(
        num_tokens=vocab.num_tokens,
        vocab_size=vocab.vocab_size,
        level_bytes=level_bytes,
        level_parent=level_parent,
        child_start=child_start,
        child_count=child_count,
        level_offset=np.asarray(offsets, dtype=np.int64),
        node_tok_ptr=ptr,
        node_tok_ids=order[srt].astype(np.int32),
        grammar_ids=np.sort(order).astype(np.int32),
        dfs_byte=dfs[0],
        dfs_depth=dfs[1],
        dfs_tok=dfs[2],
        dfs_tok_next=dfs[3],
    )


def _preorder(order: np.ndarray, lens: np.ndarray, lcp: np.ndarray, mat: np.ndarray | None,
              num_tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pre-order node arrays from the byte-sorted tokens (``order``: ids, ``lcp`` with the previous)."""
    n = order.size
    tok_next = np.full(num_tokens, -1, dtype=np.int32)
    if not n:
        return np.zeros(0, np.uint8), np.zeros(0, np.int32), np.zeros(0, np.int32), tok_next
    new = lens - lcp                      # nodes token i adds (0: same bytes as token i-1)
    first = np.cumsum(new) - new          # index of its first node
    total = int(new.sum())
    owner = np.repeat(np.arange(n), new)
    depth = lcp[owner] + 1 + (np.arange(total) - first[owner])
    node_byte = mat[owner, depth - 1]
    # the node where token i ends; duplicates end where the last token with new nodes ended
    src = np.maximum.accumulate(np.where(new > 0, np.arange(n), 0))
    end_node = (first + new - 1)[src]
    fresh = new > 0
    node_tok = np.full(total, -1, dtype=np.int32)
    node_tok[end_node[fresh]] = order[fresh]
    dup = np.flatnonzero(~fresh)
    tok_next[order[dup - 1]] = order[dup]  # stable sort: equal bytes keep ascending ids
    return node_byte.astype(np.uint8), depth.astype(np.int32), node_tok, tok_next


def token_trie(vocab: Vocabulary) -> TokenTrie:
    """The vocabulary's trie, built once and memoized on the vocabulary."""
    return vocab.cached("fsm:token_trie", lambda: build_token_trie(vocab))
