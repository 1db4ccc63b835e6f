/* tokenrails._apply_native -- the CPU token-bitmask apply, in C.
 *
 * One function, apply(), called by tokenrails/kernels/cpu.py with raw data pointers of tensors the
 * Python side has already validated (dtype, shapes, vocab_size, index range). This file re-checks
 * every size and index it relies on, so a bad call raises ValueError -- before any logit is
 * written -- instead of writing out of bounds.
 *
 * Per masked row: all-allowed 512-column blocks are skipped; the other blocks are walked in
 * 64-column units that are filled, blended or given single -inf stores (the strategies and why are
 * described above DEFINE_ROW); then the partial last word, then the columns from vocab_size to the
 * end of the row become -inf. Only the dtype's -inf bit pattern is ever stored, except by the blend,
 * which stores allowed logits' own bits back, so allowed logits stay bit-exact (NaN payloads,
 * -0.0). A repeated row gets each of its masks in turn (stores of -inf accumulate: their AND).
 *
 * No -march flags: the vector code uses 16-byte GCC/Clang vector extensions (SSE2 / NEON width);
 * other compilers, or -DTR_FORCE_SCALAR, get scalar loops of the same algorithm.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "native_common.h"
#include <stdint.h>
#include <string.h>

#if (defined(__GNUC__) || defined(__clang__)) && !defined(TR_FORCE_SCALAR) /* the macro: tests */
#define TR_VECTOR 1
typedef uint32_t v4u32 __attribute__((vector_size(16)));
typedef uint16_t v8u16 __attribute__((vector_size(16)));
#define TR_CTZ64(x) ((int)__builtin_ctzll(x))
#define TR_INLINE static inline __attribute__((always_inline))
#define TR_PREFETCH_W(p) __builtin_prefetch((p), 1)
#else
#define TR_PREFETCH_W(p) ((void)(p))
#define TR_VECTOR 0
#define TR_INLINE static inline
static int TR_CTZ64(uint64_t x) {
    int n = 0;
    while (!(x & 1)) { x >>= 1; n++; }
    return n;
}
#endif

/* GIL is released when a call covers at least this many logit columns (rows x row width): below,
 * the call takes a few microseconds and the release/reacquire would be a large part of it. */
#define RELEASE_GIL_COLUMNS 65536

#if TR_VECTOR
static v4u32 NIBBLE_KEEP[16];  /* nibble -> 4 fp32 lanes of 0 / 0xFFFFFFFF */
static v8u16 BYTE_KEEP[256];   /* byte -> 8 16-bit lanes of 0 / 0xFFFF */
#endif

static void init_tables(void) {
#if TR_VECTOR
    for (int n = 0; n < 16; n++)
        for (int lane = 0; lane < 4; lane++) NIBBLE_KEEP[n][lane] = (n >> lane) & 1 ? 0xFFFFFFFFu : 0u;
    for (int b = 0; b < 256; b++)
        for (int lane = 0; lane < 8; lane++) BYTE_KEEP[b][lane] = (b >> lane) & 1 ? 0xFFFFu : 0u;
#endif
}

/* ---- element-type specific unit operations; n (columns) is 32 or 64 ---- */

TR_INLINE void blend32(uint32_t *x, uint64_t bits, int n, uint32_t ninf) {
#if TR_VECTOR
    const v4u32 nv = {ninf, ninf, ninf, ninf};
    for (int k = 0; k < n; k += 4) {
        v4u32 v;
        memcpy(&v, x + k, sizeof v);
        v = ((v ^ nv) & NIBBLE_KEEP[(bits >> k) & 15]) ^ nv;
        memcpy(x + k, &v, sizeof v);
    }
#else
    for (int k = 0; k < n; k++) {
        uint32_t keep = 0u - (uint32_t)((bits >> k) & 1);
        x[k] = ((x[k] ^ ninf) & keep) ^ ninf;
    }
#endif
}

