/* The per-client products of the shared-start local steps (problems/shared_start.py): the Gram products
 * out[c, i, j] = sum_l X[c, i, l] * P[c, j, l] (X a client's b current rows, P its k earlier ones) and the
 * low-rank updates out[c] += G[c] R[c] that apply them.
 *
 * One fixed order of the additions per dot product, written out here, so that a client's numbers depend on
 * nothing but its own rows: not on the other clients of the call, their number, the memory addresses, the BLAS
 * or its mode. The products of a dot product go to LANES partial sums by position (l mod LANES, in increasing
 * l), then the lanes are added in a fixed tree (lane l + 4 into l, then l + 2, l + 1). Each operation is
 * one IEEE multiplication or addition: built with -ffp-contract=off and without -ffast-math (no fused
 * multiply-add, no reassociation), so vectorising across the lanes changes no bit on any CPU, and
 * kernels.gram's torch path (the same operations, lane block by lane block) gives the same bits without a
 * compiler. tests/unit/test_kernels.py compares the two bit for bit.
 *
 * Blocked for the registers: four rows of X against two rows of P at a time in float32 (a P row loaded once per
 * four dot products; 8 x LANES partial sums), against one in float64. The blocking changes no bit.
 */
#include <stdint.h>
#include <string.h>

#define LANES 8

#define REDUCE(a)                                                                                              \
    do {                                                                                                       \
        for (int l = 0; l < 4; l++) a[l] += a[l + 4];                                                          \
        for (int l = 0; l < 2; l++) a[l] += a[l + 2];                                                          \
        a[0] += a[1];                                                                                          \
    } while (0)

/* gram_T(X, P, out, C, b, k, K, sxc, sxr, spc, spr): X rows at X + c * sxc + i * sxr, P rows at
 * P + c * spc + j * spr (elements; rows contiguous), out (C, b, k) contiguous. */
