/* Causal attention of a prefill chunk's rows (tens to thousands) over one sequence's paged KV
 * cache, fp32, blocked like FlashAttention: a block of queries against the keys a chunk at a
 * time, its scores kept in L1 and its running softmax state per query. AVX-512 (16 lanes, 32
 * registers) or AVX2 + FMA (8 lanes, 16 registers), OpenMP over (kv head, row block) tasks.
 *
 * q      row t, head h at q[t * q_stride + h * D], D a multiple of PREFILL_DIM_MULTIPLE
 * cache  k / v: the layer's pool [num_blocks, block_size, KV, D], contiguous; key j of the
 *        sequence lives in block blocks[j / block_size], offset j % block_size
 * rule   row t sees keys j <= t + L - T (L >= T keys: a committed prefix of L - T, then the rows)
 * out    (T, H, D) contiguous
 * work   prefill_attention_work(L, KV, D) floats: the keys transposed and the values, per kv head
 *
 * Why a kernel of its own: torch's SDPA runs a 2,000-token prefill's attention at about 45% of
 * the FMA peak (bench/results/2026-11-26-cpu-prefill-attention/NOTES.md), with a masked prefix
 * far below that, and for long prompts it is a third of the time to the first token.
 *
 * The work of a task (kv head g, rows t0 .. t0 + R - 1) is M = R * G queries, the G query heads
 * of the group sharing every key and value they load:
 *   1. the keys of the task's head are packed once per call, transposed into panels of KN keys
 *      ([D][KN]), so the score tile (queries x KN keys) is a sum of outer products: per d one
 *      load of KN keys' d-th dims, one broadcast of each query's, MQ x KN / VL FMAs;
 *   2. per chunk of KC keys: the scores, the causal cut, the chunk's max per query, the new
 *      running max, e^(scale (s - max)) and its sum, then the running output rescaled and the
 *      chunk's values added (a tile of MP queries x 4 vectors of dims per value row loaded).
 * A query's result depends on its own scores alone, computed in a fixed order (dims ascending,
 * chunks at fixed key offsets 0, KC, 2 KC, ..., keys ascending inside a chunk): the same bits
 * whatever the row block, its place in it, T for the same L - T + t, or the thread count. Keys
 * past a row's cut weigh exactly 0. kernels/skinny.py calls it; kernels/tree_attention.py
 * holds the reference.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>

#if defined(__AVX512F__)
#define VL 16
typedef __m512 vf;
#define V_LOAD _mm512_loadu_ps
#define V_STORE _mm512_storeu_ps
#define V_SET1 _mm512_set1_ps
#define V_ZERO _mm512_setzero_ps
#define V_FMA _mm512_fmadd_ps
#define V_FNMA _mm512_fnmadd_ps
#define V_MUL _mm512_mul_ps
#define V_ADD _mm512_add_ps
#define V_SUB _mm512_sub_ps
#define V_MAX _mm512_max_ps
#define V_ROUND(x) _mm512_roundscale_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_POW2(n) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), \
                                                                          _mm512_set1_epi32(127)), 23))
#define MQ 12 /* score tile: MQ queries x 2 vectors of keys = 24 of the 32 registers */
#define MP 6  /* value tile: MP queries x 4 vectors of dims = 24 */
static inline float v_hmax(vf v) { return _mm512_reduce_max_ps(v); }
static inline float v_hsum(vf v) {
    __m256 s = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}
#else
#define VL 8
typedef __m256 vf;
#define V_LOAD _mm256_loadu_ps
#define V_STORE _mm256_storeu_ps
#define V_SET1 _mm256_set1_ps
#define V_ZERO _mm256_setzero_ps
#define V_FMA _mm256_fmadd_ps
#define V_FNMA _mm256_fnmadd_ps
#define V_MUL _mm256_mul_ps
#define V_ADD _mm256_add_ps
#define V_SUB _mm256_sub_ps
#define V_MAX _mm256_max_ps
#define V_ROUND(x) _mm256_round_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_POW2(n) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), \
                                                                          _mm256_set1_epi32(127)), 23))