TR_INLINE void blend16(uint16_t *x, uint64_t bits, int n, uint16_t ninf) {
#if TR_VECTOR
    const v8u16 nv = {ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf};
    for (int k = 0; k < n; k += 8) {
        v8u16 v;
        memcpy(&v, x + k, sizeof v);
        v = ((v ^ nv) & BYTE_KEEP[(bits >> k) & 255]) ^ nv;
        memcpy(x + k, &v, sizeof v);
    }
#else
    for (int k = 0; k < n; k++) {
        uint16_t keep = (uint16_t)(0u - (unsigned)((bits >> k) & 1));
        x[k] = (uint16_t)(((x[k] ^ ninf) & keep) ^ ninf);
    }
#endif
}

/* Whole words are walked in chunks of CHUNK_WORDS words (2048 columns), each in blocks of
 * BLOCK_WORDS words (512 columns, skipped whole when all allowed) made of 64-column units. A unit
 * with more than four disallowed tokens is filled with -inf (none allowed) or blended on the spot.
 * Units with one to four disallowed tokens take one of two strategies, fixed per call:
 *
 *  - gathered (calls whose masked rows fit in about one L2 cache): pass 1 over a chunk writes the
 *    offsets of those tokens into `pending`, branch-free (four slots per unit; the count advances
 *    only for real bits), pass 2 stores -inf at them. No data-dependent branch, so no
 *    mispredictions whatever the mask looks like.
 *  - direct (larger calls): a loop over the unit's zero bits storing -inf as it goes. Once the
 *    logits come from memory, the stores' cache misses dominate; a store buffer shared with the
 *    `pending` writes (or with dummy stores) would hold fewer misses in flight, while the loop's
 *    mispredictions hide behind the misses. Every such unit also prefetches its columns 8 KB
 *    ahead (2048 float32 / 4096 16-bit columns): the row then streams in at memory bandwidth
 *    instead of one store miss at a time (measured, in-string rows at batch 16-256: float32
 *    0.75-0.85x -> 0.5-0.55x xgrammar's time; 16-bit rows, whose lines nearly all take a store
 *    anyway, gain ~7%). Units that are filled or blended do not prefetch: they touch every
 *    line, which the hardware prefetcher follows by itself (prefetching them measured slower).
 */
#define CHUNK_WORDS 64
#define BLOCK_WORDS 16
#define GATHER_MAX_BYTES (1 << 20)
static int FORCE_STRATEGY = 0; /* tests: 0 by size, 1 always direct, 2 always gathered */

/* The first j' >= j such that words [j', j' + BLOCK_WORDS) are not all -1, or the start of the
 * last, shorter stretch before `end`, or `end` (skip a run of all-allowed blocks, 64 B a step). */
TR_INLINE Py_ssize_t skip_allowed(const uint32_t *w, Py_ssize_t j, Py_ssize_t end) {
    if (j >= end) return end;
    for (; j + BLOCK_WORDS <= end; j += BLOCK_WORDS) {
#if TR_VECTOR
        v4u32 a, b, c, d;
        memcpy(&a, w + j, 16);
        memcpy(&b, w + j + 4, 16);
        memcpy(&c, w + j + 8, 16);
        memcpy(&d, w + j + 12, 16);
        a &= b & c & d;
        uint64_t h[2];
        memcpy(h, &a, 16);
        if ((h[0] & h[1]) != ~0ull) break;
#else
        uint32_t a = ~0u;
        for (int k = 0; k < BLOCK_WORDS; k++) a &= w[j + k];
        if (a != ~0u) break;
#endif
    }
    return j;
}

