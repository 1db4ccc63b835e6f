/* Stage: Thompson construction from a flattened regex AST (mirrors fsm/nfa.py ThompsonNFA). */
#include "dfa_native.h"

/* ---- Thompson construction from a flattened regex AST ---------------------------------------- */
/* Pre-order program: CharSet [0, fragment], Concat [1, n, children...], Alt [2, n, children...],
 * Repeat [3, min, max (-1: unbounded), child], Empty [4]. Character sets are copies of cached
 * fragments (the minimal byte DFA of the set: size, final state, edges (src, lo, hi, dst) with no
 * edge into state 0). Mirrors ThompsonNFA in tokenrails/guided/fsm/nfa.py state for state. */
#define SIZE_CAP ((int64_t)1 << 62)



/* Validates the subtree at i; returns the index after it, or -1 with a Python error set. */
Py_ssize_t dn_prog_check(const int32_t *prog, Py_ssize_t len, Py_ssize_t i, int depth, int32_t nfrag, int32_t *next) {
    if (depth > MAX_AST_DEPTH) {
        PyErr_SetString(PyExc_ValueError, "regex AST nested too deeply");
        return -1;
    }
    if (i >= len) goto truncated;
    Py_ssize_t j;
    switch (prog[i]) {
    case K_SET:
        if (i + 1 >= len) goto truncated;
        if (prog[i + 1] < 0 || prog[i + 1] >= nfrag) {
            PyErr_SetString(PyExc_ValueError, "fragment id out of range");
            return -1;
        }
        j = i + 2;
        break;
    case K_CAT:
    case K_ALT:
        if (i + 1 >= len) goto truncated;
        if (prog[i + 1] < (prog[i] == K_CAT ? 1 : 0)) {
            PyErr_SetString(PyExc_ValueError, "bad item count");
            return -1;
        }
        j = i + 2;
        for (int32_t k = 0; k < prog[i + 1]; k++) {
            j = dn_prog_check(prog, len, j, depth + 1, nfrag, next);
            if (j < 0) return -1;
        }
        break;
    case K_REP:
        if (i + 2 >= len) goto truncated;
        if (prog[i + 1] < 0 || (prog[i + 2] != -1 && prog[i + 2] < prog[i + 1])) {
            PyErr_SetString(PyExc_ValueError, "bad repetition bounds");
            return -1;
        }
        j = dn_prog_check(prog, len, i + 3, depth + 1, nfrag, next);
        if (j < 0) return -1;
        break;
    case K_EMPTY:
        j = i + 1;
        break;
    default:
        PyErr_SetString(PyExc_ValueError, "unknown AST node kind");
        return -1;
    }
    next[i] = (int32_t)j;
    return j;
truncated:
    PyErr_SetString(PyExc_ValueError, "truncated AST program");
    return -1;
}

static int64_t sat_add(int64_t a, int64_t b) { return a > SIZE_CAP - b ? SIZE_CAP : a + b; }
static int64_t sat_mul(int64_t a, int64_t b) { return (b && a > SIZE_CAP / b) ? SIZE_CAP : a * b; }

/* expanded_size() of regex_ast.py (character positions after expanding repeats), saturating. */
int64_t dn_prog_size(const int32_t *prog, const int32_t *next, int32_t i) {
    switch (prog[i]) {
    case K_CAT:
    case K_ALT: {
        int64_t s = 1;
        int32_t j = i + 2;
        for (int32_t k = 0; k < prog[i + 1]; k++) {
            s = sat_add(s, dn_prog_size(prog, next, j));
            j = next[j];
        }
        return s;
    }
    case K_REP: {
        int64_t inner = dn_prog_size(prog, next, i + 3);
        int64_t copies = prog[i + 2] >= 0 ? prog[i + 2] : (prog[i + 1] > 1 ? prog[i + 1] : 1);
        return sat_add(sat_mul(inner, copies > 1 ? copies : 1), 1);
    }
    default:
        return 1;
    }
}

