/* tokenrails._dfa_native -- the FSM backend's regex automaton construction in C.
 *
 * determinize(eps, edges, start, accepting, max_states, budget_s, max_bytes)
 *     eps: list of lists of state ids, or None (no epsilon moves); edges: list (one per state) of
 *     lists of (lo, hi, target) byte ranges; accepting: list of accepting state ids.
 *     Epsilon elimination (kept: the start and every byte-edge target), byte classes from the
 *     edges' cut points, subset construction over classes, pruning of states that cannot reach
 *     acceptance, minimization (Hopcroft with whole blocks as splitters and class bitmasks as
 *     signatures, over sparse runs of classes) and the
 *     canonical numbering: 0 = dead, 1 = start, the rest in breadth-first order over classes.
 *     Same result, state for state, as the Python fallback builder (tokenrails/guided/fsm/dfa_fallback.py).
 * compile_ast(program, fragments, max_nfa, max_states, budget_s, max_bytes)
 *     The same from a regex AST flattened in pre-order (see flatten_ast in thompson.py; the pattern is parsed once, in Python) plus the charset
 *     fragments it references: the Thompson construction of ThompsonNFA, state for state, after
 *     the expanded-size guard (5: more than max_nfa character positions; 6: more than max_nfa
 *     NFA states), then as determinize.
 * compile_tree(node, node_types, fragment, max_nfa, max_states, budget_s, max_bytes)
 *     The same straight from the regex AST: ``node_types`` is (CharSet, Concat, Alt, Repeat,
 *     Empty) and ``fragment(ranges)`` gives a CharSet's fragment (thompson.charset_fragment). The
 *     tree is walked here, in the pre-order of flatten_ast, into the program and fragments
 *     compile_ast takes (the walk in Python cost as much as the build for short patterns).
 * from_strings(strings, max_nodes, budget_s, max_bytes)
 *     The minimal DFA of a finite set of byte strings: a trie over byte classes, minimized
 *     bottom-up (Revuz: a node's class is the register entry of (final, [(class, child class)])).
 *
 * Both return (trans: bytearray int32 [S*K], classmap: bytearray int32 [256], accepting:
 * bytearray uint8 [S], S, K) or, when the automaton cannot be built, (code, value):
 * 1 = more than max_states DFA states (max_nodes trie nodes; value: the count reached),
 * 2 = budget_s seconds elapsed (the clock is read every few hundred states), 3 = the working
 * memory would exceed max_bytes (refused before allocating; value: the bytes it would need),
 * 4 = the language is empty. Every input size and index is validated (ValueError/TypeError);
 * the GIL is released while building.
 */
#include "dfa_native.h"

/* ---- Python glue --------------------------------------------------------------------------- */
static PyObject *result_of(Ctx *c, Dense *d, int rc) {
    if (rc) {
        int err = c->err ? c->err : E_MEMORY;
        cx_free(c, d->trans);
        cx_free(c, d->acc);
        return Py_BuildValue("(iL)", err, c->err_value);
    }
    size_t cells = (size_t)d->num * (size_t)d->k;
    PyObject *trans = PyByteArray_FromStringAndSize((const char *)d->trans, (Py_ssize_t)(cells * sizeof(int32_t)));
    PyObject *cm = PyByteArray_FromStringAndSize((const char *)d->classmap, (Py_ssize_t)sizeof(d->classmap));
    PyObject *acc = PyByteArray_FromStringAndSize((const char *)d->acc, (Py_ssize_t)d->num);
    cx_free(c, d->trans);
    cx_free(c, d->acc);
    if (!trans || !cm || !acc) {
        Py_XDECREF(trans);
        Py_XDECREF(cm);
        Py_XDECREF(acc);
        return NULL;
    }
    return Py_BuildValue("(NNNii)", trans, cm, acc, (int)d->num, (int)d->k);
}

static int parse_budget(PyObject *const *args, Ctx *c) {
    double budget = PyFloat_AsDouble(args[0]);
    if (budget == -1.0 && PyErr_Occurred()) return -1;
    long long maxb = PyLong_AsLongLong(args[1]);
    if (maxb == -1 && PyErr_Occurred()) return -1;
    if (maxb < 0) {
        PyErr_SetString(PyExc_ValueError, "max_bytes must be >= 0");
        return -1;
    }
    memset(c, 0, sizeof(*c));
    c->limit = (size_t)maxb;
    c->end = now_s() + (budget > 1e9 ? 1e9 : budget);
    return 0;
}

