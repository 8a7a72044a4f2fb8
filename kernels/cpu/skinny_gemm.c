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
#include <math.h>
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

/* ---- The LM head's greedy answer, screened in bf16 (skinny_head_topk) ----
 *
 * Greedy decoding needs of the LM head only each row's argmax (and, for proposers that learn
 * from it, its top-k), not its logits. The head is the step's largest product (the vocabulary
 * is 85 times the hidden size here), so it is screened first at half the bytes and twice the
 * multiply rate: z'[r, v] = bf16(h[r]) . Wb[v] with AVX512-BF16's dot product (Wb = bf16(W),
 * both rounded to nearest even), and |z' - z| <= B[r, v] for the exact fp32 logit z, where
 * (a Cauchy-Schwarz bound on each rounding, h.(w - w') + (h - h').w', plus fp32 accumulation)
 *   B = (|h| |w - w'| + |h - h'| |w'| + 2e-5 |h| |w|) (1 + 2^-10) + 1e-30.
 * L = the k-th largest of z' - B is then at most the k-th largest exact logit, so only the
 * tokens with z' + B >= L can be in the top-k. Those (a handful) are computed exactly by the
 * same tile as skinny_linear at one row, so the answer is the top-k of skinny_linear(h, W)
 * itself, bit for bit: equal values in index order, independent of M. A row whose screen is
 * not finite is left to the caller (status 1 in bad[r]). */
#if defined(__AVX512BF16__)
#define HEAD_PF_TILES 2

/* R rows of hb (bf16, stride K) times C rows of Wb from wb[] -> z (stride N), columns n.. */
#define HTILE(R, C)                                                                                       \
    static inline void htile_##R##x##C(const uint16_t *hb, const uint16_t *const *wb, float *z, int64_t N,  \
                                       int64_t K, int64_t n, int nc, int64_t pf) {                        \
        __m512 acc[R][C];                                                                                 \
        _Pragma("GCC unroll 8") for (int i = 0; i < R; i++)                                              \
            _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) acc[i][j] = _mm512_setzero_ps();          \
        const int64_t K32 = K & ~(int64_t)31;                                                             \
        for (int64_t k = 0; k < K32; k += 32) {                                                           \
            __m512i wv[C];                                                                                \
            _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) {                                        \
                wv[j] = _mm512_loadu_si512((const void *)(wb[j] + k));                                    \
                KEEP_IN_REGISTER(wv[j]);                                                                  \
            }                                                                                             \
            if (pf && !(k & 31))                                                                          \
                _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) _mm_prefetch((const char *)(wb[j] + k + pf), _MM_HINT_T1); \
            _Pragma("GCC unroll 8") for (int i = 0; i < R; i++) {                                         \
                const __m512bh xv = (__m512bh)_mm512_loadu_si512((const void *)(hb + i * K + k));         \
                _Pragma("GCC unroll 8") for (int j = 0; j < C; j++)                                       \
                    acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, (__m512bh)wv[j]);                         \
            }                                                                                             \
        }                                                                                                 \
        float sum[R][C];                                                                                  \
        vsums(&acc[0][0], R * C, &sum[0][0]);                                                             \
        for (int i = 0; i < R; i++)                                                                       \
            for (int j = 0; j < nc; j++) {                                                                \
                float s = sum[i][j];                                                                      \
                for (int64_t k = K32; k < K; k++)                                                         \
                    s += bf16_to_f32(hb[i * K + k]) * bf16_to_f32(wb[j][k]);                              \
                z[i * N + n + j] = s;                                                                     \
            }                                                                                             \
    }

static inline float bf16_to_f32(uint16_t b) {
    union { uint32_t u; float f; } c = {(uint32_t)b << 16};
    return c.f;
}

HTILE(1, 8)
HTILE(2, 8)
HTILE(4, 6)
HTILE(3, 6)
HTILE(2, 6)
HTILE(1, 6)

