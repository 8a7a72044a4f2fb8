/* Attention of a decoding step's rows (1 to a few dozen) over one sequence's paged KV cache,
 * fp32, AVX2 + FMA, OpenMP over (kv head, key split) tasks, a contiguous range per thread.
 *
 * q      row t, head h at q[t * q_stride + h * D], D a multiple of 8
 * cache  k / v: the layer's pool [num_blocks, block_size, KV, D], contiguous; key j of the
 *        sequence lives in block blocks[j / block_size], offset j % block_size
 * mask   (T, L) bytes, nonzero = visible; NULL = every key visible to every row, except with
 *        causal: row t sees keys j <= t + L - T
 * out    (T, H, D) contiguous
 *
 * The keys are cut into splits of SPLIT keys (fixed: the cut depends on L alone). A task is one
 * kv head and one split: while the split's keys and values sit in L1 / L2 it moves every step
 * row and every query head of the group over them (the scores of the split, their max, the
 * softmax numerators, the weighted sum of the values), QB (row, head) queries at a time so that
 * each key and value chunk loaded feeds QB FMAs (1.3x faster at 4-16 rows than one query at a
 * time, bit for bit the same numbers). So the keys are read from memory once per step, not
 * once per row. The splits'
 * partial results (max, sum, weighted sum) are merged per (row, head) in split order at the end.
 *
 * A row's result depends on its query, its mask row, the keys and L only: the same operations
 * in the same order whatever T, the row's place in the step, and the thread count. A row with
 * no visible key gets zeros. kernels/skinny.py calls it; kernels/tree_attention.py holds the
 * reference.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "skinny_common.h"

#define MAXG 16   /* query heads per kv head, at most */
#define SPLIT 64 /* keys per split */
/* a task requests the keys and values of the task this many after it: with 2 rather than 1 a
 * one-row step's attention over 1,500 keys took 11-23% less time (bench/results/
 * 2026-11-26-cpu-attention-ranges/NOTES.md) */
#define AHEAD 2

/* QB queries x 4 keys at a time: QB x 4 accumulators + QB query chunks + 1 key chunk fit the
 * 16 AVX2 registers (7 loads per 12 FMAs, where one query at a time took 9 per 8) */
#define QB 3

/* s[i][c] = q[i] . k[c] for the QB queries and 4 keys, D a multiple of 8. Each dot product is
 * summed in one fixed order: 8-lane accumulators over d ascending, then lanes
 * ((0+1)+(2+3)) + ((4+5)+(6+7)). */
static inline void qk_4(float s[QB][SPLIT], int c0, const float *const *q, const float *const *k, int D) {
    __m256 a[QB][4];
    _Pragma("GCC unroll 4") for (int i = 0; i < QB; i++)
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) a[i][c] = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 8) {
        __m256 qv[QB];
        _Pragma("GCC unroll 4") for (int i = 0; i < QB; i++) qv[i] = _mm256_loadu_ps(q[i] + d);
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
            const __m256 kv = _mm256_loadu_ps(k[c] + d);
            _Pragma("GCC unroll 4") for (int i = 0; i < QB; i++) a[i][c] = _mm256_fmadd_ps(qv[i], kv, a[i][c]);
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < QB; i++) {
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[i][0], a[i][1]), _mm256_hadd_ps(a[i][2], a[i][3]));
        _mm_storeu_ps(s[i] + c0, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    }
}

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* out[i][d0:d0 + 8 * CH] = sum_j p[i][j] * v[j][d0:...] over n keys, for the QB queries, keys
 * in ascending order (a key of probability 0 adds exactly 0: the values are finite) */
