/* The forward's elementwise steps for few rows, fp32, AVX2 + FMA (the AVX-512 build: 16 lanes a
 * register, each lane the AVX2 build's operations, so the same numbers): RMSNorm and SiLU(gate)
 * * up. One call replaces the several torch ops (and their per-op dispatch) each of them costs per
 * layer. Every element is computed the same way whatever the number of rows and threads (a row
 * is one thread's: RMSNorm's sum is a row's). With `threads` > 1 and enough elements (below) the
 * rows are shared between threads: in the layer stack these ran on the calling thread while
 * the others waited, 0.6 ms of an 8-token forward (bench/results/2026-11-28-cpu-elementwise/
 * NOTES.md). kernels/skinny.py calls them; the references are models/llama.py's torch expressions.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <omp.h>

#include "skinny_common.h"

/* elements of a call from which its rows are shared between threads, where a parallel region
 * (a few microseconds to enter and leave) costs less than it saves: SiLU-mul from a 4-token
 * step's MLP (6,144 elements; its gates' exp and division per element); RMSNorm, a few
 * operations an element, only from about 30 rows of 576 (at 8 rows, 4,608 elements, the
 * region took longer than one thread's norm: bench/results/2026-11-28-cpu-elementwise/NOTES.md) */
#define SILU_PARALLEL 4096
#define NORM_PARALLEL 16384

/* the threads a call's rows are shared between: at most one a row, one below `least` elements */
static int elem_threads(int64_t rows, int64_t n, int threads, int64_t least) {
    if (rows < 2 || rows * n < least || threads < 2) return 1;
    return threads < rows ? threads : (int)rows;
}

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, rows of n floats: the squares summed in two
 * 8-lane accumulators (elements i .. i + 7 and i + 8 .. i + 15 of each 16; the AVX-512 build holds
 * both in one register), then the 8-lane tail, the lanes, the scalar tail */
static void norm_row(const float *xr, const float *w, float *o, int64_t n, float eps) {
    const int64_t n8 = n & ~(int64_t)7;
    int64_t i = 0;
#ifdef __AVX512F__
    __m512 a = _mm512_setzero_ps();
    for (; i + 16 <= n8; i += 16) {
        const __m512 u = _mm512_loadu_ps(xr + i);
        a = _mm512_fmadd_ps(u, u, a);
    }
    __m256 a0 = _mm512_castps512_ps256(a), a1 = _mm512_extractf32x8_ps(a, 1);
#else
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (; i + 16 <= n8; i += 16) {
        const __m256 u = _mm256_loadu_ps(xr + i), v = _mm256_loadu_ps(xr + i + 8);
        a0 = _mm256_fmadd_ps(u, u, a0);
        a1 = _mm256_fmadd_ps(v, v, a1);
    }
#endif
    for (; i < n8; i += 8) {
        const __m256 u = _mm256_loadu_ps(xr + i);
        a0 = _mm256_fmadd_ps(u, u, a0);
    }
    float ss = hsum8(_mm256_add_ps(a0, a1));
    for (; i < n; i++) ss += xr[i] * xr[i];
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    i = 0;
#ifdef __AVX512F__
    const __m512 iv16 = _mm512_set1_ps(inv);
    for (; i + 16 <= n8; i += 16)
        _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xr + i), iv16), _mm512_loadu_ps(w + i)));
#endif
    const __m256 iv = _mm256_set1_ps(inv);
    for (; i < n8; i += 8)
        _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), iv), _mm256_loadu_ps(w + i)));
    for (; i < n; i++) o[i] = xr[i] * inv * w[i];
}

void skinny_rms_norm(const float *x, const float *w, float *out, int64_t rows, int64_t n, float eps, int threads) {
    const int nt = elem_threads(rows, n, threads, NORM_PARALLEL);
    if (nt == 1) { /* no parallel region at all: entering one, even of one thread, costs about a microsecond */
        for (int64_t r = 0; r < rows; r++) norm_row(x + r * n, w, out + r * n, n, eps);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < rows; r++) norm_row(x + r * n, w, out + r * n, n, eps);
}

/* out (rows, n) = silu(gu[:, :n]) * gu[:, n:], gu (rows, 2n): sigmoid(g) from e = e^-|g| as
 * 1 / (1 + e) for g >= 0 and e / (1 + e) below, so nothing overflows */
static void silu_row(const float *g, float *o, int64_t n) {
    const float *u = g + n;
    const int64_t n8 = n & ~(int64_t)7;
    int64_t i = 0;
#ifdef __AVX512F__
    {
        const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
        for (; i + 16 <= n8; i += 16) {
            const __m512 gv = _mm512_loadu_ps(g + i);
            const __m512 e = exp_neg16(_mm512_or_ps(gv, sign));
            const __m512 den = _mm512_add_ps(one, e);
            const __m512 num = _mm512_mask_blend_ps(_mm512_movepi32_mask(_mm512_castps_si512(gv)), one, e);
            const __m512 sig = _mm512_div_ps(num, den);
            _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_mul_ps(gv, sig), _mm512_loadu_ps(u + i)));
        }
    }
#endif
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
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

void skinny_silu_mul(const float *gu, float *out, int64_t rows, int64_t n, int threads) {
    const int nt = elem_threads(rows, n, threads, SILU_PARALLEL);
    if (nt == 1) {
        for (int64_t r = 0; r < rows; r++) silu_row(gu + r * 2 * n, out + r * n, n);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < rows; r++) silu_row(gu + r * 2 * n, out + r * n, n);
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
