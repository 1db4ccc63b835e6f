/* Stage: prune dead ends, minimize (Hopcroft, whole blocks as splitters), number canonically. */
#include "dfa_native.h"

/* ---- prune + minimize + canonical renumbering ---------------------------------------------- */
/* The subset DFA comes as sparse rows: runs (lo, hi, dst) of consecutive classes with the same
 * non-dead target, sorted by class. Wide edges ([^"\\] spans most classes of a JSON regex) stay
 * one run, so pruning and minimization cost per run, not per class. */

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
int dn_finish(Ctx *c, const Runs *r, const uint8_t *acc, int32_t S, int32_t k, Dense *out) {
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
