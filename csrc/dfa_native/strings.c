/* Stage: the minimal DFA of a finite set of byte strings (Revuz), for choices. */
#include "dfa_native.h"

/* ---- finite string sets (Revuz) ---------------------------------------------------------- */
int dn_build_strings(Ctx *c, const uint8_t *buf, const Py_ssize_t *soffs, Py_ssize_t count, int64_t max_nodes,
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