#define PV(CH)                                                                                            \
    static inline void pv_##CH(float *const *out, const float p[QB][SPLIT], const float *const *v, int n,  \
                               int d0) {                                                                  \
        __m256 acc[QB][CH];                                                                               \
        _Pragma("GCC unroll 4") for (int i = 0; i < QB; i++)                                             \
            _Pragma("GCC unroll 4") for (int c = 0; c < CH; c++) acc[i][c] = _mm256_setzero_ps();         \
        for (int j = 0; j < n; j++) {                                                                     \
            __m256 pj[QB];                                                                                \
            _Pragma("GCC unroll 4") for (int i = 0; i < QB; i++) pj[i] = _mm256_set1_ps(p[i][j]);         \
            _Pragma("GCC unroll 4") for (int c = 0; c < CH; c++) {                                       \
                const __m256 vc = _mm256_loadu_ps(v[j] + d0 + 8 * c);                                     \
                _Pragma("GCC unroll 4") for (int i = 0; i < QB; i++)                                     \
                    acc[i][c] = _mm256_fmadd_ps(pj[i], vc, acc[i][c]);                                    \
            }                                                                                             \
        }                                                                                                 \
        _Pragma("GCC unroll 4") for (int i = 0; i < QB; i++)                                             \
            _Pragma("GCC unroll 4") for (int c = 0; c < CH; c++) _mm256_storeu_ps(out[i] + d0 + 8 * c, acc[i][c]); \
    }
PV(4)
PV(1)

typedef struct {
    const float *q, *kc, *vc;
    const int64_t *off; /* key j's first float in a pool for kv head 0 */
    const uint8_t *mask;
    int64_t q_stride, L;
    int T, H, KV, D, causal;
    float scale;
    float *part; /* this split's [t][h]: max score, sum of numerators, D weighted sums */
} job;

/* which of the 8 keys j0 + 8b .. of the split row t sees, per block b; returns whether any */
static int visible(const job *a, int t, int64_t j0, int n, __m256 *vis) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int any = 0;
    for (int b = 0; b < (n + 7) / 8; b++) {
        const int64_t j = j0 + 8 * b;
        const int nk = n - 8 * b < 8 ? n - 8 * b : 8;
        __m256i v = _mm256_cmpgt_epi32(_mm256_set1_epi32(nk), lane);
        if (a->mask) {
            uint8_t bytes[8] = {0};
            memcpy(bytes, a->mask + (int64_t)t * a->L + j, (size_t)nk);
            const __m256i m8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)bytes));
            v = _mm256_andnot_si256(_mm256_cmpeq_epi32(m8, _mm256_setzero_si256()), v);
        } else if (a->causal) {
            const int64_t last = t + a->L - a->T; /* keys after it are hidden */
            const int64_t room = last < j ? 0 : (last - j + 1 < 8 ? last - j + 1 : 8);
            v = _mm256_and_si256(v, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)room), lane));
        }
        vis[b] = _mm256_castsi256_ps(v);
        any |= !_mm256_testz_si256(v, v);
    }
    return any;
}

/* Requests one kv head's keys and values [j0, j1) into L2. A task reads them from memory in
 * 256-byte pieces 768 bytes apart (the pool interleaves the kv heads), which the hardware
 * prefetchers do not follow: the loads waited on one miss after another (a one-row step's
 * attention read at about 6 GB/s per core; with this, 10-20% faster at 1-32 rows:
 * bench/results/2026-11-26-cpu-roofline/NOTES.md). A task requests a later task's a few keys at
 * a time, spread over its first pass over its own keys: requested all at once, the 512 lines of
 * a split held the core up (one row over 1,500 keys 20% slower in the forward: bench/results/
 * 2026-11-26-cpu-attention-ranges/NOTES.md). */
static void prefetch_split(const job *a, int kvh, int64_t j0, int64_t j1) {
    const float *kh = a->kc + (int64_t)kvh * a->D, *vh = a->vc + (int64_t)kvh * a->D;
    for (int64_t j = j0; j < j1; j++)
        for (int d = 0; d < a->D; d += 16) {
            _mm_prefetch((const char *)(kh + a->off[j] + d), _MM_HINT_T1);
            _mm_prefetch((const char *)(vh + a->off[j] + d), _MM_HINT_T1);
        }
}

/* one kv head over keys [j0, j1) (at most SPLIT), every row and query head of the group, QB
 * (row, head) queries at a time: the scores of all the split's keys, their softmax numerators,
 * the weighted sum of the values. Writes (max, sum, D weighted sums) per (t, g) into ``part``
 * rows of this split. A query's numbers do not depend on the other queries of its group (a
 * short last group repeats its first query and drops the copies). While the first group scores
 * the keys it requests the keys and values [next_j0, next_j1) of kv head next_kvh (a later task
 * of the thread; none: next_kvh < 0) into L2, a share per 4 keys scored. */