static int32_t as_index(PyObject *o, int32_t n, const char *what) {
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0 || v >= n) {
        PyErr_Format(PyExc_ValueError, "%s %ld out of range [0, %d)", what, v, (int)n);
        return -1;
    }
    return (int32_t)v;
}

static void nfa_free(NFA *a) {
    PyMem_Free(a->eoff);
    PyMem_Free(a->eps);
    PyMem_Free(a->boff);
    PyMem_Free(a->edges);
    PyMem_Free(a->acc);
    memset(a, 0, sizeof(*a));
}

/* Sum of the lengths of the first n items of ``lists`` (each must be a list; the caller checked
 * the outer one): TypeError ``not_list`` / ValueError ``too_many`` beyond int32 indexing, -1. */
static Py_ssize_t total_length(PyObject *lists, Py_ssize_t n, const char *not_list, const char *too_many) {
    size_t total = 0;
    for (Py_ssize_t s = 0; s < n; s++) {
        PyObject *lst = PyList_GET_ITEM(lists, s);
        if (!PyList_Check(lst)) {
            PyErr_SetString(PyExc_TypeError, not_list);
            return -1;
        }
        total += (size_t)PyList_GET_SIZE(lst);
    }
    if (total >= INT32_MAX / 4) {
        PyErr_SetString(PyExc_ValueError, too_many);
        return -1;
    }
    return (Py_ssize_t)total;
}

/* Copy and validate the Python NFA (lists) into CSR arrays. */
static int nfa_read(PyObject *eps, PyObject *edges, PyObject *start, PyObject *accepting, NFA *a) {
    memset(a, 0, sizeof(*a));
    if (!PyList_Check(edges) || (eps != Py_None && !PyList_Check(eps)) || !PyList_Check(accepting)) {
        PyErr_SetString(PyExc_TypeError, "edges and accepting must be lists, eps a list or None");
        return -1;
    }
    Py_ssize_t N = PyList_GET_SIZE(edges);
    if (N < 1 || N >= INT32_MAX / 4) {
        PyErr_SetString(PyExc_ValueError, "the NFA needs 1 .. 2**29 states");
        return -1;
    }
    if (eps != Py_None && PyList_GET_SIZE(eps) != N) {
        PyErr_SetString(PyExc_ValueError, "eps and edges must have one entry per state");
        return -1;
    }
    a->n = (int32_t)N;
    if ((a->start = as_index(start, a->n, "start")) < 0) return -1;
    a->acc = PyMem_Calloc((size_t)N, 1);
    a->boff = PyMem_Malloc(sizeof(int32_t) * ((size_t)N + 1));
    if (!a->acc || !a->boff) goto nomem;
    Py_ssize_t na = PyList_GET_SIZE(accepting);
    for (Py_ssize_t i = 0; i < na; i++) {
        int32_t s = as_index(PyList_GET_ITEM(accepting, i), a->n, "accepting state");
        if (s < 0) goto fail;
        a->acc[s] = 1;
    }
    Py_ssize_t counted = total_length(edges, N, "edges[s] must be a list", "too many NFA edges");
    if (counted < 0) goto fail;
    size_t ne = (size_t)counted;
    a->edges = PyMem_Malloc(sizeof(Edge) * (ne + 1));
    if (!a->edges) goto nomem;
    size_t w = 0;
    for (Py_ssize_t s = 0; s < N; s++) {
        PyObject *lst = PyList_GET_ITEM(edges, s);
        a->boff[s] = (int32_t)w;
        Py_ssize_t m = PyList_GET_SIZE(lst);
        if (w + (size_t)m > ne) { /* the list grew since it was counted */
            PyErr_SetString(PyExc_ValueError, "edges changed while being read");
            goto fail;
        }
        for (Py_ssize_t i = 0; i < m; i++) {
            PyObject *e = PyList_GET_ITEM(lst, i);
            if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 3) {
                PyErr_SetString(PyExc_TypeError, "an edge must be a (lo, hi, target) tuple");
                goto fail;
            }
            int32_t lo = as_index(PyTuple_GET_ITEM(e, 0), 256, "edge lo");
            if (lo < 0) goto fail;
            int32_t hi = as_index(PyTuple_GET_ITEM(e, 1), 256, "edge hi");
            if (hi < 0) goto fail;
            int32_t t = as_index(PyTuple_GET_ITEM(e, 2), a->n, "edge target");
            if (t < 0) goto fail;
            if (lo > hi) {
                PyErr_SetString(PyExc_ValueError, "edge lo > hi");
                goto fail;
            }
            a->edges[w].lo = lo;
            a->edges[w].hi = hi;
            a->edges[w].dst = t;
            w++;
        }
    }
    a->boff[N] = (int32_t)w;
    if (eps != Py_None) {
        Py_ssize_t counted_eps = total_length(eps, N, "eps[s] must be a list", "too many epsilon moves");
        if (counted_eps < 0) goto fail;
        size_t nx = (size_t)counted_eps;
        a->eoff = PyMem_Malloc(sizeof(int32_t) * ((size_t)N + 1));
        a->eps = PyMem_Malloc(sizeof(int32_t) * (nx + 1));
        if (!a->eoff || !a->eps) goto nomem;
        size_t x = 0;
        for (Py_ssize_t s = 0; s < N; s++) {
            PyObject *lst = PyList_GET_ITEM(eps, s);
            a->eoff[s] = (int32_t)x;
            Py_ssize_t m = PyList_GET_SIZE(lst);
            if (x + (size_t)m > nx) {
                PyErr_SetString(PyExc_ValueError, "eps changed while being read");
                goto fail;
            }
            for (Py_ssize_t i = 0; i < m; i++) {
                int32_t t = as_index(PyList_GET_ITEM(lst, i), a->n, "epsilon target");
                if (t < 0) goto fail;
                a->eps[x++] = t;
            }
        }
        a->eoff[N] = (int32_t)x;
    }
    return 0;