#define MQ 6 /* 6 x 2 = 12 of the 16 registers */
#define MP 3 /* 3 x 4 = 12 */
static inline float v_hmax(vf v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
static inline float v_hsum(vf v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}
#endif

#define KN (2 * VL)   /* keys per packed panel: the score tile's width */
#ifndef KC
#define KC 128        /* keys per chunk: 64 was 5% slower at 2,000 rows (bench/results/2026-11-27-cpu-prefill-kernel/NOTES.md) */
#endif
#define DV 4          /* vectors of dims per value tile */
#ifndef QBLOCK
#define QBLOCK 12     /* queries per task, at least (whole rows of the group) */
#endif
#define MAXM 32       /* queries per task, at most: heads per kv head up to 32 */
#define MAXD 256      /* head dims, at most */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* e^x for x <= 0 (as exp_neg in skinny_common.h, at this file's width); the caller zeroes the
 * lanes of masked keys itself, so the clamp at -87 only keeps the exponent bits in range */
ALWAYS_INLINE vf v_exp_neg(vf x) {
    x = V_MAX(x, V_SET1(-87.0f));
    const vf n = V_ROUND(V_MUL(x, V_SET1(1.44269504088896341f)));
    vf r = V_FNMA(n, V_SET1(0.693145751953125f), x);
    r = V_FNMA(n, V_SET1(1.428606765330187e-06f), r);
    vf p = V_SET1(1.0f / 720);
    p = V_FMA(p, r, V_SET1(1.0f / 120));
    p = V_FMA(p, r, V_SET1(1.0f / 24));
    p = V_FMA(p, r, V_SET1(1.0f / 6));
    p = V_FMA(p, r, V_SET1(0.5f));
    p = V_FMA(p, r, V_SET1(1.0f));
    p = V_FMA(p, r, V_SET1(1.0f));
    return V_MUL(p, V_POW2(n));
}

/* s[i][c0 .. c0 + KN) = q_i . k_j for m <= MQ queries and one panel of KN keys ([D][KN]) */
ALWAYS_INLINE void score_tile(int m, float s[][KC], int c0, const float *const *q, const float *kt, int D) {
    vf a[MQ][2];
    _Pragma("GCC unroll 16") for (int i = 0; i < m; i++) a[i][0] = a[i][1] = V_ZERO();
    for (int d = 0; d < D; d++) {
        const vf b0 = V_LOAD(kt + (int64_t)d * KN), b1 = V_LOAD(kt + (int64_t)d * KN + VL);
        _Pragma("GCC unroll 16") for (int i = 0; i < m; i++) {
            const vf x = V_SET1(q[i][d]);
            a[i][0] = V_FMA(x, b0, a[i][0]);
            a[i][1] = V_FMA(x, b1, a[i][1]);
        }
    }
    _Pragma("GCC unroll 16") for (int i = 0; i < m; i++) {
        V_STORE(s[i] + c0, a[i][0]);
        V_STORE(s[i] + c0 + VL, a[i][1]);
    }
}

/* o_i[d0 .. d0 + DV VL) = alpha_i o_i + sum_{j < n} p_i[j] v_j for m <= MP queries, keys ascending */
ALWAYS_INLINE void value_tile(int m, float *const *o, const float *alpha, const float (*p)[KC], const float *v,
                              int n, int D, int d0) {
    vf a[MP][DV];
    _Pragma("GCC unroll 8") for (int i = 0; i < m; i++) {
        const vf al = V_SET1(alpha[i]);
        _Pragma("GCC unroll 4") for (int c = 0; c < DV; c++) a[i][c] = V_MUL(V_LOAD(o[i] + d0 + c * VL), al);
    }
    for (int j = 0; j < n; j++) {
        const float *vr = v + (int64_t)j * D + d0;
        vf b[DV];
        _Pragma("GCC unroll 4") for (int c = 0; c < DV; c++) b[c] = V_LOAD(vr + c * VL);
        _Pragma("GCC unroll 8") for (int i = 0; i < m; i++) {
            const vf x = V_SET1(p[i][j]);
            _Pragma("GCC unroll 4") for (int c = 0; c < DV; c++) a[i][c] = V_FMA(x, b[c], a[i][c]);
        }
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < m; i++)
        _Pragma("GCC unroll 4") for (int c = 0; c < DV; c++) V_STORE(o[i] + d0 + c * VL, a[i][c]);
}

/* the switches give the compiler a constant tile height to keep the accumulators in registers */
static void scores(int m, float s[][KC], int c0, const float *const *q, const float *kt, int D) {
    switch (m) {
#define CASE(n) case n: score_tile(n, s, c0, q, kt, D); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
#if MQ > 6
        CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12)
#endif
#undef CASE
    }
}

