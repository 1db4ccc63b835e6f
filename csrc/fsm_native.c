/* tokenrails._fsm_native -- the FSM backend's per-state token masks and DFA stepping.
 *
 * Trie(node_byte, node_depth, node_tok, tok_next, num_bits)
 *     A vocabulary's grammar tokens as a flat pre-order (DFS) trie: per node its edge byte, depth
 *     (1-based) and one token id ending there (-1 if none); tok_next chains further ids with the
 *     same bytes (ascending, -1 ends). Validated and copied once; the subtree end, parent and
 *     per-byte depth-1 node are derived here, so no input can make a walk leave the arrays.
 * Walker(trie, trans, num_states, num_classes, classmap, accepting, eos_ids, vocab_size)
 *     One DFA over that trie (trans: int32 [S*K] row-major, 0 = dead). Every table value is
 *     validated; states are stored pre-multiplied by the row width so a step is one load.
 *     Token t is allowed in state s iff feeding its bytes from s never reaches the dead state; the
 *     EOS ids iff s accepts. A walk visits only the subtrees under live transitions.
 * Walker.fill(state, out) -> (hash, full)
 *     The raw walk, uncached: zeroes ``out`` (words int32) and writes the packed row in xgrammar's
 *     layout. Returns a 64-bit hash of the row and whether every id below vocab_size is allowed.
 * Walker.fill_into(state, address, words) -> masked
 *     The decoding path: the state's row from the walker's cache (computed on first visit; rows
 *     with few ids kept as id lists, the rest packed; equal rows stored once) written at a raw
 *     address (state -1: the EOS-only row). The Python caller checks the target tensor.
 * Walker.advance(state, token) -> state (0 = not allowed), row_index / is_cached / allows_everything /
 * precompute(states): stepping over a token's bytes, cache queries, and a GIL-free batch fill of the
 * cache (the background warm-up).
 * Walker.budget_table(dist, maxnext, max_edges) / fill_within(state, dist, bound, address, words)
 *     The token-level distance to completion per state, and a row restricted by it (the budget
 *     rule, tokenrails/guided/budget.py).
 * The cache is only mutated with the GIL held; walks of packed rows release it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "native_common.h"
#include <stdint.h>
#include <string.h>
#include <time.h>

#define MAX_DEPTH 65535
#define LOCAL_STACK 512

typedef struct {
    int32_t end;    /* first node index after this node's subtree */
    int32_t tok;    /* the smallest token id ending here (0 when none: then has_tok = 0) */
    uint16_t depth; /* 1..MAX_DEPTH */
    uint8_t byte;   /* edge byte into this node */
    uint8_t flags;  /* HAS_TOK: tok is real; DUP: more ids end here, chained in tok_next */
} Node;

#define HAS_TOK 1
#define DUP 2

typedef struct {
    PyObject_HEAD
    Node *nodes;
    Py_ssize_t n;
    int32_t *tok_next;
    int32_t *parent;      /* per node: its parent node, -1 at depth 1 (rebuilds a token's bytes) */
    int32_t *tok_node;    /* per id: the node its bytes end at, -1 for ids not in the trie */
    Py_ssize_t num_ids;   /* length of tok_next; every token id is below it */
    Py_ssize_t num_bits;  /* row width in bits (a multiple of 32) */
    int max_depth;
    int32_t root[256];    /* per byte: its depth-1 node, -1 if none (walks start from the live ones) */
} TrieObject;

/* One cached mask row. Sparse rows (few allowed ids, the usual case for tight regexes) keep the ids
 * in trie pre-order: a fill zeroes the target and sets their bits, and equal rows have equal id
 * sequences because the walk order does not depend on the state. Dense rows keep the packed words. */
typedef struct {
    uint64_t hash;
    uint32_t *data;  /* sparse: ids; dense: words */
    int32_t count;   /* sparse: number of ids; DENSE_ROW: packed */
    uint8_t full;    /* every id below vocab_size allowed (dense rows only) */
} Row;

#define DENSE_ROW (-1)
#define NO_ROW (-1)
#define EOS_ONLY (-1) /* state argument of fill_into: the EOS-only row of a terminated matcher */

typedef struct {
    PyObject_HEAD
    TrieObject *trie;
    int32_t *table;    /* scaled transitions: next = table[scaled_state + column] */
    int32_t cmap[256]; /* byte -> column */
    uint8_t *accepting;
    int32_t *eos;
    Py_ssize_t num_eos;
    Py_ssize_t num_states;
    int32_t width;     /* row width of table: num_classes */
    Py_ssize_t vocab_size;
    /* row cache, mutated only with the GIL held */
    int32_t *row_of;      /* per state: index into rows, NO_ROW until computed */
    Row *rows;            /* distinct rows, at most one per state */
    Py_ssize_t num_rows;
    int32_t *slots;       /* open addressing over rows by hash (power-of-two size, -1 = empty) */
    Py_ssize_t num_slots;
    Py_ssize_t cached;    /* states with a row */
    Py_ssize_t row_bytes; /* bytes held by row data */
} WalkerObject;

/* ---- buffer helpers ------------------------------------------------------------------------- */