nomem:
    PyErr_NoMemory();
fail:
    nfa_free(a);
    return -1;
}

static long as_count(PyObject *o, const char *what) {
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0) {
        PyErr_Format(PyExc_ValueError, "%s must be >= 0", what);
        return -1;
    }
    return v;
}

PyDoc_STRVAR(determinize_doc,
             "determinize(eps, edges, start, accepting, max_states, budget_s, max_bytes)\n"
             "-> (trans, classmap, accepting, num_states, num_classes) | (error code, value)");

static PyObject *py_determinize(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (check_nargs(nargs, 7, "determinize")) return NULL;
    long max_states = as_count(args[4], "max_states");
    if (max_states < 0) return NULL;
    if (max_states > INT32_MAX / 2) max_states = INT32_MAX / 2;
    Ctx c;
    if (parse_budget(args + 5, &c)) return NULL;
    NFA a;
    if (nfa_read(args[0], args[1], args[2], args[3], &a)) return NULL;
    Dense d;
    memset(&d, 0, sizeof(d));
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dn_determinize(&c, &a, (int32_t)max_states, &d);
    Py_END_ALLOW_THREADS
    nfa_free(&a);
    return result_of(&c, &d, rc);
}

PyDoc_STRVAR(from_strings_doc,
             "from_strings(strings, max_nodes, budget_s, max_bytes)\n"
             "-> (trans, classmap, accepting, num_states, num_classes) | (error code, value)");

static PyObject *py_from_strings(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (check_nargs(nargs, 4, "from_strings")) return NULL;
    if (!PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "strings must be a list of bytes");
        return NULL;
    }
    long long max_nodes = PyLong_AsLongLong(args[1]);
    if (max_nodes == -1 && PyErr_Occurred()) return NULL;
    Ctx c;
    if (parse_budget(args + 2, &c)) return NULL;
    PyObject *lst = args[0];
    Py_ssize_t count = PyList_GET_SIZE(lst);
    size_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *s = PyList_GET_ITEM(lst, i);
        if (!PyBytes_Check(s)) {
            PyErr_SetString(PyExc_TypeError, "strings must be a list of bytes");
            return NULL;
        }
        total += (size_t)PyBytes_GET_SIZE(s);
    }
    if (total > (size_t)INT32_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "strings too long");
        return NULL;
    }
    uint8_t *buf = PyMem_Malloc(total + 1);
    Py_ssize_t *offs = PyMem_Malloc(sizeof(Py_ssize_t) * ((size_t)count + 1));
    if (!buf || !offs) {
        PyMem_Free(buf);
        PyMem_Free(offs);
        return PyErr_NoMemory();
    }
    size_t w = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *s = PyList_GET_ITEM(lst, i);
        offs[i] = (Py_ssize_t)w;
        memcpy(buf + w, PyBytes_AS_STRING(s), (size_t)PyBytes_GET_SIZE(s));
        w += (size_t)PyBytes_GET_SIZE(s);
    }
    offs[count] = (Py_ssize_t)w;
    if (max_nodes > INT32_MAX / 2) max_nodes = INT32_MAX / 2;
    Dense d;
    memset(&d, 0, sizeof(d));
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dn_build_strings(&c, buf, offs, count, max_nodes, &d);
    Py_END_ALLOW_THREADS
    PyMem_Free(buf);
    PyMem_Free(offs);
    return result_of(&c, &d, rc);
}

