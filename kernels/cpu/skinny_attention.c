/* Attention of a few query rows (a decoding step) over one sequence's paged KV cache, fp32,
 * AVX2 + FMA, OpenMP over (kv head, query row) tasks.
 *
 * q      row t, head h at q[t * q_stride + h * D], D a multiple of 8
 * cache  k / v: the layer's pool [num_blocks, block_size, KV, D], contiguous; key j of the
 *        sequence lives in block blocks[j / block_size], offset j % block_size
 * mask   (T, L) bytes, nonzero = visible; NULL = every key visible to every row, except with
 *        causal: row t sees keys j <= t + L - T
 * out    (T, H, D) contiguous
 *
 * A task is one query row and the H / KV query heads that share a kv head. Pass 1 writes the
 * scaled scores, four keys at a time, hidden keys -inf; then the softmax (a max, exp by a
 * polynomial, a sum); pass 2 the probability-weighted sum of the value rows in 64-float
 * chunks held in registers, skipping keys of probability 0. A row's result does not depend on the other
 * rows of the step. kernels/skinny.py calls it; kernels/tree_attention.py holds the reference.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <omp.h>

#include "skinny_common.h"

#define MAXG 16 /* query heads per kv head, at most */

static void row_group(const float *q, int64_t q_stride, int T, int H, int KV, int D, const float *kc,
                      const float *vc, const int64_t *off, int64_t L, const uint8_t *mask, int causal,
                      float scale, float *out, int t, int kvh, float *s /* G x L */) {
    const int G = H / KV;
    const float *qt = q + t * q_stride + (int64_t)kvh * G * D;
    const float *kh = kc + (int64_t)kvh * D, *vh = vc + (int64_t)kvh * D;
    const uint8_t *vis = mask ? mask + (int64_t)t * L : NULL;
    const int64_t last = causal && !mask ? t + L - T : L - 1; /* keys after it are hidden */
    /* pass 1: scores, four keys at a time (four independent FMA chains) */
    for (int64_t j = 0; j < L; j += 4) {
        const int nk = L - j < 4 ? (int)(L - j) : 4;
        const float *k0 = kh + off[j], *k1 = kh + off[j + (nk > 1)], *k2 = kh + off[j + (nk > 2 ? 2 : 0)],
                    *k3 = kh + off[j + (nk > 3 ? 3 : 0)];
        for (int g = 0; g < G; g++) {
            const float *qg = qt + g * D;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < D; d += 8) {
                const __m256 qv = _mm256_loadu_ps(qg + d);
                a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
                a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
                a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
                a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
            }
            const float sc[4] = {hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)};
            for (int i = 0; i < nk; i++) {
                const int64_t jj = j + i;
                s[g * L + jj] = (jj > last || (vis && !vis[jj])) ? -INFINITY : sc[i] * scale;
            }
        }
    }
    for (int g = 0; g < G; g++) {
        float *sg = s + g * L;
        float *og = out + ((int64_t)t * H + (int64_t)kvh * G + g) * D;
        float mx = -INFINITY;
        for (int64_t j = 0; j < L; j++) mx = sg[j] > mx ? sg[j] : mx;
        if (mx == -INFINITY) { /* no visible key: zeros */
            for (int d = 0; d < D; d++) og[d] = 0.0f;
            continue;
        }
        /* softmax numerators; hidden keys get exactly 0 */
        const __m256 m = _mm256_set1_ps(mx), ninf = _mm256_set1_ps(-INFINITY);
        __m256 tot = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 8 <= L; j += 8) {
            const __m256 raw = _mm256_loadu_ps(sg + j);
            const __m256 p = _mm256_and_ps(exp_neg(_mm256_sub_ps(raw, m)), _mm256_cmp_ps(raw, ninf, _CMP_NEQ_OQ));
            _mm256_storeu_ps(sg + j, p);
            tot = _mm256_add_ps(tot, p);
        }
        float total = hsum8(tot);
        for (; j < L; j++) {
            const float p = sg[j] == -INFINITY ? 0.0f : expf(sg[j] - mx);
            sg[j] = p;
            total += p;
        }
        /* pass 2: the weighted sum of value rows, 64 floats (8 registers) at a time */
        const __m256 inv = _mm256_set1_ps(1.0f / total);
        for (int d0 = 0; d0 < D; d0 += 64) {
            const int dn = D - d0 < 64 ? (D - d0) / 8 : 8;
            __m256 acc[8];
            _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
            for (int64_t jj = 0; jj < L; jj++) {
                if (sg[jj] == 0.0f) continue; /* hidden (or underflowed): adds nothing */
                const __m256 p = _mm256_set1_ps(sg[jj]);
                const float *vj = vh + off[jj] + d0;
                if (dn == 8) {
                    _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++)
                        acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 8 * c), acc[c]);
                } else {
                    for (int c = 0; c < dn; c++) acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 8 * c), acc[c]);
                }
            }
            for (int c = 0; c < dn; c++) _mm256_storeu_ps(og + d0 + 8 * c, _mm256_mul_ps(acc[c], inv));
        }
    }
}

/* returns 0, or -1 when a buffer could not be allocated (out is then incomplete) */
int skinny_attention(const float *q, int64_t q_stride, int T, int H, int KV, int D, const float *kc,
                     const float *vc, const int32_t *blocks, int bs, int64_t L, const uint8_t *mask, int causal,
                     float scale, float *out, int threads) {
    const int G = H / KV;
    const int64_t tasks = (int64_t)T * KV;
    if (G > MAXG || D % 8) return -2;
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(L > 0 ? L : 1)); /* key j's row in the pool */
    if (!off) return -1;
    for (int64_t b = 0, j = 0; j < L; b++)
        for (int o = 0; o < bs && j < L; o++, j++) off[j] = ((int64_t)blocks[b] * bs + o) * KV * D;
    if (threads > tasks) threads = (int)tasks;
    if (threads < 1) threads = 1;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float *s = malloc(sizeof(float) * (size_t)G * (size_t)(L > 0 ? L : 1));
        failed = s == NULL;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < tasks; i++)
            if (s)
                row_group(q, q_stride, T, H, KV, D, kc, vc, off, L, mask, causal, scale, out, (int)(i / KV),
                          (int)(i % KV), s);
        free(s);
    }
    free(off);
    return failed ? -1 : 0;
}
