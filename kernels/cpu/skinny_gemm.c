/* y = x @ W.T (+ b) for few rows of x, fp32, AVX2 + FMA, OpenMP over the rows of W.
 *
 * x (M, K), W (N, K) and y (M, N) are contiguous and row-major; W is nn.Linear's own weight,
 * so no second copy of it is made. The rows of W are taken NB at a time (a tile stays in L1
 * while every row of x passes over it) and x up to MB rows at a time, with one 8-lane
 * accumulator per (row of x, row of W): W is read from memory once per call whatever M is.
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

#ifndef NB
#define NB 6 /* rows of W per tile */
#endif
#ifndef MB
#define MB 2 /* rows of x per tile, at most */
#endif

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* MB rows of x (from x, stride K) times the NB rows of W in w[] -> y (stride N), columns n..n+nb-1 */
#define TILE(R)                                                                                          \
    static inline void tile##R(const float *x, const float *const *w, const float *b, float *y,         \
                                int64_t N, int64_t K, int64_t n, int nb) {                               \
        __m256 acc[R][NB];                                                                               \
        _Pragma("GCC unroll 8") for (int i = 0; i < R; i++)                                              \
            _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++) acc[i][j] = _mm256_setzero_ps();         \
        const int64_t K8 = K & ~(int64_t)7;                                                               \
        for (int64_t k = 0; k < K8; k += 8) {                                                             \
            __m256 wv[NB];                                                                                \
            _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++) wv[j] = _mm256_loadu_ps(w[j] + k);       \
            _Pragma("GCC unroll 8") for (int i = 0; i < R; i++) {                                        \
                const __m256 xv = _mm256_loadu_ps(x + i * K + k);                                         \
                _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++)                                      \
                    acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);                                    \
            }                                                                                             \
        }                                                                                                 \
        float sum[R][NB]; /* constant indices above keep acc in registers */                             \
        _Pragma("GCC unroll 8") for (int i = 0; i < R; i++)                                              \
            _Pragma("GCC unroll 8") for (int j = 0; j < NB; j++) sum[i][j] = hsum8(acc[i][j]);            \
        for (int i = 0; i < R; i++)                                                                      \
            for (int j = 0; j < nb; j++) {                                                                \
                float s = sum[i][j];                                                                      \
                for (int64_t k = K8; k < K; k++) s += x[i * K + k] * w[j][k];                            \
                if (b) s += b[n + j];                                                                     \
                y[i * N + n + j] = s;                                                                     \
            }                                                                                             \
    }

TILE(1)
TILE(2)
TILE(3)

static void rows(const float *x, const float *W, const float *b, float *y, int64_t M, int64_t N, int64_t K,
                 int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n += NB) {
        const int nb = n1 - n < NB ? (int)(n1 - n) : NB;
        const float *w[NB];
        for (int j = 0; j < NB; j++) w[j] = W + (n + (j < nb ? j : 0)) * K; /* a short tile repeats row n */
        int64_t m = 0;
#if MB >= 3
        for (; m + 3 <= M; m += 3) tile3(x + m * K, w, b, y + m * N, N, K, n, nb);
#endif
        for (; m + 2 <= M; m += 2) tile2(x + m * K, w, b, y + m * N, N, K, n, nb);
        if (m < M) tile1(x + m * K, w, b, y + m * N, N, K, n, nb);
    }
}

int skinny_tile_rows(void) { return NB; }

void skinny_linear(const float *x, const float *W, const float *b, float *y, int64_t M, int64_t N, int64_t K,
                   int threads) {
    const int64_t tiles = (N + NB - 1) / NB;
    if (threads > tiles) threads = (int)tiles;
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads(threads)
    {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t n0 = tiles * t / nt * NB, n1e = tiles * (t + 1) / nt * NB;
        const int64_t n1 = n1e < N ? n1e : N;
        if (n0 < n1) rows(x, W, b, y, M, N, K, n0, n1);
    }
}