static int32_t as_i32(PyObject *o, int32_t lo, int32_t hi, const char *what) {
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred()) return INT32_MIN;
    if (v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s %ld out of range [%d, %d]", what, v, (int)lo, (int)hi);
        return INT32_MIN;
    }
    return (int32_t)v;
}

static void frags_free(Frags *f) {
    PyMem_Free(f->size);
    PyMem_Free(f->final);
    PyMem_Free(f->off);
    PyMem_Free(f->edges);
    memset(f, 0, sizeof(*f)); /* idempotent: the caller frees again on its way out */
}

/* Fragment i of ``f`` from a checked (size, edges tuple, final) tuple ``t``, its edges written from
 * f->edges[*w] (room reserved by the caller); validates every number. 0 or -1 (Python error). */
static int frag_fill(Frags *f, int32_t i, PyObject *t, size_t *w) {
    PyObject *edges = PyTuple_GET_ITEM(t, 1);
    int32_t size = as_i32(PyTuple_GET_ITEM(t, 0), 2, 1 << 24, "fragment size");
    if (size == INT32_MIN) return -1;
    int32_t fin = as_i32(PyTuple_GET_ITEM(t, 2), 1, size - 1, "fragment final state");
    if (fin == INT32_MIN) return -1;
    f->size[i] = size;
    f->final[i] = fin;
    f->off[i] = (int32_t)*w;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(edges); k++) {
        PyObject *e = PyTuple_GET_ITEM(edges, k);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 4) {
            PyErr_SetString(PyExc_TypeError, "a fragment edge must be (src, lo, hi, dst)");
            return -1;
        }
        FEdge x;
        if ((x.src = as_i32(PyTuple_GET_ITEM(e, 0), 0, size - 1, "fragment edge src")) == INT32_MIN ||
            (x.lo = as_i32(PyTuple_GET_ITEM(e, 1), 0, 255, "fragment edge lo")) == INT32_MIN ||
            (x.hi = as_i32(PyTuple_GET_ITEM(e, 2), x.lo, 255, "fragment edge hi")) == INT32_MIN ||
            (x.dst = as_i32(PyTuple_GET_ITEM(e, 3), 1, size - 1, "fragment edge dst")) == INT32_MIN)
            return -1;
        f->edges[(*w)++] = x;
    }
    return 0;
}

/* Copy and validate fragments: a list of (size, ((src, lo, hi, dst), ...), final). */
static int frags_read(PyObject *lst, Frags *f) {
    memset(f, 0, sizeof(*f));
    if (!PyList_Check(lst)) {
        PyErr_SetString(PyExc_TypeError, "fragments must be a list");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(lst);
    if (n >= INT32_MAX / 4) {
        PyErr_SetString(PyExc_ValueError, "too many fragments");
        return -1;
    }
    f->nfrag = (int32_t)n;
    f->size = PyMem_Malloc(sizeof(int32_t) * ((size_t)n + 1));
    f->final = PyMem_Malloc(sizeof(int32_t) * ((size_t)n + 1));
    f->off = PyMem_Malloc(sizeof(int32_t) * ((size_t)n + 1));
    if (!f->size || !f->final || !f->off) goto nomem;
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(lst, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3 || !PyTuple_Check(PyTuple_GET_ITEM(t, 1))) {
            PyErr_SetString(PyExc_TypeError, "a fragment must be (size, edges tuple, final)");
            goto fail;
        }
        total += (size_t)PyTuple_GET_SIZE(PyTuple_GET_ITEM(t, 1));
    }
    if (total >= INT32_MAX / 4) {
        PyErr_SetString(PyExc_ValueError, "too many fragment edges");
        goto fail;
    }
    f->edges = PyMem_Malloc(sizeof(FEdge) * (total + 1));
    if (!f->edges) goto nomem;
    size_t w = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (frag_fill(f, (int32_t)i, PyList_GET_ITEM(lst, i), &w)) goto fail;
    f->off[n] = (int32_t)w;
    return 0;
nomem:
    PyErr_NoMemory();
fail:
    frags_free(f);
    return -1;
}

