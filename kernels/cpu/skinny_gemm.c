/* y = x @ W.T (+ b) for few rows of x, fp32, OpenMP over the rows of W. Built twice by
 * kernels/skinny.py: with AVX2 + FMA (8-lane vectors) and, for CPUs that have it, with AVX-512
 * (16-lane vectors, 32 registers); the preprocessor picks the tiles below.
 *
 * x (M, K), W (N, K) and y (M, N) are contiguous and row-major; W is nn.Linear's own weight,
 * so no second copy of it is made. W is read from memory once per call whatever M is: its rows
 * are taken C at a time (a tile, which stays in L1 while every row of x passes over it, with
 * one vector accumulator per (row of x, row of W)), and x R rows at a time. The tile shapes
 * use the registers there are (accumulators + C rows of W + 1 of x):
 *   AVX2 (16 registers):   M = 1: 1 x 8; M = 2, 3: 2 x 6 and 1 x 6; M >= 4: 4 x 3 (7 loads per
 *                          12 FMAs), the rest of M in 3 x 3, 2 x 3, 1 x 3;
 *   AVX-512 (32 registers): M = 1: 1 x 8; M = 2 .. 7: 2 x 8 and 1 x 8 (still memory-bound: 8 rows
 *                          of W in flight); M >= 8: 4 x 6 (10 loads per 24 FMAs), the rest of M
 *                          in 3 x 6, 2 x 6, 1 x 6.
 * In the AVX-512 build the C rows of W of a k step are loaded into registers once and kept
 * there for the R rows of x (an empty asm statement stops the compiler from folding them back
 * into each FMA as a memory operand, which reloads W for every row of x). While a tile is computed, the rows of
 * the tile PF_TILES ahead are prefetched into L2 (not L1: software prefetches into L1 hold the
 * core's few L1 miss buffers, so memory could not stream while the tile was computed); every
 * pass of x over the tile issues them again (a burst from the first pass alone left 12-16-row
 * products slower than with W in cache). OpenMP threads take contiguous ranges of tiles.
 *
 * Every output y[m, n] is computed by the same sequence of operations whatever M, m and the
 * tile it falls in: acc = fma(x[m, k:k+V], W[n, k:k+V], acc) for k = 0, V, ... ascending
 * (V = 8 or 16 lanes), one fixed horizontal sum, the K % V tail in order, then the bias. A
 * row's result therefore does not depend on how many rows the step has (bit for bit), unlike a
 * BLAS that switches kernels with M. The two builds sum in different orders and so differ from
 * each other by rounding. kernels/skinny.py builds this file and holds its torch reference.
 */
#include <immintrin.h>
#include <stdint.h>
#include <omp.h>

#include "skinny_common.h"

#if defined(__AVX512F__)
typedef __m512 vec;
#define V 16
#define VZERO _mm512_setzero_ps
#define VLOAD _mm512_loadu_ps
#define VFMA _mm512_fmadd_ps
/* an empty asm statement: the compiler must hold v in a register rather than fold its load into
 * each FMA (32 registers leave room for a tile's rows of W) */
#define KEEP_IN_REGISTER(v) __asm__("" : "+v"(v))
/* The lane sums of 16 accumulators a[0..15] into out[0..15], all at once: four levels of
 * cross-vector shuffles and adds (15 adds and 30 shuffles for 16 sums, where one vector at a
 * time takes about 9 instructions per sum; the products gained 0-3% from it on a Zen 4, whose
 * FMAs, not these sums, bound a tile: bench/results/2026-11-26-cpu-roofline/NOTES.md). Every
 * lane is summed in the one fixed order of a single 16-lane sum: lanes i + (i + 8), then
 * + (i + 4), then (0 + 2) + (1 + 3), i.e. the two 256-bit halves added, then the AVX2
 * build's hsum8; so which accumulators share a call changes no result. */
