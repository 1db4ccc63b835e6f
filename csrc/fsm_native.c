/* tokenrails._fsm_native -- the FSM backend's per-state token mask, computed by a pre-order trie walk.
 *
 * Trie(node_byte, node_depth, node_tok, tok_next, num_bits)
 *     A vocabulary's grammar tokens as a flat pre-order (DFS) trie: per node its edge byte, depth
 *     (1-based) and one token id ending there (-1 if none); tok_next chains further ids with the
 *     same bytes (ascending, -1 ends). Validated and copied once; the subtree end of every node is
 *     derived here from the depths, so no input can make a walk leave the arrays.
 * Walker(trie, trans, num_states, num_classes, classmap, accepting, eos_ids, vocab_size, byte_table)
 *     One DFA over that trie (trans: int32 [S*K] row-major, 0 = dead). Every table value is
 *     validated; states are stored pre-multiplied by the row width so a step is one load.
 *     byte_table=True expands the table to [S, 256] (one load per node, no class lookup).
 * Walker.fill(state, out) -> (hash, full)
 *     Zeroes ``out`` (a writable buffer of words*4 bytes) and writes the packed mask row in
 *     xgrammar's layout: token t allowed iff feeding its bytes from ``state`` never reaches the dead
 *     state; EOS ids iff ``state`` accepts. A dead transition skips the node's whole subtree.
 *     Returns a 64-bit hash of the row (for de-duplication) and whether every id below
 *     vocab_size is allowed. The GIL is released during the walk.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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
    Py_ssize_t num_ids;   /* length of tok_next; every token id is below it */
    Py_ssize_t num_bits;  /* row width in bits (a multiple of 32) */
    int max_depth;
} TrieObject;

typedef struct {
    PyObject_HEAD
    TrieObject *trie;
    int32_t *table;    /* scaled transitions: next = table[scaled_state + column] */
    int32_t cmap[256]; /* byte -> column (the byte itself when byte_table) */
    uint8_t *accepting;
    int32_t *eos;
    Py_ssize_t num_eos;
    Py_ssize_t num_states;
    int32_t width;     /* row width of table: 256 or num_classes */
    Py_ssize_t vocab_size;
    int byte_table;
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
    }
    int32_t *open = PyMem_RawMalloc(sizeof(int32_t) * (MAX_DEPTH + 1));
    if (!open) {
        PyErr_NoMemory();
        return -1;
    }
    int cur = 0, max_depth = 0;
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
        if (!self->nodes || !self->tok_next) {
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
    return PyLong_FromSsize_t(self->n * (Py_ssize_t)sizeof(Node) + self->num_ids * 4);
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
    for (Py_ssize_t i = 0; i < S * K; i++) {
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
    if (self->byte_table) {
        for (Py_ssize_t s = 0; s < S; s++) {
            const int32_t *src = trans + s * K;
            int32_t *dst = self->table + s * 256;
            for (int b = 0; b < 256; b++) {
                dst[b] = src[cmap[b]] * w;
            }
        }
        for (int b = 0; b < 256; b++) {
            self->cmap[b] = b;
        }
    } else {
        for (Py_ssize_t i = 0; i < S * K; i++) {
            self->table[i] = trans[i] * w;
        }
        memcpy(self->cmap, cmap, sizeof(self->cmap));
    }
    return 0;
}

static PyObject *Walker_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"trie", "trans", "num_states", "num_classes", "classmap", "accepting", "eos_ids",
                             "vocab_size", "byte_table", NULL};
    PyObject *trie, *otr, *ocm, *oacc, *oeos;
    Py_ssize_t S, K, vocab_size;
    int byte_table = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OnnOOOn|p", kwlist, &TrieType, &trie, &otr, &S, &K, &ocm, &oacc,
                                     &oeos, &vocab_size, &byte_table)) {
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
    Py_ssize_t width = byte_table ? 256 : K;
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
        self->byte_table = byte_table;
        self->num_eos = veos.len / 4;
        self->table = PyMem_RawMalloc(sizeof(int32_t) * S * width);
        self->accepting = PyMem_RawMalloc(S);
        self->eos = PyMem_RawMalloc(sizeof(int32_t) * (self->num_eos ? self->num_eos : 1));
        if (!self->table || !self->accepting || !self->eos) {
            PyErr_NoMemory();
            Py_CLEAR(self);
        } else if (build_walker(self, vtr.buf, S, K, vcm.buf, vacc.buf, veos.buf) < 0) {
            Py_CLEAR(self);
        }
    }
    PyBuffer_Release(&vtr); PyBuffer_Release(&vcm); PyBuffer_Release(&vacc); PyBuffer_Release(&veos);
    return (PyObject *)self;
}