/* (max_nfa, max_states, budget_s, max_bytes) of the AST/regex entry points: counts clamped to
 * what int32 indices allow, then the budget into a fresh context. */
static int parse_build_limits(PyObject *const *args, int32_t *max_nfa, int32_t *max_states, Ctx *c) {
    long nfa = as_count(args[0], "max_nfa");
    if (nfa < 0) return -1;
    long states = as_count(args[1], "max_states");
    if (states < 0) return -1;
    *max_nfa = (int32_t)(nfa > INT32_MAX / 4 ? INT32_MAX / 4 : nfa);
    *max_states = (int32_t)(states > INT32_MAX / 2 ? INT32_MAX / 2 : states);
    return parse_budget(args + 2, c);
}

/* Validate the program, apply the expanded-size guard, build (GIL released): the result tuple. */
static PyObject *run_prog(Ctx *c, const int32_t *prog, int32_t *next, Py_ssize_t len, const Frags *fr,
                          int32_t max_nfa, int32_t max_states) {
    Py_ssize_t end = dn_prog_check(prog, len, 0, 0, fr->nfrag, next);
    if (end < 0) return NULL;
    if (end != len) {
        PyErr_SetString(PyExc_ValueError, "trailing entries after the AST program");
        return NULL;
    }
    int64_t size = dn_prog_size(prog, next, 0);
    if (size > max_nfa) return Py_BuildValue("(iL)", E_SIZE, (long long)size);
    Dense d;
    memset(&d, 0, sizeof(d));
    int rc;
    char *arena = malloc(ARENA_BYTES); /* NULL: every block from malloc */
    c->ar = arena;
    c->ar_off = 0;
    c->ar_cap = arena ? ARENA_BYTES : 0;
    Py_BEGIN_ALLOW_THREADS
    rc = dn_build_ast(c, prog, next, fr, max_nfa, max_states, &d);
    Py_END_ALLOW_THREADS
    PyObject *res = result_of(c, &d, rc); /* copies out of (and releases) blocks that may be in the arena */
    c->ar = NULL;
    free(arena);
    return res;
}

PyDoc_STRVAR(compile_ast_doc,
             "compile_ast(program, fragments, max_nfa, max_states, budget_s, max_bytes)\n"
             "-> (trans, classmap, accepting, num_states, num_classes) | (error code, value)");

static PyObject *py_compile_ast(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (check_nargs(nargs, 6, "compile_ast")) return NULL;
    if (!PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "program must be a list of ints");
        return NULL;
    }
    int32_t max_nfa, max_states;
    Ctx c;
    if (parse_build_limits(args + 2, &max_nfa, &max_states, &c)) return NULL;
    Py_ssize_t len = PyList_GET_SIZE(args[0]);
    if (len < 1 || len >= INT32_MAX / 4) {
        PyErr_SetString(PyExc_ValueError, "empty or oversized AST program");
        return NULL;
    }
    int32_t *prog = PyMem_Malloc(sizeof(int32_t) * (size_t)len);
    int32_t *next = PyMem_Malloc(sizeof(int32_t) * (size_t)len);
    Frags fr;
    memset(&fr, 0, sizeof(fr));
    PyObject *res = NULL;
    if (!prog || !next) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        int32_t v = as_i32(PyList_GET_ITEM(args[0], i), -1, INT32_MAX, "program entry");
        if (v == INT32_MIN) goto done;
        prog[i] = v;
    }
    if (frags_read(args[1], &fr)) goto done;
    res = run_prog(&c, prog, next, len, &fr, max_nfa, max_states);
done:
    PyMem_Free(prog);
    PyMem_Free(next);
    frags_free(&fr);
    return res;
}