static int get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable, const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        return -1;
    }
    if (view->itemsize != itemsize || view->len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: expected items of %zd bytes, got %zd", what, itemsize, view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* ---- Trie ----------------------------------------------------------------------------------- */

static void Trie_dealloc(TrieObject *self) {
    PyMem_RawFree(self->nodes);
    PyMem_RawFree(self->tok_next);
    PyMem_RawFree(self->parent);
    PyMem_RawFree(self->tok_node);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int build_trie(TrieObject *self, const uint8_t *bytes, const int32_t *depth, const int32_t *tok,
                      const int32_t *next) {
    Py_ssize_t n = self->n, m = self->num_ids;
    for (Py_ssize_t t = 0; t < m; t++) {
        int32_t x = next[t];
        if (x != -1 && (x <= t || x >= m)) {
            PyErr_Format(PyExc_ValueError, "tok_next[%zd]=%d: must be -1 or an id in (%zd, %zd)", t, x, t, m);
            return -1;
        }
        self->tok_next[t] = x;
        self->tok_node[t] = -1;
    }
    int32_t *open = PyMem_RawMalloc(sizeof(int32_t) * (MAX_DEPTH + 1));
    if (!open) {
        PyErr_NoMemory();
        return -1;
    }
    int cur = 0, max_depth = 0;
    memset(self->root, 0xff, sizeof(self->root));
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t d = depth[i], t = tok[i];
        if (d < 1 || d > cur + 1 || d > MAX_DEPTH) {
            PyErr_Format(PyExc_ValueError, "node %zd: depth %d after depth %d (pre-order needs 1..%d)", i, d, cur,
                         cur + 1 < MAX_DEPTH ? cur + 1 : MAX_DEPTH);
            PyMem_RawFree(open);
            return -1;
        }
        if (t < -1 || t >= m) {
            PyErr_Format(PyExc_ValueError, "node %zd: token id %d outside [-1, %zd)", i, t, m);
            PyMem_RawFree(open);
            return -1;
        }
        for (int dd = cur; dd >= d; dd--) {
            self->nodes[open[dd]].end = (int32_t)i; /* close the subtrees this node leaves */
        }
        open[d] = (int32_t)i;
        cur = d;
        if (d > max_depth) {
            max_depth = d;
        }
        self->parent[i] = d > 1 ? open[d - 1] : -1;
        if (d == 1) {
            if (self->root[bytes[i]] != -1) {
                PyErr_Format(PyExc_ValueError, "node %zd: a second depth-1 node for byte %d", i, bytes[i]);
                PyMem_RawFree(open);
                return -1;
            }
            self->root[bytes[i]] = (int32_t)i;
        }
        for (int32_t id = t; id >= 0; id = self->tok_next[id]) {
            if (self->tok_node[id] != -1) {
                PyErr_Format(PyExc_ValueError, "token id %d ends at two nodes", id);
                PyMem_RawFree(open);
                return -1;
            }
            self->tok_node[id] = (int32_t)i;
        }
        Node *nd = &self->nodes[i];
        nd->tok = t >= 0 ? t : 0;
        nd->depth = (uint16_t)d;
        nd->byte = bytes[i];
        nd->flags = (uint8_t)((t >= 0 ? HAS_TOK : 0) | (t >= 0 && self->tok_next[t] != -1 ? DUP : 0));
    }
    for (int dd = cur; dd >= 1; dd--) {
        self->nodes[open[dd]].end = (int32_t)n;
    }
    PyMem_RawFree(open);
    self->max_depth = max_depth;
    return 0;
}

static PyObject *Trie_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"node_byte", "node_depth", "node_tok", "tok_next", "num_bits", NULL};
    PyObject *ob, *od, *ot, *on;
    Py_ssize_t num_bits;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOn", kwlist, &ob, &od, &ot, &on, &num_bits)) {
        return NULL;
    }
    Py_buffer vb, vd, vt, vn;
    if (get_buffer(ob, &vb, 1, 0, "node_byte") < 0) return NULL;
    if (get_buffer(od, &vd, 4, 0, "node_depth") < 0) { PyBuffer_Release(&vb); return NULL; }
    if (get_buffer(ot, &vt, 4, 0, "node_tok") < 0) { PyBuffer_Release(&vb); PyBuffer_Release(&vd); return NULL; }
    if (get_buffer(on, &vn, 4, 0, "tok_next") < 0) {
        PyBuffer_Release(&vb); PyBuffer_Release(&vd); PyBuffer_Release(&vt);
        return NULL;
    }
    TrieObject *self = NULL;
    Py_ssize_t n = vb.len, m = vn.len / 4;
    if (vd.len / 4 != n || vt.len / 4 != n) {
        PyErr_SetString(PyExc_ValueError, "node_byte, node_depth and node_tok must have the same length");
    } else if (n >= INT32_MAX || num_bits <= 0 || num_bits % 32 || num_bits >= INT32_MAX || m > num_bits) {
        PyErr_Format(PyExc_ValueError, "bad sizes: %zd nodes, %zd ids, num_bits=%zd (a positive multiple of 32 >= ids)",
                     n, m, num_bits);
    } else if ((self = (TrieObject *)type->tp_alloc(type, 0)) != NULL) {
        self->n = n;
        self->num_ids = m;
        self->num_bits = num_bits;
        self->nodes = PyMem_RawMalloc(sizeof(Node) * (n ? n : 1));
        self->tok_next = PyMem_RawMalloc(sizeof(int32_t) * (m ? m : 1));
        self->parent = PyMem_RawMalloc(sizeof(int32_t) * (n ? n : 1));
        self->tok_node = PyMem_RawMalloc(sizeof(int32_t) * (m ? m : 1));
        if (!self->nodes || !self->tok_next || !self->parent || !self->tok_node) {
            PyErr_NoMemory();
            Py_CLEAR(self);
        } else if (build_trie(self, vb.buf, vd.buf, vt.buf, vn.buf) < 0) {
            Py_CLEAR(self);
        }
    }
    PyBuffer_Release(&vb); PyBuffer_Release(&vd); PyBuffer_Release(&vt); PyBuffer_Release(&vn);
    return (PyObject *)self;
}

static PyObject *Trie_get_num_nodes(TrieObject *self, void *closure) { return PyLong_FromSsize_t(self->n); }
static PyObject *Trie_get_max_depth(TrieObject *self, void *closure) { return PyLong_FromLong(self->max_depth); }
static PyObject *Trie_get_num_bits(TrieObject *self, void *closure) { return PyLong_FromSsize_t(self->num_bits); }
static PyObject *Trie_get_nbytes(TrieObject *self, void *closure) {
    return PyLong_FromSsize_t(self->n * (Py_ssize_t)(sizeof(Node) + 4) + self->num_ids * 8);
}

static PyGetSetDef Trie_getset[] = {
    {"num_nodes", (getter)Trie_get_num_nodes, NULL, "number of trie nodes", NULL},
    {"max_depth", (getter)Trie_get_max_depth, NULL, "longest token in bytes", NULL},
    {"num_bits", (getter)Trie_get_num_bits, NULL, "row width in bits", NULL},
    {"nbytes", (getter)Trie_get_nbytes, NULL, "memory held", NULL},
    {NULL},
};

static PyTypeObject TrieType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tokenrails._fsm_native.Trie",
    .tp_basicsize = sizeof(TrieObject),
    .tp_dealloc = (destructor)Trie_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Pre-order token trie of one vocabulary (immutable, validated).",
    .tp_new = Trie_new,
    .tp_getset = Trie_getset,
};

/* ---- Walker --------------------------------------------------------------------------------- */