static void split_task(const job *a, int kvh, int64_t j0, int64_t j1, int next_kvh, int64_t next_j0,
                       int64_t next_j1) {
    const int G = a->H / a->KV, D = a->D, T = a->T, W = D + 2, n = (int)(j1 - j0), nb = (n + 7) / 8;
    const __m256 ninf = _mm256_set1_ps(-INFINITY), scale = _mm256_set1_ps(a->scale);
    const float *kh = a->kc + (int64_t)kvh * D, *vh = a->vc + (int64_t)kvh * D;
    const float *kp[SPLIT], *vp[SPLIT];
    for (int i = 0; i < nb * 8; i++) { /* a short last block repeats the first key, hidden */
        const int64_t jj = j0 + (i < n ? i : 0);
        kp[i] = kh + a->off[jj];
        vp[i] = vh + a->off[jj];
    }
    __m256 vis[SPLIT / 8];
    int vis_row = -1, vis_any = 0; /* the row vis holds (consecutive queries share rows) */
    float sc[QB][SPLIT];
    const int NQ = T * G;
    for (int q0 = 0; q0 < NQ; q0 += QB) {
        const int nq = NQ - q0 < QB ? NQ - q0 : QB;
        const float *qp[QB];
        float *outp[QB];
        int live[QB]; /* the query sees a key of the split */
        for (int i = 0; i < QB; i++) {
            const int qq = q0 + (i < nq ? i : 0), t = qq / G, g = qq % G;
            qp[i] = a->q + t * a->q_stride + ((int64_t)kvh * G + g) * D;
            outp[i] = a->part + (t * (int64_t)a->H + (int64_t)kvh * G + g) * W;
        }
        for (int c = 0; c < nb * 8; c += 4) {
            if (q0 == 0 && next_kvh >= 0) { /* the later task's share for these 4 keys' scores */
                const int64_t span = next_j1 - next_j0, pa = next_j0 + span * c / (nb * 8),
                              pb = next_j0 + span * (c + 4) / (nb * 8);
                prefetch_split(a, next_kvh, pa, pb < next_j1 ? pb : next_j1);
            }
            qk_4(sc, c, qp, kp + c, D);
        }
        for (int i = 0; i < QB; i++) {
            const int t = (q0 + (i < nq ? i : 0)) / G;
            if (t != vis_row) {
                vis_any = visible(a, t, j0, n, vis);
                vis_row = t;
            }
            live[i] = vis_any;
            if (!live[i]) { /* all hidden: numerators 0, so the value sums below are 0 too */
                memset(sc[i], 0, sizeof(float) * (size_t)(nb * 8));
                continue;
            }
            __m256 mx = ninf;
            for (int b = 0; b < nb; b++) {
                const __m256 s = _mm256_blendv_ps(ninf, _mm256_mul_ps(_mm256_loadu_ps(sc[i] + 8 * b), scale), vis[b]);
                _mm256_storeu_ps(sc[i] + 8 * b, s);
                mx = _mm256_max_ps(mx, s);
            }
            const float m = hmax8(mx);
            const __m256 mv = _mm256_set1_ps(m);
            __m256 tot = _mm256_setzero_ps();
            for (int b = 0; b < nb; b++) {
                const __m256 p = _mm256_and_ps(exp_neg(_mm256_sub_ps(_mm256_loadu_ps(sc[i] + 8 * b), mv)), vis[b]);
                _mm256_storeu_ps(sc[i] + 8 * b, p);
                tot = _mm256_add_ps(tot, p);
            }
            outp[i][0] = m;
            outp[i][1] = hsum8(tot);
        }
        /* the weighted sums: into a buffer, or (D > 256) straight into part, where the copies of
         * query 0 in a short group write the same numbers as query 0 itself */
        float sums[QB][256];
        float *sp[QB];
        for (int i = 0; i < QB; i++) sp[i] = D <= 256 ? sums[i] : outp[i] + 2;
        int d0 = 0;
        for (; d0 + 32 <= D; d0 += 32) pv_4(sp, (const float(*)[SPLIT])sc, vp, nb * 8, d0);
        for (; d0 < D; d0 += 8) pv_1(sp, (const float(*)[SPLIT])sc, vp, nb * 8, d0);
        if (D <= 256)
            for (int i = 0; i < nq; i++) memcpy(outp[i] + 2, sums[i], sizeof(float) * (size_t)D);
        for (int i = 0; i < nq; i++)
            if (!live[i]) {
                outp[i][0] = -INFINITY;
                outp[i][1] = 0.0f;
                memset(outp[i] + 2, 0, sizeof(float) * (size_t)D);
            }
    }
}

