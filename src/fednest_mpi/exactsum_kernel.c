/* The binned exact sum of fednest_mpi.exactsum (BinnedSum.add): one fused kernel, blocked for the cache.
 *
 * The same IEEE operations as the torch path of exactsum.py, element by element, so the same bits: the payload
 * converted to float64 exactly (times its float64 weight: one rounding), the column's top from the largest
 * magnitude, the window moved up in whole bins, then per bin q = (r + sigma) - sigma, bin += q, r -= q. The
 * slices of one bin are multiples of its grid and bounded, so their sum is exact in any order: the order of the
 * additions here (rows four at a time into a tile accumulator, tile accumulators into the bins) cannot show.
 *
 * One pass, blocked for the cache. The columns are taken in tiles of TILE (their block sums, sigmas and limits
 * stay in L1), the rows of a tile in blocks of ROW_BLOCK. A block is read once: its values are sliced under the
 * columns' current windows into block sums while their largest magnitudes are taken. Where a column's largest
 * magnitude reaches its limit (the window must move up), that column's block sum is thrown away, its window
 * moved up and the block sliced again under the new window (a second pass over the block, from L1/L2: the
 * first block of a fresh sum, rarely any other); elsewhere the block sums are added to the bins. A block
 * deposited under a lower window and moved up later leaves the same bits as one deposited under the final
 * window (exactsum's module docstring: a bin above a value's top receives exactly 0, and the bins a higher
 * window shares receive the same slices), so this blocking, like the row tiles of the caller, changes no bit.
 *
 * A block's largest magnitude is the largest IEEE bit pattern of |r| taken as an unsigned integer (the same order
 * as the values for non-negative doubles, and a NaN's pattern lies above infinity's: a non-finite value gives
 * the top TOP_MAX without a test of its own). Sigma = 1.5 * 2**e is built from its bit pattern (no libm call per
 * column): e lies in [-1004, 1012], the exponents of normal doubles.
 *
 * Built by exactsum.kernel() with -ffp-contract=off and without -ffast-math: no fused multiply-add and no
 * reassociation may change an operation. tests/unit/test_exactsum.py compares it with the torch path bit for bit.
 * Bins per coordinate: 2 or 3 (exactsum.BINS); the caller takes the torch path for any other count.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BIN_BITS 32
#define TOP_MIN (-30)
#define TOP_MAX 31
#define MAX_BINS 3
#ifndef TILE
#define TILE 4096
#endif
#ifndef ROW_BLOCK
#define ROW_BLOCK 64
#endif
#define EXP_MASK UINT64_C(0x7ff0000000000000)

static inline uint64_t bits_of(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* 1.5 * 2**((top - k - 1) * BIN_BITS + 52): the constant that rounds to bin k's grid under window top. */
static inline double sigma_of(int64_t top, int k) {
    int64_t e = (top - k - 1) * BIN_BITS + 52;
    uint64_t u = ((uint64_t)(e + 1023) << 52) | (UINT64_C(1) << 51);
    double s;
    memcpy(&s, &u, sizeof s);
    return s;
}

/* The top of a column whose largest |value| has the bit pattern u (exactsum.tops): the smallest t with
 * |value| < 2**(t * BIN_BITS - 1), clamped; TOP_MIN for 0, TOP_MAX for a non-finite value. */
static inline int64_t top_of(uint64_t u) {
    /* A normal |value| < 2**e with e = its biased exponent - 1022 (frexp's e); a zero or subnormal one (biased
     * exponent 0, e <= -1022) lies far below TOP_MIN's range, as does e = -1022 itself, so the biased exponent
     * alone decides: t = floor((e + BIN_BITS) / BIN_BITS), clamped; the exponent 0x7ff (non-finite) gives TOP_MAX.
     * No branch: the loops over a tile's columns vectorise. */
    int64_t biased = (int64_t)(u >> 52);
    int64_t t = (biased - 1022 + BIN_BITS) >> 5; /* BIN_BITS = 32: an arithmetic shift is floor division */
    t = t < TOP_MIN ? TOP_MIN : t;
    t = t > TOP_MAX ? TOP_MAX : t;
    return biased == 0x7ff ? TOP_MAX : t;
}

/* The bit pattern of 2**(top * BIN_BITS - 1): a column's window must move up exactly when a |value|'s pattern
 * reaches it (no window lies above TOP_MAX's). */