static void Walker_dealloc(WalkerObject *self) {
    PyMem_RawFree(self->table);
    PyMem_RawFree(self->accepting);
    PyMem_RawFree(self->eos);
    if (self->rows) {
        for (Py_ssize_t i = 0; i < self->num_rows; i++) {
            PyMem_RawFree(self->rows[i].data);
        }
    }
    PyMem_RawFree(self->rows);
    PyMem_RawFree(self->row_of);
    PyMem_RawFree(self->slots);
    Py_XDECREF(self->trie);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int build_walker(WalkerObject *self, const int32_t *trans, Py_ssize_t S, Py_ssize_t K, const int32_t *cmap,
                        const uint8_t *acc, const int32_t *eos) {
    for (int b = 0; b < 256; b++) {
        if (cmap[b] < 0 || cmap[b] >= K) {
            PyErr_Format(PyExc_ValueError, "classmap[%d]=%d outside [0, %zd)", b, cmap[b], K);
            return -1;
        }
    }
    uint32_t bad = 0; /* branch-free (vectorized) check; the offending entry is looked up only on failure */
    for (Py_ssize_t i = 0; i < S * K; i++) {
        bad |= (uint32_t)trans[i] >= (uint32_t)S;
    }
    for (Py_ssize_t i = 0; bad && i < S * K; i++) {
        if (trans[i] < 0 || trans[i] >= S) {
            PyErr_Format(PyExc_ValueError, "trans[%zd]=%d outside [0, %zd)", i, trans[i], S);
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < self->num_eos; i++) {
        if (eos[i] < 0 || eos[i] >= self->trie->num_bits) {
            PyErr_Format(PyExc_ValueError, "eos id %d outside [0, %zd)", eos[i], self->trie->num_bits);
            return -1;
        }
        self->eos[i] = eos[i];
    }
    for (Py_ssize_t s = 0; s < S; s++) {
        self->accepting[s] = acc[s] != 0;
    }
    int32_t w = self->width;
    for (Py_ssize_t i = 0; i < S * K; i++) {
        self->table[i] = trans[i] * w;
    }
    memcpy(self->cmap, cmap, sizeof(self->cmap));
    return 0;
}

static PyObject *Walker_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"trie", "trans", "num_states", "num_classes", "classmap", "accepting", "eos_ids",
                             "vocab_size", NULL};
    PyObject *trie, *otr, *ocm, *oacc, *oeos;
    Py_ssize_t S, K, vocab_size;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OnnOOOn", kwlist, &TrieType, &trie, &otr, &S, &K, &ocm, &oacc,
                                     &oeos, &vocab_size)) {
        return NULL;
    }
    TrieObject *tr = (TrieObject *)trie;
    Py_buffer vtr, vcm, vacc, veos;
    if (get_buffer(otr, &vtr, 4, 0, "trans") < 0) return NULL;
    if (get_buffer(ocm, &vcm, 4, 0, "classmap") < 0) { PyBuffer_Release(&vtr); return NULL; }
    if (get_buffer(oacc, &vacc, 1, 0, "accepting") < 0) { PyBuffer_Release(&vtr); PyBuffer_Release(&vcm); return NULL; }
    if (get_buffer(oeos, &veos, 4, 0, "eos_ids") < 0) {
        PyBuffer_Release(&vtr); PyBuffer_Release(&vcm); PyBuffer_Release(&vacc);
        return NULL;
    }
    WalkerObject *self = NULL;
    Py_ssize_t width = K;
    if (S < 1 || K < 1 || K > 256 || S > (INT32_MAX - 256) / width) {
        PyErr_Format(PyExc_ValueError, "bad DFA size: %zd states x %zd classes", S, K);
    } else if (vtr.len / 4 != S * K || vcm.len / 4 != 256 || vacc.len != S) {
        PyErr_Format(PyExc_ValueError, "table sizes: trans %zd (want %zd), classmap %zd (want 256), accepting %zd (want %zd)",
                     vtr.len / 4, S * K, vcm.len / 4, vacc.len, S);
    } else if (vocab_size < 0 || vocab_size > tr->num_bits) {
        PyErr_Format(PyExc_ValueError, "vocab_size %zd outside [0, %zd]", vocab_size, tr->num_bits);
    } else if ((self = (WalkerObject *)type->tp_alloc(type, 0)) != NULL) {
        Py_INCREF(trie);
        self->trie = tr;
        self->num_states = S;
        self->width = (int32_t)width;
        self->vocab_size = vocab_size;
        self->num_eos = veos.len / 4;
        self->table = PyMem_RawMalloc(sizeof(int32_t) * S * width);
        self->accepting = PyMem_RawMalloc(S);
        self->eos = PyMem_RawMalloc(sizeof(int32_t) * (self->num_eos ? self->num_eos : 1));
        Py_ssize_t slots = 4;
        while (slots < 2 * S) {
            slots <<= 1;
        }
        self->num_slots = slots;
        self->row_of = PyMem_RawMalloc(sizeof(int32_t) * S);
        self->rows = PyMem_RawCalloc(S, sizeof(Row));
        self->slots = PyMem_RawMalloc(sizeof(int32_t) * slots);
        if (self->row_of && self->slots) {
            memset(self->row_of, 0xff, sizeof(int32_t) * S); /* NO_ROW */
            memset(self->slots, 0xff, sizeof(int32_t) * slots);
        }
        if (!self->table || !self->accepting || !self->eos || !self->row_of || !self->rows || !self->slots) {
            PyErr_NoMemory();
            Py_CLEAR(self);
        } else if (build_walker(self, vtr.buf, S, K, vcm.buf, vacc.buf, veos.buf) < 0) {
            Py_CLEAR(self);
        }
    }
    PyBuffer_Release(&vtr); PyBuffer_Release(&vcm); PyBuffer_Release(&vacc); PyBuffer_Release(&veos);
    return (PyObject *)self;
}

/* The walk: pre-order over the subtrees of the live depth-1 nodes (found through trie->root, so
 * the dead ones -- usually almost all of the ~256, scattered over the node array -- cost no cache
 * miss); stk[d] = scaled state after the first d bytes of the current path. */
static inline int32_t live_subtree(const WalkerObject *w, int32_t scaled, int b, int32_t *end) {
    int32_t first = w->trie->root[b];
    *end = (first < 0 || !w->table[scaled + w->cmap[b]]) ? first : w->trie->nodes[first].end;
    return first;
}

/* Dense (ids == NULL): set the bit of every allowed id in row; returns 0. Sparse: append the
 * allowed ids in pre-order to ids[0..cap) and return how many, or -1 as soon as there are more.
 * Inlined into both callers, so each gets a loop without the other mode's branches. */
