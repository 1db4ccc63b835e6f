/* tokenrails._dfa_native -- shared by its stages (one extension, several sources; see module.c).
 *
 * Infrastructure every stage uses (the build context: error code, deadline, memory budget and
 * arena; growable vectors; hashing), the types handed from one stage to the next, and the stage
 * entry points:
 *   thompson.c  regex AST (flattened in pre-order) -> Thompson NFA, after the expanded-size guard
 *   subset.c    NFA -> epsilon elimination, byte classes, subset construction (sparse runs)
 *   minimize.c  runs -> dead-end pruning, Hopcroft minimization, canonical numbering (dense DFA)
 *   strings.c   finite string set -> minimal acyclic DFA (Revuz), no NFA
 *   module.c    the Python entry points (argument validation, GIL release, results)
 */
#ifndef TOKENRAILS_DFA_NATIVE_H
#define TOKENRAILS_DFA_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../native_common.h"

enum { OK = 0, E_LIMIT = 1, E_TIMEOUT = 2, E_MEMORY = 3, E_EMPTY = 4, E_SIZE = 5, E_NFA = 6 };

/* ---- context: error code, deadline, memory budget --------------------------------------- */
typedef struct {
    size_t used, limit;
    double end;
    int err;
    long long err_value;
    char *ar; /* optional bump arena for the many small blocks of a small build (NULL: none) */
    size_t ar_off, ar_cap;
} Ctx;

#define ARENA_BYTES ((size_t)64 << 10)

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int timed_out(Ctx *c) {
    if (now_s() > c->end) {
        c->err = E_TIMEOUT;
        return 1;
    }
    return 0;
}

#define HDR 16 /* keeps 16-byte alignment; holds the block size for the accounting */
#define ARENA_SPAN(n) (((n) + HDR + 15) & ~(size_t)15)

/* Blocks come from the arena while it has room, else from malloc; the accounting (used against
 * limit, err_value) is the same either way. Arena space is reclaimed only for the last block. */
static inline int in_arena(const Ctx *c, const char *p) { return c->ar && p >= c->ar && p < c->ar + c->ar_cap; }

static inline void *cx_alloc(Ctx *c, size_t n) {
    if (c->err) return NULL;
    if (n > c->limit - c->used) {
        c->err = E_MEMORY;
        c->err_value = (long long)(c->used + n);
        return NULL;
    }
    char *p;
    if (c->ar && n < c->ar_cap && ARENA_SPAN(n) <= c->ar_cap - c->ar_off) {
        p = c->ar + c->ar_off;
        c->ar_off += ARENA_SPAN(n);
    } else if (!(p = malloc(n + HDR))) {
        c->err = E_MEMORY;
        c->err_value = (long long)(c->used + n);
        return NULL;
    }
    *(size_t *)p = n;
    c->used += n;
    return p + HDR;
}

static inline void *cx_calloc(Ctx *c, size_t count, size_t size) {
    if (size && count > ((size_t)-1 - HDR) / size / 2) {
        c->err = E_MEMORY;
        c->err_value = -1;
        return NULL;
    }
    void *p = cx_alloc(c, count * size);
    if (p) memset(p, 0, count * size);
    return p;
}

static inline void *cx_realloc(Ctx *c, void *q, size_t n) {
    if (!q) return cx_alloc(c, n);
    if (c->err) return NULL;
    char *p = (char *)q - HDR;
    size_t old = *(size_t *)p;
    if (n > old && n - old > c->limit - c->used) {
        c->err = E_MEMORY;
        c->err_value = (long long)(c->used + n - old);
        return NULL;
    }
    if (in_arena(c, p)) {
        size_t at = (size_t)(p - c->ar);
        if (at + ARENA_SPAN(old) == c->ar_off && n < c->ar_cap && at + ARENA_SPAN(n) <= c->ar_cap) {
            c->ar_off = at + ARENA_SPAN(n); /* the last block: grow or shrink in place */
            *(size_t *)p = n;
            c->used = c->used - old + n;
            return q;
        }
        c->used -= old; /* moved: the old block is dropped */
        void *r = cx_alloc(c, n);
        if (!r) {
            c->used += old;
            return NULL;
        }
        memcpy(r, q, old < n ? old : n);
        return r;
    }
    char *np_ = realloc(p, n + HDR);
    if (!np_) {
        c->err = E_MEMORY;
        c->err_value = (long long)(c->used + n - old);
        return NULL;
    }
    *(size_t *)np_ = n;
    c->used = c->used - old + n;
    return np_ + HDR;
}

static inline void cx_free(Ctx *c, void *q) {
    if (!q) return;
    char *p = (char *)q - HDR;
    size_t n = *(size_t *)p;
    c->used -= n;
    if (in_arena(c, p)) {
        if ((size_t)(p - c->ar) + ARENA_SPAN(n) == c->ar_off) c->ar_off = (size_t)(p - c->ar);
        return;
    }
    free(p);
}

/* Double an open-addressing table of (id + 1) entries (0 = empty), re-slotting each entry by
 * hashes[id] (the interning tables of subset construction and of the choice register). */