/* z' for rows of Wb n0..n1 (n0 a multiple of the tile width) */
static void head_screen_rows(const uint16_t *hb, const uint16_t *Wb, float *z, int64_t M, int64_t N, int64_t K,
                             int64_t n0, int64_t n1) {
    const int C = tile_cols(M);
    for (int64_t n = n0; n < n1; n += C) {
        const int nc = n1 - n < C ? (int)(n1 - n) : C;
        const uint16_t *w[MAX_C];
        for (int j = 0; j < MAX_C; j++) w[j] = Wb + (n + (j < nc ? j : 0)) * K;
        int64_t PF = n + (HEAD_PF_TILES + 1) * C <= n1 ? HEAD_PF_TILES * C * K : 0;
        int64_t m = 0;
        if (M == 1) {
            htile_1x8(hb, w, z, N, K, n, nc, PF);
        } else if (M < MID_ROWS) {
            for (; m + 2 <= M; m += 2) htile_2x8(hb + m * K, w, z + m * N, N, K, n, nc, PF);
            if (m < M) htile_1x8(hb + m * K, w, z + m * N, N, K, n, nc, PF);
        } else {
            for (; m + 4 <= M; m += 4) htile_4x6(hb + m * K, w, z + m * N, N, K, n, nc, PF);
            if (M - m == 3) htile_3x6(hb + m * K, w, z + m * N, N, K, n, nc, PF);
            else if (M - m == 2) htile_2x6(hb + m * K, w, z + m * N, N, K, n, nc, PF);
            else if (M - m == 1) htile_1x6(hb + m * K, w, z + m * N, N, K, n, nc, PF);
        }
    }
}

/* insert v (index i) into the sorted (descending) val/idx of `*filled` <= k entries: after every
 * kept value >= v, so equal values stay in index order when indices arrive ascending */
static inline void head_push(float *val, int64_t *idx, int *filled, int k, float v, int64_t i) {
    int p = *filled < k ? *filled : k - 1;
    while (p > 0 && val[p - 1] < v) {
        if (p < k) {
            val[p] = val[p - 1];
            if (idx) idx[p] = idx[p - 1];
        }
        p--;
    }
    val[p] = v;
    if (idx) idx[p] = i;
    if (*filled < k) (*filled)++;
}

/* one row: the top-k of the exact logits among the screen's candidates; 0, or 1 when the screen
 * is not finite. cand: N indices of room. */
static int head_row(const float *h, const float *W, const float *zr, const float *e, const float *wbn,
                    const float *wfn, float hn, float dn, int64_t N, int64_t K, int k, int64_t *out,
                    int64_t *cand, int64_t *n_cand) {
    const float safe = 1.0f + 0x1p-10f;
    const __m512 va = _mm512_set1_ps(hn * safe), vb = _mm512_set1_ps(dn * safe),
                 vc = _mm512_set1_ps(2e-5f * hn * safe), tiny = _mm512_set1_ps(1e-30f);
#define HEAD_BOUND(v) _mm512_add_ps(_mm512_fmadd_ps(va, _mm512_loadu_ps(e + (v)), _mm512_fmadd_ps(             \
        vb, _mm512_loadu_ps(wbn + (v)), _mm512_fmadd_ps(vc, _mm512_loadu_ps(wfn + (v)), tiny))), tiny)
    /* pass 1: L = the k-th largest z' - B (and the screen is finite) */
    float lo[64];
    int filled = 0;
    const int64_t N16 = N & ~(int64_t)15;
    __m512 bad = _mm512_setzero_ps();
    for (int64_t v = 0; v < N16; v += 16) {
        const __m512 zv = _mm512_loadu_ps(zr + v), l = _mm512_sub_ps(zv, HEAD_BOUND(v));
        bad = _mm512_or_ps(bad, _mm512_sub_ps(zv, zv)); /* 0 where finite, NaN elsewhere */
        __mmask16 m = filled < k ? 0xffff : _mm512_cmp_ps_mask(l, _mm512_set1_ps(lo[k - 1]), _CMP_GT_OQ);
        if (!m) continue;
        float ls[16];
        _mm512_storeu_ps(ls, l);
        while (m) {
            const int j = __builtin_ctz(m);
            m &= m - 1;
            if (filled < k || ls[j] > lo[k - 1]) head_push(lo, NULL, &filled, k, ls[j], v + j);
        }
    }
    for (int64_t v = N16; v < N; v++) {
        const float b = (hn * e[v] + dn * wbn[v] + 2e-5f * hn * wfn[v]) * safe + 2e-30f;
        if (!isfinite(zr[v])) return 1;
        if (filled < k || zr[v] - b > lo[k - 1]) head_push(lo, NULL, &filled, k, zr[v] - b, v);
    }
    if (_mm512_cmp_ps_mask(bad, bad, _CMP_UNORD_Q)) return 1;
    const float L = lo[k - 1];
    /* pass 2: the candidates, z' + B >= L, in index order */
    int64_t nc = 0;
    for (int64_t v = 0; v < N16; v += 16) {
        __mmask16 m = _mm512_cmp_ps_mask(_mm512_add_ps(_mm512_loadu_ps(zr + v), HEAD_BOUND(v)), _mm512_set1_ps(L),
                                         _CMP_GE_OQ);
        while (m) {
            cand[nc++] = v + __builtin_ctz(m);
            m &= m - 1;
        }
    }
    for (int64_t v = N16; v < N; v++)
        if (zr[v] + (hn * e[v] + dn * wbn[v] + 2e-5f * hn * wfn[v]) * safe + 2e-30f >= L) cand[nc++] = v;