static inline Py_ssize_t walk(const WalkerObject *w, int32_t state, int32_t *stk, uint32_t *row, int32_t *ids,
                              Py_ssize_t cap) {
    const TrieObject *tr = w->trie;
    const Node *nodes = tr->nodes;
    const int32_t *table = w->table, *cmap = w->cmap, *next = tr->tok_next;
    Py_ssize_t count = 0;
    stk[0] = state * w->width;
    for (int b = 0; b < 256; b++) {
        int32_t end, i = live_subtree(w, stk[0], b, &end);
        while (i < end) {
            const Node *nd = &nodes[i];
            int32_t ns = table[stk[nd->depth - 1] + cmap[nd->byte]];
            if (!ns) {
                i = nd->end;
                continue;
            }
            stk[nd->depth] = ns;
            i++;
            int32_t t = nd->tok;
            if (!ids) {
                /* branch-free: about half the nodes end a token, in no predictable pattern */
                row[t >> 5] |= (uint32_t)(nd->flags & HAS_TOK) << (t & 31);
            } else if (nd->flags & HAS_TOK) {
                if (count == cap) {
                    return -1;
                }
                ids[count++] = t;
            }
            if (nd->flags & DUP) {
                for (t = next[t]; t >= 0; t = next[t]) {
                    if (!ids) {
                        row[t >> 5] |= 1u << (t & 31);
                    } else if (count == cap) {
                        return -1;
                    } else {
                        ids[count++] = t;
                    }
                }
            }
        }
    }
    return count;
}

static uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* Key of the row for de-duplication (equal rows, equal keys; candidates are compared in full) and
 * whether every id below vocab_size is set.  A plain sum and a sum salted by position: one
 * vectorizable pass over the row. */
static uint64_t row_key(const uint32_t *row, Py_ssize_t words, Py_ssize_t vocab_size, int *full) {
    uint32_t s1 = 0, s2 = 0, k = 0x12345678u; /* 32-bit lanes: the loop vectorizes to plain adds */
    for (Py_ssize_t i = 0; i < words; i++) {
        s1 += row[i];
        s2 += row[i] ^ k;
        k += 0x9e3779b9u;
    }
    Py_ssize_t whole = vocab_size >> 5, j = 0;
    while (j < whole && row[j] == 0xffffffffu) { /* almost always stops at the first word */
        j++;
    }
    int ok = j == whole;
    if (ok && (vocab_size & 31)) {
        uint32_t need = (1u << (vocab_size & 31)) - 1;
        ok = (row[whole] & need) == need;
    }
    *full = ok;
    return mix(((uint64_t)s1 << 32 | s2) ^ (uint64_t)words);
}

/* One state's row, GIL released by the caller: zero, walk, EOS bits, dedup key. */
static uint64_t fill_row(WalkerObject *self, int32_t state, uint32_t *row, Py_ssize_t words, int32_t *stk,
                         int *full) {
    memset(row, 0, words * 4);
    if (state != 0) {
        walk(self, state, stk, row, NULL, 0);
    }
    if (self->accepting[state]) {
        for (Py_ssize_t k = 0; k < self->num_eos; k++) {
            int32_t t = self->eos[k];
            row[t >> 5] |= 1u << (t & 31);
        }
    }
    return row_key(row, words, self->vocab_size, full);
}

/* The depth stack: on the C stack for usual tries, else from the heap (NULL + MemoryError). */
static int32_t *stack_for(WalkerObject *self, int32_t *local) {
    if (self->trie->max_depth + 1 <= LOCAL_STACK) {
        return local;
    }
    int32_t *stk = PyMem_RawMalloc(sizeof(int32_t) * (self->trie->max_depth + 1));
    if (!stk) {
        PyErr_NoMemory();
    }
    return stk;
}

static int check_state(WalkerObject *self, Py_ssize_t state) {
    if (state < 0 || state >= self->num_states) {
        PyErr_Format(PyExc_ValueError, "state %zd outside [0, %zd)", state, self->num_states);
        return -1;
    }
    return 0;
}

static int get_state(WalkerObject *self, PyObject *arg, Py_ssize_t *state, int allow_eos_only) {
    *state = PyLong_AsSsize_t(arg);
    if (*state == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (allow_eos_only && *state == EOS_ONLY) {
        return 0;
    }
    return check_state(self, *state);
}

/* The head of every (state, ...) METH_FASTCALL method: the argument count, then a valid state. */
static int state_args(WalkerObject *self, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *usage,
                      Py_ssize_t *state, int allow_eos_only) {
    if (check_nargs(nargs, want, usage)) {
        return -1;
    }
    return get_state(self, args[0], state, allow_eos_only);
}

static PyObject *Walker_fill(WalkerObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t state;
    if (state_args(self, args, nargs, 2, "fill(state, out)", &state, 0) < 0) {
        return NULL;
    }
    Py_buffer out;
    if (get_buffer(args[1], &out, 4, 1, "out") < 0) {
        return NULL;
    }
    Py_ssize_t words = self->trie->num_bits / 32;
    if (out.len != words * 4) {
        PyErr_Format(PyExc_ValueError, "out has %zd words; the row needs %zd", out.len / 4, words);
        PyBuffer_Release(&out);
        return NULL;
    }
    int32_t local[LOCAL_STACK];
    int32_t *stk = stack_for(self, local);
    if (!stk) {
        PyBuffer_Release(&out);
        return NULL;
    }
    uint64_t h;
    int full;
    Py_BEGIN_ALLOW_THREADS
    h = fill_row(self, (int32_t)state, out.buf, words, stk, &full);
    Py_END_ALLOW_THREADS
    if (stk != local) {
        PyMem_RawFree(stk);
    }
    PyBuffer_Release(&out);
    return Py_BuildValue("(KO)", (unsigned long long)h, full ? Py_True : Py_False);
}

/* ---- the row cache ----------------------------------------------------------------------------- */

static uint64_t hash_ids(const int32_t *ids, Py_ssize_t n) {
    uint64_t h = 0x6a09e667f3bcc909ULL ^ (uint64_t)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        h = (h ^ (uint32_t)ids[i]) * 0x100000001b3ULL;
    }
    return mix(h);
}

/* Most ids a sparse row holds: a quarter of the packed row's words, so a fill from a sparse row
 * (zero the target, set the bits) costs about what copying a packed row does. Below vocab_size,
 * so a sparse row never allows every id. */
static Py_ssize_t sparse_cap(const WalkerObject *w) {
    Py_ssize_t cap = w->trie->num_bits / 128;
    if (cap >= w->vocab_size) {
        cap = w->vocab_size - 1;
    }
    return cap > 0 ? cap : 0;
}