typedef struct {
    Ctx *c;
    const int32_t *prog, *next;
    const Frags *fr;
    Vec xs, xd;             /* epsilon moves (src, dst) */
    Vec es, elo, ehi, ed;   /* byte edges */
    int32_t n, max_n;
} TB;

/* ``count`` fresh states; returns the first id, or -1 (c->err set). */
static int32_t tb_new(TB *t, int32_t count) {
    if ((int64_t)t->n + count > t->max_n) {
        t->c->err = E_NFA;
        t->c->err_value = (long long)t->n + count;
        return -1;
    }
    if ((t->n & 4095) + count > 4095 && timed_out(t->c)) return -1;
    int32_t first = t->n;
    t->n += count;
    return first;
}

static inline int tb_eps(TB *t, int32_t a, int32_t b) { return vpush(t->c, &t->xs, a) || vpush(t->c, &t->xd, b); }

/* Copy fragment f; with at >= 0 its start state is ``at``. Returns 0 or -1. */
static int tb_set(TB *t, int32_t f, int32_t at, int32_t *s, int32_t *e) {
    const Frags *fr = t->fr;
    int32_t size = fr->size[f], base;
    if (at < 0) {
        if ((base = tb_new(t, size)) < 0) return -1;
        *s = base;
    } else {
        if ((base = tb_new(t, size - 1)) < 0) return -1;
        base -= 1; /* fragment state i > 0 -> base + i */
        *s = at;
    }
    for (int32_t i = fr->off[f]; i < fr->off[f + 1]; i++) {
        const FEdge *x = &fr->edges[i];
        int32_t src = (at >= 0 && x->src == 0) ? at : base + x->src;
        if (vpush(t->c, &t->es, src) || vpush(t->c, &t->elo, x->lo) || vpush(t->c, &t->ehi, x->hi) ||
            vpush(t->c, &t->ed, base + x->dst))
            return -1;
    }
    *e = base + fr->final[f];
    return 0;
}

static int tb_build(TB *t, int32_t i, int32_t *s, int32_t *e);

/* Continue the fragment ending at ``end`` with node i; returns the new end or -1. */
static int32_t tb_append(TB *t, int32_t end, int32_t i) {
    int32_t s, e;
    if (t->prog[i] == K_SET) {
        if (tb_set(t, t->prog[i + 1], end, &s, &e)) return -1;
        return e;
    }
    if (tb_build(t, i, &s, &e) || tb_eps(t, end, s)) return -1;
    return e;
}

static int tb_build(TB *t, int32_t i, int32_t *s, int32_t *e) {
    const int32_t *prog = t->prog;
    switch (prog[i]) {
    case K_SET:
        return tb_set(t, prog[i + 1], -1, s, e);
    case K_CAT: {
        int32_t j = i + 2;
        if (tb_build(t, j, s, e)) return -1;
        for (int32_t k = 1; k < prog[i + 1]; k++) {
            j = t->next[j];
            if ((*e = tb_append(t, *e, j)) < 0) return -1;
        }
        return 0;
    }
    case K_ALT: {
        int32_t start = tb_new(t, 1), end = start < 0 ? -1 : tb_new(t, 1), j = i + 2;
        if (end < 0) return -1;
        for (int32_t k = 0; k < prog[i + 1]; k++, j = t->next[j]) {
            int32_t a, b;
            if (tb_build(t, j, &a, &b) || tb_eps(t, start, a) || tb_eps(t, b, end)) return -1;
        }
        *s = start;
        *e = end;
        return 0;
    }
    case K_REP: {
        int32_t mn = prog[i + 1], mx = prog[i + 2], item = i + 3;
        int32_t start = tb_new(t, 1), end = start;
        if (start < 0) return -1;
        for (int32_t k = 0; k < mn; k++)
            if ((end = tb_append(t, end, item)) < 0) return -1;
        if (mx < 0) {
            int32_t loop = tb_new(t, 1), a, b;
            if (loop < 0 || tb_build(t, item, &a, &b) || tb_eps(t, end, loop) || tb_eps(t, loop, a) ||
                tb_eps(t, b, loop))
                return -1;
            *s = start;
            *e = loop;
            return 0;
        }
        if (mx - mn) {
            int32_t fin = tb_new(t, 1);
            if (fin < 0) return -1;
            for (int32_t k = 0; k < mx - mn; k++) {
                if (tb_eps(t, end, fin)) return -1;
                if ((end = tb_append(t, end, item)) < 0) return -1;
            }
            if (tb_eps(t, end, fin)) return -1;
            end = fin;
        }
        *s = start;
        *e = end;
        return 0;
    }
    default: { /* K_EMPTY */
        int32_t x = tb_new(t, 1);
        if (x < 0) return -1;
        *s = *e = x;
        return 0;
    }
    }
}