static inline uint64_t limit_of(int64_t top) {
    return top >= TOP_MAX ? UINT64_MAX : (uint64_t)(top * BIN_BITS - 1 + 1023) << 52;
}

/* Move column j's window up to top t (BinnedSum.align for one column): bins keep their absolute position. */
static void align_column(double *bins, int64_t ld_bins, int n_bins, int64_t *top, int64_t j, int64_t t) {
    int64_t shift = t - top[j];
    for (int k = n_bins - 1; k >= 0; k--) {
        int64_t from = k - shift;
        bins[k * ld_bins + j] = from >= 0 ? bins[from * ld_bins + j] : 0.0;
    }
    top[j] = t;
}

/* One value's slices into the block sums x[0..NB) of a column (NB bins, a constant: the loop unrolls). */
#define SLICE(NB, r, x, s)                                                                                      \
    do {                                                                                                        \
        double r_ = (r);                                                                                        \
        for (int k = 0; k < (NB); k++) {                                                                        \
            double q_ = (r_ + s[k]) - s[k];                                                                     \
            x[k] += q_;                                                                                         \
            r_ -= q_;                                                                                           \
        }                                                                                                       \
    } while (0)

/* One row's values at column j: slice them into x and, with TRACK, take the largest |value|'s pattern into m. */
#define VISIT(NB, TRACK, p, wb, x, s, m)                                                                        \
    do {                                                                                                        \
        double r = (double)(p)[j] * (wb);                                                                       \
        if (TRACK) {                                                                                            \
            uint64_t u = bits_of(fabs(r));                                                                      \
            m = u > m ? u : m;                                                                                  \
        }                                                                                                       \
        SLICE(NB, r, x, s);                                                                                     \
    } while (0)

/* Rows [b0, b1) of a tile (columns lo..lo+n-1) sliced into blk under sigma, four rows at a time (a column's
 * sums and sigmas are loaded once per four rows); with TRACK, mx[j] = the largest |value|'s bit pattern. */
#define SWEEP(T, NB, TRACK)                                                                                     \
    do {                                                                                                        \
        int64_t b = b0;                                                                                         \
        for (; b + 4 <= b1; b += 4) {                                                                           \
            const T *p0 = values + b * ld + lo, *p1 = p0 + ld, *p2 = p1 + ld, *p3 = p2 + ld;                    \
            const double w0 = w[b - b0], w1 = w[b - b0 + 1], w2 = w[b - b0 + 2], w3 = w[b - b0 + 3];            \
            for (int64_t j = 0; j < n; j++) {                                                                   \
                double s[NB], x[NB];                                                                            \
                uint64_t m = mx[j];                                                                             \
                for (int k = 0; k < (NB); k++) s[k] = sigma[k][j], x[k] = blk[k][j];                            \
                VISIT(NB, TRACK, p0, w0, x, s, m);                                                              \
                VISIT(NB, TRACK, p1, w1, x, s, m);                                                              \
                VISIT(NB, TRACK, p2, w2, x, s, m);                                                              \
                VISIT(NB, TRACK, p3, w3, x, s, m);                                                              \
                for (int k = 0; k < (NB); k++) blk[k][j] = x[k];                                                \
                mx[j] = m;                                                                                      \
            }                                                                                                   \
        }                                                                                                       \
        for (; b < b1; b++) {                                                                                   \
            const T *p0 = values + b * ld + lo;                                                                 \
            const double w0 = w[b - b0];                                                                        \
            for (int64_t j = 0; j < n; j++) {                                                                   \
                double s[NB], x[NB];                                                                            \
                uint64_t m = mx[j];                                                                             \
                for (int k = 0; k < (NB); k++) s[k] = sigma[k][j], x[k] = blk[k][j];                            \
                VISIT(NB, TRACK, p0, w0, x, s, m);                                                              \
                for (int k = 0; k < (NB); k++) blk[k][j] = x[k];                                                \
                mx[j] = m;                                                                                      \
            }                                                                                                   \
        }                                                                                                       \
    } while (0)

