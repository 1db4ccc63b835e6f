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
 *     Same result, state for state, as the Python path in tokenrails/guided/fsm/dfa.py.
 * compile_ast(program, fragments, max_nfa, max_states, budget_s, max_bytes)
 *     The same from a regex AST flattened in pre-order (see flatten_ast in nfa.py) plus the charset
 *     fragments it references: the Thompson construction of ThompsonNFA, state for state, after
 *     the expanded-size guard (5: more than max_nfa character positions; 6: more than max_nfa
 *     NFA states), then as determinize.
 * compile_regex(pattern, max_repeat, max_nfa, max_states, budget_s, max_bytes, fragment_fn)
 *     A C parser for the common subset of regex_parser.py's syntax producing compile_ast's program
 *     directly, then as compile_ast; None for anything it does not handle (the Python parser runs).
 *     See "regex fast path" below.
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
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "native_common.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int timed_out(Ctx *c) {
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

static void *cx_alloc(Ctx *c, size_t n) {
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

static void *cx_calloc(Ctx *c, size_t count, size_t size) {
    if (size && count > ((size_t)-1 - HDR) / size / 2) {
        c->err = E_MEMORY;
        c->err_value = -1;
        return NULL;
    }
    void *p = cx_alloc(c, count * size);
    if (p) memset(p, 0, count * size);
    return p;
}

static void *cx_realloc(Ctx *c, void *q, size_t n) {
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

static void cx_free(Ctx *c, void *q) {
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
static int grow_id_table(Ctx *c, int32_t **table, size_t *cap, const int32_t *hashes) {
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

static int vreserve(Ctx *c, Vec *v, size_t need) {
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

static void vfree(Ctx *c, Vec *v) {
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

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void sort_small(int32_t *a, size_t n) {
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
static int32_t classes_from_cuts(const uint8_t cut[257], int32_t cm[256]) {
    int32_t cls = 0;
    for (int b = 0; b < 256; b++) {
        if (b && cut[b]) cls++;
        cm[b] = cls;
    }
    return cls + 1;
}

/* ---- prune + minimize + canonical renumbering ---------------------------------------------- */
/* The subset DFA comes as sparse rows: runs (lo, hi, dst) of consecutive classes with the same
 * non-dead target, sorted by class. Wide edges ([^"\\] spans most classes of a JSON regex) stay
 * one run, so pruning and minimization cost per run, not per class. */
typedef struct {
    int32_t *off;            /* [S + 1] */
    int32_t *lo, *hi, *dst;  /* runs */
} Runs;

#define MAXW 4 /* 256 classes = 4 words */

typedef struct {
    int32_t block, state;
    uint64_t sig[MAXW];
} Touch;

static int cmp_touch(const void *a, const void *b) {
    const Touch *x = a, *y = b;
    if (x->block != y->block) return x->block < y->block ? -1 : 1;
    for (int w = 0; w < MAXW; w++)
        if (x->sig[w] != y->sig[w]) return x->sig[w] < y->sig[w] ? -1 : 1;
    return 0;
}

static inline int same_sig(const Touch *x, const Touch *y) {
    return !memcmp(x->sig, y->sig, sizeof(x->sig));
}

static void set_range(uint64_t *m, int32_t lo, int32_t hi) {
    for (int32_t a = lo; a <= hi;) {
        int32_t w = a >> 6, b = a & 63;
        int32_t e = (hi >> 6) == w ? (hi & 63) : 63;
        uint64_t bits = (e - b == 63) ? ~0ULL : (((1ULL << (e - b + 1)) - 1) << b);
        m[w] |= bits;
        a = (w + 1) << 6;
    }
}

/* Refinable partition of 0..n-1: E lists states block by block, L = position in E, B = block,
 * block z occupies E[F[z] .. P[z]). */
typedef struct {
    int32_t z, *E, *L, *B, *F, *P;
} Part;

/* Move the listed states (all in block y) to the end of y's range and make them block z = p->z. */
static int32_t carve(Part *p, int32_t y, const Touch *t, int32_t cnt) {
    int32_t end = p->P[y];
    for (int32_t i = 0; i < cnt; i++) {
        int32_t e = t[i].state, at = p->L[e], j = p->P[y] - 1;
        int32_t other = p->E[j];
        p->E[at] = other;
        p->L[other] = at;
        p->E[j] = e;
        p->L[e] = j;
        p->P[y]--;
    }
    int32_t z = p->z++;
    p->F[z] = p->P[y];
    p->P[z] = end;
    for (int32_t i = 0; i < cnt; i++) p->B[t[i].state] = z;
    return z;
}

/* Hopcroft with whole blocks as splitters: the signature of a source state is the bitmask of
 * classes leading into the splitter (all classes at once). A block splits by (signature, touched
 * or not); the largest part keeps the block's id and queue status, every other part is queued
 * (Hopcroft's "all but the largest"). n live states, np (source, target, mask) pairs with their
 * incoming lists (inoff/inl). acc per state. Writes blocks into p; returns 0 or -1. */
static int hopcroft(Ctx *c, int32_t n, int32_t W, const int32_t *psrc, const uint64_t *pmask, const int32_t *inoff,
                    const int32_t *inl, const uint8_t *acc, Part *p) {
    int rc = -1;
    int32_t *queue = NULL, *tslot = NULL, *tstamp = NULL, *bcnt = NULL, *blist = NULL;
    Touch *touch2 = NULL;
    Touch *touch = NULL;
    queue = cx_alloc(c, sizeof(int32_t) * ((size_t)n + 1));
    tslot = cx_alloc(c, sizeof(int32_t) * ((size_t)n + 1));
    tstamp = cx_calloc(c, (size_t)n + 1, sizeof(int32_t));
    touch = cx_alloc(c, sizeof(Touch) * ((size_t)n + 1));
    touch2 = cx_alloc(c, sizeof(Touch) * ((size_t)n + 1));
    bcnt = cx_calloc(c, (size_t)n + 1, sizeof(int32_t));
    blist = cx_alloc(c, sizeof(int32_t) * ((size_t)n + 1));
    if (c->err) goto done;
    /* initial partition: accepting first */
    int32_t na = 0;
    for (int32_t q = 0; q < n; q++)
        if (acc[q]) {
            p->E[na] = q;
            p->L[q] = na++;
        }
    int32_t nr = na;
    for (int32_t q = 0; q < n; q++)
        if (!acc[q]) {
            p->E[nr] = q;
            p->L[q] = nr++;
        }
    p->z = 0;
    int32_t qn = 0;
    if (na) {
        p->F[p->z] = 0;
        p->P[p->z] = na;
        for (int32_t i = 0; i < na; i++) p->B[p->E[i]] = p->z;
        queue[qn++] = p->z++;
    }
    if (n - na) {
        p->F[p->z] = na;
        p->P[p->z] = n;
        for (int32_t i = na; i < n; i++) p->B[p->E[i]] = p->z;
        queue[qn++] = p->z++;
    }
    int32_t iter = 0;
    while (qn) {
        if ((++iter & 255) == 0 && timed_out(c)) goto done;
        int32_t x = queue[--qn];
        /* signatures of every source into x */
        int32_t nt = 0;
        for (int32_t i = p->F[x]; i < p->P[x]; i++) {
            int32_t t = p->E[i];
            for (int32_t j = inoff[t]; j < inoff[t + 1]; j++) {
                int32_t pr = inl[j], s = psrc[pr];
                Touch *tt;
                if (tstamp[s] != iter) {
                    tstamp[s] = iter;
                    tslot[s] = nt;
                    tt = &touch[nt++];
                    tt->state = s;
                    memset(tt->sig, 0, sizeof(tt->sig));
                } else {
                    tt = &touch[tslot[s]];
                }
                const uint64_t *m = pmask + (size_t)pr * W;
                for (int32_t w = 0; w < W; w++) tt->sig[w] |= m[w];
            }
        }
        if (!nt) continue;
        /* group by block (stable counting sort over the touched blocks), then by signature
         * within a block: sorted only when its signatures differ (rare after the first rounds) */
        int32_t nbl = 0;
        for (int32_t i = 0; i < nt; i++) {
            int32_t y = touch[i].block = p->B[touch[i].state];
            if (!bcnt[y]++) blist[nbl++] = y;
        }
        if (nbl > 1) {
            int32_t at = 0;
            for (int32_t i = 0; i < nbl; i++) {
                int32_t y = blist[i], k = bcnt[y];
                bcnt[y] = at;
                at += k;
            }
            for (int32_t i = 0; i < nt; i++) touch2[bcnt[touch[i].block]++] = touch[i];
            Touch *sw = touch;
            touch = touch2;
            touch2 = sw;
        }
        for (int32_t i = 0; i < nbl; i++) bcnt[blist[i]] = 0;
        for (int32_t g0 = 0; g0 < nt;) {
            int32_t g1 = g0 + 1;
            int sorted = 1;
            while (g1 < nt && touch[g1].block == touch[g0].block) {
                if (sorted && !same_sig(&touch[g1], &touch[g0])) sorted = 0;
                g1++;
            }
            if (!sorted) qsort(touch + g0, (size_t)(g1 - g0), sizeof(Touch), cmp_touch);
            g0 = g1;
        }
        for (int32_t g0 = 0; g0 < nt;) {
            int32_t y = touch[g0].block, g1 = g0;
            while (g1 < nt && touch[g1].block == y) g1++;
            int32_t size = p->P[y] - p->F[y], touched = g1 - g0, rest = size - touched;
            /* groups of equal signature within [g0, g1); find the biggest */
            int32_t ngroups = 0, big_at = g0, big_len = 0;
            for (int32_t a = g0; a < g1;) {
                int32_t b = a + 1;
                while (b < g1 && same_sig(&touch[a], &touch[b])) b++;
                if (b - a > big_len) {
                    big_len = b - a;
                    big_at = a;
                }
                ngroups++;
                a = b;
            }
            if (ngroups == 1 && !rest) {
                g0 = g1;
                continue;
            }
            if (rest >= big_len) { /* the untouched remainder stays as y */
                for (int32_t a = g0; a < g1;) {
                    int32_t b = a + 1;
                    while (b < g1 && same_sig(&touch[a], &touch[b])) b++;
                    int32_t z = carve(p, y, touch + a, b - a);
                    queue[qn++] = z;
                    a = b;
                }
            } else { /* the biggest touched group stays as y */
                for (int32_t a = g0; a < g1;) {
                    int32_t b = a + 1;
                    while (b < g1 && same_sig(&touch[a], &touch[b])) b++;
                    if (a != big_at) {
                        int32_t z = carve(p, y, touch + a, b - a);
                        queue[qn++] = z;
                    }
                    a = b;
                }
                if (rest) { /* big group to the front of y, the remainder becomes a new block */
                    for (int32_t i = 0; i < big_len; i++) {
                        int32_t e = touch[big_at + i].state, at = p->L[e], j = p->F[y] + i;
                        int32_t other = p->E[j];
                        p->E[at] = other;
                        p->L[other] = at;
                        p->E[j] = e;
                        p->L[e] = j;
                    }
                    int32_t z = p->z++;
                    p->F[z] = p->F[y] + big_len;
                    p->P[z] = p->P[y];
                    p->P[y] = p->F[z];
                    for (int32_t i = p->F[z]; i < p->P[z]; i++) p->B[p->E[i]] = z;
                    queue[qn++] = z;
                }
            }
            g0 = g1;
        }
    }
    rc = 0;
done:
    cx_free(c, queue);
    cx_free(c, tslot);
    cx_free(c, tstamp);
    cx_free(c, touch);
    cx_free(c, touch2);
    cx_free(c, bcnt);
    cx_free(c, blist);
    return rc;
}

/* S states (0 dead, 1 start) as runs, acc per state. Fills out. Returns 0, or -1 (c->err set). */
static int finish(Ctx *c, const Runs *r, const uint8_t *acc, int32_t S, int32_t k, Dense *out) {
    int rc = -1;
    int32_t W = (k + 63) / 64;
    int32_t *roff = NULL, *rsrc = NULL, *stack = NULL, *lid = NULL, *pstamp = NULL, *pidx = NULL;
    int32_t *inoff = NULL, *inl = NULL, *rep = NULL, *newid = NULL, *order = NULL;
    uint8_t *alive = NULL, *lacc = NULL;
    uint64_t *pmask = NULL;
    Vec psrc = {0}, pdst = {0};
    Part p = {0};
    size_t nruns = (size_t)r->off[S];
    if (W > MAXW) {
        c->err = E_MEMORY;
        c->err_value = -1;
        return -1;
    }
    /* co-reachability of acceptance over reversed runs */
    roff = cx_calloc(c, (size_t)S + 1, sizeof(int32_t));
    alive = cx_calloc(c, (size_t)S, 1);
    stack = cx_alloc(c, sizeof(int32_t) * (size_t)S);
    rsrc = cx_alloc(c, sizeof(int32_t) * (nruns + 1));
    if (c->err) goto done;
    for (size_t i = 0; i < nruns; i++) roff[r->dst[i] + 1]++;
    for (int32_t s = 0; s < S; s++) roff[s + 1] += roff[s];
    memcpy(stack, roff, sizeof(int32_t) * (size_t)S); /* fill cursor */
    for (int32_t s = 1; s < S; s++)
        for (int32_t i = r->off[s]; i < r->off[s + 1]; i++) rsrc[stack[r->dst[i]]++] = s;
    {
        int32_t sp = 0;
        for (int32_t s = 1; s < S; s++)
            if (acc[s]) {
                alive[s] = 1;
                stack[sp++] = s;
            }
        while (sp) {
            int32_t t = stack[--sp];
            for (int32_t i = roff[t]; i < roff[t + 1]; i++) {
                int32_t s = rsrc[i];
                if (!alive[s]) {
                    alive[s] = 1;
                    stack[sp++] = s;
                }
            }
        }
    }
    if (S < 2 || !alive[1]) {
        c->err = E_EMPTY;
        goto done;
    }
    /* live states 0..n-1; (source, target) pairs with the class mask between them */
    lid = cx_alloc(c, sizeof(int32_t) * (size_t)S);
    if (c->err) goto done;
    int32_t n = 0;
    for (int32_t s = 0; s < S; s++) lid[s] = alive[s] ? n++ : -1;
    lacc = cx_alloc(c, (size_t)n + 1);
    pstamp = cx_alloc(c, sizeof(int32_t) * ((size_t)n + 1));
    pidx = cx_alloc(c, sizeof(int32_t) * ((size_t)n + 1));
    if (c->err) goto done;
    for (int32_t q = 0; q < n; q++) pstamp[q] = -1;
    size_t mask_cap = 0;
    for (int32_t s = 1; s < S; s++) {
        if (!alive[s]) continue;
        int32_t q = lid[s];
        lacc[q] = acc[s];
        for (int32_t i = r->off[s]; i < r->off[s + 1]; i++) {
            int32_t d = r->dst[i];
            if (!alive[d]) continue;
            int32_t t = lid[d];
            if (pstamp[t] != q) {
                pstamp[t] = q;
                pidx[t] = (int32_t)psrc.n;
                if (vpush(c, &psrc, q) || vpush(c, &pdst, t)) goto done;
                if (psrc.n * (size_t)W > mask_cap) {
                    size_t cap = mask_cap ? mask_cap * 2 : 256;
                    uint64_t *nm = cx_realloc(c, pmask, cap * sizeof(uint64_t));
                    if (!nm) goto done;
                    pmask = nm;
                    mask_cap = cap;
                }
                memset(pmask + (psrc.n - 1) * W, 0, sizeof(uint64_t) * (size_t)W);
            }
            set_range(pmask + (size_t)pidx[t] * W, r->lo[i], r->hi[i]);
        }
    }
    size_t np_ = psrc.n;
    inoff = cx_calloc(c, (size_t)n + 1, sizeof(int32_t));
    inl = cx_alloc(c, sizeof(int32_t) * (np_ + 1));
    if (c->err) goto done;
    for (size_t i = 0; i < np_; i++) inoff[pdst.a[i] + 1]++;
    for (int32_t q = 0; q < n; q++) inoff[q + 1] += inoff[q];
    memcpy(pstamp, inoff, sizeof(int32_t) * (size_t)n); /* fill cursor */
    for (size_t i = 0; i < np_; i++) inl[pstamp[pdst.a[i]]++] = (int32_t)i;
    p.E = cx_alloc(c, sizeof(int32_t) * ((size_t)n + 1));
    p.L = cx_alloc(c, sizeof(int32_t) * ((size_t)n + 1));
    p.B = cx_alloc(c, sizeof(int32_t) * ((size_t)n + 1));
    p.F = cx_alloc(c, sizeof(int32_t) * ((size_t)n + 1));
    p.P = cx_alloc(c, sizeof(int32_t) * ((size_t)n + 1));
    if (c->err) goto done;
    if (hopcroft(c, n, W, psrc.a, pmask, inoff, inl, lacc, &p)) goto done;
    /* canonical numbering: BFS over classes from the start's block */
    int32_t nb = p.z;
    rep = cx_alloc(c, sizeof(int32_t) * (size_t)nb);
    newid = cx_alloc(c, sizeof(int32_t) * (size_t)nb);
    order = cx_alloc(c, sizeof(int32_t) * (size_t)nb);
    if (c->err) goto done;
    for (int32_t b = 0; b < nb; b++) rep[b] = newid[b] = -1;
    for (int32_t s = S - 1; s >= 1; s--)
        if (alive[s]) rep[p.B[lid[s]]] = s;
    out->k = k;
    out->trans = cx_calloc(c, ((size_t)nb + 1) * (size_t)k, sizeof(int32_t));
    out->acc = cx_calloc(c, (size_t)nb + 1, 1);
    if (c->err) goto done;
    {
        int32_t cnt = 0;
        int32_t b0 = p.B[lid[1]];
        newid[b0] = 1;
        order[cnt++] = b0;
        for (int32_t i = 0; i < cnt; i++) {
            int32_t s = rep[order[i]];
            int32_t sid = i + 1;
            out->acc[sid] = acc[s];
            int32_t *orow = out->trans + (size_t)sid * k;
            for (int32_t j = r->off[s]; j < r->off[s + 1]; j++) {
                int32_t d = r->dst[j];
                if (!alive[d]) continue;
                int32_t tb = p.B[lid[d]];
                if (newid[tb] < 0) {
                    newid[tb] = cnt + 1;
                    order[cnt++] = tb;
                }
                for (int32_t a = r->lo[j]; a <= r->hi[j]; a++) orow[a] = newid[tb];
            }
        }
        out->num = cnt + 1; /* every block is reachable from the start */
    }
    rc = 0;
done:
    cx_free(c, roff);
    cx_free(c, rsrc);
    cx_free(c, stack);
    cx_free(c, lid);
    cx_free(c, pstamp);
    cx_free(c, pidx);
    cx_free(c, inoff);
    cx_free(c, inl);
    cx_free(c, rep);
    cx_free(c, newid);
    cx_free(c, order);
    cx_free(c, alive);
    cx_free(c, lacc);
    cx_free(c, pmask);
    cx_free(c, p.E);
    cx_free(c, p.L);
    cx_free(c, p.B);
    cx_free(c, p.F);
    cx_free(c, p.P);
    vfree(c, &psrc);
    vfree(c, &pdst);
    if (rc) {
        cx_free(c, out->trans);
        cx_free(c, out->acc);
        out->trans = NULL;
        out->acc = NULL;
    }
    return rc;
}

/* ---- input NFA (validated copy) -------------------------------------------------------- */
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

static int cmp_edge(const void *a, const void *b) {
    const Edge *x = a, *y = b;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    if (x->hi != y->hi) return x->hi < y->hi ? -1 : 1;
    return (x->dst > y->dst) - (x->dst < y->dst);
}

/* Epsilon elimination + subset construction + finish. */
static int build(Ctx *c, const NFA *nfa, int32_t max_states, Dense *out) {
    int rc = -1;
    int32_t N = nfa->n;
    /* epsilon-free NFA over the kept states */
    int32_t *imp = NULL, *stamp = NULL, *single = NULL, *table = NULL, *cnt = NULL, *pos = NULL;
    Vec order = {0}, stack = {0}, foff = {0}, pool = {0}, soff = {0}, slen = {0}, shash = {0}, tmp = {0};
    Vec roff = {0}, rlo = {0}, rhi = {0}, rdst = {0}; /* the subset DFA as runs */
    Edge *fe = NULL;
    size_t fe_n = 0, fe_cap = 0;
    Vec dacc = {0}, racc = {0};
    uint8_t *disjoint = NULL;
    imp = cx_alloc(c, sizeof(int32_t) * (size_t)N);
    stamp = cx_calloc(c, (size_t)N, sizeof(int32_t));
    if (c->err) goto done;
    for (int32_t i = 0; i < N; i++) imp[i] = -1;
    imp[nfa->start] = 0;
    if (vpush(c, &order, nfa->start) || vpush(c, &foff, 0)) goto done;
    if (!nfa->eoff) /* epsilon-free input: every state is kept, so every edge cuts classes (as dfa.py) */
        for (int32_t i = 0; i < N; i++)
            if (i != nfa->start) {
                imp[i] = (int32_t)order.n;
                if (vpush(c, &order, i)) goto done;
            }
    for (size_t kk = 0; kk < order.n; kk++) {
        if ((kk & 255) == 255 && timed_out(c)) goto done;
        int32_t root = order.a[kk];
        size_t first = fe_n;
        stack.n = 0;
        if (vpush(c, &stack, root)) goto done;
        stamp[root] = (int32_t)kk + 1;
        int acc = 0;
        while (stack.n) {
            int32_t s = stack.a[--stack.n];
            acc |= nfa->acc[s];
            int32_t ne = nfa->boff[s + 1] - nfa->boff[s];
            if (fe_n + (size_t)ne > fe_cap) {
                size_t cap = fe_cap ? fe_cap : 64;
                while (cap < fe_n + (size_t)ne) cap *= 2;
                Edge *p = cx_realloc(c, fe, cap * sizeof(Edge));
                if (!p) goto done;
                fe = p;
                fe_cap = cap;
            }
            for (int32_t i = nfa->boff[s]; i < nfa->boff[s + 1]; i++) fe[fe_n++] = nfa->edges[i];
            if (nfa->eoff)
                for (int32_t i = nfa->eoff[s]; i < nfa->eoff[s + 1]; i++) {
                    int32_t t = nfa->eps[i];
                    if (stamp[t] != (int32_t)kk + 1) {
                        stamp[t] = (int32_t)kk + 1;
                        if (vpush(c, &stack, t)) goto done;
                    }
                }
        }
        /* sort + dedup this state's edges, map targets to kept-state ids */
        size_t cntE = fe_n - first;
        if (cntE > 1) {
            qsort(fe + first, cntE, sizeof(Edge), cmp_edge);
            size_t w = first + 1;
            for (size_t i = first + 1; i < fe_n; i++)
                if (cmp_edge(fe + i, fe + w - 1)) fe[w++] = fe[i];
            fe_n = w;
        }
        for (size_t i = first; i < fe_n; i++) {
            int32_t t = fe[i].dst;
            if (imp[t] < 0) {
                imp[t] = (int32_t)order.n;
                if (vpush(c, &order, t)) goto done;
            }
            fe[i].dst = imp[t];
        }
        if (vpush(c, &foff, (int32_t)fe_n) || vpush(c, &dacc, acc)) goto done;
        if (fe_n >= (size_t)INT32_MAX / 2) {
            c->err = E_MEMORY;
            c->err_value = -1;
            goto done;
        }
    }
    int32_t nf = (int32_t)order.n;
    /* byte classes */
    {
        uint8_t cut[257] = {0};
        for (size_t i = 0; i < fe_n; i++) {
            cut[fe[i].lo] = 1;
            cut[fe[i].hi + 1] = 1;
        }
        out->k = classes_from_cuts(cut, out->classmap);
        for (size_t i = 0; i < fe_n; i++) {
            fe[i].lo = out->classmap[fe[i].lo];
            fe[i].hi = out->classmap[fe[i].hi];
        }
    }
    int32_t K = out->k;
    /* subset construction: state 0 = {} (dead), 1 = {0} */
    single = cx_alloc(c, sizeof(int32_t) * (size_t)nf);
    disjoint = cx_alloc(c, (size_t)nf);
    if (c->err) goto done;
    for (int32_t p = 0; p < nf; p++) { /* edges sorted by lo: disjoint iff each starts after the last */
        disjoint[p] = 1;
        for (int32_t e = foff.a[p] + 1; e < foff.a[p + 1]; e++)
            if (fe[e].lo <= fe[e - 1].hi) {
                disjoint[p] = 0;
                break;
            }
    }
    cnt = cx_alloc(c, sizeof(int32_t) * ((size_t)K + 1));
    pos = cx_alloc(c, sizeof(int32_t) * ((size_t)K + 1));
    size_t tcap = 64;
    table = cx_calloc(c, tcap, sizeof(int32_t));
    if (c->err) goto done;
    for (int32_t i = 0; i < nf; i++) single[i] = -1;
    single[0] = 1;
    size_t tcount = 0;
    if (vpush(c, &soff, 0) || vpush(c, &slen, 0) || vpush(c, &shash, 0) || vpush(c, &pool, 0) ||
        vpush(c, &soff, 0) || vpush(c, &slen, 1) || vpush(c, &shash, 0))
        goto done;
    if (vpush(c, &roff, 0) || vpush(c, &roff, 0)) goto done; /* the dead state: no runs */
    if (vpush(c, &racc, 0)) goto done;
    for (size_t j = 1; j < soff.n; j++) {
        if ((j & 255) == 0 && timed_out(c)) goto done;
        int32_t off = soff.a[j], len = slen.a[j];
        int acc = 0;
        size_t total = 0;
        if (len == 1 && disjoint[pool.a[off]]) { /* one NFA state, deterministic edges: runs directly */
            int32_t p = pool.a[off];
            if (vpush(c, &racc, dacc.a[p])) goto done;
            for (int32_t e = foff.a[p]; e < foff.a[p + 1]; e++) {
                int32_t d = fe[e].dst, id = single[d];
                if (id < 0) {
                    id = (int32_t)soff.n;
                    if ((int64_t)soff.n + 1 > (int64_t)max_states) {
                        c->err = E_LIMIT;
                        c->err_value = (long long)soff.n + 1;
                        goto done;
                    }
                    single[d] = id;
                    if (vpush(c, &soff, (int32_t)pool.n) || vpush(c, &slen, 1) || vpush(c, &shash, 0) ||
                        vpush(c, &pool, d))
                        goto done;
                }
                if (rdst.n > (size_t)roff.a[j] && rdst.a[rdst.n - 1] == id && rhi.a[rhi.n - 1] == fe[e].lo - 1) {
                    rhi.a[rhi.n - 1] = fe[e].hi;
                } else if (vpush(c, &rlo, fe[e].lo) || vpush(c, &rhi, fe[e].hi) || vpush(c, &rdst, id)) {
                    goto done;
                }
            }
            if (vpush(c, &roff, (int32_t)rdst.n)) goto done;
            continue;
        }
        memset(cnt, 0, sizeof(int32_t) * ((size_t)K + 1));
        for (int32_t i = 0; i < len; i++) {
            int32_t p = pool.a[off + i];
            acc |= dacc.a[p];
            for (int32_t e = foff.a[p]; e < foff.a[p + 1]; e++) {
                for (int32_t a = fe[e].lo; a <= fe[e].hi; a++) cnt[a + 1]++;
                total += (size_t)(fe[e].hi - fe[e].lo + 1);
            }
        }
        if (vpush(c, &racc, acc)) goto done;
        for (int32_t a = 0; a < K; a++) cnt[a + 1] += cnt[a];
        if (vreserve(c, &tmp, total + 1)) goto done;
        memcpy(pos, cnt, sizeof(int32_t) * ((size_t)K + 1));
        for (int32_t i = 0; i < len; i++) {
            int32_t p = pool.a[off + i];
            for (int32_t e = foff.a[p]; e < foff.a[p + 1]; e++)
                for (int32_t a = fe[e].lo; a <= fe[e].hi; a++) tmp.a[pos[a]++] = fe[e].dst;
        }
        int32_t prev_lo = -1, prev_len = -1, prev_id = 0;
        for (int32_t a = 0; a < K; a++) {
            int32_t lo = cnt[a], L = cnt[a + 1] - cnt[a];
            int32_t *seg = tmp.a + lo;
            int32_t id;
            if (L == 0) {
                id = 0;
            } else {
                sort_small(seg, (size_t)L);
                int32_t w = 1;
                for (int32_t i = 1; i < L; i++)
                    if (seg[i] != seg[w - 1]) seg[w++] = seg[i];
                L = w;
                if (L == prev_len && !memcmp(seg, tmp.a + prev_lo, sizeof(int32_t) * (size_t)L)) {
                    id = prev_id;
                } else if (L == 1) {
                    id = single[seg[0]];
                    if (id < 0) {
                        id = (int32_t)soff.n;
                        if ((int64_t)soff.n + 1 > (int64_t)max_states) {
                            c->err = E_LIMIT;
                            c->err_value = (long long)soff.n + 1;
                            goto done;
                        }
                        single[seg[0]] = id;
                        if (vpush(c, &soff, (int32_t)pool.n) || vpush(c, &slen, 1) || vpush(c, &shash, 0) ||
                            vpush(c, &pool, seg[0]))
                            goto done;
                    }
                } else {
                    uint32_t h = hash_ints(seg, (size_t)L, 0);
                    size_t mask = tcap - 1, slot = h & mask;
                    id = -1;
                    while (table[slot]) {
                        int32_t cand = table[slot] - 1;
                        if ((uint32_t)shash.a[cand] == h && slen.a[cand] == L &&
                            !memcmp(pool.a + soff.a[cand], seg, sizeof(int32_t) * (size_t)L)) {
                            id = cand;
                            break;
                        }
                        slot = (slot + 1) & mask;
                    }
                    if (id < 0) {
                        id = (int32_t)soff.n;
                        if ((int64_t)soff.n + 1 > (int64_t)max_states) {
                            c->err = E_LIMIT;
                            c->err_value = (long long)soff.n + 1;
                            goto done;
                        }
                        if (vreserve(c, &pool, pool.n + (size_t)L)) goto done;
                        if (pool.n + (size_t)L >= (size_t)INT32_MAX) {
                            c->err = E_MEMORY;
                            c->err_value = -1;
                            goto done;
                        }
                        if (vpush(c, &soff, (int32_t)pool.n) || vpush(c, &slen, L) || vpush(c, &shash, (int32_t)h))
                            goto done;
                        memcpy(pool.a + pool.n, seg, sizeof(int32_t) * (size_t)L);
                        pool.n += (size_t)L;
                        table[slot] = id + 1;
                        if (++tcount * 2 > tcap && grow_id_table(c, &table, &tcap, shash.a)) goto done;
                    }
                }
            }
            if (id) { /* extend the open run or start one */
                if (rdst.n > (size_t)roff.a[j] && rdst.a[rdst.n - 1] == id && rhi.a[rhi.n - 1] == a - 1) {
                    rhi.a[rhi.n - 1] = a;
                } else if (vpush(c, &rlo, a) || vpush(c, &rhi, a) || vpush(c, &rdst, id)) {
                    goto done;
                }
            }
            prev_lo = lo;
            prev_len = L;
            prev_id = id;
        }
        if (vpush(c, &roff, (int32_t)rdst.n)) goto done;
    }
    {
        int32_t S = (int32_t)soff.n;
        uint8_t *acc8 = cx_alloc(c, (size_t)S);
        if (!acc8) goto done;
        for (int32_t s = 0; s < S; s++) acc8[s] = (uint8_t)racc.a[s];
        /* free construction state before minimizing (memory budget) */
        vfree(c, &pool);
        vfree(c, &tmp);
        cx_free(c, table);
        table = NULL;
        Runs runs = {roff.a, rlo.a, rhi.a, rdst.a};
        rc = finish(c, &runs, acc8, S, K, out);
        cx_free(c, acc8);
    }
done:
    vfree(c, &racc);
    cx_free(c, imp);
    cx_free(c, stamp);
    cx_free(c, single);
    cx_free(c, table);
    cx_free(c, cnt);
    cx_free(c, pos);
    cx_free(c, fe);
    cx_free(c, disjoint);
    vfree(c, &order);
    vfree(c, &stack);
    vfree(c, &foff);
    vfree(c, &pool);
    vfree(c, &soff);
    vfree(c, &slen);
    vfree(c, &shash);
    vfree(c, &roff);
    vfree(c, &rlo);
    vfree(c, &rhi);
    vfree(c, &rdst);
    vfree(c, &tmp);
    vfree(c, &dacc);
    return rc;
}

/* ---- Thompson construction from a flattened regex AST ---------------------------------------- */
/* Pre-order program: CharSet [0, fragment], Concat [1, n, children...], Alt [2, n, children...],
 * Repeat [3, min, max (-1: unbounded), child], Empty [4]. Character sets are copies of cached
 * fragments (the minimal byte DFA of the set: size, final state, edges (src, lo, hi, dst) with no
 * edge into state 0). Mirrors ThompsonNFA in tokenrails/guided/fsm/nfa.py state for state. */
enum { K_SET = 0, K_CAT = 1, K_ALT = 2, K_REP = 3, K_EMPTY = 4 };
#define MAX_AST_DEPTH 4096
#define SIZE_CAP ((int64_t)1 << 62)

typedef struct {
    int32_t src, lo, hi, dst;
} FEdge;

typedef struct {
    int32_t nfrag;
    int32_t *size, *final, *off; /* off: [nfrag + 1] into edges */
    FEdge *edges;
} Frags;

/* Validates the subtree at i; returns the index after it, or -1 with a Python error set. */
static Py_ssize_t prog_check(const int32_t *prog, Py_ssize_t len, Py_ssize_t i, int depth, int32_t nfrag, int32_t *next) {
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
            j = prog_check(prog, len, j, depth + 1, nfrag, next);
            if (j < 0) return -1;
        }
        break;
    case K_REP:
        if (i + 2 >= len) goto truncated;
        if (prog[i + 1] < 0 || (prog[i + 2] != -1 && prog[i + 2] < prog[i + 1])) {
            PyErr_SetString(PyExc_ValueError, "bad repetition bounds");
            return -1;
        }
        j = prog_check(prog, len, i + 3, depth + 1, nfrag, next);
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
static int64_t prog_size(const int32_t *prog, const int32_t *next, int32_t i) {
    switch (prog[i]) {
    case K_CAT:
    case K_ALT: {
        int64_t s = 1;
        int32_t j = i + 2;
        for (int32_t k = 0; k < prog[i + 1]; k++) {
            s = sat_add(s, prog_size(prog, next, j));
            j = next[j];
        }
        return s;
    }
    case K_REP: {
        int64_t inner = prog_size(prog, next, i + 3);
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

/* Thompson NFA of the program, then build(). */
static int build_ast(Ctx *c, const int32_t *prog, const int32_t *next, const Frags *fr, int32_t max_nfa,
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
    rc = build(c, &a, max_states, out);
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

/* ---- finite string sets (Revuz) ---------------------------------------------------------- */
static int build_strings(Ctx *c, const uint8_t *buf, const Py_ssize_t *soffs, Py_ssize_t count, int64_t max_nodes,
                         Dense *out) {
    int rc = -1;
    Vec final = {0}, ep = {0}, ec = {0}, ech = {0}, pool = {0}, roff = {0}, rlen = {0}, rhash = {0}, reps = {0};
    int64_t *hkeys = NULL;
    int32_t *hvals = NULL, *canon = NULL, *srt = NULL, *srt2 = NULL, *coff = NULL, *ccount = NULL, *rtab = NULL;
    int32_t *sig = NULL, *newid = NULL, *order = NULL;
    size_t hcap = 1024, hcount = 0, rcap = 64, rcount = 0;
    uint8_t cut[257] = {0};
    for (Py_ssize_t i = 0; i < soffs[count]; i++) {
        cut[buf[i]] = 1;
        cut[buf[i] + 1] = 1;
    }
    int32_t K = out->k = classes_from_cuts(cut, out->classmap);
    hkeys = cx_alloc(c, sizeof(int64_t) * hcap);
    hvals = cx_alloc(c, sizeof(int32_t) * hcap);
    if (c->err || vpush(c, &final, 0)) goto done;
    for (size_t i = 0; i < hcap; i++) hkeys[i] = -1;
    /* the trie: (node, class) -> child through an open-addressing table */
    for (Py_ssize_t si = 0; si < count; si++) {
        if ((si & 1023) == 1023 && timed_out(c)) goto done;
        int32_t node = 0;
        for (Py_ssize_t i = soffs[si]; i < soffs[si + 1]; i++) {
            int32_t a = out->classmap[buf[i]];
            int64_t key = (int64_t)node * K + a;
            uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ULL;
            size_t slot = (size_t)(h >> 20) & (hcap - 1);
            while (hkeys[slot] >= 0 && hkeys[slot] != key) slot = (slot + 1) & (hcap - 1);
            if (hkeys[slot] == key) {
                node = hvals[slot];
                continue;
            }
            int32_t child = (int32_t)final.n;
            if (vpush(c, &final, 0) || vpush(c, &ep, node) || vpush(c, &ec, a) || vpush(c, &ech, child)) goto done;
            hkeys[slot] = key;
            hvals[slot] = child;
            if (++hcount * 2 > hcap) {
                size_t ncap = hcap * 2;
                int64_t *nk = cx_alloc(c, sizeof(int64_t) * ncap);
                int32_t *nv = cx_alloc(c, sizeof(int32_t) * ncap);
                if (c->err) {
                    cx_free(c, nk);
                    cx_free(c, nv);
                    goto done;
                }
                for (size_t x = 0; x < ncap; x++) nk[x] = -1;
                for (size_t x = 0; x < hcap; x++) {
                    if (hkeys[x] < 0) continue;
                    size_t sl = (size_t)(((uint64_t)hkeys[x] * 0x9E3779B97F4A7C15ULL) >> 20) & (ncap - 1);
                    while (nk[sl] >= 0) sl = (sl + 1) & (ncap - 1);
                    nk[sl] = hkeys[x];
                    nv[sl] = hvals[x];
                }
                cx_free(c, hkeys);
                cx_free(c, hvals);
                hkeys = nk;
                hvals = nv;
                hcap = ncap;
            }
            node = child;
        }
        final.a[node] = 1;
        if ((int64_t)final.n > max_nodes) { /* checked per string, as dfa.py does */
            c->err = E_LIMIT;
            c->err_value = (long long)final.n;
            goto done;
        }
    }
    int32_t n = (int32_t)final.n;
    size_t ne = ep.n;
    if (n == 1 && !final.a[0]) {
        c->err = E_EMPTY;
        goto done;
    }
    cx_free(c, hkeys);
    cx_free(c, hvals);
    hkeys = NULL;
    hvals = NULL;
    /* edges sorted by (parent, class): counting sort by class, then stable by parent */
    srt = cx_alloc(c, sizeof(int32_t) * (ne + 1));
    srt2 = cx_alloc(c, sizeof(int32_t) * (ne + 1));
    ccount = cx_calloc(c, (size_t)K + 1, sizeof(int32_t));
    coff = cx_calloc(c, (size_t)n + 1, sizeof(int32_t));
    canon = cx_alloc(c, sizeof(int32_t) * (size_t)n);
    sig = cx_alloc(c, sizeof(int32_t) * (2 * (size_t)K + 2));
    rtab = cx_calloc(c, rcap, sizeof(int32_t));
    if (c->err) goto done;
    for (size_t e = 0; e < ne; e++) ccount[ec.a[e] + 1]++;
    for (int32_t a = 0; a < K; a++) ccount[a + 1] += ccount[a];
    for (size_t e = 0; e < ne; e++) srt[ccount[ec.a[e]]++] = (int32_t)e;
    for (size_t e = 0; e < ne; e++) coff[ep.a[e] + 1]++;
    for (int32_t q = 0; q < n; q++) coff[q + 1] += coff[q];
    {
        int32_t *cur = canon; /* reuse as fill cursor */
        memcpy(cur, coff, sizeof(int32_t) * (size_t)n);
        for (size_t i = 0; i < ne; i++) {
            int32_t e = srt[i];
            srt2[cur[ep.a[e]]++] = e;
        }
    }
    /* register, bottom-up: children are created after their parent */
    for (int32_t q = n - 1; q >= 0; q--) {
        if ((q & 4095) == 0 && timed_out(c)) goto done;
        int32_t L = 0;
        sig[L++] = final.a[q];
        for (int32_t i = coff[q]; i < coff[q + 1]; i++) {
            int32_t e = srt2[i];
            sig[L++] = ec.a[e];
            sig[L++] = canon[ech.a[e]];
        }
        uint32_t h = hash_ints(sig, (size_t)L, 1);
        size_t slot = h & (rcap - 1);
        int32_t id = -1;
        while (rtab[slot]) {
            int32_t cand = rtab[slot] - 1;
            if ((uint32_t)rhash.a[cand] == h && rlen.a[cand] == L &&
                !memcmp(pool.a + roff.a[cand], sig, sizeof(int32_t) * (size_t)L)) {
                id = cand;
                break;
            }
            slot = (slot + 1) & (rcap - 1);
        }
        if (id < 0) {
            id = (int32_t)reps.n;
            if (vreserve(c, &pool, pool.n + (size_t)L)) goto done;
            if (vpush(c, &roff, (int32_t)pool.n) || vpush(c, &rlen, L) || vpush(c, &rhash, (int32_t)h) ||
                vpush(c, &reps, q))
                goto done;
            memcpy(pool.a + pool.n, sig, sizeof(int32_t) * (size_t)L);
            pool.n += (size_t)L;
            rtab[slot] = id + 1;
            if (++rcount * 2 > rcap && grow_id_table(c, &rtab, &rcap, rhash.a)) goto done;
        }
        canon[q] = id;
    }
    /* canonical numbering: BFS over classes from the root's register entry */
    {
        int32_t m = (int32_t)reps.n;
        newid = cx_alloc(c, sizeof(int32_t) * (size_t)m);
        order = cx_alloc(c, sizeof(int32_t) * (size_t)m);
        out->num = m + 1;
        out->trans = cx_calloc(c, (size_t)out->num * (size_t)K, sizeof(int32_t));
        out->acc = cx_calloc(c, (size_t)out->num, 1);
        if (c->err) goto done;
        for (int32_t x = 0; x < m; x++) newid[x] = -1;
        int32_t cntq = 0;
        newid[canon[0]] = 1;
        order[cntq++] = canon[0];
        for (int32_t i = 0; i < cntq; i++) {
            int32_t q = reps.a[order[i]];
            int32_t sid = i + 1;
            out->acc[sid] = (uint8_t)final.a[q];
            int32_t *orow = out->trans + (size_t)sid * K;
            for (int32_t j = coff[q]; j < coff[q + 1]; j++) {
                int32_t e = srt2[j];
                int32_t x = canon[ech.a[e]];
                if (newid[x] < 0) {
                    newid[x] = cntq + 1;
                    order[cntq++] = x;
                }
                orow[ec.a[e]] = newid[x];
            }
        }
        out->num = cntq + 1;
    }
    rc = 0;
done:
    vfree(c, &final);
    vfree(c, &ep);
    vfree(c, &ec);
    vfree(c, &ech);
    vfree(c, &pool);
    vfree(c, &roff);
    vfree(c, &rlen);
    vfree(c, &rhash);
    vfree(c, &reps);
    cx_free(c, hkeys);
    cx_free(c, hvals);
    cx_free(c, canon);
    cx_free(c, srt);
    cx_free(c, srt2);
    cx_free(c, coff);
    cx_free(c, ccount);
    cx_free(c, rtab);
    cx_free(c, sig);
    cx_free(c, newid);
    cx_free(c, order);
    if (rc) {
        cx_free(c, out->trans);
        cx_free(c, out->acc);
        out->trans = NULL;
        out->acc = NULL;
    }
    return rc;
}

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
    rc = build(&c, &a, (int32_t)max_states, &d);
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
    rc = build_strings(&c, buf, offs, count, max_nodes, &d);
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
    Py_ssize_t end = prog_check(prog, len, 0, 0, fr->nfrag, next);
    if (end < 0) return NULL;
    if (end != len) {
        PyErr_SetString(PyExc_ValueError, "trailing entries after the AST program");
        return NULL;
    }
    int64_t size = prog_size(prog, next, 0);
    if (size > max_nfa) return Py_BuildValue("(iL)", E_SIZE, (long long)size);
    Dense d;
    memset(&d, 0, sizeof(d));
    int rc;
    char *arena = malloc(ARENA_BYTES); /* NULL: every block from malloc */
    c->ar = arena;
    c->ar_off = 0;
    c->ar_cap = arena ? ARENA_BYTES : 0;
    Py_BEGIN_ALLOW_THREADS
    rc = build_ast(c, prog, next, fr, max_nfa, max_states, &d);
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

/* ---- regex fast path: pattern -> flattened AST in C ------------------------------------------- */
/* compile_regex(pattern, max_repeat, max_nfa, max_states, budget_s, max_bytes, fragment_fn) parses
 * the common subset of tokenrails/guided/fsm/regex_parser.py's syntax (literals, escaped
 * metacharacters, \d \w \s \D \W \S, \a \f \n \r \t \v \xHH \uXXXX \UXXXXXXXX, classes with ranges
 * and negation, '.', ( ) and (?: ) groups, alternation, * + ? {m} {m,} {,n} {m,n} and their lazy
 * forms) into exactly the AST that parser builds -- node for node, so the program is flatten_ast's
 * -- then builds as compile_ast. Anchors (^ $ \A \Z) are parsed as regex_parser does and removed by
 * rx_strip (_strip_anchors) where full-match semantics make them empty; '{' not starting a valid
 * quantifier is a literal (sre's rule, as _brace). Everything else (anchors _strip_anchors refuses,
 * flags, named groups, comments, octal/backreference/\N escapes, possessive quantifiers, repeat
 * counts above max_repeat, group nesting beyond 200, any syntax error) returns None without
 * raising, and the caller runs the Python parser, which gives every error its type, message and
 * position.
 * Character sets all of whose code points are ASCII get their fragment here (one byte per
 * character, as _charset_fragment builds it); the others from fragment_fn(ranges) (the cached
 * _charset_fragment). \d \w \s use the Unicode tables installed once by set_class_ranges(index,
 * ranges); a pattern needing a missing one returns the int bitmask of the missing ones (1 d, 2 w,
 * 4 s) and is to be retried once they are installed.
 * parse_regex_program(pattern, max_repeat) -> None | int | (program list, [ranges tuple per set]):
 * the parse alone, for tests. */
#define RX_MAX_DEPTH 200         /* regex_parser.MAX_NESTING */
#define RX_MAX_COUNT 100000000LL /* brace counts above this decline (program entries are int32) */
#define RX_MAX_CP 0x10FFFF
#define RX_END ((Py_UCS4)0xFFFFFFFFu) /* rx_peek past the end */

typedef struct {
    int32_t lo, hi;
} CR;

/* \d \w \s (0..2) and their complements (3..5): sorted, disjoint, non-adjacent ranges */
static CR *rx_tab[6];
static int32_t rx_tab_n[6];

/* An anchor (^ \A: a = 0, $ \Z: a = 1) while parsing; rx_strip turns each into K_EMPTY or declines,
 * so programs never contain one. */
#define K_ANCHOR 5

typedef struct {
    int32_t kind;  /* K_* or K_ANCHOR */
    int32_t a, b;  /* SET: set id; REP: min, max (-1: unbounded); ANCHOR: 0 start, 1 end */
    int32_t child; /* CAT/ALT: first kid in kids; REP: the repeated node */
    int32_t nkid;
} RNode;

typedef struct {
    int ukind;
    const void *udata;
    Py_ssize_t n, i;
    int64_t max_repeat;
    int depth, decline, need, anchors; /* anchors: any ^ $ \A \Z seen (rx_strip then runs) */
    RNode *nodes;
    int32_t nn, ncap;
    int32_t *kids, nkids, kcap; /* children of CAT/ALT nodes */
    int32_t *st, nst, stcap;    /* items of the open sequences/alternations (a stack) */
    CR *rng;                    /* ranges of every set: set s at rng[soff[s] .. soff[s + 1]) */
    int32_t nr, rcap;
    int32_t *soff, socap;       /* ns + 1 entries */
    uint32_t *shash;
    int32_t shcap, ns;
    int32_t *htab, hcap;        /* open addressing over set ids (-1: empty) */
    CR *parts;                  /* a class's items before normalization */
    int32_t np, pcap;
} RX;

static int rx_grow(RX *p, void **arr, int32_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = c > ((int64_t)1 << 28) ? NULL : PyMem_Realloc(*arr, (size_t)c * elem);
    if (!q) {
        p->decline = 1;
        return -1;
    }
    *arr = q;
    *cap = (int32_t)c;
    return 0;
}

static void rx_free(RX *p) {
    PyMem_Free(p->nodes);
    PyMem_Free(p->kids);
    PyMem_Free(p->st);
    PyMem_Free(p->rng);
    PyMem_Free(p->soff);
    PyMem_Free(p->shash);
    PyMem_Free(p->htab);
    PyMem_Free(p->parts);
}

#define RX_AT(p, j) PyUnicode_READ((p)->ukind, (p)->udata, (j))

static inline Py_UCS4 rx_peek(const RX *p) { return p->i < p->n ? RX_AT(p, p->i) : RX_END; }

static int32_t rx_node(RX *p, int32_t kind, int32_t a, int32_t b, int32_t child, int32_t nkid) {
    if (rx_grow(p, (void **)&p->nodes, &p->ncap, (int64_t)p->nn + 1, sizeof(RNode))) return -1;
    RNode *x = &p->nodes[p->nn];
    x->kind = kind;
    x->a = a;
    x->b = b;
    x->child = child;
    x->nkid = nkid;
    return p->nn++;
}

static int rx_rehash(RX *p, int32_t cap) {
    int32_t *t = PyMem_Malloc(sizeof(int32_t) * (size_t)cap);
    if (!t) {
        p->decline = 1;
        return -1;
    }
    for (int32_t j = 0; j < cap; j++) t[j] = -1;
    for (int32_t s = 0; s < p->ns; s++) {
        uint32_t j = p->shash[s] & (uint32_t)(cap - 1);
        while (t[j] >= 0) j = (j + 1) & (uint32_t)(cap - 1);
        t[j] = s;
    }
    PyMem_Free(p->htab);
    p->htab = t;
    p->hcap = cap;
    return 0;
}

/* A SET node for these (normalized) ranges; equal sets share an id, ids in order of first
 * appearance (= flatten_ast's pre-order numbering). -1: decline. */
static int32_t rx_set(RX *p, const CR *r, int32_t cnt) {
    if ((p->ns + 1) * 2 > p->hcap) {
        if (rx_rehash(p, p->hcap ? p->hcap * 2 : 64)) return -1;
        if (!p->ns) {
            if (rx_grow(p, (void **)&p->soff, &p->socap, 2, sizeof(int32_t))) return -1;
            p->soff[0] = 0;
        }
    }
    uint32_t h = hash_ints((const int32_t *)r, 2 * (size_t)cnt, 7), mask = (uint32_t)(p->hcap - 1);
    uint32_t j = h & mask;
    int32_t id = -1;
    while (p->htab[j] >= 0) {
        int32_t s = p->htab[j];
        if (p->shash[s] == h && p->soff[s + 1] - p->soff[s] == cnt &&
            (cnt == 0 || !memcmp(p->rng + p->soff[s], r, sizeof(CR) * (size_t)cnt))) {
            id = s;
            break;
        }
        j = (j + 1) & mask;
    }
    if (id < 0) {
        if (rx_grow(p, (void **)&p->rng, &p->rcap, (int64_t)p->nr + cnt + 1, sizeof(CR)) ||
            rx_grow(p, (void **)&p->soff, &p->socap, (int64_t)p->ns + 2, sizeof(int32_t)) ||
            rx_grow(p, (void **)&p->shash, &p->shcap, (int64_t)p->ns + 1, sizeof(uint32_t)))
            return -1;
        if (cnt) memcpy(p->rng + p->nr, r, sizeof(CR) * (size_t)cnt);
        p->nr += cnt;
        id = p->ns++;
        p->soff[p->ns] = p->nr;
        p->shash[id] = h;
        p->htab[j] = id;
    }
    return rx_node(p, K_SET, id, 0, -1, 0);
}

static int32_t rx_lit(RX *p, Py_UCS4 c) {
    CR r = {(int32_t)c, (int32_t)c};
    return rx_set(p, &r, 1);
}

static inline int rx_push(RX *p, int32_t node) {
    if (rx_grow(p, (void **)&p->st, &p->stcap, (int64_t)p->nst + 1, sizeof(int32_t))) return -1;
    p->st[p->nst++] = node;
    return 0;
}

/* The items st[base..] as one node of ``kind`` (one item: itself; none: Empty); pops them. */
static int32_t rx_close(RX *p, int32_t base, int32_t kind) {
    int32_t cnt = p->nst - base, node;
    if (cnt == 0)
        node = rx_node(p, K_EMPTY, 0, 0, -1, 0);
    else if (cnt == 1)
        node = p->st[base];
    else {
        if (rx_grow(p, (void **)&p->kids, &p->kcap, (int64_t)p->nkids + cnt, sizeof(int32_t))) return -1;
        memcpy(p->kids + p->nkids, p->st + base, sizeof(int32_t) * (size_t)cnt);
        node = rx_node(p, kind, 0, 0, p->nkids, cnt);
        p->nkids += cnt;
    }
    p->nst = base;
    return node;
}

static inline int rx_is_meta(Py_UCS4 c) {
    switch (c) {
    case '\\': case '(': case ')': case '[': case ']': case '{': case '}':
    case '|': case '.': case '*': case '+': case '?': case '^': case '$':
        return 1;
    default:
        return 0;
    }
}

static inline int rx_digit(Py_UCS4 c) { return c >= '0' && c <= '9'; }
static inline int rx_alpha(Py_UCS4 c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

static int rx_hexval(Py_UCS4 c) {
    if (c >= '0' && c <= '9') return (int)(c - '0');
    if (c >= 'a' && c <= 'f') return (int)(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return (int)(c - 'A' + 10);
    return -1;
}

/* Digits at j (saturating at RX_MAX_COUNT + 1); *end: the index after them. -1: none. */
static int64_t rx_number(const RX *p, Py_ssize_t j, Py_ssize_t *end) {
    int64_t v = -1;
    while (j < p->n && rx_digit(RX_AT(p, j))) {
        v = (v < 0 ? 0 : v) * 10 + (int64_t)(RX_AT(p, j) - '0');
        if (v > RX_MAX_COUNT) v = RX_MAX_COUNT + 1;
        j++;
    }
    *end = j;
    return v;
}

/* _brace(): 1 with the bounds (hi -1: unbounded) and the cursor past it; 0 when '{' is a literal. */
static int rx_brace(RX *p, int64_t *lo, int64_t *hi) {
    Py_ssize_t j = p->i + 1, k, m;
    if (j < p->n && RX_AT(p, j) == '}') return 0;
    int64_t a = rx_number(p, j, &k), b;
    if (k < p->n && RX_AT(p, k) == ',') {
        b = rx_number(p, k + 1, &m);
        k = m;
    } else {
        b = a;
    }
    if (k >= p->n || RX_AT(p, k) != '}') return 0;
    p->i = k + 1;
    *lo = a < 0 ? 0 : a;
    *hi = b;
    return 1;
}

/* A class-escape table (index 0..5) as ranges; NULL (need recorded) when not installed. */
static const CR *rx_table(RX *p, int idx, int32_t *cnt) {
    if (!rx_tab[idx]) {
        p->need |= 1 << (idx % 3);
        p->decline = 1;
        return NULL;
    }
    *cnt = rx_tab_n[idx];
    return rx_tab[idx];
}

/* _common_escape() at the cursor (the letter after the backslash): 1 = code point in *cp, 2 = the
 * ranges in *r / *cnt, 0 = not a common escape (cursor kept), -1 = decline. */
static int rx_common(RX *p, Py_UCS4 c, Py_UCS4 *cp, const CR **r, int32_t *cnt) {
    int digits = 0;
    switch (c) {
    case 'a': *cp = 7; break;
    case 'f': *cp = 12; break;
    case 'n': *cp = 10; break;
    case 'r': *cp = 13; break;
    case 't': *cp = 9; break;
    case 'v': *cp = 11; break;
    case 'd': case 'w': case 's': case 'D': case 'W': case 'S': {
        int idx = (c == 'd' || c == 'D') ? 0 : (c == 'w' || c == 'W') ? 1 : 2;
        if (c < 'a') idx += 3;
        p->i++;
        *r = rx_table(p, idx, cnt);
        return *r ? 2 : -1;
    }
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    case 'N': p->decline = 1; return -1;
    default: return 0;
    }
    p->i++;
    if (!digits) return 1;
    if (p->i + digits > p->n) {
        p->decline = 1;
        return -1;
    }
    uint32_t v = 0;
    for (int k = 0; k < digits; k++) {
        int h = rx_hexval(RX_AT(p, p->i + k));
        if (h < 0) {
            p->decline = 1;
            return -1;
        }
        v = v * 16 + (uint32_t)h;
    }
    if (v > RX_MAX_CP) {
        p->decline = 1;
        return -1;
    }
    p->i += digits;
    *cp = v;
    return 1;
}

/* escape() outside a class: a node, or -1. */
static int32_t rx_escape(RX *p) {
    p->i++;
    Py_UCS4 c = rx_peek(p), cp = 0;
    if (c == RX_END) return p->decline = 1, -1;
    const CR *r = NULL;
    int32_t cnt = 0;
    int k = rx_common(p, c, &cp, &r, &cnt);
    if (k == 1) return rx_lit(p, cp);
    if (k == 2) return rx_set(p, r, cnt);
    if (k < 0) return -1;
    if (c == 'A' || c == 'Z') {
        p->i++;
        p->anchors = 1;
        return rx_node(p, K_ANCHOR, c == 'Z', 0, -1, 0);
    }
    if (rx_digit(c) || rx_alpha(c)) return p->decline = 1, -1; /* \b, octal, refs, bad escapes */
    p->i++;
    return rx_lit(p, c);
}

/* _class_item(): 1 = code point, 2 = ranges, -1 = decline. */
static int rx_class_item(RX *p, Py_UCS4 *cp, const CR **r, int32_t *cnt) {
    Py_UCS4 c = RX_AT(p, p->i);
    if (c != '\\') {
        p->i++;
        *cp = c;
        return 1;
    }
    p->i++;
    c = rx_peek(p);
    if (c == RX_END) return p->decline = 1, -1;
    int k = rx_common(p, c, cp, r, cnt);
    if (k) return k;
    if (c == 'b') {
        p->i++;
        *cp = 8;
        return 1;
    }
    if (rx_digit(c) || rx_alpha(c)) return p->decline = 1, -1; /* octal or bad escapes */
    p->i++;
    *cp = c;
    return 1;
}

static int rx_add_part(RX *p, int32_t lo, int32_t hi) {
    if (rx_grow(p, (void **)&p->parts, &p->pcap, (int64_t)p->np + 1, sizeof(CR))) return -1;
    p->parts[p->np].lo = lo;
    p->parts[p->np].hi = hi;
    p->np++;
    return 0;
}

static int cmp_cr(const void *a, const void *b) {
    const CR *x = a, *y = b;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    return (x->hi > y->hi) - (x->hi < y->hi);
}

/* charset.normalize of parts[0..np) in place; returns the new count. */
static int32_t rx_normalize(CR *a, int32_t n) {
    if (n > 1) {
        if (n <= 16) {
            for (int32_t i = 1; i < n; i++) {
                CR x = a[i];
                int32_t j = i;
                while (j && cmp_cr(&a[j - 1], &x) > 0) {
                    a[j] = a[j - 1];
                    j--;
                }
                a[j] = x;
            }
        } else {
            qsort(a, (size_t)n, sizeof(CR), cmp_cr);
        }
    }
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (m && (int64_t)a[i].lo <= (int64_t)a[m - 1].hi + 1) {
            if (a[i].hi > a[m - 1].hi) a[m - 1].hi = a[i].hi;
        } else {
            a[m++] = a[i];
        }
    }
    return m;
}

/* charset.negate of a normalized a[0..n) into out (room for n + 1); returns the count. */
static int32_t rx_negate(const CR *a, int32_t n, CR *out) {
    int32_t m = 0, nxt = 0;
    for (int32_t i = 0; i < n; i++) {
        if (a[i].lo > nxt) {
            out[m].lo = nxt;
            out[m].hi = a[i].lo - 1;
            m++;
        }
        nxt = a[i].hi + 1;
    }
    if (nxt <= RX_MAX_CP) {
        out[m].lo = nxt;
        out[m].hi = RX_MAX_CP;
        m++;
    }
    return m;
}

/* _parse_class(): a SET node, or -1. */
static int32_t rx_class(RX *p) {
    p->i++;
    int negated = 0;
    if (rx_peek(p) == '^') {
        negated = 1;
        p->i++;
    }
    Py_ssize_t first = p->i;
    p->np = 0;
    for (;;) {
        if (p->i >= p->n) return p->decline = 1, -1;
        if (RX_AT(p, p->i) == ']' && p->i != first) {
            p->i++;
            break;
        }
        Py_UCS4 cp1 = 0, cp2 = 0;
        const CR *r = NULL;
        int32_t cnt = 0;
        int k1 = rx_class_item(p, &cp1, &r, &cnt);
        if (k1 < 0) return -1;
        if (rx_peek(p) == '-' && p->i + 1 < p->n && RX_AT(p, p->i + 1) != ']') {
            p->i++;
            const CR *r2 = NULL;
            int32_t cnt2 = 0;
            int k2 = rx_class_item(p, &cp2, &r2, &cnt2);
            if (k2 < 0) return -1;
            if (k1 != 1 || k2 != 1 || cp2 < cp1) return p->decline = 1, -1; /* bad character range */
            if (rx_add_part(p, (int32_t)cp1, (int32_t)cp2)) return -1;
        } else {
            if (rx_peek(p) == '-' && p->i + 1 >= p->n) return p->decline = 1, -1; /* unterminated */
            if (k1 == 1) {
                if (rx_add_part(p, (int32_t)cp1, (int32_t)cp1)) return -1;
            } else {
                if (rx_grow(p, (void **)&p->parts, &p->pcap, (int64_t)p->np + cnt, sizeof(CR))) return -1;
                memcpy(p->parts + p->np, r, sizeof(CR) * (size_t)cnt);
                p->np += cnt;
            }
        }
    }
    int32_t m = rx_normalize(p->parts, p->np);
    if (!negated) return rx_set(p, p->parts, m);
    /* the complement goes after the class's own ranges in the same scratch buffer */
    if (rx_grow(p, (void **)&p->parts, &p->pcap, (int64_t)2 * m + 1, sizeof(CR))) return -1;
    int32_t k = rx_negate(p->parts, m, p->parts + m);
    return rx_set(p, p->parts + m, k);
}

static int32_t rx_alternation(RX *p);

/* group(): only ( ) and (?: ); its body's node, or -1. */
static int32_t rx_group(RX *p) {
    p->i++;
    if (rx_peek(p) == '?') {
        if (p->i + 1 < p->n && RX_AT(p, p->i + 1) == ':')
            p->i += 2;
        else
            return p->decline = 1, -1;
    }
    if (++p->depth > RX_MAX_DEPTH) return p->decline = 1, -1;
    int32_t body = rx_alternation(p);
    p->depth--;
    if (body < 0) return -1;
    if (rx_peek(p) != ')') return p->decline = 1, -1;
    p->i++;
    return body;
}

static int32_t rx_sequence(RX *p) {
    int32_t base = p->nst;
    int last_repeat = 0;
    while (p->i < p->n) {
        Py_UCS4 c = RX_AT(p, p->i);
        if (c == '|' || c == ')') break;
        int32_t node;
        if (!rx_is_meta(c)) {
            p->i++;
            if ((node = rx_lit(p, c)) < 0 || rx_push(p, node)) return -1;
            last_repeat = 0;
            continue;
        }
        int64_t lo = -2, hi = -1;
        if (c == '*') {
            lo = 0;
            p->i++;
        } else if (c == '+') {
            lo = 1;
            p->i++;
        } else if (c == '?') {
            lo = 0;
            hi = 1;
            p->i++;
        } else if (c == '{' && rx_brace(p, &lo, &hi)) { /* else '{' is a literal (lo stays -2) */
            if ((hi >= 0 && hi < lo) || lo > p->max_repeat || hi > p->max_repeat) return p->decline = 1, -1;
        }
        if (lo != -2) { /* a quantifier */
            Py_UCS4 d = rx_peek(p);
            if (d == '?')
                p->i++;
            else if (d == '+')
                return p->decline = 1, -1; /* possessive */
            if (p->nst == base || last_repeat || p->nodes[p->st[p->nst - 1]].kind == K_ANCHOR)
                return p->decline = 1, -1; /* nothing to repeat (an anchor counts as nothing) / multiple repeat */
            node = rx_node(p, K_REP, (int32_t)lo, (int32_t)hi, p->st[p->nst - 1], 0);
            if (node < 0) return -1;
            p->st[p->nst - 1] = node;
            last_repeat = 1;
            continue;
        }
        switch (c) {
        case '(':
            node = rx_group(p);
            break;
        case '[':
            node = rx_class(p);
            break;
        case '.': {
            static const CR dot[2] = {{0, 9}, {11, RX_MAX_CP}};
            p->i++;
            node = rx_set(p, dot, 2);
            break;
        }
        case '\\':
            node = rx_escape(p);
            break;
        case ']':
        case '{': /* not a quantifier (rx_brace said so): atom() reads it as a literal */
        case '}':
            p->i++;
            node = rx_lit(p, c);
            break;
        default: /* ^ $ */
            p->i++;
            p->anchors = 1;
            node = rx_node(p, K_ANCHOR, c == '$', 0, -1, 0);
        }
        if (node < 0 || rx_push(p, node)) return -1;
        last_repeat = 0;
    }
    return rx_close(p, base, K_CAT);
}

static int32_t rx_alternation(RX *p) {
    int32_t base = p->nst, node = rx_sequence(p);
    if (node < 0 || rx_push(p, node)) return -1;
    while (rx_peek(p) == '|') {
        p->i++;
        if ((node = rx_sequence(p)) < 0 || rx_push(p, node)) return -1;
    }
    return rx_close(p, base, K_ALT);
}

static inline int rx_empty_like(const RX *p, int32_t x) {
    int32_t k = p->nodes[x].kind;
    return k == K_ANCHOR || k == K_EMPTY;
}

/* regex_parser._strip_anchors in place: an anchor where full-match semantics make it empty (a start
 * anchor with nothing but anchors/empties before it up to the pattern's start, through
 * alternatives and repeats of at most one; an end anchor likewise) becomes K_EMPTY, as Python's
 * becomes EMPTY; any other anchor declines (Python raises UnsupportedGuideError). Rewriting in
 * place keeps every node empty-like or not, so later siblings see what Python sees. 0 or -1. */
static int rx_strip(RX *p, int32_t x, int at_start, int at_end) {
    RNode *r = &p->nodes[x];
    switch (r->kind) {
    case K_ANCHOR:
        if (r->a ? !at_end : !at_start) return p->decline = 1, -1;
        r->kind = K_EMPTY;
        return 0;
    case K_ALT:
        for (int32_t k = 0; k < r->nkid; k++)
            if (rx_strip(p, p->kids[r->child + k], at_start, at_end)) return -1;
        return 0;
    case K_CAT: {
        const int32_t *kid = p->kids + r->child;
        int32_t n = r->nkid, last = -1; /* the last item that is not empty-like */
        for (int32_t k = 0; k < n; k++)
            if (!rx_empty_like(p, kid[k])) last = k;
        int s = at_start;
        for (int32_t k = 0; k < n; k++) {
            int empty = rx_empty_like(p, kid[k]);
            if (rx_strip(p, kid[k], s, at_end && k >= last)) return -1;
            s = s && empty;
        }
        return 0;
    }
    case K_REP: {
        int inherit = r->b >= 0 && r->b <= 1;
        return rx_strip(p, r->child, at_start && inherit, at_end && inherit);
    }
    default:
        return 0;
    }
}

/* Pre-order program of node x appended to prog. */
static int rx_emit(RX *p, Vec *prog, Ctx *c, int32_t x) {
    const RNode *r = &p->nodes[x];
    switch (r->kind) {
    case K_SET:
        return vpush(c, prog, K_SET) || vpush(c, prog, r->a);
    case K_CAT:
    case K_ALT:
        if (vpush(c, prog, r->kind) || vpush(c, prog, r->nkid)) return -1;
        for (int32_t k = 0; k < r->nkid; k++)
            if (rx_emit(p, prog, c, p->kids[r->child + k])) return -1;
        return 0;
    case K_REP:
        return vpush(c, prog, K_REP) || vpush(c, prog, r->a) || vpush(c, prog, r->b) || rx_emit(p, prog, c, r->child);
    default:
        return vpush(c, prog, K_EMPTY);
    }
}

/* Parse; 0 with p's tree (root in *root), 1 declined (p->need may be set), -1 Python error. */
static int rx_parse(RX *p, PyObject *pattern, PyObject *max_repeat, int32_t *root) {
    memset(p, 0, sizeof(*p));
    if (!PyUnicode_Check(pattern)) return 1;
    long long mr = PyLong_AsLongLong(max_repeat);
    if (mr == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 1;
    }
    p->max_repeat = mr < 0 ? -1 : (mr > RX_MAX_COUNT ? RX_MAX_COUNT : mr);
    p->ukind = PyUnicode_KIND(pattern);
    p->udata = PyUnicode_DATA(pattern);
    p->n = PyUnicode_GET_LENGTH(pattern);
    if (p->n > (1 << 24)) return 1;
    int32_t r = rx_alternation(p);
    if (r < 0 || p->decline || p->i < p->n) return 1; /* p->i < n: a stray ')' */
    if (p->anchors && rx_strip(p, r, 1, 1)) return 1;
    *root = r;
    return 0;
}

/* Set s's ranges as a tuple of (lo, hi) tuples (what _charset_fragment takes). */
static PyObject *rx_ranges_tuple(const RX *p, int32_t s) {
    int32_t a = p->soff[s], b = p->soff[s + 1];
    PyObject *t = PyTuple_New(b - a);
    if (!t) return NULL;
    for (int32_t k = a; k < b; k++) {
        PyObject *pair = Py_BuildValue("(ii)", (int)p->rng[k].lo, (int)p->rng[k].hi);
        if (!pair) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, k - a, pair);
    }
    return t;
}

/* ---- fragment cache: (fragment_fn, non-ASCII ranges) -> the fragment fragment_fn returned -----
 * fragment_fn (_charset_fragment) is a pure function of the ranges, and calling it costs a tuple of
 * (lo, hi) tuples plus the lru_cache hash over them (~2.5 us for \d, ~25 us for Unicode \w): the
 * validated result is kept here, keyed by the function (a strong reference: its address cannot be
 * reused) and the ranges. Bounded (FC_MAX entries, FC_MAX_BYTES of ranges + edges): beyond that
 * fragments are simply not cached. Entries are never changed or freed, so a pointer to one stays
 * valid across the Python calls (which may switch threads) of the same rx_frags; the table is only
 * touched with the GIL held. Not freed at interpreter exit. */
typedef struct {
    PyObject *fn;
    uint32_t hash;
    int32_t nr, size, final, nedge;
    CR *ranges;
    FEdge *edges;
} FragEntry;

#define FC_SLOTS 512 /* power of two, at least 2 * FC_MAX */
#define FC_MAX 256
#define FC_MAX_BYTES ((size_t)8 << 20)
static FragEntry *fc_tab[FC_SLOTS];
static int32_t fc_count;
static size_t fc_bytes;

static inline uint32_t fc_hash(PyObject *fn, uint32_t ranges_hash) {
    uint64_t h = ((uint64_t)(uintptr_t)fn ^ ((uint64_t)ranges_hash << 17)) * 0x9E3779B97F4A7C15ULL;
    return (uint32_t)(h >> 32);
}

/* The cached fragment of set s under fn, or NULL. */
static const FragEntry *fc_find(const RX *p, int32_t s, PyObject *fn, uint32_t h) {
    const CR *r = p->rng + p->soff[s];
    int32_t nr = p->soff[s + 1] - p->soff[s];
    for (uint32_t j = h & (FC_SLOTS - 1);; j = (j + 1) & (FC_SLOTS - 1)) {
        const FragEntry *e = fc_tab[j];
        if (!e) return NULL;
        if (e->hash == h && e->fn == fn && e->nr == nr && !memcmp(e->ranges, r, sizeof(CR) * (size_t)nr)) return e;
    }
}

/* Remember fragment s of f (just validated) under (fn, set s's ranges), if within the bounds. */
static void fc_add(const RX *p, int32_t s, PyObject *fn, uint32_t h, const Frags *f) {
    int32_t nr = p->soff[s + 1] - p->soff[s], nedge = f->off[s + 1] - f->off[s];
    size_t bytes = sizeof(FragEntry) + sizeof(CR) * (size_t)nr + sizeof(FEdge) * (size_t)nedge;
    if (fc_count >= FC_MAX || fc_bytes + bytes > FC_MAX_BYTES || fc_find(p, s, fn, h)) return;
    FragEntry *e = PyMem_Malloc(sizeof(FragEntry));
    CR *r = PyMem_Malloc(sizeof(CR) * ((size_t)nr + 1));
    FEdge *x = PyMem_Malloc(sizeof(FEdge) * ((size_t)nedge + 1));
    if (!e || !r || !x) { /* not cached; no error */
        PyMem_Free(e);
        PyMem_Free(r);
        PyMem_Free(x);
        return;
    }
    memcpy(r, p->rng + p->soff[s], sizeof(CR) * (size_t)nr);
    memcpy(x, f->edges + f->off[s], sizeof(FEdge) * (size_t)nedge);
    Py_INCREF(fn);
    *e = (FragEntry){fn, h, nr, f->size[s], f->final[s], nedge, r, x};
    uint32_t j = h & (FC_SLOTS - 1);
    while (fc_tab[j]) j = (j + 1) & (FC_SLOTS - 1);
    fc_tab[j] = e;
    fc_count++;
    fc_bytes += bytes;
}

/* Fragments of every set: ASCII-only sets built here (2 states, one edge per range, final 1, as
 * _charset_fragment does), the others from the fragment cache or fragment_fn (then cached).
 * f->off[s + 1] is set as each fragment is written, so fc_add can read fragment s's edges.
 * 0 or -1 (Python error). */
static int rx_frags(const RX *p, PyObject *fn, Frags *f) {
    int32_t n = p->ns;
    PyObject **got = PyMem_Calloc((size_t)n + 1, sizeof(PyObject *));
    const FragEntry **hit = PyMem_Calloc((size_t)n + 1, sizeof(FragEntry *));
    f->nfrag = n;
    f->size = PyMem_Malloc(sizeof(int32_t) * ((size_t)n + 1));
    f->final = PyMem_Malloc(sizeof(int32_t) * ((size_t)n + 1));
    f->off = PyMem_Malloc(sizeof(int32_t) * ((size_t)n + 1));
    int rc = -1;
    if (!got || !hit || !f->size || !f->final || !f->off) {
        PyErr_NoMemory();
        goto done;
    }
    size_t total = 0;
    for (int32_t s = 0; s < n; s++) {
        int32_t a = p->soff[s], b = p->soff[s + 1];
        if (a == b || p->rng[b - 1].hi <= 0x7F) {
            total += (size_t)(b - a);
            continue;
        }
        if ((hit[s] = fc_find(p, s, fn, fc_hash(fn, p->shash[s])))) {
            total += (size_t)hit[s]->nedge;
            continue;
        }
        PyObject *ranges = rx_ranges_tuple(p, s);
        if (!ranges) goto done;
        got[s] = PyObject_CallOneArg(fn, ranges);
        Py_DECREF(ranges);
        if (!got[s]) goto done;
        if (!PyTuple_Check(got[s]) || PyTuple_GET_SIZE(got[s]) != 3 || !PyTuple_Check(PyTuple_GET_ITEM(got[s], 1))) {
            PyErr_SetString(PyExc_TypeError, "a fragment must be (size, edges tuple, final)");
            goto done;
        }
        total += (size_t)PyTuple_GET_SIZE(PyTuple_GET_ITEM(got[s], 1));
    }
    if (total >= INT32_MAX / 4) {
        PyErr_SetString(PyExc_ValueError, "too many fragment edges");
        goto done;
    }
    f->edges = PyMem_Malloc(sizeof(FEdge) * (total + 1));
    if (!f->edges) {
        PyErr_NoMemory();
        goto done;
    }
    size_t w = 0;
    for (int32_t s = 0; s < n; s++) {
        if (got[s]) {
            if (frag_fill(f, s, got[s], &w)) goto done;
            f->off[s + 1] = (int32_t)w;
            fc_add(p, s, fn, fc_hash(fn, p->shash[s]), f);
            continue;
        }
        f->off[s] = (int32_t)w;
        if (hit[s]) {
            f->size[s] = hit[s]->size;
            f->final[s] = hit[s]->final;
            memcpy(f->edges + w, hit[s]->edges, sizeof(FEdge) * (size_t)hit[s]->nedge);
            w += (size_t)hit[s]->nedge;
            continue;
        }
        f->size[s] = 2;
        f->final[s] = 1;
        for (int32_t k = p->soff[s]; k < p->soff[s + 1]; k++) {
            FEdge x = {0, p->rng[k].lo, p->rng[k].hi, 1};
            f->edges[w++] = x;
        }
    }
    f->off[n] = (int32_t)w;
    rc = 0;
done:
    if (got)
        for (int32_t s = 0; s < n; s++) Py_XDECREF(got[s]);
    PyMem_Free(got);
    PyMem_Free(hit);
    return rc;
}

PyDoc_STRVAR(fragment_cache_info_doc,
             "fragment_cache_info() -> (entries, bytes): the C fragment cache's size (tests, benchmarks)");

static PyObject *py_fragment_cache_info(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue("(in)", (int)fc_count, (Py_ssize_t)fc_bytes);
}

/* The program of a parsed tree as a fresh int32 array (PyMem), its length in *len. */
static int32_t *rx_program(RX *p, int32_t root, Py_ssize_t *len) {
    Ctx c;
    memset(&c, 0, sizeof(c));
    c.limit = (size_t)1 << 40;
    Vec prog = {0};
    if (rx_emit(p, &prog, &c, root)) {
        vfree(&c, &prog);
        PyErr_NoMemory();
        return NULL;
    }
    int32_t *out = PyMem_Malloc(sizeof(int32_t) * (prog.n + 1));
    if (!out) {
        vfree(&c, &prog);
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(out, prog.a, sizeof(int32_t) * prog.n);
    *len = (Py_ssize_t)prog.n;
    vfree(&c, &prog);
    return out;
}

static PyObject *rx_declined(const RX *p) {
    if (p->need) return PyLong_FromLong(p->need);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(compile_regex_doc,
             "compile_regex(pattern, max_repeat, max_nfa, max_states, budget_s, max_bytes, fragment_fn)\n"
             "-> None (not handled: use the Python parser) | int (bitmask of class tables to install)\n"
             "   | (trans, classmap, accepting, num_states, num_classes) | (error code, value)");

static PyObject *py_compile_regex(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (check_nargs(nargs, 7, "compile_regex")) return NULL;
    int32_t max_nfa, max_states;
    Ctx c;
    if (parse_build_limits(args + 2, &max_nfa, &max_states, &c)) return NULL;
    if (!PyCallable_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "fragment_fn must be callable");
        return NULL;
    }
    RX p;
    int32_t root = -1;
    int rc = rx_parse(&p, args[0], args[1], &root);
    PyObject *res = NULL;
    int32_t *prog = NULL, *next = NULL;
    Frags fr;
    memset(&fr, 0, sizeof(fr));
    if (rc) {
        res = rc > 0 ? rx_declined(&p) : NULL;
        goto done;
    }
    Py_ssize_t len = 0;
    if (!(prog = rx_program(&p, root, &len))) goto done;
    if (!(next = PyMem_Malloc(sizeof(int32_t) * ((size_t)len + 1)))) {
        PyErr_NoMemory();
        goto done;
    }
    if (rx_frags(&p, args[6], &fr)) goto done;
    res = run_prog(&c, prog, next, len, &fr, max_nfa, max_states);
done:
    rx_free(&p);
    PyMem_Free(prog);
    PyMem_Free(next);
    frags_free(&fr);
    return res;
}

PyDoc_STRVAR(parse_regex_program_doc,
             "parse_regex_program(pattern, max_repeat) -> None | int (missing class tables)\n"
             "   | (program, [ranges tuple of each set])  -- the fast-path parse alone (tests)");

static PyObject *py_parse_regex_program(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (check_nargs(nargs, 2, "parse_regex_program")) return NULL;
    RX p;
    int32_t root = -1;
    int rc = rx_parse(&p, args[0], args[1], &root);
    PyObject *res = NULL, *plist = NULL, *sets = NULL;
    int32_t *prog = NULL;
    if (rc) {
        res = rc > 0 ? rx_declined(&p) : NULL;
        goto done;
    }
    Py_ssize_t len = 0;
    if (!(prog = rx_program(&p, root, &len))) goto done;
    if (!(plist = PyList_New(len)) || !(sets = PyList_New(p.ns))) goto done;
    for (Py_ssize_t k = 0; k < len; k++) {
        PyObject *v = PyLong_FromLong(prog[k]);
        if (!v) goto done;
        PyList_SET_ITEM(plist, k, v);
    }
    for (int32_t s = 0; s < p.ns; s++) {
        PyObject *t = rx_ranges_tuple(&p, s);
        if (!t) goto done;
        PyList_SET_ITEM(sets, s, t);
    }
    res = PyTuple_Pack(2, plist, sets);
done:
    Py_XDECREF(plist);
    Py_XDECREF(sets);
    rx_free(&p);
    PyMem_Free(prog);
    return res;
}

PyDoc_STRVAR(set_class_ranges_doc,
             "set_class_ranges(index, ranges) -- install the \\d (0), \\w (1) or \\s (2) table: normalized\n"
             "(lo, hi) code-point ranges (the complement is derived here)");

static PyObject *py_set_class_ranges(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (check_nargs(nargs, 2, "set_class_ranges")) return NULL;
    int32_t idx = as_i32(args[0], 0, 2, "class index");
    if (idx == INT32_MIN) return NULL;
    PyObject *seq = PySequence_Fast(args[1], "ranges must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    CR *a = NULL, *neg = NULL;
    if (n > RX_MAX_CP) {
        PyErr_SetString(PyExc_ValueError, "too many ranges");
        goto fail;
    }
    a = PyMem_Malloc(sizeof(CR) * ((size_t)n + 1));
    neg = PyMem_Malloc(sizeof(CR) * ((size_t)n + 2));
    if (!a || !neg) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *pr = PySequence_Fast_GET_ITEM(seq, k);
        if (!PyTuple_Check(pr) || PyTuple_GET_SIZE(pr) != 2) {
            PyErr_SetString(PyExc_TypeError, "a range must be a (lo, hi) tuple");
            goto fail;
        }
        /* normalized: sorted, disjoint and not adjacent to the previous range */
        int32_t lo = as_i32(PyTuple_GET_ITEM(pr, 0), k ? a[k - 1].hi + 2 : 0, RX_MAX_CP, "range start");
        if (lo == INT32_MIN) goto fail;
        int32_t hi = as_i32(PyTuple_GET_ITEM(pr, 1), lo, RX_MAX_CP, "range end");
        if (hi == INT32_MIN) goto fail;
        a[k].lo = lo;
        a[k].hi = hi;
    }
    Py_DECREF(seq);
    int32_t m = rx_negate(a, (int32_t)n, neg);
    PyMem_Free(rx_tab[idx]);
    PyMem_Free(rx_tab[idx + 3]);
    rx_tab[idx] = a;
    rx_tab_n[idx] = (int32_t)n;
    rx_tab[idx + 3] = neg;
    rx_tab_n[idx + 3] = m;
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    PyMem_Free(a);
    PyMem_Free(neg);
    return NULL;
}

static PyMethodDef methods[] = {
    {"determinize", (PyCFunction)(void (*)(void))py_determinize, METH_FASTCALL, determinize_doc},
    {"compile_ast", (PyCFunction)(void (*)(void))py_compile_ast, METH_FASTCALL, compile_ast_doc},
    {"from_strings", (PyCFunction)(void (*)(void))py_from_strings, METH_FASTCALL, from_strings_doc},
    {"compile_regex", (PyCFunction)(void (*)(void))py_compile_regex, METH_FASTCALL, compile_regex_doc},
    {"parse_regex_program", (PyCFunction)(void (*)(void))py_parse_regex_program, METH_FASTCALL,
     parse_regex_program_doc},
    {"set_class_ranges", (PyCFunction)(void (*)(void))py_set_class_ranges, METH_FASTCALL, set_class_ranges_doc},
    {"fragment_cache_info", py_fragment_cache_info, METH_NOARGS, fragment_cache_info_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_dfa_native", "Regex/string-set automaton construction (see csrc/dfa_native.c).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__dfa_native(void) { return PyModule_Create(&module); }