/* CSR of a list of (src, ...) pairs: off [n + 1] and the order of the pairs by src. */
static int csr(Ctx *c, const Vec *src, int32_t n, int32_t **off_out, int32_t **order_out) {
    int32_t *off = cx_calloc(c, (size_t)n + 1, sizeof(int32_t));
    int32_t *ord = cx_alloc(c, sizeof(int32_t) * (src->n + 1));
    int32_t *cur = cx_alloc(c, sizeof(int32_t) * ((size_t)n + 1));
    if (c->err) {
        cx_free(c, off);
        cx_free(c, ord);
        cx_free(c, cur);
        return -1;
    }
    for (size_t i = 0; i < src->n; i++) off[src->a[i] + 1]++;
    for (int32_t q = 0; q < n; q++) off[q + 1] += off[q];
    memcpy(cur, off, sizeof(int32_t) * (size_t)n);
    for (size_t i = 0; i < src->n; i++) ord[cur[src->a[i]]++] = (int32_t)i;
    cx_free(c, cur);
    *off_out = off;
    *order_out = ord;
    return 0;
}

/* Thompson NFA of the program, then dn_determinize(). */
int dn_build_ast(Ctx *c, const int32_t *prog, const int32_t *next, const Frags *fr, int32_t max_nfa,
                     int32_t max_states, Dense *out) {
    int rc = -1;
    TB t;
    memset(&t, 0, sizeof(t));
    t.c = c;
    t.prog = prog;
    t.next = next;
    t.fr = fr;
    t.max_n = max_nfa;
    NFA a;
    memset(&a, 0, sizeof(a));
    int32_t *xord = NULL, *eord = NULL;
    int32_t start, accept;
    if (tb_build(&t, 0, &start, &accept)) goto done;
    a.n = t.n;
    a.start = start;
    if (csr(c, &t.xs, t.n, &a.eoff, &xord) || csr(c, &t.es, t.n, &a.boff, &eord)) goto done;
    a.eps = cx_alloc(c, sizeof(int32_t) * (t.xd.n + 1));
    a.edges = cx_alloc(c, sizeof(Edge) * (t.ed.n + 1));
    a.acc = cx_calloc(c, (size_t)t.n, 1);
    if (c->err) goto done;
    for (size_t i = 0; i < t.xd.n; i++) a.eps[i] = t.xd.a[xord[i]];
    for (size_t i = 0; i < t.ed.n; i++) {
        int32_t k = eord[i];
        a.edges[i].lo = t.elo.a[k];
        a.edges[i].hi = t.ehi.a[k];
        a.edges[i].dst = t.ed.a[k];
    }
    a.acc[accept] = 1;
    vfree(c, &t.xs);
    vfree(c, &t.xd);
    vfree(c, &t.es);
    vfree(c, &t.elo);
    vfree(c, &t.ehi);
    vfree(c, &t.ed);
    rc = dn_determinize(c, &a, max_states, out);
done:
    vfree(c, &t.xs);
    vfree(c, &t.xd);
    vfree(c, &t.es);
    vfree(c, &t.elo);
    vfree(c, &t.ehi);
    vfree(c, &t.ed);
    cx_free(c, xord);
    cx_free(c, eord);
    cx_free(c, a.eoff);
    cx_free(c, a.eps);
    cx_free(c, a.boff);
    cx_free(c, a.edges);
    cx_free(c, a.acc);
    return rc;
}