/* Rows [b0, b1) of a tile: mx[j] = the largest |value|'s bit pattern of column j, nothing sliced. */
#define MAXIMA(T)                                                                                               \
    do {                                                                                                        \
        int64_t b = b0;                                                                                         \
        for (; b + 4 <= b1; b += 4) { /* four rows at a time: a column's maximum loaded once per four */        \
            const T *p0 = values + b * ld + lo, *p1 = p0 + ld, *p2 = p1 + ld, *p3 = p2 + ld;                    \
            const double w0 = w[b - b0], w1 = w[b - b0 + 1], w2 = w[b - b0 + 2], w3 = w[b - b0 + 3];            \
            for (int64_t j = 0; j < n; j++) {                                                                   \
                uint64_t m = mx[j];                                                                             \
                uint64_t u0 = bits_of(fabs((double)p0[j] * w0)), u1 = bits_of(fabs((double)p1[j] * w1));        \
                uint64_t u2 = bits_of(fabs((double)p2[j] * w2)), u3 = bits_of(fabs((double)p3[j] * w3));        \
                u0 = u1 > u0 ? u1 : u0;                                                                         \
                u2 = u3 > u2 ? u3 : u2;                                                                         \
                u0 = u2 > u0 ? u2 : u0;                                                                         \
                mx[j] = u0 > m ? u0 : m;                                                                        \
            }                                                                                                   \
        }                                                                                                       \
        for (; b < b1; b++) {                                                                                   \
            const T *p0 = values + b * ld + lo;                                                                 \
            const double w0 = w[b - b0];                                                                        \
            for (int64_t j = 0; j < n; j++) {                                                                   \
                uint64_t u = bits_of(fabs((double)p0[j] * w0));                                                 \
                mx[j] = u > mx[j] ? u : mx[j];                                                                  \
            }                                                                                                   \
        }                                                                                                       \
    } while (0)

/* One block of rows of a tile, NB bins. Into a tile whose bins are all empty (every top TOP_MIN: a fresh sum,
 * e.g. a buffer of summation groups' sums), the windows are set from the block's maxima first and the block
 * sliced once; elsewhere the speculative pass, then the columns whose window moves, again. */
#define BLOCK(T, NB)                                                                                            \
    do {                                                                                                        \
        int fresh = 1;                                                                                          \
        for (int64_t j = 0; j < n; j++) {                                                                       \
            mx[j] = 0;                                                                                          \
            fresh &= top[lo + j] == TOP_MIN;                                                                    \
            for (int k = 0; k < (NB); k++) blk[k][j] = 0.0;                                                     \
        }                                                                                                       \
        if (fresh) {                                                                                            \
            MAXIMA(T);                                                                                          \
            /* Every top is TOP_MIN, and top_of gives TOP_MIN below its limit: the new tops of all columns at   \
             * once (vectorised). Bins move only where a column holds something (values below 2**-961). */      \
            int held = 0;                                                                                       \
            for (int64_t j = 0; j < n; j++) {                                                                   \
                tnew[j] = top_of(mx[j]);                                                                        \
                for (int k = 0; k < (NB); k++) held |= bins[k * ld_bins + lo + j] != 0.0;                       \
            }                                                                                                   \
            for (int64_t j = 0; j < n && held; j++)                                                             \
                if (tnew[j] != top[lo + j]) align_column(bins, ld_bins, NB, top, lo + j, tnew[j]);              \
            for (int64_t j = 0; j < n; j++) {                                                                   \
                top[lo + j] = tnew[j];                                                                          \
                limit[j] = limit_of(tnew[j]);                                                                   \
                for (int k = 0; k < (NB); k++) sigma[k][j] = sigma_of(tnew[j], k);                              \
            }                                                                                                   \
            SWEEP(T, NB, 0);                                                                                    \
            for (int64_t j = 0; j < n; j++)                                                                     \
                for (int k = 0; k < (NB); k++) bins[k * ld_bins + lo + j] += blk[k][j];                         \
            break;                                                                                              \
        }                                                                                                       \
        SWEEP(T, NB, 1);                                                                                        \
        int rises = 0;                                                                                          \
        for (int64_t j = 0; j < n; j++) rises |= mx[j] >= limit[j];                                             \
        if (!rises) { /* the common case: every block sum into its bins (vectorised) */                         \
            for (int64_t j = 0; j < n; j++)                                                                     \
                for (int k = 0; k < (NB); k++) bins[k * ld_bins + lo + j] += blk[k][j];                         \
            break;                                                                                              \
        }                                                                                                       \
        for (int64_t j = 0; j < n; j++) {                                                                       \
            moved[j] = mx[j] >= limit[j];                                                                       \
            if (moved[j]) {                                                                                     \
                int64_t t = top_of(mx[j]);                                                                      \
                align_column(bins, ld_bins, NB, top, lo + j, t);                                                \
                limit[j] = limit_of(t);                                                                         \
                for (int k = 0; k < (NB); k++) sigma[k][j] = sigma_of(t, k), blk[k][j] = 0.0;                   \
            } else {                                                                                            \
                for (int k = 0; k < (NB); k++) bins[k * ld_bins + lo + j] += blk[k][j], blk[k][j] = 0.0;        \
            }                                                                                                   \
        }                                                                                                       \
        SWEEP(T, NB, 0); /* all columns (vectorised); only the moved ones' sums are kept */                     \
        for (int64_t j = 0; j < n; j++)                                                                         \
            if (moved[j])                                                                                       \
                for (int k = 0; k < (NB); k++) bins[k * ld_bins + lo + j] += blk[k][j];                         \
    } while (0)