/* Sparse attempt (cheap, no allocation beyond cap ids): 0 = done, 1 = too many ids (use
 * compute_dense), -1 = out of memory. Safe without the GIL (touches only `out`). */
static int compute_sparse(const WalkerObject *w, int32_t state, Row *out, int32_t *stk) {
    Py_ssize_t cap = sparse_cap(w);
    int32_t *ids = PyMem_RawMalloc(sizeof(int32_t) * (cap ? cap : 1));
    if (!ids) {
        return -1;
    }
    Py_ssize_t count = state ? walk(w, state, stk, NULL, ids, cap) : 0;
    if (count >= 0 && w->accepting[state]) {
        if (count + w->num_eos > cap) {
            count = -1;
        } else {
            for (Py_ssize_t k = 0; k < w->num_eos; k++) {
                ids[count++] = w->eos[k];
            }
        }
    }
    if (count < 0) {
        PyMem_RawFree(ids);
        return 1;
    }
    if (count && count < cap) {
        int32_t *fit = PyMem_RawRealloc(ids, sizeof(int32_t) * count);
        if (fit) {
            ids = fit;
        }
    }
    out->data = (uint32_t *)ids;
    out->count = (int32_t)count;
    out->full = 0;
    out->hash = hash_ids(ids, count);
    return 0;
}

/* Packed row (the walk of `fill`). Safe without the GIL. */
static int compute_dense(WalkerObject *w, int32_t state, Row *out, int32_t *stk) {
    Py_ssize_t words = w->trie->num_bits / 32;
    uint32_t *row = PyMem_RawMalloc(words * 4);
    if (!row) {
        return -1;
    }
    int full;
    out->hash = ~fill_row(w, state, row, words, stk, &full);
    out->data = row;
    out->count = DENSE_ROW;
    out->full = (uint8_t)full;
    return 0;
}

static Py_ssize_t row_words(const WalkerObject *w, const Row *row) {
    return row->count == DENSE_ROW ? w->trie->num_bits / 32 : row->count;
}

/* Cache `row` as the state's row (taking its data), sharing an identical stored row. GIL held. */
static int32_t store_row(WalkerObject *w, int32_t state, Row *row) {
    if (w->row_of[state] != NO_ROW) { /* another thread stored it while this one computed */
        PyMem_RawFree(row->data);
        return w->row_of[state];
    }
    Py_ssize_t mask = w->num_slots - 1, j = (Py_ssize_t)(row->hash & (uint64_t)mask);
    Py_ssize_t n = row_words(w, row);
    for (; w->slots[j] >= 0; j = (j + 1) & mask) {
        int32_t r = w->slots[j];
        const Row *o = &w->rows[r];
        if (o->hash == row->hash && o->count == row->count && !memcmp(o->data, row->data, n * 4)) {
            PyMem_RawFree(row->data);
            w->row_of[state] = r;
            w->cached++;
            return r;
        }
    }
    int32_t r = (int32_t)w->num_rows++; /* at most one new row per state: fits rows[S], slots >= 2S */
    w->rows[r] = *row;
    w->slots[j] = r;
    w->row_of[state] = r;
    w->cached++;
    w->row_bytes += n * 4;
    return r;
}

/* The state's row index, computing it on first visit (GIL held; released for a dense walk). */
static int32_t ensure_row(WalkerObject *w, int32_t state) {
    int32_t r = w->row_of[state];
    if (r != NO_ROW) {
        return r;
    }
    int32_t local[LOCAL_STACK];
    int32_t *stk = stack_for(w, local);
    if (!stk) {
        return -1;
    }
    Row row;
    int rc = compute_sparse(w, state, &row, stk);
    if (rc == 1) {
        Py_BEGIN_ALLOW_THREADS
        rc = compute_dense(w, state, &row, stk);
        Py_END_ALLOW_THREADS
    }
    if (stk != local) {
        PyMem_RawFree(stk);
    }
    if (rc < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return store_row(w, state, &row);
}

/* fill_into(state, address, words) -> bool: write the state's row (computed on first visit) at
 * `address`, an int32 row of `words` >= the row width (the tail is zeroed); state -1 writes the
 * EOS-only row. Returns whether anything is masked. The caller vouches for the address (the
 * Python side checks the tensor: CPU, int32, row-contiguous, row index in range). */
static PyObject *Walker_fill_into(WalkerObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t state;
    if (state_args(self, args, nargs, 3, "fill_into(state, address, words)", &state, 1) < 0) {
        return NULL;
    }
    uintptr_t addr = (uintptr_t)PyLong_AsVoidPtr(args[1]);
    if (!addr) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "fill_into: null address");
        }
        return NULL;
    }
    Py_ssize_t dst_words = PyLong_AsSsize_t(args[2]), words = self->trie->num_bits / 32;
    if (dst_words == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (dst_words < words || addr % 4) {
        PyErr_Format(PyExc_ValueError, "bitmask row has %zd words; this vocabulary needs %zd (and 4-byte alignment)",
                     dst_words, words);
        return NULL;
    }
    uint32_t *dst = (uint32_t *)addr;
    if (state == EOS_ONLY) {
        memset(dst, 0, dst_words * 4);
        for (Py_ssize_t k = 0; k < self->num_eos; k++) {
            dst[self->eos[k] >> 5] |= 1u << (self->eos[k] & 31);
        }
        Py_RETURN_TRUE;
    }
    int32_t r = ensure_row(self, (int32_t)state);
    if (r < 0) {
        return NULL;
    }
    const Row *row = &self->rows[r];
    if (row->count == DENSE_ROW) {
        memcpy(dst, row->data, words * 4);
        if (dst_words > words) {
            memset(dst + words, 0, (dst_words - words) * 4);
        }
        return PyBool_FromLong(!row->full);
    }
    memset(dst, 0, dst_words * 4);
    const int32_t *ids = (const int32_t *)row->data;
    for (int32_t i = 0; i < row->count; i++) {
        dst[ids[i] >> 5] |= 1u << (ids[i] & 31);
    }
    Py_RETURN_TRUE;
}

/* advance(state, token) -> state after the token's bytes; 0 (dead) for an id outside the trie
 * (specials, EOS, empty or out-of-range ids) or a byte the DFA refuses. */