#define DEFINE_ROW(NAME, T, BLEND, PFD)                                                               \
    TR_INLINE void NAME##_unit(T *x, uint32_t *pending, int *count, uint64_t bits, int off,      \
                               int n, T ninf, int direct) {                                      \
        const uint64_t all = n == 64 ? ~0ull : 0xFFFFFFFFull;                                    \
        uint64_t z = ~bits & all, rest = z;                                                      \
        if (direct) {                                                                            \
            for (int s = 0; s < 4; s++) rest &= rest - 1;                                        \
            if (!rest) {                                                                         \
                if (n == 64) { /* keep the stream PFD columns (8 KB) ahead in flight */          \
                    uintptr_t ahead = (uintptr_t)(x + off) + (uintptr_t)PFD * sizeof(T);         \
                    for (int l = 0; l < 64 * (int)sizeof(T); l += 64)                            \
                        TR_PREFETCH_W((const void *)(ahead + (uintptr_t)l));                     \
                }                                                                                \
                for (; z; z &= z - 1) x[off + TR_CTZ64(z)] = ninf;                               \
                return;                                                                          \
            }                                                                                    \
        } else {                                                                                 \
            int c = *count;                                                                      \
            for (int s = 0; s < 4; s++) {                                                        \
                pending[c] = (uint32_t)(off + TR_CTZ64(rest | (1ull << 63)));                     \
                c += rest != 0;                                                                  \
                rest &= rest - 1;                                                                \
            }                                                                                    \
            if (!rest) { /* done: pass 2 stores them */                                         \
                *count = c;                                                                      \
                return;                                                                          \
            }                                                                                    \
        }                                                                                        \
        /* more than four disallowed tokens: the whole unit */                                   \
        if (z == all) {                                                                          \
            for (int k = 0; k < n; k++) x[off + k] = ninf;                                       \
        } else {                                                                                 \
            BLEND(x + off, bits, n, ninf);                                                       \
        }                                                                                        \
    }                                                                                            \
                                                                                                 \
    static void NAME(T *x, const uint32_t *w, Py_ssize_t vocab, Py_ssize_t ncols, T ninf,        \
                     int direct) {                                                               \
        const Py_ssize_t whole = vocab / 32;                                                     \
        uint32_t pending[2 * CHUNK_WORDS + 4];                                                   \
        for (Py_ssize_t c0 = skip_allowed(w, 0, whole); c0 < whole;                              \
             c0 = skip_allowed(w, c0 + CHUNK_WORDS, whole)) {                                    \
            const Py_ssize_t cend = whole - c0 < CHUNK_WORDS ? whole : c0 + CHUNK_WORDS;         \
            T *xc = x + 32 * c0;                                                                 \
            int count = 0;                                                                       \
            Py_ssize_t j = c0;                                                                   \
            for (; j + BLOCK_WORDS <= cend; j += BLOCK_WORDS) {                                  \
                uint64_t u[BLOCK_WORDS / 2], a = ~0ull;                                          \
                memcpy(u, w + j, sizeof u);                                                      \
                for (int k = 0; k < BLOCK_WORDS / 2; k++) a &= u[k];                             \
                if (a == ~0ull) continue; /* every token allowed */                              \
                for (int k = 0; k < BLOCK_WORDS / 2; k++)                                        \
                    NAME##_unit(xc, pending, &count, u[k], (int)(32 * (j - c0) + 64 * k), 64,    \
                                ninf, direct);                                                   \
            }                                                                                    \
            for (; j + 2 <= cend; j += 2) {                                                      \
                uint64_t u;                                                                      \
                memcpy(&u, w + j, sizeof u);                                                     \
                NAME##_unit(xc, pending, &count, u, (int)(32 * (j - c0)), 64, ninf, direct);     \
            }                                                                                    \
            if (j < cend)                                                                        \
                NAME##_unit(xc, pending, &count, w[j], (int)(32 * (j - c0)), 32, ninf, direct);  \
            for (int s = 0; s < count; s++) xc[pending[s]] = ninf;                               \
        }                                                                                        \
        Py_ssize_t col = 32 * whole;                                                             \
        if (col < vocab) { /* partial last word */                                               \
            uint32_t last = w[whole];                                                            \
            for (; col < vocab; col++)                                                           \
                if (!((last >> (col - 32 * whole)) & 1)) x[col] = ninf;                          \
        }                                                                                        \
        for (; col < ncols; col++) x[col] = ninf; /* beyond the vocabulary */                    \
    }

DEFINE_ROW(mask_row32, uint32_t, blend32, 2048)
DEFINE_ROW(mask_row16, uint16_t, blend16, 4096)

/* dtype codes of the Python side: 0 float32, 1 float16, 2 bfloat16 */
static const uint32_t NINF_BITS[3] = {0xFF800000u, 0xFC00u, 0xFF80u};