#undef HEAD_BOUND
    *n_cand = nc;
    /* pass 3: their exact logits, 8 at a time by skinny_linear's one-row tile; the top-k */
    float val[64];
    filled = 0;
    for (int64_t c = 0; c < nc; c += 8) {
        const int cn = nc - c < 8 ? (int)(nc - c) : 8;
        const float *w[MAX_C];
        float y[8];
        for (int j = 0; j < MAX_C; j++) w[j] = W + cand[c + (j < cn ? j : 0)] * K;
        TILE_ONE(h, w, NULL, y, 8, K, 0, cn, 0);
        for (int j = 0; j < cn; j++)
            if (filled < k || y[j] > val[k - 1]) head_push(val, out, &filled, k, y[j], cand[c + j]);
    }
    return filled < k; /* fewer candidates than k: cannot happen with a finite screen */
}

/* idx (M, k) = the top-k of each row of h (M, K) @ W (N, K).T as skinny_linear computes it,
 * largest first, equal values in index order; hb = bf16(h), Wb = bf16(W); hn[r] = |h[r]|,
 * dn[r] = |h[r] - hb[r]|, e[v] = |W[v] - Wb[v]|, wbn[v] = |Wb[v]|, wfn[v] = |W[v]| (2-norms);
 * z: (M, N) scratch; cand: (threads, N) scratch; bad[r] = 1 where the row is left to the
 * caller; n_cand[r]: the candidates computed exactly. Returns 0, or -1 when k is out of range. */
int skinny_head_topk(const float *h, const uint16_t *hb, const float *W, const uint16_t *Wb, const float *hn,
                     const float *dn, const float *e, const float *wbn, const float *wfn, int64_t M, int64_t N,
                     int64_t K, int k, float *z, int64_t *cand, int64_t *idx, int64_t *bad, int64_t *n_cand,
                     int threads) {
    if (k < 1 || k > 64 || k > N) return -1;
    const int64_t C = tile_cols(M), tiles = (N + C - 1) / C;
    int nt_screen = threads > tiles ? (int)tiles : threads;
    if (nt_screen < 1) nt_screen = 1;
#pragma omp parallel num_threads(nt_screen)
    {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t n0 = tiles * t / nt * C, n1e = tiles * (t + 1) / nt * C;
        const int64_t n1 = n1e < N ? n1e : N;
        if (n0 < n1) head_screen_rows(hb, Wb, z, M, N, K, n0, n1);
    }
    int nt_rows = threads > M ? (int)M : threads;
    if (nt_rows < 1) nt_rows = 1;
#pragma omp parallel for num_threads(nt_rows) schedule(static)
    for (int64_t r = 0; r < M; r++)
        bad[r] = head_row(h + r * K, W, z + r * N, e, wbn, wfn, hn[r], dn[r], N, K, k, idx + r * k,
                          cand + (int64_t)omp_get_thread_num() * N, n_cand + r);
    return 0;
}

int skinny_head_available(void) { return 1; }
#else
int skinny_head_topk(const float *h, const uint16_t *hb, const float *W, const uint16_t *Wb, const float *hn,
                     const float *dn, const float *e, const float *wbn, const float *wfn, int64_t M, int64_t N,
                     int64_t K, int k, float *z, int64_t *cand, int64_t *idx, int64_t *bad, int64_t *n_cand,
                     int threads) {
    (void)h; (void)hb; (void)W; (void)Wb; (void)hn; (void)dn; (void)e; (void)wbn; (void)wfn; (void)M; (void)N;
    (void)K; (void)k; (void)z; (void)cand; (void)idx; (void)bad; (void)n_cand; (void)threads;
    return -2;
}

int skinny_head_available(void) { return 0; } /* built without AVX512-BF16 */
#endif
