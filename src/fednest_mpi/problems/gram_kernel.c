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
 * Blocked for the registers: four rows of X against two rows of P at a time (a P row loaded once per four dot
 * products; 8 x LANES partial sums). The blocking changes no bit.
 */
#include <stdint.h>
#include <string.h>

#define LANES 8

/* The NX x NP dot products of the rows x[0..NX) with the rows p[0..NP) (K long, full = K - K % LANES) into
 * o[r * ldo + q]: each into LANES partial sums by position, then the fixed tree (lane l + 4 into l, then l + 2,
 * l + 1). NX and NP are constants: the loops over them unroll and the lanes vectorise. */
#define DOTS(T, NX, NP, x, p, o, ldo)                                                                          \
    do {                                                                                                       \
        T a[NX][NP][LANES] = {{{0}}};                                                                          \
        for (int64_t l0 = 0; l0 < full; l0 += LANES)                                                           \
            for (int l = 0; l < LANES; l++)                                                                    \
                for (int r = 0; r < (NX); r++)                                                                 \
                    for (int q = 0; q < (NP); q++) a[r][q][l] += x[r][l0 + l] * p[q][l0 + l];                  \
        for (int64_t l = full; l < K; l++)                                                                     \
            for (int r = 0; r < (NX); r++)                                                                     \
                for (int q = 0; q < (NP); q++) a[r][q][l - full] += x[r][l] * p[q][l];                         \
        for (int r = 0; r < (NX); r++)                                                                         \
            for (int q = 0; q < (NP); q++) {                                                                   \
                for (int h = LANES / 2; h > 0; h /= 2)                                                         \
                    for (int l = 0; l < h; l++) a[r][q][l] += a[r][q][l + h];                                  \
                (o)[r * (ldo) + q] = a[r][q][0];                                                               \
            }                                                                                                  \
    } while (0)

/* gram_T(X, P, out, C, b, k, K, sxc, sxr, spc, spr): X rows at X + c * sxc + i * sxr, P rows at
 * P + c * spc + j * spr (elements; rows contiguous), out (C, b, k) contiguous. Four rows of X against two
 * rows of P at a time, then the rest. */
#define DEFINE_GRAM(NAME, T)                                                                                   \
    void NAME(const T *X, const T *P, T *out, int64_t C, int64_t b, int64_t k, int64_t K, int64_t sxc,         \
              int64_t sxr, int64_t spc, int64_t spr) {                                                         \
        const int64_t full = K - K % LANES;                                                                    \
        for (int64_t c = 0; c < C; c++) {                                                                      \
            const T *Xc = X + c * sxc, *Pc = P + c * spc;                                                      \
            T *oc = out + c * b * k;                                                                           \
            int64_t i = 0;                                                                                     \
            for (; i + 4 <= b; i += 4) {                                                                       \
                const T *x[4] = {Xc + i * sxr, Xc + (i + 1) * sxr, Xc + (i + 2) * sxr, Xc + (i + 3) * sxr};    \
                int64_t j = 0;                                                                                 \
                for (; j + 2 <= k; j += 2) {                                                                   \
                    const T *p[2] = {Pc + j * spr, Pc + (j + 1) * spr};                                        \
                    DOTS(T, 4, 2, x, p, oc + i * k + j, k);                                                    \
                }                                                                                              \
                for (; j < k; j++) {                                                                           \
                    const T *p[1] = {Pc + j * spr};                                                            \
                    DOTS(T, 4, 1, x, p, oc + i * k + j, k);                                                    \
                }                                                                                              \
            }                                                                                                  \
            for (; i < b; i++)                                                                                 \
                for (int64_t j = 0; j < k; j++) {                                                              \
                    const T *x[1] = {Xc + i * sxr}, *p[1] = {Pc + j * spr};                                    \
                    DOTS(T, 1, 1, x, p, oc + i * k + j, k);                                                    \
                }                                                                                              \
        }                                                                                                      \
    }

DEFINE_GRAM(gram_f32, float)
DEFINE_GRAM(gram_f64, double)

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
