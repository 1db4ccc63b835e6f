/* Stage: epsilon elimination, byte classes from cut points, subset construction over classes. */
#include "dfa_native.h"

/* ---- input NFA (validated copy) -------------------------------------------------------- */


static int cmp_edge(const void *a, const void *b) {
    const Edge *x = a, *y = b;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    if (x->hi != y->hi) return x->hi < y->hi ? -1 : 1;
    return (x->dst > y->dst) - (x->dst < y->dst);
}

/* Append the subset ``members[0..L)`` (hash ``h``) as a new DFA state; its id, or -1 with c->err set. */
static int32_t new_subset(Ctx *c, Vec *soff, Vec *slen, Vec *shash, Vec *pool, const int32_t *members, int32_t L,
                          uint32_t h, int32_t max_states) {
    int32_t id = (int32_t)soff->n;
    if ((int64_t)soff->n + 1 > (int64_t)max_states) {
        c->err = E_LIMIT;
        c->err_value = (long long)soff->n + 1;
        return -1;
    }
    if (pool->n + (size_t)L >= (size_t)INT32_MAX) {
        c->err = E_MEMORY;
        c->err_value = -1;
        return -1;
    }
    if (vreserve(c, pool, pool->n + (size_t)L)) return -1;
    if (vpush(c, soff, (int32_t)pool->n) || vpush(c, slen, L) || vpush(c, shash, (int32_t)h)) return -1;
    memcpy(pool->a + pool->n, members, sizeof(int32_t) * (size_t)L);
    pool->n += (size_t)L;
    return id;
}

/* Epsilon elimination + subset construction + finish. */
int dn_determinize(Ctx *c, const NFA *nfa, int32_t max_states, Dense *out) {
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
                    id = new_subset(c, &soff, &slen, &shash, &pool, &d, 1, 0, max_states);
                    if (id < 0) goto done;
                    single[d] = id;
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
                        id = new_subset(c, &soff, &slen, &shash, &pool, seg, 1, 0, max_states);
                        if (id < 0) goto done;
                        single[seg[0]] = id;
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
                        id = new_subset(c, &soff, &slen, &shash, &pool, seg, L, h, max_states);
                        if (id < 0) goto done;
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
        rc = dn_finish(c, &runs, acc8, S, K, out);
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