static void values(int m, float *const *o, const float *alpha, const float (*p)[KC], const float *v, int n, int D,
                   int d0) {
    switch (m) {
#define CASE(k) case k: value_tile(k, o, alpha, p, v, n, D, d0); break;
        CASE(1) CASE(2) CASE(3)
#if MP > 3
        CASE(4) CASE(5) CASE(6)
#endif
#undef CASE
    }
}

int prefill_attention_dim_multiple(void) { return DV * VL; }

int64_t prefill_attention_work(int64_t L, int KV, int D) { return (L + KC - 1) / KC * KC * KV * D * 2; }

static int prefill(const float *q, int64_t q_stride, int T, int H, int KV, int D, const void *kc, const void *vc,
                   const int32_t *blocks, int block_size, int64_t L, float scale, float *out, float *work, int threads,
                   int half) {
    if (D % (DV * VL) || D > MAXD || H % KV || H / KV > MAXM || L < T || T < 1) return 1;
    const int G = H / KV;
    const int R = G >= QBLOCK ? 1 : (QBLOCK + G - 1) / G; /* rows per task */
    const int64_t Lp = (L + KC - 1) / KC * KC, n_rb = (T + R - 1) / R, prefix = L - T;
    float *kt_all = work, *v_all = work + (int64_t)KV * Lp * D;
    if (threads < 1) threads = 1;

#pragma omp parallel num_threads(threads)
    {
        /* 1. pack: per kv head the keys as panels [Lp / KN][D][KN] (zeros past L), the values [Lp][D] */
#pragma omp for schedule(static)
        for (int64_t u = 0; u < KV * (Lp / KN); u++) {
            const int g = (int)(u / (Lp / KN));
            const int64_t j0 = u % (Lp / KN) * KN;
            float *kt = kt_all + (int64_t)g * Lp * D + j0 * D, *vp = v_all + ((int64_t)g * Lp + j0) * D;
            for (int jj = 0; jj < KN; jj++) {
                const int64_t j = j0 + jj;
                if (j >= L) {
                    for (int d = 0; d < D; d++) kt[(int64_t)d * KN + jj] = 0.0f;
                    memset(vp + (int64_t)jj * D, 0, sizeof(float) * D);
                    continue;
                }
                const int64_t slot = ((int64_t)blocks[j / block_size] * block_size + j % block_size) * KV + g;
                if (half) { /* fp16 pools: widened exactly as they are packed */
#ifdef __F16C__
                    const uint16_t *kr = (const uint16_t *)kc + slot * D, *vr = (const uint16_t *)vc + slot * D;
                    float row[MAXD];
                    for (int d = 0; d < D; d += 8)
                        _mm256_storeu_ps(row + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr + d))));
                    for (int d = 0; d < D; d++) kt[(int64_t)d * KN + jj] = row[d];
                    for (int d = 0; d < D; d += 8)
                        _mm256_storeu_ps(vp + (int64_t)jj * D + d,
                                         _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vr + d))));