static PyObject *Walker_advance(WalkerObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t state;
    if (state_args(self, args, nargs, 2, "advance(state, token)", &state, 0) < 0) {
        return NULL;
    }
    Py_ssize_t token = PyLong_AsSsize_t(args[1]);
    if (token == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            return NULL;
        }
        PyErr_Clear(); /* an id beyond any vocabulary: not allowed */
        return PyLong_FromLong(0);
    }
    const TrieObject *tr = self->trie;
    if (token < 0 || token >= tr->num_ids || tr->tok_node[token] < 0 || state == 0) {
        return PyLong_FromLong(0);
    }
    uint8_t local[LOCAL_STACK], *path = local;
    int32_t node = tr->tok_node[token];
    int depth = tr->nodes[node].depth;
    if (depth > LOCAL_STACK && !(path = PyMem_RawMalloc(depth))) {
        return PyErr_NoMemory();
    }
    for (int32_t x = node, k = depth - 1; x >= 0 && k >= 0; x = tr->parent[x], k--) {
        path[k] = tr->nodes[x].byte;
    }
    int32_t s = (int32_t)state * self->width;
    for (int k = 0; k < depth && s; k++) {
        s = self->table[s + self->cmap[path[k]]];
    }
    if (path != local) {
        PyMem_RawFree(path);
    }
    return PyLong_FromLong(s / self->width);
}

/* row_index(state) -> index of the state's distinct row (computed on first visit): equal rows, equal index. */
static PyObject *Walker_row_index(WalkerObject *self, PyObject *arg) {
    Py_ssize_t state;
    if (get_state(self, arg, &state, 0) < 0) {
        return NULL;
    }
    int32_t r = ensure_row(self, (int32_t)state);
    return r < 0 ? NULL : PyLong_FromLong(r);
}

static PyObject *Walker_is_cached(WalkerObject *self, PyObject *arg) {
    Py_ssize_t state;
    if (get_state(self, arg, &state, 0) < 0) {
        return NULL;
    }
    return PyBool_FromLong(self->row_of[state] != NO_ROW);
}

static PyObject *Walker_is_packed(WalkerObject *self, PyObject *arg) {
    Py_ssize_t state;
    if (get_state(self, arg, &state, 0) < 0) {
        return NULL;
    }
    int32_t r = ensure_row(self, (int32_t)state);
    return r < 0 ? NULL : PyBool_FromLong(self->rows[r].count == DENSE_ROW);
}

static PyObject *Walker_allows_everything(WalkerObject *self, PyObject *arg) {
    Py_ssize_t state;
    if (get_state(self, arg, &state, 0) < 0) {
        return NULL;
    }
    int32_t r = ensure_row(self, (int32_t)state);
    return r < 0 ? NULL : PyBool_FromLong(self->rows[r].full);
}

static double monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* precompute(states int32[n][, budget_s[, sparse_only]]) -> rows added: compute the missing rows, in
 * order, in one GIL-free pass, then store them (a background warm-up takes the GIL twice per batch,
 * not twice per row). budget_s >= 0 stops starting new rows once that much time has passed;
 * sparse_only skips (leaves lazy) states whose row turns out packed -- the compile step's cheap
 * eager pass, which must never run into a ~1 ms permissive walk. */
static PyObject *Walker_precompute(WalkerObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "precompute(states[, budget_s[, sparse_only]])");
        return NULL;
    }
    double budget = -1.0;
    int sparse_only = 0;
    if (nargs > 1 && (budget = PyFloat_AsDouble(args[1])) == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    if (nargs > 2 && (sparse_only = PyObject_IsTrue(args[2])) < 0) {
        return NULL;
    }
    Py_buffer vs;
    if (get_buffer(args[0], &vs, 4, 0, "states") < 0) {
        return NULL;
    }
    Py_ssize_t n = vs.len / 4, todo = 0;
    const int32_t *states = vs.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (check_state(self, states[i]) < 0) {
            PyBuffer_Release(&vs);
            return NULL;
        }
    }
    int32_t *want = PyMem_RawMalloc(sizeof(int32_t) * (n ? n : 1));
    Row *rows = PyMem_RawCalloc(n ? n : 1, sizeof(Row));
    int32_t local[LOCAL_STACK];
    int32_t *stk = (want && rows) ? stack_for(self, local) : NULL;
    if (!want || !rows || !stk) {
        PyMem_RawFree(want);
        PyMem_RawFree(rows);
        PyBuffer_Release(&vs);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (self->row_of[states[i]] == NO_ROW) {
            want[todo++] = states[i];
        }
    }
    PyBuffer_Release(&vs);
    Py_ssize_t done = 0, added = 0;
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    double end = budget >= 0 ? monotonic_s() + budget : 0.0;
    for (; done < todo; done++) {
        if (budget >= 0 && monotonic_s() > end) {
            break;
        }
        rc = compute_sparse(self, want[done], &rows[done], stk);
        if (rc == 1) {
            if (sparse_only) { /* rows[done].data stays NULL: not stored */
                rc = 0;
                continue;
            }
            rc = compute_dense(self, want[done], &rows[done], stk);
        }
        if (rc < 0) {
            break;
        }
    }
    Py_END_ALLOW_THREADS
    if (stk != local) {
        PyMem_RawFree(stk);
    }
    for (Py_ssize_t i = 0; i < done; i++) {
        if (rc < 0) {
            PyMem_RawFree(rows[i].data);
        } else if (rows[i].data) {
            if (self->row_of[want[i]] == NO_ROW) {
                added++;
            }
            store_row(self, want[i], &rows[i]);
        }
    }
    PyMem_RawFree(want);
    PyMem_RawFree(rows);
    if (rc < 0) {
        return PyErr_NoMemory();
    }
    return PyLong_FromSsize_t(added);
}

/* ---- the token-level distance table (the budget rule) ---------------------------------------- */

#define DIST_INF INT32_MAX

/* For every token-ending node under state s (scaled), visit(end state) -- the same pruned pre-order
 * walk as `walk`, reporting where each token ends instead of its id (ids ending at one node share
 * their end state). */