static inline __m512 halves2(__m512 a, __m512 b) { /* [a.lo256 + a.hi256 | b.lo256 + b.hi256] */
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
static inline __m512 quarters4(__m512 ab, __m512 cd) { /* 128-bit lane k: accumulator k's 4 partial sums */
    return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
}
static inline __m512 pairs8(__m512 s1, __m512 s2) { /* lane k: [s1_0+s1_2, s1_1+s1_3, s2_0+s2_2, s2_1+s2_3] */
    return _mm512_add_ps(_mm512_shuffle_ps(s1, s2, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(s1, s2, _MM_SHUFFLE(3, 2, 3, 2)));
}
static inline void vsum16(const __m512 *a, float *out) {
    const __m512 t1 = pairs8(quarters4(halves2(a[0], a[1]), halves2(a[2], a[3])),
                             quarters4(halves2(a[4], a[5]), halves2(a[6], a[7])));
    const __m512 t2 = pairs8(quarters4(halves2(a[8], a[9]), halves2(a[10], a[11])),
                             quarters4(halves2(a[12], a[13]), halves2(a[14], a[15])));
    /* 128-bit lane k, slot j: accumulator k + 4 j */
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(t1, t2, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(t1, t2, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, r));
}
/* the sums of n accumulators (n a compile-time constant after inlining), 16 at a time; a last
 * partial group repeats accumulators in its empty places (their sums are dropped) */
static inline void vsums(const __m512 *a, int n, float *out) {
    for (int g = 0; g < n; g += 16) {
        __m512 grp[16];
        float buf[16];
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) grp[i] = a[g + (g + i < n ? i : 0)];
        vsum16(grp, buf);
        for (int i = 0; i < 16 && g + i < n; i++) out[g + i] = buf[i];
    }
}
#else
typedef __m256 vec;
#define V 8
#define VZERO _mm256_setzero_ps
#define VLOAD _mm256_loadu_ps
#define VFMA _mm256_fmadd_ps
#define KEEP_IN_REGISTER(v) /* 16 registers: tiles of more than 3 rows of W fold them into the FMAs */
static inline void vsums(const __m256 *a, int n, float *out) {
    for (int i = 0; i < n; i++) out[i] = hsum8(a[i]);
}
#endif

/* R rows of x (from x, stride K) times the C rows of W in w[] -> y (stride N), columns n..n+nc-1 */
#define TILE(R, C)                                                                                        \
    static inline void tile_##R##x##C(const float *x, const float *const *w, const float *b, float *y,   \
                                      int64_t N, int64_t K, int64_t n, int nc, int64_t pf) {             \
        vec acc[R][C];                                                                                    \
        _Pragma("GCC unroll 8") for (int i = 0; i < R; i++)                                              \
            _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) acc[i][j] = VZERO();                      \
        const int64_t KV = K & ~(int64_t)(V - 1);                                                         \
        for (int64_t k = 0; k < KV; k += V) {                                                             \
            vec wv[C];                                                                                    \
            _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) {                                        \
                wv[j] = VLOAD(w[j] + k);                                                                  \
                KEEP_IN_REGISTER(wv[j]);                                                                  \
            }                                                                                             \
            if (pf && !(k & 15))                                                                          \
                _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) _mm_prefetch((const char *)(w[j] + k + pf), _MM_HINT_T1); \
            _Pragma("GCC unroll 8") for (int i = 0; i < R; i++) {                                         \
                const vec xv = VLOAD(x + i * K + k);                                                      \
                _Pragma("GCC unroll 8") for (int j = 0; j < C; j++)                                       \
                    acc[i][j] = VFMA(xv, wv[j], acc[i][j]);                                               \
            }                                                                                             \
        }                                                                                                 \
        float sum[R][C];                                                                                  \
        vsums(&acc[0][0], R * C, &sum[0][0]);                                                             \
        for (int i = 0; i < R; i++)                                                                       \
            for (int j = 0; j < nc; j++) {                                                                \
                float s = sum[i][j];                                                                      \
                for (int64_t k = KV; k < K; k++) s += x[i * K + k] * w[j][k];                            \
                if (b) s += b[n + j];                                                                     \
                y[i * N + n + j] = s;                                                                     \
            }                                                                                             \
    }

#if defined(__AVX512F__)
#define WIDE 8  /* M = 1 */
#define MID 8   /* M = 2 .. 7 */
#define NARROW 6 /* M >= 8 */
#define MID_ROWS 8 /* fewer rows than this: the MID tiles, more rows of W in flight (memory-bound) */
TILE(1, 8)
TILE(2, 8)
TILE(4, 6)
TILE(3, 6)
TILE(2, 6)
TILE(1, 6)
#define TILE_ONE tile_1x8
#define TILE_MID2 tile_2x8
#define TILE_MID1 tile_1x8
#define TILE_4 tile_4x6
#define TILE_3 tile_3x6
#define TILE_2 tile_2x6
#define TILE_1 tile_1x6
#else
#define WIDE 8
#define MID 6
#define NARROW 3
#define MID_ROWS 4
TILE(1, 8)
TILE(2, 6)
TILE(1, 6)
TILE(4, 3)
TILE(3, 3)
TILE(2, 3)
TILE(1, 3)
#define TILE_ONE tile_1x8
#define TILE_MID2 tile_2x6
#define TILE_MID1 tile_1x6
#define TILE_4 tile_4x3
#define TILE_3 tile_3x3
#define TILE_2 tile_2x3
#define TILE_1 tile_1x3
#endif
#define MAX_C 8 /* the widest tile of either build */


/* how many tiles ahead the rows of W are prefetched */
#define PF_TILES 2

static int tile_cols(int64_t M) { return M == 1 ? WIDE : M < MID_ROWS ? MID : NARROW; }

/* rows n0..n1 of W (n0 a multiple of C = tile_cols(M)) */
static void rows(const float *x, const float *W, const float *b, float *y, int64_t M, int64_t N, int64_t K,
                 int64_t n0, int64_t n1) {
    const int C = tile_cols(M);
    for (int64_t n = n0; n < n1; n += C) {
        const int nc = n1 - n < C ? (int)(n1 - n) : C;
        const float *w[MAX_C];
        for (int j = 0; j < MAX_C; j++) w[j] = W + (n + (j < nc ? j : 0)) * K; /* past the tile: row n again */
        int64_t PF = n + (PF_TILES + 1) * C <= n1 ? PF_TILES * C * K : 0; /* while that tile is ours */
        int64_t m = 0;
        if (M == 1) {
            TILE_ONE(x, w, b, y, N, K, n, nc, PF);
        } else if (M < MID_ROWS) {
            for (; m + 2 <= M; m += 2) TILE_MID2(x + m * K, w, b, y + m * N, N, K, n, nc, PF);
            if (m < M) TILE_MID1(x + m * K, w, b, y + m * N, N, K, n, nc, PF);
        } else {
            for (; m + 4 <= M; m += 4) TILE_4(x + m * K, w, b, y + m * N, N, K, n, nc, PF);
            if (M - m == 3) TILE_3(x + m * K, w, b, y + m * N, N, K, n, nc, PF);
            else if (M - m == 2) TILE_2(x + m * K, w, b, y + m * N, N, K, n, nc, PF);
            else if (M - m == 1) TILE_1(x + m * K, w, b, y + m * N, N, K, n, nc, PF);
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