/* ---- compile_tree: the AST walked in C ------------------------------------------------------- */
static PyObject *attr_ranges, *attr_items, *attr_item, *attr_min, *attr_max;

typedef struct {
    int32_t *v;
    Py_ssize_t n, cap;
} IVec;

static int ivec_push(IVec *a, int32_t x) {
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? 2 * a->cap : 64;
        int32_t *v = PyMem_Realloc(a->v, sizeof(int32_t) * (size_t)cap);
        if (!v) {
            PyErr_NoMemory();
            return -1;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

/* An int attribute of an AST node as a program entry (the range compile_ast accepts). */
static int push_attr_int(IVec *a, PyObject *node, PyObject *name, int none_as_minus_one) {
    PyObject *o = PyObject_GetAttr(node, name);
    if (!o) return -1;
    int32_t v;
    if (o == Py_None && none_as_minus_one) {
        v = -1;
    } else {
        v = as_i32(o, -1, INT32_MAX, "program entry");
    }
    Py_DECREF(o);
    if (v == INT32_MIN) return -1;
    return ivec_push(a, v);
}

/* Pre-order walk of ``root`` (explicit stack, children pushed in reverse: flatten_ast's order)
 * into ``prog``; each distinct CharSet ranges gets the next fragment id, its fragment appended to
 * ``frags``. Owned references on the stack; 0 or -1 (Python error). */
static int tree_walk(PyObject *root, PyObject *const *types, PyObject *fragment, IVec *prog, PyObject *frags) {
    PyObject *ids = PyDict_New();
    Py_ssize_t cap = 64, top = 0;
    PyObject **stack = PyMem_Malloc(sizeof(PyObject *) * (size_t)cap);
    int rc = -1;
    if (!ids || !stack) {
        PyErr_NoMemory();
        goto done;
    }
    Py_INCREF(root);
    stack[top++] = root;
    while (top) {
        PyObject *n = stack[--top];
        PyTypeObject *t = Py_TYPE(n);
        int ok = -1;
        if (t == (PyTypeObject *)types[0]) { /* CharSet */
            PyObject *ranges = PyObject_GetAttr(n, attr_ranges);
            if (ranges) {
                PyObject *fid = PyDict_GetItemWithError(ids, ranges);
                long id = -1;
                if (fid) {
                    id = PyLong_AsLong(fid);
                } else if (!PyErr_Occurred()) {
                    PyObject *frag = PyObject_CallOneArg(fragment, ranges);
                    id = PyList_GET_SIZE(frags);
                    PyObject *key = frag ? PyLong_FromLong(id) : NULL;
                    if (!key || PyList_Append(frags, frag) || PyDict_SetItem(ids, ranges, key)) id = -1;
                    Py_XDECREF(key);
                    Py_XDECREF(frag);
                }
                Py_DECREF(ranges);
                if (id >= 0 && !ivec_push(prog, K_SET) && !ivec_push(prog, (int32_t)id)) ok = 0;
            }
        } else if (t == (PyTypeObject *)types[1] || t == (PyTypeObject *)types[2]) { /* Concat, Alt */
            PyObject *items = PyObject_GetAttr(n, attr_items);
            if (items && !PyTuple_Check(items)) {
                PyErr_SetString(PyExc_TypeError, "AST items must be a tuple");
            } else if (items) {
                Py_ssize_t m = PyTuple_GET_SIZE(items);
                if (!ivec_push(prog, t == (PyTypeObject *)types[1] ? K_CAT : K_ALT) &&
                    !ivec_push(prog, m > INT32_MAX ? INT32_MAX : (int32_t)m)) {
                    if (top + m > cap) {
                        while (top + m > cap) cap *= 2;
                        PyObject **grown = PyMem_Realloc(stack, sizeof(PyObject *) * (size_t)cap);
                        if (grown) stack = grown;
                        else PyErr_NoMemory();
                    }
                    if (!PyErr_Occurred()) {
                        for (Py_ssize_t k = m - 1; k >= 0; k--) {
                            PyObject *item = PyTuple_GET_ITEM(items, k);
                            Py_INCREF(item);
                            stack[top++] = item;
                        }
                        ok = 0;
                    }
                }
            }
            Py_XDECREF(items);
        } else if (t == (PyTypeObject *)types[3]) { /* Repeat */
            if (!ivec_push(prog, K_REP) && !push_attr_int(prog, n, attr_min, 0) &&
                !push_attr_int(prog, n, attr_max, 1)) {
                PyObject *item = PyObject_GetAttr(n, attr_item);
                if (item && top == cap) {
                    PyObject **grown = PyMem_Realloc(stack, sizeof(PyObject *) * (size_t)(cap * 2));
                    if (grown) {
                        stack = grown;
                        cap *= 2;
                    } else {
                        PyErr_NoMemory();
                        Py_CLEAR(item);
                    }
                }
                if (item) {
                    stack[top++] = item;
                    ok = 0;
                }
            }
        } else if (t == (PyTypeObject *)types[4]) { /* Empty */
            ok = ivec_push(prog, K_EMPTY);
        } else {
            PyErr_Format(PyExc_TypeError, "unexpected AST node %R", n);
        }
        Py_DECREF(n);
        if (ok) goto done;
    }
    rc = 0;
done:
    while (top) {
        PyObject *n = stack[--top];
        Py_DECREF(n);
    }
    PyMem_Free(stack);
    Py_XDECREF(ids);
    return rc;
}

PyDoc_STRVAR(compile_tree_doc,
             "compile_tree(node, node_types, fragment, max_nfa, max_states, budget_s, max_bytes)\n"
             "-> (trans, classmap, accepting, num_states, num_classes) | (error code, value)");

static PyObject *py_compile_tree(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (check_nargs(nargs, 7, "compile_tree")) return NULL;
    PyObject *types = args[1];
    if (!PyTuple_Check(types) || PyTuple_GET_SIZE(types) != 5) {
        PyErr_SetString(PyExc_TypeError, "node_types must be (CharSet, Concat, Alt, Repeat, Empty)");
        return NULL;
    }
    for (int i = 0; i < 5; i++) {
        if (!PyType_Check(PyTuple_GET_ITEM(types, i))) {
            PyErr_SetString(PyExc_TypeError, "node_types must be types");
            return NULL;
        }
    }
    if (!PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "fragment must be callable");
        return NULL;
    }
    int32_t max_nfa, max_states;
    Ctx c;
    if (parse_build_limits(args + 3, &max_nfa, &max_states, &c)) return NULL;
    IVec prog = {NULL, 0, 0};
    PyObject *frags = PyList_New(0);
    PyObject *res = NULL;
    int32_t *next = NULL;
    Frags fr;
    memset(&fr, 0, sizeof(fr));
    if (!frags) goto done;
    if (tree_walk(args[0], &PyTuple_GET_ITEM(types, 0), args[2], &prog, frags)) goto done;
    if (prog.n >= INT32_MAX / 4) {
        PyErr_SetString(PyExc_ValueError, "empty or oversized AST program");
        goto done;
    }
    next = PyMem_Malloc(sizeof(int32_t) * (size_t)prog.n);
    if (!next) {
        PyErr_NoMemory();
        goto done;
    }
    if (frags_read(frags, &fr)) goto done;
    res = run_prog(&c, prog.v, next, prog.n, &fr, max_nfa, max_states);
done:
    PyMem_Free(prog.v);
    PyMem_Free(next);
    frags_free(&fr);
    Py_XDECREF(frags);
    return res;
}


static PyMethodDef methods[] = {
    {"determinize", (PyCFunction)(void (*)(void))py_determinize, METH_FASTCALL, determinize_doc},
    {"compile_ast", (PyCFunction)(void (*)(void))py_compile_ast, METH_FASTCALL, compile_ast_doc},
    {"compile_tree", (PyCFunction)(void (*)(void))py_compile_tree, METH_FASTCALL, compile_tree_doc},
    {"from_strings", (PyCFunction)(void (*)(void))py_from_strings, METH_FASTCALL, from_strings_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_dfa_native", "Regex/string-set automaton construction (see csrc/dfa_native/).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__dfa_native(void) {
    if (!(attr_ranges = PyUnicode_InternFromString("ranges")) || !(attr_items = PyUnicode_InternFromString("items")) ||
        !(attr_item = PyUnicode_InternFromString("item")) || !(attr_min = PyUnicode_InternFromString("min")) ||
        !(attr_max = PyUnicode_InternFromString("max")))
        return NULL;
    return PyModule_Create(&module);
}
