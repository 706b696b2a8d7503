/* fednest_mpi.rng.stream_normals's numbers (Box-Muller on SplitMix64 words) in one pass, with the project's own
 * elementary functions.
 *
 * The same operations as the numpy passes of rng._NormalBuffers.numbers (rng.box_muller), element by element, so
 * the same bits on every x86-64 CPU: exact integer arithmetic, exact float conversions and subtractions, and
 * correctly rounded IEEE double operations (+, -, *, /, sqrt, rint) in a fixed order: no fused multiply-add (built
 * with -ffp-contract=off, without -ffast-math), no math library. log, sin and cos are the series of rng.box_muller,
 * whose coefficients the caller passes (rng._LOG_SERIES, _SIN_SERIES, _COS_SERIES: one definition for both paths).
 * tests/unit/test_rng.py compares it with the numpy passes and with a one-number-at-a-time definition,
 * bit for bit.
 */
#include <stdint.h>
#include <string.h>

#define M1 UINT64_C(0xBF58476D1CE4E5B9)
#define M2 UINT64_C(0x94D049BB133111EB)
#define GOLDEN UINT64_C(0x9E3779B97F4A7C15)
#define LN2 0.6931471805599453
#define HALF_PI 1.5707963267948966
#define SQRT2 1.4142135623730951

/* c[0] z^(n-1) + ... + c[n-1] by Horner's rule: p = c[0], then p = p z + c[k] (two roundings per step). */
static inline double horner(const double *c, int n, double z) {
    double p = c[0];
    for (int k = 1; k < n; k++) p = p * z + c[k];
    return p;
}

static inline double unit_of(uint32_t half) { /* a half's 23 high bits as the mantissa of u in [1, 2) */
    uint32_t bits = (half >> 9) | UINT32_C(0x3F800000);
    float u;
    memcpy(&u, &bits, sizeof u);
    return (double)u;
}

/* log(t) for t in (0, 1] (a normal double): t = m 2^e with m in [sqrt(1/2), sqrt(2)], s = (m - 1) / (m + 1),
 * log t = e log 2 + 2 s (1 + s^2 / 3 + s^4 / 5 + ... + s^20 / 21). */
static inline double own_log(double t, const double *log_series) {
    uint64_t bits;
    memcpy(&bits, &t, sizeof bits);
    double e = (double)((int64_t)(bits >> 52) - 1023);
    bits = (bits & UINT64_C(0x000FFFFFFFFFFFFF)) | UINT64_C(0x3FF0000000000000);
    double m;
    memcpy(&m, &bits, sizeof m);
    double big = m > SQRT2 ? 1.0 : 0.0;
    m = m > SQRT2 ? m * 0.5 : m;
    e = e + big;
    double f = m - 1.0;
    double s = f / (2.0 + f);
    return e * LN2 + (2.0 * s) * horner(log_series, 11, s * s);
}

/* The two numbers of the word w (before the mix): z = mix(w) (SplitMix64's mix, mod 2^64), u_low and u_high its
 * low and high 32-bit halves as units (unit_of); radius = sqrt(-2 log(2 - u_high)); the angle in quarter turns
 * y = 4 (u_low - 1) (exact), k = rint(y), x = (y - k) pi/2 in [-pi/4, pi/4], (cos, sin) of x by their series and
 * of the angle by the quadrant k; *c = (float)(radius cos), *s = (float)(radius sin). The series' coefficients,
 * highest power first: log_series[11] (1/(2k+1), k = 10..0), sin_series[9] ((-1)^k/(2k+1)!, k = 8..0),
 * cos_series[10] ((-1)^k/(2k)!, k = 9..0). */
static inline void word_numbers(uint64_t z, const double *log_series, const double *sin_series,
                                const double *cos_series, float *c_out, float *s_out) {
    z = (z ^ (z >> 30)) * M1;
    z = (z ^ (z >> 27)) * M2;
    z = z ^ (z >> 31);
    double radius = __builtin_sqrt(-2.0 * own_log(2.0 - unit_of((uint32_t)(z >> 32)), log_series));
    double y = (unit_of((uint32_t)z) - 1.0) * 4.0;
    double k = __builtin_rint(y);
    double x = (y - k) * HALF_PI;
    double x2 = x * x;
    double sn = horner(sin_series, 9, x2) * x;
    double cs = horner(cos_series, 10, x2);
    int q = (int)k & 3; /* angle = q quarter turns + x */
    double c = q == 0 ? cs : q == 1 ? -sn : q == 2 ? -cs : sn;
    double s = q == 0 ? sn : q == 1 ? cs : q == 2 ? -sn : -cs;
    *c_out = (float)(radius * c);
    *s_out = (float)(radius * s);
}

/* Stream i < n_streams: its words firsts[i] + j GOLDEN (mod 2^64), j = 0, 1, ..., each giving two numbers
 * (word_numbers), written to out in order: lengths[i] numbers of stream i (an odd length drops its last word's
 * second number), then stream i + 1's. One call for every stream of rng.stream_normals: no per-word arrays. */
void stream_numbers(const uint64_t *firsts, const int64_t *lengths, int64_t n_streams, const double *log_series,
                    const double *sin_series, const double *cos_series, float *restrict out) {
    for (int64_t i = 0; i < n_streams; i++) {
        int64_t pairs = lengths[i] / 2;
        uint64_t first = firsts[i];
        for (int64_t j = 0; j < pairs; j++)
            word_numbers(first + (uint64_t)j * GOLDEN, log_series, sin_series, cos_series, out + 2 * j,
                         out + 2 * j + 1);
        out += 2 * pairs;
        if (lengths[i] % 2) {
            float dropped;
            word_numbers(first + (uint64_t)pairs * GOLDEN, log_series, sin_series, cos_series, out, &dropped);
            out += 1;
        }
    }
}
