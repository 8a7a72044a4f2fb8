/* y = x @ W.T (+ b) for few rows of x, fp32, AVX2 + FMA, OpenMP over the rows of W.
 *
 * x (M, K), W (N, K) and y (M, N) are contiguous and row-major; W is nn.Linear's own weight,
 * so no second copy of it is made. W is read from memory once per call whatever M is: its rows
 * are taken C at a time (a tile, which stays in L1 while every row of x passes over it, with
 * one 8-lane accumulator per (row of x, row of W)), and x R rows at a time:
 *   M = 1: 1 x 8 tiles (memory-bound: many rows of W in flight);
 *   M = 2, 3: 2 x 6 and 1 x 6;
 *   M >= 4: 4 x 3 tiles (12 accumulators + 3 rows of W + 1 of x = the 16 AVX2 registers,
 *           7 loads per 12 FMAs), the rest of M in 3 x 3, 2 x 3, 1 x 3;
 * while a tile is computed, the rows of the tile PF_TILES ahead are prefetched into L2 (not L1:
 * software prefetches into L1 hold the core's few L1 miss buffers, so memory could not stream
 * while the tile was computed; measured on a 2-core Zen 4, a 3072 x 576 product at 8 rows took
 * 1.6x its one-row time with L1 prefetches and 1.0x with L2 prefetches, and the one-row product
 * itself got 5-10% faster). Every pass of x over the tile issues them again (a prefetch of a
 * line already on its way costs little, and a burst from the first pass alone left 12-16-row
 * products 1.4x slower than the same product with W in cache). OpenMP threads take
 * contiguous ranges of tiles.
 *
 * Every output y[m, n] is computed by the same sequence of operations whatever M, m and the
 * tile it falls in: acc = fma(x[m, k:k+8], W[n, k:k+8], acc) for k = 0, 8, ... ascending,
 * one fixed horizontal sum, the K % 8 tail in order, then the bias. A row's result therefore
 * does not depend on how many rows the step has (bit for bit), unlike a BLAS that switches
 * kernels with M. kernels/skinny.py builds this file and holds its torch reference.
 */
#include <immintrin.h>
#include <stdint.h>
#include <omp.h>

#include "skinny_common.h"

/* R rows of x (from x, stride K) times the C rows of W in w[] -> y (stride N), columns n..n+nc-1 */
#define TILE(R, C)                                                                                        \
    static inline void tile_##R##x##C(const float *x, const float *const *w, const float *b, float *y,   \
                                      int64_t N, int64_t K, int64_t n, int nc, int64_t pf) {             \
        __m256 acc[R][C];                                                                                 \
        _Pragma("GCC unroll 8") for (int i = 0; i < R; i++)                                              \
            _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) acc[i][j] = _mm256_setzero_ps();          \
        const int64_t K8 = K & ~(int64_t)7;                                                               \
        for (int64_t k = 0; k < K8; k += 8) {                                                             \
            __m256 wv[C];                                                                                 \
            _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) wv[j] = _mm256_loadu_ps(w[j] + k);        \
            if (pf && !(k & 15))                                                                          \
                _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) _mm_prefetch((const char *)(w[j] + k + pf), _MM_HINT_T1); \
            _Pragma("GCC unroll 8") for (int i = 0; i < R; i++) {                                         \
                const __m256 xv = _mm256_loadu_ps(x + i * K + k);                                         \
                _Pragma("GCC unroll 8") for (int j = 0; j < C; j++)                                       \
                    acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);                                    \
            }                                                                                             \
        }                                                                                                 \
        float sum[R][C]; /* constant indices above keep acc in registers */                              \
        _Pragma("GCC unroll 8") for (int i = 0; i < R; i++)                                              \
            _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) sum[i][j] = hsum8(acc[i][j]);             \
        for (int i = 0; i < R; i++)                                                                       \
            for (int j = 0; j < nc; j++) {                                                                \
                float s = sum[i][j];                                                                      \
                for (int64_t k = K8; k < K; k++) s += x[i * K + k] * w[j][k];                            \
                if (b) s += b[n + j];                                                                     \
                y[i * N + n + j] = s;                                                                     \
            }                                                                                             \
    }

/* few rows (M < 4): wide tiles of W, many rows of W in flight per thread (memory-bound) */
#define WIDE 8
TILE(1, 8)
TILE(2, 6)
TILE(1, 6)
/* more rows: 4 x 3 tiles, 12 accumulators + 3 W + 1 x registers: 7 loads per 12 FMAs */
#define NARROW 3
TILE(4, 3)
TILE(3, 3)
TILE(2, 3)
TILE(1, 3)

/* how many tiles ahead the rows of W are prefetched */
#define PF_TILES 2

/* rows n0..n1 of W (n0 a multiple of C = tile_cols(M)) */
static int tile_cols(int64_t M) { return M == 1 ? WIDE : M < 4 ? 6 : NARROW; }

static void rows(const float *x, const float *W, const float *b, float *y, int64_t M, int64_t N, int64_t K,
                 int64_t n0, int64_t n1) {
    const int C = tile_cols(M);
    for (int64_t n = n0; n < n1; n += C) {
        const int nc = n1 - n < C ? (int)(n1 - n) : C;
        const float *w[WIDE];
        for (int j = 0; j < WIDE; j++) w[j] = W + (n + (j < nc ? j : 0)) * K; /* past the tile: row n again */
        const int64_t PF = n + (PF_TILES + 1) * C <= n1 ? PF_TILES * C * K : 0; /* while that tile is ours */
        int64_t m = 0;
        if (M == 1) {
            tile_1x8(x, w, b, y, N, K, n, nc, PF);
        } else if (M < 4) {
            for (; m + 2 <= M; m += 2) tile_2x6(x + m * K, w, b, y + m * N, N, K, n, nc, PF);
            if (m < M) tile_1x6(x + m * K, w, b, y + m * N, N, K, n, nc, PF);
        } else {
            for (; m + 4 <= M; m += 4) tile_4x3(x + m * K, w, b, y + m * N, N, K, n, nc, PF);
            if (M - m == 3) tile_3x3(x + m * K, w, b, y + m * N, N, K, n, nc, PF);
            else if (M - m == 2) tile_2x3(x + m * K, w, b, y + m * N, N, K, n, nc, PF);
            else if (M - m == 1) tile_1x3(x + m * K, w, b, y + m * N, N, K, n, nc, PF);
        }
    }
}

void skinny_linear(const float *x, const float *W, const float *b, float *y, int64_t M, int64_t N, int64_t K,
                   int threads) {
    const int64_t C = tile_cols(M), tiles = (N + C - 1) / C;
    if (threads > tiles) threads = (int)tiles;
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads(threads)
    {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t n0 = tiles * t / nt * C, n1e = tiles * (t + 1) / nt * C;
        const int64_t n1 = n1e < N ? n1e : N;
        if (n0 < n1) rows(x, W, b, y, M, N, K, n0, n1);
    }
}
