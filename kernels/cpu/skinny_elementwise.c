/* The forward's elementwise steps for few rows, fp32, AVX2 + FMA, one thread (a step's rows
 * are too few to pay for a parallel region): RMSNorm and SiLU(gate) * up. One call replaces
 * the several torch ops (and their per-op dispatch) each of them costs per layer. Every row is
 * computed the same way whatever the number of rows. kernels/skinny.py calls them; the
 * references are models/llama.py's torch expressions.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "skinny_common.h"

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, rows of n floats */
void skinny_rms_norm(const float *x, const float *w, float *out, int64_t rows, int64_t n, float eps) {
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        int64_t i = 0;
        for (; i + 16 <= n8; i += 16) {
            const __m256 u = _mm256_loadu_ps(xr + i), v = _mm256_loadu_ps(xr + i + 8);
            a0 = _mm256_fmadd_ps(u, u, a0);
            a1 = _mm256_fmadd_ps(v, v, a1);
        }
        for (; i < n8; i += 8) {
            const __m256 u = _mm256_loadu_ps(xr + i);
            a0 = _mm256_fmadd_ps(u, u, a0);
        }
        float ss = hsum8(_mm256_add_ps(a0, a1));
        for (; i < n; i++) ss += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(ss / (float)n + eps);
        const __m256 iv = _mm256_set1_ps(inv);
        for (i = 0; i < n8; i += 8)
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), iv), _mm256_loadu_ps(w + i)));
        for (; i < n; i++) o[i] = xr[i] * inv * w[i];
    }
}

/* out (rows, n) = silu(gu[:, :n]) * gu[:, n:], gu (rows, 2n): sigmoid(g) from e = e^-|g| as
 * 1 / (1 + e) for g >= 0 and e / (1 + e) below, so nothing overflows */
void skinny_silu_mul(const float *gu, float *out, int64_t rows, int64_t n) {
    const int64_t n8 = n & ~(int64_t)7;
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * n, *u = g + n;
        float *o = out + r * n;
        int64_t i = 0;
        for (; i < n8; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i);
            const __m256 e = exp_neg(_mm256_or_ps(gv, sign)); /* e^-|g| */
            const __m256 den = _mm256_add_ps(one, e);
            const __m256 num = _mm256_blendv_ps(one, e, gv); /* sign bit of g set: e */
            const __m256 sig = _mm256_div_ps(num, den);
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + i)));
        }
        for (; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* Rotary embedding in place on the first `heads` heads of each row (the "NeoX" halves layout):
 * x[:h] <- x[:h] cos[:h] + x[h:] sin[:h],  x[h:] <- x[h:] cos[h:] + x[:h] sin[h:]  (h = D / 2),
 * with cos / sin the full-width (rows, D) tables, sin signed. A product, a product, a sum, each
 * rounded (no fused multiply-add): bit for bit torch's `x * cos + rotate(x) * sin`. D a
 * multiple of 16; row r, head j at x[r * row_stride + j * D]. */
void skinny_rope(float *x, const float *cos, const float *sin, int64_t rows, int64_t row_stride, int64_t heads,
                 int64_t D) {
    const int64_t h = D / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos + r * D, *s = sin + r * D;
        for (int64_t j = 0; j < heads; j++) {
            float *p = x + r * row_stride + j * D;
            for (int64_t i = 0; i < h; i += 8) {
                const __m256 a = _mm256_loadu_ps(p + i), b = _mm256_loadu_ps(p + h + i);
                const __m256 lo = _mm256_add_ps(_mm256_mul_ps(a, _mm256_loadu_ps(c + i)),
                                                _mm256_mul_ps(b, _mm256_loadu_ps(s + i)));
                const __m256 hi = _mm256_add_ps(_mm256_mul_ps(b, _mm256_loadu_ps(c + h + i)),
                                                _mm256_mul_ps(a, _mm256_loadu_ps(s + h + i)));
                _mm256_storeu_ps(p + i, lo);
                _mm256_storeu_ps(p + h + i, hi);
            }
        }
    }
}