static int as_ssize(PyObject *o, Py_ssize_t *out, const char *name) {
    Py_ssize_t v = PyLong_AsSsize_t(o);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be an int", name);
        return -1;
    }
    *out = v;
    return 0;
}

PyDoc_STRVAR(apply_doc,
"apply(logits_ptr, logits_rows, row_stride, ncols, dtype_code, bitmask_ptr, bitmask_stride,\n"
"      bitmask_width, nmask, rows, rows_itemsize, vocab_size)\n"
"\n"
"Set disallowed logits to -inf in place. logits_ptr: address of logits[0, 0]; logits_rows rows of\n"
"ncols contiguous elements, row_stride elements apart; dtype_code 0 float32, 1 float16,\n"
"2 bfloat16. bitmask_ptr: int32 rows of bitmask_width contiguous words, bitmask_stride words\n"
"apart; nmask rows. Bitmask row i masks logits row rows[i]: rows is None (row i), a tuple/list\n"
"of ints, or the address of nmask contiguous int32 (rows_itemsize 4) / int64 (8) integers.\n"
"Every row index is checked (ValueError) before anything is written.");

static PyObject *apply(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (check_nargs(nargs, 12, "apply()")) {
        return NULL;
    }
    Py_ssize_t logits_addr, logits_rows, row_stride, ncols, dtype_code, bm_addr, bm_stride, bm_width,
        nmask, rows_itemsize, vocab;
    if (as_ssize(args[0], &logits_addr, "logits_ptr") || as_ssize(args[1], &logits_rows, "logits_rows") ||
        as_ssize(args[2], &row_stride, "row_stride") || as_ssize(args[3], &ncols, "ncols") ||
        as_ssize(args[4], &dtype_code, "dtype_code") || as_ssize(args[5], &bm_addr, "bitmask_ptr") ||
        as_ssize(args[6], &bm_stride, "bitmask_stride") || as_ssize(args[7], &bm_width, "bitmask_width") ||
        as_ssize(args[8], &nmask, "nmask") || as_ssize(args[10], &rows_itemsize, "rows_itemsize") ||
        as_ssize(args[11], &vocab, "vocab_size"))
        return NULL;
    if (dtype_code < 0 || dtype_code > 2) {
        PyErr_SetString(PyExc_ValueError, "dtype_code must be 0 (float32), 1 (float16) or 2 (bfloat16)");
        return NULL;
    }
    if (logits_rows < 0 || ncols < 0 || nmask < 0 || bm_width < 0 || row_stride < 0 || bm_stride < 0) {
        PyErr_SetString(PyExc_ValueError, "sizes and strides must be >= 0");
        return NULL;
    }
    if (vocab < 0 || vocab > ncols || vocab > 32 * bm_width) {
        PyErr_Format(PyExc_ValueError, "vocab_size=%zd must be in [0, min(%zd, 32 * %zd)]", vocab, ncols,
                     bm_width);
        return NULL;
    }
    if (nmask == 0 || ncols == 0) Py_RETURN_NONE;
    if (!logits_addr || (vocab > 0 && !bm_addr)) { /* no word is read when vocab_size == 0 */
        PyErr_SetString(PyExc_ValueError, "null data pointer");
        return NULL;
    }
    if (logits_rows > 1 && row_stride < ncols) {
        PyErr_SetString(PyExc_ValueError, "row_stride is smaller than the row width (overlapping rows)");
        return NULL;
    }

    /* Row map: resolve and range-check every index before the first write. */
    Py_ssize_t small[64];
    Py_ssize_t *rows = NULL;
    PyObject *rows_obj = args[9];
    int identity = rows_obj == Py_None;
    if (identity) {
        if (nmask != logits_rows) {
            PyErr_Format(PyExc_ValueError, "bitmask has %zd rows but logits have %zd", nmask, logits_rows);
            return NULL;
        }
    } else {
        rows = nmask <= 64 ? small : PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)nmask);
        if (!rows) return PyErr_NoMemory();
        int bad = 0;
        if (PyTuple_Check(rows_obj) || PyList_Check(rows_obj)) {
            PyObject **items = PySequence_Fast_ITEMS(rows_obj);
            if (PySequence_Fast_GET_SIZE(rows_obj) != nmask) {
                PyErr_SetString(PyExc_ValueError, "len(rows) != number of bitmask rows");
                bad = 1;
            }
            for (Py_ssize_t i = 0; !bad && i < nmask; i++) {
                Py_ssize_t r = PyLong_AsSsize_t(items[i]);
                if (r == -1 && PyErr_Occurred()) {
                    PyErr_Clear();
                    PyErr_SetString(PyExc_ValueError, "rows must hold ints");
                    bad = 1;
                }
                rows[i] = r;
            }
        } else {
            Py_ssize_t addr;
            if (as_ssize(rows_obj, &addr, "rows")) {
                bad = 1;
            } else if (!addr || (rows_itemsize != 4 && rows_itemsize != 8)) {
                PyErr_SetString(PyExc_ValueError, "rows pointer needs rows_itemsize 4 or 8");
                bad = 1;
            } else if (rows_itemsize == 4) {
                const int32_t *src = (const int32_t *)addr;
                for (Py_ssize_t i = 0; i < nmask; i++) rows[i] = src[i];
            } else {
                const int64_t *src = (const int64_t *)addr;
                for (Py_ssize_t i = 0; i < nmask; i++) rows[i] = (Py_ssize_t)src[i];
            }
        }
        for (Py_ssize_t i = 0; !bad && i < nmask; i++) {
            if (rows[i] < 0 || rows[i] >= logits_rows) {
                PyErr_Format(PyExc_ValueError, "index %zd out of range for logits with %zd rows", rows[i],
                             logits_rows);
                bad = 1;
            }
        }
        if (bad) {
            if (rows != small) PyMem_Free(rows);
            return NULL;
        }
    }

    const Py_ssize_t esize = dtype_code == 0 ? 4 : 2;
    const uint32_t ninf = NINF_BITS[dtype_code];
    char *const base = (char *)logits_addr;
    const uint32_t *const words = (const uint32_t *)bm_addr;
    const double columns = (double)nmask * (double)ncols;
    const int direct = columns * (double)esize > GATHER_MAX_BYTES || FORCE_STRATEGY == 1;
    int release = columns >= RELEASE_GIL_COLUMNS;
    PyThreadState *ts = release ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < nmask; i++) {
        Py_ssize_t r = identity ? i : rows[i];
        char *row = base + r * row_stride * esize;
        const uint32_t *w = words + i * bm_stride;
        if (esize == 4)
            mask_row32((uint32_t *)row, w, vocab, ncols, ninf, direct && FORCE_STRATEGY != 2);
        else
            mask_row16((uint16_t *)row, w, vocab, ncols, (uint16_t)ninf, direct && FORCE_STRATEGY != 2);
    }
    if (release) PyEval_RestoreThread(ts);
    if (rows && rows != small) PyMem_Free(rows);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(set_strategy_doc,
"_set_strategy(mode) -> previous mode. Tests only: 0 picks the scatter strategy by call size,\n"
"1 forces the direct loop, 2 the gathered two-pass one (so tests cover both on small inputs).");

static PyObject *set_strategy(PyObject *self, PyObject *arg) {
    (void)self;
    long mode = PyLong_AsLong(arg);
    if (mode == -1 && PyErr_Occurred()) return NULL;
    if (mode < 0 || mode > 2) {
        PyErr_SetString(PyExc_ValueError, "mode must be 0, 1 or 2");
        return NULL;
    }
    int previous = FORCE_STRATEGY;
    FORCE_STRATEGY = (int)mode;
    return PyLong_FromLong(previous);
}

static PyMethodDef methods[] = {
    {"_set_strategy", set_strategy, METH_O, set_strategy_doc},
    {"apply", (PyCFunction)(void (*)(void))apply, METH_FASTCALL, apply_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_apply_native",
    "CPU token-bitmask apply (tokenrails.kernels.cpu calls it; the numpy path is the fallback).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__apply_native(void) {
    init_tables();
    return PyModule_Create(&module);
}