static inline int grow_id_table(Ctx *c, int32_t **table, size_t *cap, const int32_t *hashes) {
    size_t ncap = *cap * 2;
    int32_t *nt = cx_calloc(c, ncap, sizeof(int32_t));
    if (!nt) return -1;
    for (size_t i = 0; i < *cap; i++) {
        int32_t e = (*table)[i];
        if (!e) continue;
        size_t sl = (uint32_t)hashes[e - 1] & (ncap - 1);
        while (nt[sl]) sl = (sl + 1) & (ncap - 1);
        nt[sl] = e;
    }
    cx_free(c, *table);
    *table = nt;
    *cap = ncap;
    return 0;
}

/* growable int32 vector */
typedef struct {
    int32_t *a;
    size_t n, cap;
} Vec;

static inline int vreserve(Ctx *c, Vec *v, size_t need) {
    if (need <= v->cap) return 0;
    size_t cap = v->cap ? v->cap : 16;
    while (cap < need) {
        if (cap > ((size_t)1 << 40)) {
            c->err = E_MEMORY;
            c->err_value = -1;
            return -1;
        }
        cap *= 2;
    }
    int32_t *p = cx_realloc(c, v->a, cap * sizeof(int32_t));
    if (!p) return -1;
    v->a = p;
    v->cap = cap;
    return 0;
}

static inline int vpush(Ctx *c, Vec *v, int32_t x) {
    if (v->n == v->cap && vreserve(c, v, v->n + 1)) return -1;
    v->a[v->n++] = x;
    return 0;
}

static inline void vfree(Ctx *c, Vec *v) {
    cx_free(c, v->a);
    v->a = NULL;
    v->n = v->cap = 0;
}

static inline uint32_t hash_ints(const int32_t *x, size_t n, uint32_t seed) {
    uint64_t h = 1469598103934665603ULL ^ (seed + n * 0x9E3779B97F4A7C15ULL);
    for (size_t i = 0; i < n; i++) h = (h ^ (uint32_t)x[i]) * 1099511628211ULL;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 32;
    return (uint32_t)h;
}

static inline int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static inline void sort_small(int32_t *a, size_t n) {
    if (n > 16) {
        qsort(a, n, sizeof(int32_t), cmp_i32);
        return;
    }
    for (size_t i = 1; i < n; i++) {
        int32_t x = a[i];
        size_t j = i;
        while (j && a[j - 1] > x) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = x;
    }
}

/* ---- result: a dense DFA (0 dead, 1 start) -------------------------------------------- */
typedef struct {
    int32_t *trans;  /* [num * k] */
    uint8_t *acc;    /* [num] */
    int32_t classmap[256];
    int32_t num, k;
} Dense;

/* ---- classes from cut points ---------------------------------------------------------- */
static inline int32_t classes_from_cuts(const uint8_t cut[257], int32_t cm[256]) {
    int32_t cls = 0;
    for (int b = 0; b < 256; b++) {
        if (b && cut[b]) cls++;
        cm[b] = cls;
    }
    return cls + 1;
}

/* ---- stage hand-over types ---------------------------------------------------------------- */
/* The subset DFA as sparse rows: runs (lo, hi, dst) of consecutive classes with the same non-dead
 * target, sorted by class (subset.c -> minimize.c). */
typedef struct {
    int32_t *off;            /* [S + 1] */
    int32_t *lo, *hi, *dst;  /* runs */
} Runs;

/* A validated input NFA (module.c / thompson.c -> subset.c). */
typedef struct {
    int32_t lo, hi, dst;
} Edge;

typedef struct {
    int32_t n, start;
    int32_t *eoff, *eps; /* epsilon CSR (eoff NULL: no epsilons) */
    int32_t *boff;       /* byte-edge CSR */
    Edge *edges;
    uint8_t *acc;
} NFA;

/* Flattened regex AST node kinds and the charset fragments it references (module.c -> thompson.c). */
enum { K_SET = 0, K_CAT = 1, K_ALT = 2, K_REP = 3, K_EMPTY = 4 };
#define MAX_AST_DEPTH 4096

typedef struct {
    int32_t src, lo, hi, dst;
} FEdge;

typedef struct {
    int32_t nfrag;
    int32_t *size, *final, *off; /* off: [nfrag + 1] into edges */
    FEdge *edges;
} Frags;

/* ---- stage entry points --------------------------------------------------------------------- */
int dn_finish(Ctx *c, const Runs *r, const uint8_t *acc, int32_t S, int32_t k, Dense *out);
int dn_determinize(Ctx *c, const NFA *nfa, int32_t max_states, Dense *out);
Py_ssize_t dn_prog_check(const int32_t *prog, Py_ssize_t len, Py_ssize_t i, int depth, int32_t nfrag, int32_t *next);
int64_t dn_prog_size(const int32_t *prog, const int32_t *next, int32_t i);
int dn_build_ast(Ctx *c, const int32_t *prog, const int32_t *next, const Frags *fr, int32_t max_nfa,
                     int32_t max_states, Dense *out);
int dn_build_strings(Ctx *c, const uint8_t *buf, const Py_ssize_t *soffs, Py_ssize_t count, int64_t max_nodes,
                         Dense *out);

#endif