#define WALK_ENDS(w, state, stk, VISIT)                                                           \
    do {                                                                                          \
        const Node *nodes_ = (w)->trie->nodes;                                                    \
        const int32_t *table_ = (w)->table, *cmap_ = (w)->cmap;                                   \
        (stk)[0] = (state) * (w)->width;                                                          \
        for (int b_ = 0; b_ < 256; b_++) {                                                        \
            int32_t end_, i_ = live_subtree((w), (stk)[0], b_, &end_);                            \
            while (i_ < end_) {                                                                   \
                const Node *nd_ = &nodes_[i_];                                                    \
                int32_t ns_ = table_[(stk)[nd_->depth - 1] + cmap_[nd_->byte]];                   \
                if (!ns_) {                                                                       \
                    i_ = nd_->end;                                                                \
                    continue;                                                                     \
                }                                                                                 \
                (stk)[nd_->depth] = ns_;                                                          \
                i_++;                                                                             \
                if (nd_->flags & HAS_TOK) {                                                       \
                    int32_t END_STATE = ns_ / (w)->width;                                         \
                    VISIT;                                                                        \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    } while (0)

/* budget_table(dist, maxnext, max_edges) -> edges. dist[s]: the fewest tokens that complete the
 * output from state s, the final EOS included (1 when s accepts; INT32_MAX when no token sequence
 * completes it; dist[0] = INT32_MAX). maxnext[s]: the largest dist over the states the allowed
 * tokens of s lead to (0 when none). A breadth-first search backwards from the accepting states
 * over the graph "some grammar token leads from a to b": exact. Raises OverflowError past
 * max_edges distinct (state, next state) pairs. */
static PyObject *Walker_budget_table(WalkerObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (check_nargs(nargs, 3, "budget_table(dist, maxnext, max_edges)")) {
        return NULL;
    }
    Py_ssize_t max_edges = PyLong_AsSsize_t(args[2]);
    if (max_edges == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer vd, vm;
    if (get_buffer(args[0], &vd, 4, 1, "dist") < 0) return NULL;
    if (get_buffer(args[1], &vm, 4, 1, "maxnext") < 0) { PyBuffer_Release(&vd); return NULL; }
    Py_ssize_t S = self->num_states;
    if (vd.len != S * 4 || vm.len != S * 4) {
        PyErr_Format(PyExc_ValueError, "dist and maxnext need %zd int32 entries", S);
        PyBuffer_Release(&vd); PyBuffer_Release(&vm);
        return NULL;
    }
    int32_t *dist = vd.buf, *maxnext = vm.buf;
    int32_t local[LOCAL_STACK];
    int32_t *stk = stack_for(self, local);
    int32_t *stamp = PyMem_RawMalloc(sizeof(int32_t) * S);
    Py_ssize_t *start = PyMem_RawMalloc(sizeof(Py_ssize_t) * (S + 1));
    Py_ssize_t cap = 1024, n = 0;
    int32_t *succ = PyMem_RawMalloc(sizeof(int32_t) * cap);
    Py_ssize_t *rstart = NULL;
    int32_t *pred = NULL, *queue = NULL;
    int status = 0; /* 0 ok, -1 memory, -2 too many edges */
    if (!stk || !stamp || !start || !succ) {
        status = -1;
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    memset(stamp, 0xff, sizeof(int32_t) * S);
    start[0] = start[1] = 0;
    for (int32_t s = 1; s < S && !status; s++) {
        start[s] = n;
        WALK_ENDS(self, s, stk, {
            if (stamp[END_STATE] != s && !status) {
                stamp[END_STATE] = s;
                if (n == max_edges) {
                    status = -2;
                } else {
                    if (n == cap) {
                        int32_t *grown = PyMem_RawRealloc(succ, sizeof(int32_t) * cap * 2);
                        if (!grown) {
                            status = -1;
                        } else {
                            succ = grown;
                            cap *= 2;
                        }
                    }
                    if (!status) {
                        succ[n++] = END_STATE;
                    }
                }
            }
        });
    }
    start[S] = n;
    if (!status) {
        /* predecessors in CSR form, then BFS from the accepting states */
        rstart = PyMem_RawCalloc(S + 1, sizeof(Py_ssize_t));
        pred = PyMem_RawMalloc(sizeof(int32_t) * (n ? n : 1));
        queue = PyMem_RawMalloc(sizeof(int32_t) * S);
        if (!rstart || !pred || !queue) {
            status = -1;
        } else {
            for (Py_ssize_t e = 0; e < n; e++) rstart[succ[e] + 1]++;
            for (Py_ssize_t s = 0; s < S; s++) rstart[s + 1] += rstart[s];
            for (int32_t s = 1; s < S; s++) {
                for (Py_ssize_t e = start[s]; e < start[s + 1]; e++) pred[rstart[succ[e]]++] = s;
            }
            for (Py_ssize_t s = S; s > 0; s--) rstart[s] = rstart[s - 1];
            rstart[0] = 0;
            Py_ssize_t head = 0, tail = 0;
            for (int32_t s = 0; s < S; s++) {
                dist[s] = (s && self->accepting[s]) ? 1 : DIST_INF;
                if (dist[s] == 1) queue[tail++] = s;
            }
            while (head < tail) {
                int32_t u = queue[head++];
                for (Py_ssize_t e = rstart[u]; e < rstart[u + 1]; e++) {
                    int32_t p = pred[e];
                    if (dist[p] == DIST_INF) {
                        dist[p] = dist[u] + 1;
                        queue[tail++] = p;
                    }
                }
            }
            maxnext[0] = 0;
            for (int32_t s = 1; s < S; s++) {
                int32_t m = 0;
                for (Py_ssize_t e = start[s]; e < start[s + 1]; e++) {
                    if (dist[succ[e]] > m) m = dist[succ[e]];
                }
                maxnext[s] = m;
            }
        }
    }
    Py_END_ALLOW_THREADS
done:
    if (stk && stk != local) PyMem_RawFree(stk);
    PyMem_RawFree(stamp); PyMem_RawFree(start); PyMem_RawFree(succ);
    PyMem_RawFree(rstart); PyMem_RawFree(pred); PyMem_RawFree(queue);
    PyBuffer_Release(&vd); PyBuffer_Release(&vm);
    if (status == -1) {
        return PyErr_NoMemory();
    }
    if (status == -2) {
        PyErr_Format(PyExc_OverflowError, "more than %zd token edges between DFA states", max_edges);
        return NULL;
    }
    return PyLong_FromSsize_t(n);
}

/* fill_within(state, dist, bound, address, words) -> allowed ids: write the row of the tokens
 * allowed in `state` whose end state t has dist[t] <= bound, plus EOS when the state accepts
 * (bound >= 0), at `address` (the caller vouches for it, as for fill_into). */
static PyObject *Walker_fill_within(WalkerObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t state;
    if (state_args(self, args, nargs, 5, "fill_within(state, dist, bound, address, words)", &state, 0) < 0) {
        return NULL;
    }
    Py_ssize_t bound = PyLong_AsSsize_t(args[2]);
    if (bound == -1 && PyErr_Occurred()) return NULL;
    uintptr_t addr = (uintptr_t)PyLong_AsVoidPtr(args[3]);
    if (!addr) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "fill_within: null address");
        return NULL;
    }
    Py_ssize_t dst_words = PyLong_AsSsize_t(args[4]), words = self->trie->num_bits / 32;
    if (dst_words == -1 && PyErr_Occurred()) return NULL;
    if (dst_words < words || addr % 4) {
        PyErr_Format(PyExc_ValueError, "bitmask row has %zd words; this vocabulary needs %zd (and 4-byte alignment)",
                     dst_words, words);
        return NULL;
    }
    Py_buffer vd;
    if (get_buffer(args[1], &vd, 4, 0, "dist") < 0) return NULL;
    if (vd.len != self->num_states * 4) {
        PyErr_Format(PyExc_ValueError, "dist needs %zd int32 entries", self->num_states);
        PyBuffer_Release(&vd);
        return NULL;
    }
    int32_t local[LOCAL_STACK];
    int32_t *stk = stack_for(self, local);
    if (!stk) {
        PyBuffer_Release(&vd);
        return NULL;
    }
    const int32_t *dist = vd.buf, *next = self->trie->tok_next;
    uint32_t *dst = (uint32_t *)addr;
    Py_ssize_t count = 0;
    memset(dst, 0, dst_words * 4);
    if (bound >= 0 && state) {
        WALK_ENDS(self, (int32_t)state, stk, {
            if (dist[END_STATE] <= bound) {
                int32_t t = nd_->tok;
                dst[t >> 5] |= 1u << (t & 31);
                count++;
                if (nd_->flags & DUP) {
                    for (t = next[t]; t >= 0; t = next[t]) {
                        dst[t >> 5] |= 1u << (t & 31);
                        count++;
                    }
                }
            }
        });
        if (self->accepting[state]) {
            for (Py_ssize_t k = 0; k < self->num_eos; k++) {
                dst[self->eos[k] >> 5] |= 1u << (self->eos[k] & 31);
                count++;
            }
        }
    }
    if (stk != local) PyMem_RawFree(stk);
    PyBuffer_Release(&vd);
    return PyLong_FromSsize_t(count);
}

static PyObject *Walker_get_nbytes(WalkerObject *self, void *closure) {
    Py_ssize_t tables = self->num_states * (Py_ssize_t)self->width * 4 + self->num_states + self->num_eos * 4;
    Py_ssize_t cache = self->num_states * (Py_ssize_t)(4 + sizeof(Row)) + self->num_slots * 4 + self->row_bytes;
    return PyLong_FromSsize_t(tables + cache);
}
static PyObject *Walker_get_cached_states(WalkerObject *self, void *closure) { return PyLong_FromSsize_t(self->cached); }
static PyObject *Walker_get_distinct_rows(WalkerObject *self, void *closure) { return PyLong_FromSsize_t(self->num_rows); }
static PyObject *Walker_get_row_bytes(WalkerObject *self, void *closure) { return PyLong_FromSsize_t(self->row_bytes); }
static PyObject *Walker_get_words(WalkerObject *self, void *closure) {
    return PyLong_FromSsize_t(self->trie->num_bits / 32);
}

static PyMethodDef Walker_methods[] = {
    {"fill", (PyCFunction)(void (*)(void))Walker_fill, METH_FASTCALL,
     "fill(state, out) -> (hash, full): write state's packed mask row into out (words int32)"},
    {"fill_into", (PyCFunction)(void (*)(void))Walker_fill_into, METH_FASTCALL,
     "fill_into(state, address, words) -> bool: copy the cached row (state -1: EOS only) to an int32 row"},
    {"advance", (PyCFunction)(void (*)(void))Walker_advance, METH_FASTCALL,
     "advance(state, token) -> next state, 0 when the token is not allowed"},
    {"row_index", (PyCFunction)Walker_row_index, METH_O, "row_index(state) -> index of its distinct cached row"},
    {"is_cached", (PyCFunction)Walker_is_cached, METH_O, "is_cached(state) -> whether its row is cached"},
    {"is_packed", (PyCFunction)Walker_is_packed, METH_O,
     "is_packed(state) -> whether its row is kept packed (too many ids for a list)"},
    {"allows_everything", (PyCFunction)Walker_allows_everything, METH_O,
     "allows_everything(state) -> whether its row allows every id below vocab_size"},
    {"precompute", (PyCFunction)(void (*)(void))Walker_precompute, METH_FASTCALL,
     "precompute(states int32[, budget_s[, sparse_only]]) -> rows added: cache the missing rows"},
    {"budget_table", (PyCFunction)(void (*)(void))Walker_budget_table, METH_FASTCALL,
     "budget_table(dist int32[S], maxnext int32[S], max_edges) -> edges: fewest tokens to finish, per state"},
    {"fill_within", (PyCFunction)(void (*)(void))Walker_fill_within, METH_FASTCALL,
     "fill_within(state, dist, bound, address, words) -> ids: the row of tokens whose end state has dist <= bound"},
    {NULL},
};

static PyGetSetDef Walker_getset[] = {
    {"nbytes", (getter)Walker_get_nbytes, NULL, "memory held: transition table and row cache", NULL},
    {"cached_states", (getter)Walker_get_cached_states, NULL, "states whose row is cached", NULL},
    {"distinct_rows", (getter)Walker_get_distinct_rows, NULL, "distinct rows stored", NULL},
    {"row_bytes", (getter)Walker_get_row_bytes, NULL, "bytes of row data stored", NULL},
    {"words", (getter)Walker_get_words, NULL, "int32 words per row", NULL},
    {NULL},
};

static PyTypeObject WalkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tokenrails._fsm_native.Walker",
    .tp_basicsize = sizeof(WalkerObject),
    .tp_dealloc = (destructor)Walker_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One DFA over one Trie: fill(state, out) writes the state's packed mask row.",
    .tp_new = Walker_new,
    .tp_methods = Walker_methods,
    .tp_getset = Walker_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fsm_native", "Pre-order token-trie walk for the FSM backend's masks.", -1, NULL,
};

PyMODINIT_FUNC PyInit__fsm_native(void) {
    if (PyType_Ready(&TrieType) < 0 || PyType_Ready(&WalkerType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (!m) {
        return NULL;
    }
    Py_INCREF(&TrieType);
    if (PyModule_AddObject(m, "Trie", (PyObject *)&TrieType) < 0) {
        Py_DECREF(&TrieType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&WalkerType);
    if (PyModule_AddObject(m, "Walker", (PyObject *)&WalkerType) < 0) {
        Py_DECREF(&WalkerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