/* The per-call working set of a tile (block sums, sigmas, largest magnitudes, limits, moved columns) and a row
 * block's weights: about 290 kB with the defaults, so it lives on the heap, not on a (possibly small) thread stack. */
struct scratch {
    double blk[MAX_BINS][TILE], sigma[MAX_BINS][TILE], w[ROW_BLOCK];
    uint64_t mx[TILE], limit[TILE];
    int64_t tnew[TILE];
    char moved[TILE];
};

/* BinnedSum.add of rows x cols values (row stride ld), each row times weights[b] (NULL: 1, exact), into n_bins
 * (2 or 3) bins per column (row stride ld_bins) under the columns' tops. 0, or -1 (nothing done) when its working
 * set cannot be allocated. */
#define DEFINE_ADD(NAME, T)                                                                                     \
    int NAME(const T *values, int64_t ld, const double *weights, int64_t rows, int64_t cols, int n_bins,        \
              int64_t *top, double *bins, int64_t ld_bins) {                                                    \
        struct scratch *sc = malloc(sizeof *sc); /* ~290 kB: not on a thread's stack */                         \
        if (sc == NULL) return -1;                                                                              \
        double(*restrict blk)[TILE] = sc->blk, (*restrict sigma)[TILE] = sc->sigma, *restrict w = sc->w;        \
        uint64_t *restrict mx = sc->mx, *restrict limit = sc->limit;                                            \
        int64_t *restrict tnew = sc->tnew;                                                                      \
        char *restrict moved = sc->moved;                                                                       \
        for (int64_t lo = 0; lo < cols; lo += TILE) {                                                           \
            const int64_t n = cols - lo < TILE ? cols - lo : TILE;                                              \
            for (int64_t j = 0; j < n; j++) {                                                                   \
                limit[j] = limit_of(top[lo + j]);                                                               \
                for (int k = 0; k < n_bins; k++) sigma[k][j] = sigma_of(top[lo + j], k);                        \
            }                                                                                                   \
            for (int64_t b0 = 0; b0 < rows; b0 += ROW_BLOCK) {                                                  \
                const int64_t b1 = rows - b0 < ROW_BLOCK ? rows : b0 + ROW_BLOCK;                               \
                for (int64_t b = b0; b < b1; b++) w[b - b0] = weights ? weights[b] : 1.0;                       \
                if (n_bins == 2)                                                                                \
                    BLOCK(T, 2);                                                                                \
                else                                                                                            \
                    BLOCK(T, 3);                                                                                \
            }                                                                                                   \
        }                                                                                                       \
        free(sc);                                                                                               \
        return 0;                                                                                               \
    }

DEFINE_ADD(binned_add_f32, float)
DEFINE_ADD(binned_add_f64, double)

/* BinnedSum.align: every column j whose top rises to new_top[j] (>= top[j]) has its bins moved up as
 * align_column does (a bin keeps its absolute position, bins that leave the window are dropped, new ones are 0),
 * in place; columns whose top stays are not touched (BinnedSum.align refuses a top that falls). The torch path's bits (a move of bins, no arithmetic). */
void binned_align(int64_t *top, double *bins, int64_t ld_bins, int n_bins, const int64_t *new_top, int64_t cols) {
    for (int64_t j = 0; j < cols; j++)
        if (new_top[j] > top[j]) align_column(bins, ld_bins, n_bins, top, j, new_top[j]);
}