/* task i's keys: split i / KV's, [*j0, *j1) */
static inline void task_keys(int64_t i, int KV, int64_t L, int64_t *j0, int64_t *j1) {
    *j0 = i / KV * SPLIT;
    *j1 = *j0 + SPLIT < L ? *j0 + SPLIT : L;
}

/* returns 0, -1 when a buffer could not be allocated (out is then incomplete), -2 on shapes it
 * does not take */
int skinny_attention(const float *q, int64_t q_stride, int T, int H, int KV, int D, const float *kc,
                     const float *vc, const int32_t *blocks, int bs, int64_t L, const uint8_t *mask, int causal,
                     float scale, float *out, int threads) {
    const int G = H / KV, W = D + 2;
    if (G > MAXG || D % 8 || L < 1) return -2;
    const int64_t n_split = (L + SPLIT - 1) / SPLIT, tasks = n_split * KV;
    int64_t *off = malloc(sizeof(int64_t) * (size_t)L);
    float *part = malloc(sizeof(float) * (size_t)(n_split * T * H * W));
    if (!off || !part) {
        free(off);
        free(part);
        return -1;
    }
    for (int64_t b = 0, j = 0; j < L; b++)
        for (int o = 0; o < bs && j < L; o++, j++) off[j] = ((int64_t)blocks[b] * bs + o) * KV * D;
    const job a = {q, kc, vc, off, mask, q_stride, L, T, H, KV, D, causal, scale, part};
    if (threads > tasks) threads = (int)tasks;
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads(threads)
    {
        /* each thread takes one contiguous range of tasks: the kv heads of a split, then the next
         * split's, so that its keys and values are one run of memory, 768-byte rows used whole
         * (round robin over tasks had both threads stride through rows a third used: attention
         * at 4-16 rows took 22-26% longer over 1,500 keys, 4-17% over 512, bench/results/
         * 2026-11-26-cpu-attention-ranges/NOTES.md). The first AHEAD tasks' keys and values are
         * requested before the first starts, each later one's while the task AHEAD before it
         * scores its keys (split_task). Which thread computes a task does not change its
         * numbers. */
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t lo = tasks * t / nt, hi = tasks * (t + 1) / nt;
        int64_t j0, j1, nj0, nj1;
        for (int64_t p = lo; p < lo + AHEAD && p < hi; p++) {
            task_keys(p, KV, L, &j0, &j1);
            prefetch_split(&a, (int)(p % KV), j0, j1);
        }
        for (int64_t i = lo; i < hi; i++) {
            const int64_t p = i + AHEAD;
            task_keys(i, KV, L, &j0, &j1);
            task_keys(p, KV, L, &nj0, &nj1);
            job mine = a;
            mine.part = part + i / KV * T * H * W;
            split_task(&mine, (int)(i % KV), j0, j1, p < hi ? (int)(p % KV) : -1, nj0, nj1);
        }
    }
    /* merge the splits of each (row, head), in split order */
    for (int64_t r = 0; r < (int64_t)T * H; r++) {
        float mx = -INFINITY;
        for (int64_t sp = 0; sp < n_split; sp++) {
            const float m = part[(sp * T * H + r) * W];
            mx = m > mx ? m : mx;
        }
        float *o = out + r * D;
        memset(o, 0, sizeof(float) * (size_t)D);
        if (mx == -INFINITY) continue; /* no visible key: zeros */
        float total = 0.0f;
        for (int64_t sp = 0; sp < n_split; sp++) {
            const float *p = part + (sp * T * H + r) * W;
            if (p[0] == -INFINITY) continue;
            const float w = expf(p[0] - mx);
            total += w * p[1];
            const __m256 wv = _mm256_set1_ps(w);
            for (int d = 0; d < D; d += 8)
                _mm256_storeu_ps(o + d, _mm256_fmadd_ps(wv, _mm256_loadu_ps(p + 2 + d), _mm256_loadu_ps(o + d)));
        }
        const __m256 inv = _mm256_set1_ps(1.0f / total);
        for (int d = 0; d < D; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(inv, _mm256_loadu_ps(o + d)));
    }
    free(off);
    free(part);
    return 0;
}
