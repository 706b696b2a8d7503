/* The integer and float32 passes of fednest_mpi.rng.stream_normals (Box-Muller on SplitMix64 words), fused.
 *
 * The same operations as the numpy passes of rng._NormalBuffers.normals and rng._write_numbers, element by element,
 * so the same bits: every step is exact integer arithmetic, an exact float32 subtraction, or one correctly rounded
 * float32 multiplication (no fused multiply-add: built with -ffp-contract=off, without -ffast-math; x86-64 computes
 * float in float32, without excess precision). log, sqrt, cos and sin stay torch's kernels (numpy's float32 ones
 * round differently), called between the two functions below. tests/unit/test_rng.py compares it with the numpy
 * passes bit for bit.
 */
#include <stdint.h>
#include <string.h>

#define GOLDEN UINT64_C(0x9E3779B97F4A7C15)
#define M1 UINT64_C(0xBF58476D1CE4E5B9)
#define M2 UINT64_C(0x94D049BB133111EB)

static inline float unit_of(uint32_t half) { /* a half's 23 high bits as the mantissa of u in [1, 2) */
    uint32_t bits = (half >> 9) | UINT32_C(0x3F800000);
    float u;
    memcpy(&u, &bits, sizeof u);
    return u;
}

/* Word i = mix(firsts[i * first_stride] + step[i]) (SplitMix64's mix, all mod 2^64) for i < n; then
 * radius_in[i] = 2 - u_high (in (0, 1], exact), angle[i] = (u_low - 1) * two_pi (one rounding), with u_low, u_high
 * the word's low and high 32-bit halves as units (unit_of). first_stride: 1, or 0 for one first word for all. */
void normal_inputs(const uint64_t *firsts, int64_t first_stride, const uint64_t *step, int64_t n, float two_pi,
                   float *restrict radius_in, float *restrict angle) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t z = firsts[i * first_stride] + step[i];
        z = (z ^ (z >> 30)) * M1;
        z = (z ^ (z >> 27)) * M2;
        z = z ^ (z >> 31);
        radius_in[i] = 2.0f - unit_of((uint32_t)(z >> 32));
        angle[i] = (unit_of((uint32_t)z) - 1.0f) * two_pi;
    }
}

/* out[2 i] = radius[i] * cos_[i], out[2 i + 1] = radius[i] * sin_[i] for i < n (one rounding each). */
void normal_pairs(const float *radius, const float *cos_, const float *sin_, int64_t n, float *restrict out) {
    for (int64_t i = 0; i < n; i++) {
        out[2 * i] = radius[i] * cos_[i];
        out[2 * i + 1] = radius[i] * sin_[i];
    }
}