#define DEFINE_GRAM(NAME, T, PAIRS)                                                                            \
    void NAME(const T *X, const T *P, T *out, int64_t C, int64_t b, int64_t k, int64_t K, int64_t sxc,         \
              int64_t sxr, int64_t spc, int64_t spr) {                                                         \
        const int64_t full = K - K % LANES;                                                                    \
        for (int64_t c = 0; c < C; c++) {                                                                      \
            const T *Xc = X + c * sxc, *Pc = P + c * spc;                                                      \
            T *oc = out + c * b * k;                                                                           \
            int64_t i = 0;                                                                                     \
            for (; i + 4 <= b; i += 4) {                                                                       \
                const T *x0 = Xc + i * sxr, *x1 = x0 + sxr, *x2 = x1 + sxr, *x3 = x2 + sxr;                    \
                int64_t j = 0;                                                                                 \
                for (; PAIRS && j + 2 <= k; j += 2) { /* two rows of P: eight dot products at once */          \
                    const T *p = Pc + j * spr, *q = p + spr;                                                   \
                    T a0[LANES] = {0}, a1[LANES] = {0}, a2[LANES] = {0}, a3[LANES] = {0};                      \
                    T c0[LANES] = {0}, c1[LANES] = {0}, c2[LANES] = {0}, c3[LANES] = {0};                      \
                    for (int64_t l0 = 0; l0 < full; l0 += LANES)                                               \
                        for (int l = 0; l < LANES; l++) {                                                      \
                            const T v = p[l0 + l], u = q[l0 + l];                                              \
                            const T y0 = x0[l0 + l], y1 = x1[l0 + l], y2 = x2[l0 + l], y3 = x3[l0 + l];        \
                            a0[l] += y0 * v, a1[l] += y1 * v, a2[l] += y2 * v, a3[l] += y3 * v;                \
                            c0[l] += y0 * u, c1[l] += y1 * u, c2[l] += y2 * u, c3[l] += y3 * u;                \
                        }                                                                                      \
                    for (int64_t l = full; l < K; l++) {                                                       \
                        const T v = p[l], u = q[l], y0 = x0[l], y1 = x1[l], y2 = x2[l], y3 = x3[l];            \
                        a0[l - full] += y0 * v, a1[l - full] += y1 * v, a2[l - full] += y2 * v;                \
                        a3[l - full] += y3 * v, c0[l - full] += y0 * u, c1[l - full] += y1 * u;                \
                        c2[l - full] += y2 * u, c3[l - full] += y3 * u;                                        \
                    }                                                                                          \
                    REDUCE(a0);                                                                                \
                    REDUCE(a1);                                                                                \
                    REDUCE(a2);                                                                                \
                    REDUCE(a3);                                                                                \
                    REDUCE(c0);                                                                                \
                    REDUCE(c1);                                                                                \
                    REDUCE(c2);                                                                                \
                    REDUCE(c3);                                                                                \
                    oc[i * k + j] = a0[0], oc[(i + 1) * k + j] = a1[0];                                        \
                    oc[(i + 2) * k + j] = a2[0], oc[(i + 3) * k + j] = a3[0];                                  \
                    oc[i * k + j + 1] = c0[0], oc[(i + 1) * k + j + 1] = c1[0];                                \
                    oc[(i + 2) * k + j + 1] = c2[0], oc[(i + 3) * k + j + 1] = c3[0];                          \
                }                                                                                              \
                for (; j < k; j++) {                                                                           \
                    const T *p = Pc + j * spr;                                                                 \
                    T a0[LANES], a1[LANES], a2[LANES], a3[LANES];                                              \
                    memset(a0, 0, sizeof a0), memset(a1, 0, sizeof a1);                                        \
                    memset(a2, 0, sizeof a2), memset(a3, 0, sizeof a3);                                        \
                    for (int64_t l0 = 0; l0 < full; l0 += LANES)                                               \
                        for (int l = 0; l < LANES; l++) {                                                      \
                            const T v = p[l0 + l];                                                             \
                            a0[l] += x0[l0 + l] * v, a1[l] += x1[l0 + l] * v;                                  \
                            a2[l] += x2[l0 + l] * v, a3[l] += x3[l0 + l] * v;                                  \
                        }                                                                                      \
                    for (int64_t l = full; l < K; l++) {                                                       \
                        const T v = p[l];                                                                      \
                        a0[l - full] += x0[l] * v, a1[l - full] += x1[l] * v;                                  \
                        a2[l - full] += x2[l] * v, a3[l - full] += x3[l] * v;                                  \
                    }                                                                                          \
                    REDUCE(a0);                                                                                \
                    REDUCE(a1);                                                                                \
                    REDUCE(a2);                                                                                \
                    REDUCE(a3);                                                                                \
                    oc[i * k + j] = a0[0], oc[(i + 1) * k + j] = a1[0];                                        \
                    oc[(i + 2) * k + j] = a2[0], oc[(i + 3) * k + j] = a3[0];                                  \
                }                                                                                              \
            }                                                                                                  \
            for (; i < b; i++) {                                                                               \
                const T *x0 = Xc + i * sxr;                                                                    \
                for (int64_t j = 0; j < k; j++) {                                                              \
                    const T *p = Pc + j * spr;                                                                 \
                    T a0[LANES];                                                                               \
                    memset(a0, 0, sizeof a0);                                                                  \
                    for (int64_t l0 = 0; l0 < full; l0 += LANES)                                               \
                        for (int l = 0; l < LANES; l++) a0[l] += x0[l0 + l] * p[l0 + l];                       \
                    for (int64_t l = full; l < K; l++) a0[l - full] += x0[l] * p[l];                           \
                    REDUCE(a0);                                                                                \
                    oc[i * k + j] = a0[0];                                                                     \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }

DEFINE_GRAM(gram_f32, float, 1)
DEFINE_GRAM(gram_f64, double, 0) /* one row of P at a time: 8 x 8 doubles would not fit the registers */

/* low_rank_add_T(G, R, out, C, b, k, N, src, srr, soc, sor): out[c, i, :] += sum_j G[c, i, j] * R[c, j, :], the
 * terms added to out one at a time in increasing j (out + G[i, 0] R[0] first, then + G[i, 1] R[1], ...): each an
 * IEEE multiplication and addition, vectorised across the N columns only. G (C, b, k) contiguous; R rows at
 * R + c * src + j * srr, out rows at out + c * soc + i * sor (rows contiguous). Four rows of out at a time (a
 * row of R loaded once per four). */
#define DEFINE_LOW_RANK_ADD(NAME, T)                                                                           \
    void NAME(const T *G, const T *R, T *out, int64_t C, int64_t b, int64_t k, int64_t N, int64_t src,         \
              int64_t srr, int64_t soc, int64_t sor) {                                                         \
        for (int64_t c = 0; c < C; c++) {                                                                      \
            const T *Gc = G + c * b * k, *Rc = R + c * src;                                                    \
            int64_t i = 0;                                                                                     \
            for (; i + 4 <= b; i += 4) {                                                                       \
                T *restrict o0 = out + c * soc + i * sor, *restrict o1 = o0 + sor;                             \
                T *restrict o2 = o1 + sor, *restrict o3 = o2 + sor;                                            \
                for (int64_t j = 0; j < k; j++) {                                                              \
                    const T *restrict r = Rc + j * srr;                                                        \
                    const T g0 = Gc[i * k + j], g1 = Gc[(i + 1) * k + j];                                      \
                    const T g2 = Gc[(i + 2) * k + j], g3 = Gc[(i + 3) * k + j];                                \
                    for (int64_t n = 0; n < N; n++) {                                                          \
                        const T v = r[n];                                                                      \
                        o0[n] += g0 * v, o1[n] += g1 * v, o2[n] += g2 * v, o3[n] += g3 * v;                    \
                    }                                                                                          \
                }                                                                                              \
            }                                                                                                  \
            for (; i < b; i++) {                                                                               \
                T *o0 = out + c * soc + i * sor;                                                               \
                for (int64_t j = 0; j < k; j++) {                                                              \
                    const T *r = Rc + j * srr, g0 = Gc[i * k + j];                                             \
                    for (int64_t n = 0; n < N; n++) o0[n] += g0 * r[n];                                        \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }

DEFINE_LOW_RANK_ADD(low_rank_add_f32, float)
DEFINE_LOW_RANK_ADD(low_rank_add_f64, double)
