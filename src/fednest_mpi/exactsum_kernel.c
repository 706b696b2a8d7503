/* The binned exact sum of fednest_mpi.exactsum (BinnedSum.add) in one fused pass per tile of columns.
 *
 * The same IEEE operations as the torch path of exactsum.py, element by element, so the same bits: the payload
 * converted to float64 exactly (times its float64 weight: one rounding), the column's top from the largest
 * magnitude (frexp), the window moved up in whole bins, then per bin q = (r + sigma) - sigma, bin += q,
 * r -= q. The slices of one bin are multiples of its grid and bounded, so their sum is exact in any order:
 * the order of the additions here (row by row into a tile accumulator) cannot show.
 *
 * Built by exactsum._kernel() with -ffp-contract=off and without -ffast-math: no fused multiply-add and no
 * reassociation may change an operation. tests/unit/test_exactsum.py compares it with the torch path bit for bit.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BIN_BITS 32
#define TOP_MIN (-30)
#define TOP_MAX 31
#define MAX_BINS 3
#define TILE_MAX 1024

static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* The top of a column whose largest magnitude is m (exactsum.tops); bad: a non-finite value was seen. */
static int64_t top_of(double m, int bad) {
    if (bad) return TOP_MAX;
    if (m == 0.0) return TOP_MIN;
    int e;
    frexp(m, &e); /* m < 2**e */
    int64_t t = floor_div((int64_t)e + BIN_BITS, BIN_BITS);
    return t < TOP_MIN ? TOP_MIN : (t > TOP_MAX ? TOP_MAX : t);
}

/* Move column j's window up to top t (BinnedSum.align for one column): bins keep their absolute position. */
static void align_column(double *bins, int64_t ld_bins, int n_bins, int64_t *top, int64_t j, int64_t t) {
    int64_t shift = t - top[j];
    if (shift <= 0) return;
    for (int k = n_bins - 1; k >= 0; k--) {
        int64_t from = k - shift;
        bins[k * ld_bins + j] = from >= 0 ? bins[from * ld_bins + j] : 0.0;
    }
    top[j] = t;
}

#define DEFINE_ADD(NAME, T)                                                                                       \
    void NAME(const T *values, int64_t ld, const double *weights, int64_t rows, int64_t cols, int n_bins,       \
              int64_t *top, double *bins, int64_t ld_bins, int64_t tile) {                                       \
        double mx[TILE_MAX], bad[TILE_MAX], acc[MAX_BINS][TILE_MAX], sigma[MAX_BINS][TILE_MAX];                 \
        if (tile > TILE_MAX) tile = TILE_MAX;                                                                    \
        for (int64_t lo = 0; lo < cols; lo += tile) {                                                            \
            int64_t n = cols - lo < tile ? cols - lo : tile;                                                     \
            for (int64_t j = 0; j < n; j++) mx[j] = 0.0, bad[j] = 0.0;                                           \
            for (int64_t b = 0; b < rows; b++) {                                                                 \
                const T *row = values + b * ld + lo;                                                             \
                double w = weights ? weights[b] : 1.0;                                                           \
                for (int64_t j = 0; j < n; j++) {                                                                \
                    double r = weights ? (double)row[j] * w : (double)row[j];                                    \
                    double a = fabs(r);                                                                          \
                    mx[j] = a > mx[j] ? a : mx[j];                                                               \
                    bad[j] += r - r; /* 0, or NaN once a value is not finite */                                  \
                }                                                                                                \
            }                                                                                                    \
            for (int64_t j = 0; j < n; j++) {                                                                    \
                align_column(bins, ld_bins, n_bins, top, lo + j, top_of(mx[j], bad[j] != 0.0));                 \
                for (int k = 0; k < n_bins; k++) {                                                               \
                    sigma[k][j] = ldexp(1.5, (int)((top[lo + j] - k - 1) * BIN_BITS + 52));                      \
                    acc[k][j] = 0.0;                                                                             \
                }                                                                                                \
            }                                                                                                    \
            for (int64_t b = 0; b < rows; b++) {                                                                 \
                const T *row = values + b * ld + lo;                                                             \
                double w = weights ? weights[b] : 1.0;                                                           \
                if (n_bins == 2) {                                                                               \
                    for (int64_t j = 0; j < n; j++) {                                                            \
                        double r = weights ? (double)row[j] * w : (double)row[j];                                \
                        double q = (r + sigma[0][j]) - sigma[0][j];                                              \
                        acc[0][j] += q;                                                                          \
                        r -= q;                                                                                  \
                        acc[1][j] += (r + sigma[1][j]) - sigma[1][j];                                            \
                    }                                                                                            \
                } else if (n_bins == 3) {                                                                        \
                    for (int64_t j = 0; j < n; j++) {                                                            \
                        double r = weights ? (double)row[j] * w : (double)row[j];                                \
                        double q = (r + sigma[0][j]) - sigma[0][j];                                              \
                        acc[0][j] += q;                                                                          \
                        r -= q;                                                                                  \
                        q = (r + sigma[1][j]) - sigma[1][j];                                                     \
                        acc[1][j] += q;                                                                          \
                        r -= q;                                                                                  \
                        acc[2][j] += (r + sigma[2][j]) - sigma[2][j];                                            \
                    }                                                                                            \
                } else {                                                                                         \
                    for (int64_t j = 0; j < n; j++) {                                                            \
                        double r = weights ? (double)row[j] * w : (double)row[j];                                \
                        for (int k = 0; k < n_bins; k++) {                                                       \
                            double q = (r + sigma[k][j]) - sigma[k][j];                                          \
                            acc[k][j] += q;                                                                      \
                            r -= q;                                                                              \
                        }                                                                                        \
                    }                                                                                            \
                }                                                                                                \
            }                                                                                                    \
            for (int k = 0; k < n_bins; k++)                                                                     \
                for (int64_t j = 0; j < n; j++) bins[k * ld_bins + lo + j] += acc[k][j];                         \
        }                                                                                                        \
    }

DEFINE_ADD(binned_add_f32, float)
DEFINE_ADD(binned_add_f64, double)