/* The walk: pre-order over the trie; stk[d] = scaled state after the first d bytes of the current path. */
static void walk(const WalkerObject *w, int32_t state, uint32_t *row, int32_t *stk) {
    const TrieObject *tr = w->trie;
    const Node *nodes = tr->nodes;
    const int32_t *table = w->table, *cmap = w->cmap, *next = tr->tok_next;
    const int32_t n = (int32_t)tr->n;
    stk[0] = state * w->width;
    int32_t i = 0;
    while (i < n) {
        const Node *nd = &nodes[i];
        int32_t ns = table[stk[nd->depth - 1] + cmap[nd->byte]];
        if (!ns) {
            i = nd->end;
            continue;
        }
        stk[nd->depth] = ns;
        int32_t t = nd->tok;
        /* branch-free: about half the nodes end a token, in no predictable pattern */
        row[t >> 5] |= (uint32_t)(nd->flags & HAS_TOK) << (t & 31);
        if (nd->flags & DUP) {
            for (t = next[t]; t >= 0; t = next[t]) {
                row[t >> 5] |= 1u << (t & 31);
            }
        }
        i++;
    }
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
        walk(self, state, row, stk);
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

static PyObject *Walker_fill(WalkerObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "fill(state, out) takes 2 arguments");
        return NULL;
    }
    Py_ssize_t state = PyLong_AsSsize_t(args[0]);
    if ((state == -1 && PyErr_Occurred()) || check_state(self, state) < 0) {
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

/* fill_many(states int32[n], out int32[n * words], keys uint64[n], full uint8[n]): n rows in one
 * GIL-free pass -- the background warm-up takes the GIL twice per batch instead of twice per row. */
static PyObject *Walker_fill_many(WalkerObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "fill_many(states, out, keys, full) takes 4 arguments");
        return NULL;
    }
    Py_buffer vs, vo, vk, vf;
    if (get_buffer(args[0], &vs, 4, 0, "states") < 0) return NULL;
    if (get_buffer(args[1], &vo, 4, 1, "out") < 0) { PyBuffer_Release(&vs); return NULL; }
    if (get_buffer(args[2], &vk, 8, 1, "keys") < 0) { PyBuffer_Release(&vs); PyBuffer_Release(&vo); return NULL; }
    if (get_buffer(args[3], &vf, 1, 1, "full") < 0) {
        PyBuffer_Release(&vs); PyBuffer_Release(&vo); PyBuffer_Release(&vk);
        return NULL;
    }
    PyObject *res = NULL;
    Py_ssize_t n = vs.len / 4, words = self->trie->num_bits / 32;
    const int32_t *states = vs.buf;
    int32_t local[LOCAL_STACK];
    int32_t *stk = NULL;
    if (vo.len != n * words * 4 || vk.len != n * 8 || vf.len != n) {
        PyErr_Format(PyExc_ValueError, "fill_many: %zd states need out of %zd words, %zd keys, %zd flags",
                     n, n * words, n, n);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (check_state(self, states[i]) < 0) goto done;
    }
    stk = stack_for(self, local);
    if (!stk) goto done;
    uint32_t *rows = vo.buf;
    uint64_t *keys = vk.buf;
    uint8_t *fulls = vf.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int full;
        keys[i] = fill_row(self, states[i], rows + i * words, words, stk, &full);
        fulls[i] = (uint8_t)full;
    }
    Py_END_ALLOW_THREADS
    res = Py_None;
    Py_INCREF(res);
done:
    if (stk && stk != local) PyMem_RawFree(stk);
    PyBuffer_Release(&vs); PyBuffer_Release(&vo); PyBuffer_Release(&vk); PyBuffer_Release(&vf);
    return res;
}

static PyObject *Walker_get_nbytes(WalkerObject *self, void *closure) {
    return PyLong_FromSsize_t(self->num_states * (Py_ssize_t)self->width * 4 + self->num_states + self->num_eos * 4);
}
static PyObject *Walker_get_words(WalkerObject *self, void *closure) {
    return PyLong_FromSsize_t(self->trie->num_bits / 32);
}

static PyMethodDef Walker_methods[] = {
    {"fill", (PyCFunction)(void (*)(void))Walker_fill, METH_FASTCALL,
     "fill(state, out) -> (hash, full): write state's packed mask row into out (words int32)"},
    {"fill_many", (PyCFunction)(void (*)(void))Walker_fill_many, METH_FASTCALL,
     "fill_many(states, out, keys, full): rows of int32 states into out [n, words]; keys uint64, full uint8"},
    {NULL},
};

static PyGetSetDef Walker_getset[] = {
    {"nbytes", (getter)Walker_get_nbytes, NULL, "memory held by the transition table", NULL},
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