#endif
                    continue;
                }
                const float *kr = (const float *)kc + slot * D;
                for (int d = 0; d < D; d++) kt[(int64_t)d * KN + jj] = kr[d];
                memcpy(vp + (int64_t)jj * D, (const float *)vc + slot * D, sizeof(float) * D);
            }
        }
        /* (the implicit barrier: every task reads every panel of its head) */

        /* 2. tasks, the longest rows first so that the short ones fill in at the end */
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < KV * n_rb; u++) {
            const int g = (int)(u % KV);
            const int64_t t0 = (n_rb - 1 - u / KV) * R;
            const int rows = (int)(t0 + R <= T ? R : T - t0), m = rows * G;
            const float *qp[MAXM];
            float *op[MAXM];
            int64_t cut[MAXM]; /* keys 0 .. cut - 1 visible */
            float mx[MAXM], sum[MAXM], alpha[MAXM];
            float obuf[MAXM * MAXD] __attribute__((aligned(64)));
            float s[MAXM][KC] __attribute__((aligned(64)));
            for (int i = 0; i < m; i++) {
                const int64_t t = t0 + i / G;
                const int h = g * G + i % G;
                qp[i] = q + t * q_stride + (int64_t)h * D;
                op[i] = obuf + (int64_t)i * D;
                cut[i] = t + prefix + 1;
                mx[i] = -INFINITY;
                sum[i] = 0.0f;
            }
            memset(obuf, 0, sizeof(float) * m * D);
            const float *kt = kt_all + (int64_t)g * Lp * D, *vh = v_all + (int64_t)g * Lp * D;
            const int64_t last = cut[m - 1]; /* the task's longest row */
            for (int64_t c0 = 0; c0 < last; c0 += KC) {
                const int n = (int)(last - c0 < KC ? last - c0 : KC); /* keys any query of the task sees */
                for (int p = 0; p < n; p += KN) /* (the scores past n are cut below, whatever they hold) */
                    for (int i = 0; i < m; i += MQ)
                        scores(m - i < MQ ? m - i : MQ, s + i, p, qp + i, kt + (c0 + p) * D, D);
                for (int i = 0; i < m; i++) {
                    const int64_t nv = cut[i] - c0 < KC ? cut[i] - c0 : KC; /* this query's (may be <= 0) */
                    float *si = s[i];
                    if (nv <= 0) { /* nothing visible in this chunk: its state stays as it is */
                        memset(si, 0, sizeof(float) * KC);
                        alpha[i] = 1.0f;
                        continue;
                    }
                    const int nw = (int)((nv + VL - 1) / VL * VL); /* the vectors that hold its visible keys */
                    for (int j = (int)nv; j < nw; j++) si[j] = -INFINITY;
                    vf vm = V_LOAD(si);
                    for (int j = VL; j < nw; j += VL) vm = V_MAX(vm, V_LOAD(si + j));
                    const float m_new = fmaxf(mx[i], v_hmax(vm));
                    alpha[i] = mx[i] == -INFINITY ? 0.0f : expf(scale * (mx[i] - m_new));
                    mx[i] = m_new;
                    const vf vs = V_SET1(scale), vmn = V_SET1(m_new);
                    vf acc = V_ZERO();
                    for (int j = 0; j < nw; j += VL) {
                        vf e = v_exp_neg(V_MUL(vs, V_SUB(V_LOAD(si + j), vmn)));
                        if (j + VL > nv) { /* zero the cut keys' lanes exactly */
                            float tmp[VL] __attribute__((aligned(64)));
                            V_STORE(tmp, e);
                            for (int l = 0; l < VL; l++)
                                if (j + l >= nv) tmp[l] = 0.0f;
                            e = V_LOAD(tmp);
                        }
                        V_STORE(si + j, e);
                        acc = V_ADD(acc, e);
                    }
                    if (nw < n) memset(si + nw, 0, sizeof(float) * (n - nw)); /* keys others of the task see */
                    sum[i] = sum[i] * alpha[i] + v_hsum(acc);
                }
                for (int d0 = 0; d0 < D; d0 += DV * VL)
                    for (int i = 0; i < m; i += MP)
                        values(m - i < MP ? m - i : MP, op + i, alpha + i, (const float (*)[KC])(s + i),
                               vh + c0 * D, n, D, d0);
            }
            for (int i = 0; i < m; i++) {
                const int64_t t = t0 + i / G;
                const int h = g * G + i % G;
                float *dst = out + (t * H + h) * (int64_t)D;
                const vf inv = V_SET1(1.0f / sum[i]);
                for (int d = 0; d < D; d += VL) V_STORE(dst + d, V_MUL(V_LOAD(op[i] + d), inv));
            }
        }
    }
    return 0;
}

int prefill_attention(const float *q, int64_t q_stride, int T, int H, int KV, int D, const float *kc, const float *vc,
                      const int32_t *blocks, int block_size, int64_t L, float scale, float *out, float *work,
                      int threads) {
    return prefill(q, q_stride, T, H, KV, D, kc, vc, blocks, block_size, L, scale, out, work, threads, 0);
}

/* the same over fp16 pools (uint16_t bits), widened exactly: bit for bit prefill_attention over
 * fp32 pools holding the same numbers; 1 in a build without F16C */
int prefill_attention_kv16(const float *q, int64_t q_stride, int T, int H, int KV, int D, const void *kc,
                           const void *vc, const int32_t *blocks, int block_size, int64_t L, float scale, float *out,
                           float *work, int threads) {
#ifdef __F16C__
    return prefill(q, q_stride, T, H, KV, D, kc, vc, blocks, block_size, L, scale, out, work, threads, 1);
#else
    (void)q, (void)q_stride, (void)T, (void)H, (void)KV, (void)D, (void)kc, (void)vc, (void)blocks;
    (void)block_size, (void)L, (void)scale, (void)out, (void)work, (void)threads;
    return 1;
#endif
}
