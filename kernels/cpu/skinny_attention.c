/* Attention of a decoding step's rows (1 to a few dozen) over one sequence's paged KV cache,
 * fp32, AVX2 + FMA (the AVX-512 build: the scores' and weighted sums' FMAs 512 bits wide, the
 * same numbers), OpenMP over (kv head, key split) tasks, a contiguous range per thread.
 *
 * q      row t, head h at q[t * q_stride + h * D], D a multiple of 8
 * cache  k / v: the layer's pool [num_blocks, block_size, KV, D], contiguous, fp32 or (the
 *        _kv16 entry) fp16; key j of the sequence lives in block blocks[j / block_size], offset
 *        j % block_size
 * mask   (T, L) bytes, nonzero = visible; NULL = every key visible to every row, except with
 *        causal: row t sees keys j <= t + L - T
 * out    (T, H, D) contiguous
 *
 * A row's visible keys are cut into splits of SPLIT keys by their rank among them (visible key r
 * in split r / SPLIT), as a chain holding exactly those keys would cut them. A task is one kv
 * head and one split: while the split's keys and values sit in L1 / L2 it moves the rows of the
 * task and every query head of the group over them (the scores of the split, their max, the
 * softmax numerators, the weighted sum of the values), QB (row, head) queries at a time so that
 * each key and value chunk loaded feeds QB FMAs (1.3x faster at 4-16 rows than one query at a
 * time, bit for bit the same numbers). Where every row's visible keys are a prefix of the cache
 * (no mask, the causal rule, a chain), rank is place and a split of SPLIT places serves every
 * row: the keys are read from memory once per step, not once per row. Under a tree's mask the
 * splits of the keys every row sees (the context, rounded down to whole splits) still serve every
 * row, and each row's visible keys after them are cut into splits of its own (tasks of one row,
 * at most T + SPLIT - 1 keys a row). The splits' partial results (max, sum, weighted sum) are
 * merged per (row, head) in split order at the end. A batch's sequences can go in one call
 * (skinny_attention_seqs: one list of every sequence's tasks, one parallel region), each row the
 * same numbers as in a call of its own.
 *
 * A row's result depends on its query and its visible keys only, bit for bit that of a causal
 * last row over a cache holding exactly those keys at places 0 .. V - 1: the same operations in
 * the same order whatever T, L, the row's place in the step, the other rows, and the thread
 * count (so a branch accepted from a tree leaves the K/V that a chain of its tokens would). A row with
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

/* QB queries x 4 keys at a time: QB x 4 accumulators + QB query chunks + 1 key chunk in
 * registers. With AVX-512VL's 32 registers a task of 6 or more queries takes them 6 at a time,
 * half the query loads per FMA (a query's numbers are the same in a group of 3 or 6); the 16
 * AVX2 registers hold 3. Alone, 6 at a time measured within the runs' spread of 3 at a time (-7%
 * to +5% at 4-16 rows: bench/results/2026-11-28-cpu-attention/variants-qb.txt). */
#ifdef __AVX512VL__
#define QBMAX 6
#else
#define QBMAX 3
#endif

/* 8 numbers of a pool from element i of p: fp32, or fp16 widened exactly */
static inline __m256 load8(const void *p, int64_t i, int half) {
#ifdef __F16C__
    if (half) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
#endif
    return _mm256_loadu_ps((const float *)p + i);
}

/* s[i][c] = q[i] . k[c] for the QB queries and 4 keys, D a multiple of 8. Each dot product is
 * summed in one fixed order: 8-lane accumulators over d ascending, then lanes
 * ((0+1)+(2+3)) + ((4+5)+(6+7)). */
static inline __attribute__((always_inline)) void qk_4(float s[QBMAX][SPLIT], int c0, const float *const *q,
                                                       const void *const *k, int D, int half, const int QB) {
    __m256 a[QBMAX][4];
    _Pragma("GCC unroll 6") for (int i = 0; i < QB; i++)
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) a[i][c] = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 8) {
        __m256 qv[QBMAX];
        _Pragma("GCC unroll 6") for (int i = 0; i < QB; i++) qv[i] = _mm256_loadu_ps(q[i] + d);
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
            const __m256 kv = load8(k[c], d, half);
            _Pragma("GCC unroll 6") for (int i = 0; i < QB; i++) a[i][c] = _mm256_fmadd_ps(qv[i], kv, a[i][c]);
        }
    }
    _Pragma("GCC unroll 6") for (int i = 0; i < QB; i++) {
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[i][0], a[i][1]), _mm256_hadd_ps(a[i][2], a[i][3]));
        _mm_storeu_ps(s[i] + c0, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    }
}

#ifdef __AVX512F__
/* The AVX-512 build's scores, weighted sums and softmax: 512-bit operations, each lane the AVX2
 * build's operations in its order, so the two builds attend bit for bit alike. Why: where a 512-bit
 * FMA issues as fast as a 256-bit one the FMA peak doubles (an Emerald Rapids measured 263-277
 * against 128-134 GFLOP/s on 2 cores); the FMAs gained 5-13% at 8-16 rows there
 * (bench/results/2026-11-28-cpu-attention512/NOTES.md), the reductions below and the 16-lane
 * softmax 7-13% more at 4-16 rows (bench/results/2026-11-28-cpu-attention-reduce/NOTES.md). Zen 4
 * splits a 512-bit operation in two halves: the same rate, not measured. */
static inline __m512 load8x2(const void *p0, const void *p1, int64_t i, int half) {
    if (half)
        return _mm512_cvtph_ps(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)((const uint16_t *)p0 + i))),
            _mm_loadu_si128((const __m128i *)((const uint16_t *)p1 + i)), 1));
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps((const float *)p0 + i)),
                              _mm256_loadu_ps((const float *)p1 + i), 1);
}

/* pv_4 with 512-bit FMAs: 16 dimensions a register, each lane the same FMAs in the same order */
static inline __attribute__((always_inline)) void pv_4w(float *const *out, const float p[QBMAX][SPLIT],
                                                        const void *const *v, int n, int d0, int half, const int QB) {
    __m512 acc[QBMAX][2];
    _Pragma("GCC unroll 6") for (int i = 0; i < QB; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int j = 0; j < n; j++) {
        __m512 pj[QBMAX];
        _Pragma("GCC unroll 6") for (int i = 0; i < QB; i++) pj[i] = _mm512_set1_ps(p[i][j]);
        _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++) {
            const __m512 vc = half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)v[j] + d0 + 16 * c)))
                                   : _mm512_loadu_ps((const float *)v[j] + d0 + 16 * c);
            _Pragma("GCC unroll 6") for (int i = 0; i < QB; i++) acc[i][c] = _mm512_fmadd_ps(pj[i], vc, acc[i][c]);
        }
    }
    _Pragma("GCC unroll 6") for (int i = 0; i < QB; i++)
        _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++) _mm512_storeu_ps(out[i] + d0 + 16 * c, acc[i][c]);
}

/* The scores of 16 keys at a time, with qk_4's sums. qk_4p: a register holds the same 8 dimensions
 * of two keys (c and c + 1 in its halves) against the query's 8 in both, so each half makes qk_4's
 * FMAs in its order; then the first pairwise sums of keys c0 .. c0 + 3, in one register (per
 * 128-bit chunk: key c0's (0+1), (2+3), key c0 + 2's, then their (4+5), (6+7), then keys c0 + 1 and
 * c0 + 3 alike), stored at s1 + 4 c0. scores16 takes four such registers (16 keys) on: the next
 * pairwise sums ((0+1)+(2+3), (4+5)+(6+7)), the two added, one permutation into key order; so each
 * score is qk_4's number, bit for bit. Why: qk_4's horizontal sums on 512-bit accumulators (extracts
 * and hadds, a dozen operations a query for 4 keys) took a fifth of the kernel's time at 8 rows,
 * as much as half its score FMAs; these take about a third of that. */
static inline __attribute__((always_inline)) void qk_4p(float s1[QBMAX][4 * SPLIT], int c0, const float *const *q,
                                                        const void *const *k, int D, int half, const int QB) {
    __m512 a[QBMAX][2];
    _Pragma("GCC unroll 6") for (int i = 0; i < QB; i++) a[i][0] = a[i][1] = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 8) {
        __m512 qv[QBMAX];
        _Pragma("GCC unroll 6") for (int i = 0; i < QB; i++) qv[i] = _mm512_broadcast_f32x8(_mm256_loadu_ps(q[i] + d));
        _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++) {
            const __m512 kv = load8x2(k[2 * c], k[2 * c + 1], d, half);
            _Pragma("GCC unroll 6") for (int i = 0; i < QB; i++) a[i][c] = _mm512_fmadd_ps(qv[i], kv, a[i][c]);
        }
    }
    _Pragma("GCC unroll 6") for (int i = 0; i < QB; i++) {
        const __m512 x = a[i][0], y = a[i][1];
        _mm512_storeu_ps(s1[i] + 4 * c0, _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xDD)));
    }
}

static inline __m512 scores16(const float *s1) {
    const __m512 u0 = _mm512_loadu_ps(s1), u1 = _mm512_loadu_ps(s1 + 16);
    const __m512 u2 = _mm512_loadu_ps(s1 + 32), u3 = _mm512_loadu_ps(s1 + 48);
    /* per chunk: keys 0, 2, 4, 6 (0..3) | (4..7) | keys 1, 3, 5, 7 (0..3) | (4..7); then keys 8 .. 15 */
    const __m512 lo = _mm512_add_ps(_mm512_shuffle_ps(u0, u1, 0x88), _mm512_shuffle_ps(u0, u1, 0xDD));
    const __m512 hi = _mm512_add_ps(_mm512_shuffle_ps(u2, u3, 0x88), _mm512_shuffle_ps(u2, u3, 0xDD));
    const __m512 r = _mm512_add_ps(_mm512_shuffle_f32x4(lo, hi, 0x88), _mm512_shuffle_f32x4(lo, hi, 0xDD));
    /* r holds keys 0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15 */
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15), r);
}

#define KEYS_AT_ONCE 16 /* the keys of a split scored in groups of 16 */
#define PV_4 pv_4w
#else
#define QK_4 qk_4
#define PV_4 pv_4
#define KEYS_AT_ONCE 8
#endif

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* out[i][d0:d0 + 8 * CH] = sum_j p[i][j] * v[j][d0:...] over n keys, for the QB queries, keys
 * in ascending order (a key of probability 0 adds exactly 0: the values are finite) */
#define PV(CH)                                                                                            \
    static inline __attribute__((always_inline)) void pv_##CH(float *const *out, const float p[QBMAX][SPLIT], \
                                                              const void *const *v, int n, int d0, int half, \
                                                              const int QB) {                             \
        __m256 acc[QBMAX][CH];                                                                            \
        _Pragma("GCC unroll 6") for (int i = 0; i < QB; i++)                                             \
            _Pragma("GCC unroll 4") for (int c = 0; c < CH; c++) acc[i][c] = _mm256_setzero_ps();         \
        for (int j = 0; j < n; j++) {                                                                     \
            __m256 pj[QBMAX];                                                                             \
            _Pragma("GCC unroll 6") for (int i = 0; i < QB; i++) pj[i] = _mm256_set1_ps(p[i][j]);         \
            _Pragma("GCC unroll 4") for (int c = 0; c < CH; c++) {                                       \
                const __m256 vc = load8(v[j], d0 + 8 * c, half);                                          \
                _Pragma("GCC unroll 6") for (int i = 0; i < QB; i++)                                     \
                    acc[i][c] = _mm256_fmadd_ps(pj[i], vc, acc[i][c]);                                    \
            }                                                                                             \
        }                                                                                                 \
        _Pragma("GCC unroll 6") for (int i = 0; i < QB; i++)                                             \
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
    int half; /* the pools hold fp16 (kc, vc then point at uint16_t bits) */
} job;

/* One task: kv head kvh, the n (at most SPLIT) keys of one split, for rows t0 .. t0 + nt - 1.
 * The keys: j0 .. j0 + n - 1 (idx NULL), or idx[0 .. n - 1] (a row's visible keys, in rank
 * order). part: the split's partial results, (max, sum, D weighted sums) for row t0 + r, head h
 * at part[(r * H + h) * W]. all: every key of the task is visible to its rows (the mask and the
 * causal rule are not read). */
typedef struct {
    int kvh, t0, nt, n, all;
    int64_t j0;
    const int64_t *idx;
    float *part;
    const job *a; /* its sequence's */
} task;

static inline int64_t task_key(const task *k, int i) { return k->idx ? k->idx[i] : k->j0 + i; }

/* which of the 8 keys j0 + 8b .. of the split row t sees, per block b; returns whether any */
static int visible(const job *a, int all, int t, int64_t j0, int n, __m256 *vis) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int any = 0;
    for (int b = 0; b < (n + 7) / 8; b++) {
        const int64_t j = j0 + 8 * b;
        const int nk = n - 8 * b < 8 ? n - 8 * b : 8;
        __m256i v = _mm256_cmpgt_epi32(_mm256_set1_epi32(nk), lane);
        if (all) {
        } else if (a->mask) {
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

/* Requests the keys and values i0 .. i1 - 1 of task k into L2. A task reads them from memory in
 * 256-byte pieces 768 bytes apart (the pool interleaves the kv heads), which the hardware
 * prefetchers do not follow: the loads waited on one miss after another (a one-row step's
 * attention read at about 6 GB/s per core; with this, 10-20% faster at 1-32 rows:
 * bench/results/2026-11-26-cpu-roofline/NOTES.md). A task requests a later task's a few keys at
 * a time, spread over its first pass over its own keys: requested all at once, the 512 lines of
 * a split held the core up (one row over 1,500 keys 20% slower in the forward: bench/results/
 * 2026-11-26-cpu-attention-ranges/NOTES.md). */
static void prefetch_keys(const job *a, const task *k, int i0, int i1) {
    const int es = a->half ? 2 : 4; /* bytes per number */
    const char *kh = (const char *)a->kc + (int64_t)k->kvh * a->D * es;
    const char *vh = (const char *)a->vc + (int64_t)k->kvh * a->D * es;
    for (int i = i0; i < i1; i++) {
        const int64_t o = a->off[task_key(k, i)] * es;
        for (int d = 0; d < a->D * es; d += 64) {
            _mm_prefetch(kh + o + d, _MM_HINT_T1);
            _mm_prefetch(vh + o + d, _MM_HINT_T1);
        }
    }
}

/* task k: one kv head over the task's keys, every row of the task and query head of the group,
 * QB (row, head) queries at a time: the scores of all the keys, their softmax numerators, the
 * weighted sum of the values, written as (max, sum, D weighted sums) per (row, head) into k->part.
 * A query's numbers do not depend on the other queries of its group (a short last group repeats
 * its first query and drops the copies). While the first group scores the keys it requests the
 * keys and values of task next (a later task of the thread; none: NULL) into L2, a share per 4
 * keys scored. half: the pools hold fp16, widened to fp32 as each chunk is loaded (a constant
 * where split_task_f32 / _f16 inline it). Widening the split's keys and values into fp32 rows
 * first cost 40% of a one-row task (32 KB written per task, the whole L1) for conversions that
 * run beside the FMAs: converted at each load, the attention over 512 keys took 25-35% less time
 * at one row and 10-15% less at 4-8 rows with its keys and values in L2 or L3 (where the layer
 * stack's side stream leaves them), bit for bit the same numbers (the widening is exact):
 * bench/results/2026-11-28-cpu-attention/NOTES.md. */
static inline __attribute__((always_inline)) void split_task(const job *a, const task *k, const task *next,
                                                              const int half) {
    const int G = a->H / a->KV, D = a->D, W = D + 2, n = k->n, nb = (n + 7) / 8, kvh = k->kvh;
    const __m256 ninf = _mm256_set1_ps(-INFINITY), scale = _mm256_set1_ps(a->scale);
    const int es = half ? 2 : 4; /* bytes per number */
    const char *kh = (const char *)a->kc + (int64_t)kvh * D * es, *vh = (const char *)a->vc + (int64_t)kvh * D * es;
    const int nk = (n + KEYS_AT_ONCE - 1) / KEYS_AT_ONCE * KEYS_AT_ONCE; /* the keys scored */
    const void *kp[SPLIT], *vp[SPLIT];
    for (int i = 0; i < nk; i++) { /* a short last group repeats the first key, hidden */
        const int64_t o = a->off[task_key(k, i < n ? i : 0)] * es;
        kp[i] = kh + o;
        vp[i] = vh + o;
    }
    __m256 vis[SPLIT / 8];
    int vis_row = -1, vis_any = 0; /* the row vis holds (consecutive queries share rows) */
    float sc[QBMAX][SPLIT];
#ifdef __AVX512F__
    float s1[QBMAX][4 * SPLIT]; /* qk_4p's pairwise sums */
    __mmask16 vm[SPLIT / 16];   /* vis, 16 keys a mask */
#endif
    const int NQ = k->nt * G, QB = NQ >= QBMAX ? QBMAX : 3;
    for (int q0 = 0; q0 < NQ; q0 += QB) {
        const int nq = NQ - q0 < QB ? NQ - q0 : QB;
        const float *qp[QBMAX];
        float *outp[QBMAX];
        int live[QBMAX]; /* the query sees a key of the split */
        for (int i = 0; i < QB; i++) {
            const int qq = q0 + (i < nq ? i : 0), r = qq / G, g = qq % G;
            qp[i] = a->q + (k->t0 + r) * a->q_stride + ((int64_t)kvh * G + g) * D;
            outp[i] = k->part + (r * (int64_t)a->H + (int64_t)kvh * G + g) * W;
        }
        for (int c = 0; c < nk; c += 4) {
            /* the first group requests its own keys and values 8 ahead into L1: widened at each
             * load, the task's reads wait on misses one chunk at a time where the keys are in
             * memory, not L2 / L3 (4 rows over 512 keys 84 us without these, 66 with, 64 with the
             * split widened first: bench/results/2026-11-28-cpu-attention/variants-qb.txt,
             * attention.txt) */
            if (q0 == 0)
                for (int i = c + 8; i < c + 12 && i < n; i++)
                    for (int d = 0; d < D * es; d += 64) {
                        _mm_prefetch((const char *)kp[i] + d, _MM_HINT_T0);
                        _mm_prefetch((const char *)vp[i] + d, _MM_HINT_T0);
                    }
            if (q0 == 0 && next) { /* the later task's share for these 4 keys' scores */
                const int pa = (int)((int64_t)next->n * c / nk), pb = (int)((int64_t)next->n * (c + 4) / nk);
                prefetch_keys(next->a, next, pa, pb < next->n ? pb : next->n); /* its own sequence's */
            }
#ifdef __AVX512F__
            if (QB == QBMAX) qk_4p(s1, c, qp, kp + c, D, half, QBMAX); /* QB a constant in each call */
            else qk_4p(s1, c, qp, kp + c, D, half, 3);
#else
            if (QB == QBMAX) QK_4(sc, c, qp, kp + c, D, half, QBMAX);
            else QK_4(sc, c, qp, kp + c, D, half, 3);
#endif
        }
        for (int i = 0; i < QB; i++) {
            const int t = k->t0 + (q0 + (i < nq ? i : 0)) / G;
            if (t != vis_row) {
                vis_any = visible(a, k->all, t, k->j0, n, vis);
                vis_row = t;
#ifdef __AVX512F__
                for (int g = 0; g < nk / 16; g++)
                    vm[g] = (__mmask16)(_mm256_movemask_ps(vis[2 * g]) |
                                        (2 * g + 1 < nb ? _mm256_movemask_ps(vis[2 * g + 1]) << 8 : 0));
#endif
            }
            live[i] = vis_any;
            if (!live[i]) { /* all hidden: numerators 0, so the value sums below are 0 too */
                memset(sc[i], 0, sizeof(float) * (size_t)(nb * 8));
                continue;
            }
#ifdef __AVX512F__
            { /* the 256-bit code's operations below, 16 lanes at a time; the sum of the numerators
               * adds the same 8-lane halves in the same order */
                const __m512 ninf16 = _mm512_set1_ps(-INFINITY), scale16 = _mm512_set1_ps(a->scale);
                __m512 mx16 = ninf16;
                for (int g = 0; g < nk / 16; g++) {
                    const __m512 s = _mm512_mask_blend_ps(vm[g], ninf16, _mm512_mul_ps(scores16(s1[i] + 64 * g), scale16));
                    _mm512_storeu_ps(sc[i] + 16 * g, s);
                    mx16 = _mm512_max_ps(mx16, s);
                }
                const float m = hmax8(_mm256_max_ps(_mm512_castps512_ps256(mx16), _mm512_extractf32x8_ps(mx16, 1)));
                const __m512 mv = _mm512_set1_ps(m);
                __m256 tot = _mm256_setzero_ps();
                for (int g = 0; g < nk / 16; g++) {
                    const __m512 p = _mm512_maskz_mov_ps(vm[g], exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(sc[i] + 16 * g), mv)));
                    _mm512_storeu_ps(sc[i] + 16 * g, p);
                    tot = _mm256_add_ps(tot, _mm512_castps512_ps256(p));
                    if (2 * g + 1 < nb) tot = _mm256_add_ps(tot, _mm512_extractf32x8_ps(p, 1));
                }
                outp[i][0] = m;
                outp[i][1] = hsum8(tot);
                continue;
            }
#endif
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
        float sums[QBMAX][256];
        float *sp[QBMAX];
        for (int i = 0; i < QB; i++) sp[i] = D <= 256 ? sums[i] : outp[i] + 2;
        int d0 = 0;
        const float(*p)[SPLIT] = (const float(*)[SPLIT])sc;
        for (; d0 + 32 <= D; d0 += 32)
            if (QB == QBMAX) PV_4(sp, p, vp, nb * 8, d0, half, QBMAX);
            else PV_4(sp, p, vp, nb * 8, d0, half, 3);
        for (; d0 < D; d0 += 8)
            if (QB == QBMAX) pv_1(sp, p, vp, nb * 8, d0, half, QBMAX);
            else pv_1(sp, p, vp, nb * 8, d0, half, 3);
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

static void split_task_f32(const job *a, const task *k, const task *next) { split_task(a, k, next, 0); }
static void split_task_f16(const job *a, const task *k, const task *next) { split_task(a, k, next, 1); }

/* the first i in [0, n] with cum[i] >= x (cum ascending) */
static int64_t lower_bound(const int64_t *cum, int64_t n, int64_t x) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (cum[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* One sequence's attention of a step, planned: its job, its tasks (the shared splits', then its
 * rows' own, each pointing at the job), a rough cost of the tasks before each (cum) and the
 * buffers they fill. */
typedef struct {
    job a;
    int64_t n_shared, tasks, shared_floats;
    int64_t *off, *cum, *idx, *cnt, *first;
    float *part, *out;
    task *tk;
    int own;
} seq_att;

static void seq_free(seq_att *s) {
    free(s->off);
    free(s->part);
    free(s->tk);
    free(s->cum);
    free(s->idx);
    free(s->cnt);
    memset(s, 0, sizeof *s);
}

/* s planned for T rows (T >= 1) over L keys; 0, -1 out of memory, -2 shapes it does not take.
 * s must not move afterwards (its tasks point at s->a). */
static int seq_plan(seq_att *s, const float *q, int64_t q_stride, int T, int H, int KV, int D, const void *kc,
                    const void *vc, const int32_t *blocks, int bs, int64_t L, const uint8_t *mask, int causal,
                    float scale, float *out, int half) {
    memset(s, 0, sizeof *s);
    const int G = H / KV, W = D + 2;
    if (G > MAXG || D % 8 || L < 1) return -2;
    const int64_t n_split = (L + SPLIT - 1) / SPLIT;
    /* The splits follow a row's visible keys by rank, as a chain holding exactly those keys would
     * cut them. Where every row's visible keys are a prefix 0 .. V - 1 of the cache (no mask, the
     * causal rule, a chain's mask) rank is place: the shared splits of SPLIT places serve every
     * row. Otherwise (own: a tree's mask) the splits below P0 (keys every row sees) stay shared,
     * and each row's visible keys from P0 on are cut into splits of its own, by rank. */
    int64_t P = L; /* keys 0 .. P - 1 are visible to every row */
    int own = 0;
    if (mask)
        for (int t = 0; t < T; t++) {
            const uint8_t *row = mask + (int64_t)t * L, *z = memchr(row, 0, (size_t)L);
            const int64_t V = z ? z - row : L;
            P = V < P ? V : P;
            for (int64_t j = V + 1; j < L && !own; j++) own = row[j] != 0;
        }
    const int64_t n_shared = own ? P / SPLIT : n_split, P0 = n_shared * SPLIT, tail = L - P0;
    /* own: row t's visible keys from P0 on at idx[t * tail ..], cnt[t] of them, in its own splits
     * first[t] .. first[t + 1] - 1 (counted over all rows) */
    int64_t *idx = NULL, *cnt = NULL, *first = NULL, n_own = 0;
    if (own) {
        idx = malloc(sizeof(int64_t) * (size_t)(T * tail));
        cnt = malloc(sizeof(int64_t) * (size_t)(2 * T + 1));
        if (!idx || !cnt) {
            free(idx);
            free(cnt);
            return -1;
        }
        first = cnt + T;
        first[0] = 0;
        for (int t = 0; t < T; t++) {
            const uint8_t *row = mask + (int64_t)t * L;
            int64_t c = 0, *mine = idx + t * tail;
            for (int64_t j = P0; j < L; j++)
                if (row[j]) mine[c++] = j;
            cnt[t] = c;
            first[t + 1] = first[t] + (c + SPLIT - 1) / SPLIT;
        }
        n_own = first[T];
    }
    const int64_t tasks = (n_shared + n_own) * KV, shared_floats = n_shared * T * H * W;
    int64_t *off = malloc(sizeof(int64_t) * (size_t)L), *cum = malloc(sizeof(int64_t) * (size_t)(tasks + 1));
    float *part = malloc(sizeof(float) * (size_t)(shared_floats + n_own * H * W + 1));
    task *tk = malloc(sizeof(task) * (size_t)(tasks + 1));
    if (!off || !part || !tk || !cum) {
        free(off);
        free(part);
        free(tk);
        free(cum);
        free(idx);
        free(cnt);
        return -1;
    }
    for (int64_t b = 0, j = 0; j < L; b++)
        for (int o = 0; o < bs && j < L; o++, j++) off[j] = ((int64_t)blocks[b] * bs + o) * KV * D;
    s->a = (job){q, (const float *)kc, (const float *)vc, off, mask, q_stride, L, T, H, KV, D, causal, scale, half};
    /* the tasks: the shared splits' (split, then kv head), then each row's own (row, split, kv
     * head); cum[i]: a rough cost of the tasks before task i */
    float *own_part = part + shared_floats;
    cum[0] = 0;
    for (int64_t i = 0; i < n_shared * KV; i++) {
        const int64_t sp = i / KV, j0 = sp * SPLIT;
        tk[i] = (task){(int)(i % KV), 0, T, (int)(j0 + SPLIT < L ? SPLIT : L - j0), own, j0, NULL,
                       part + sp * T * H * W, &s->a};
        cum[i + 1] = cum[i] + (int64_t)tk[i].n * (T + 1);
    }
    for (int64_t t = 0, i = n_shared * KV; own && t < T; t++)
        for (int64_t sp = 0; sp < first[t + 1] - first[t]; sp++)
            for (int kvh = 0; kvh < KV; kvh++, i++) {
                const int64_t r0 = sp * SPLIT;
                tk[i] = (task){kvh, (int)t, 1, (int)(cnt[t] - r0 < SPLIT ? cnt[t] - r0 : SPLIT), 1, 0,
                               idx + t * tail + r0, own_part + (first[t] + sp) * H * W, &s->a};
                cum[i + 1] = cum[i] + (int64_t)tk[i].n * 2;
            }
    s->n_shared = n_shared, s->tasks = tasks, s->shared_floats = shared_floats;
    s->off = off, s->cum = cum, s->idx = idx, s->cnt = cnt, s->first = first;
    s->part = part, s->out = out, s->tk = tk, s->own = own;
    return 0;
}

/* row r (= t H + h) of sequence s: its splits' partial results merged in split order, the shared
 * ones, then the row's own, into s->out */
static void merge_row(const seq_att *s, int64_t r) {
    const int H = s->a.H, D = s->a.D, W = D + 2;
    const int64_t t = r / H, h = r % H, n_shared = s->n_shared, T = s->a.T;
    const int64_t n_part = n_shared + (s->own ? s->first[t + 1] - s->first[t] : 0);
    const float *own_part = s->part + s->shared_floats;
#define PART(sp) ((sp) < n_shared ? s->part + ((sp) * T * H + r) * W : own_part + ((s->first[t] + (sp) - n_shared) * H + h) * W)
    float mx = -INFINITY;
    for (int64_t sp = 0; sp < n_part; sp++) {
        const float m = PART(sp)[0];
        mx = m > mx ? m : mx;
    }
    float *o = s->out + r * D;
    memset(o, 0, sizeof(float) * (size_t)D);
    if (mx == -INFINITY) return; /* no visible key: zeros */
    float total = 0.0f;
    for (int64_t sp = 0; sp < n_part; sp++) {
        const float *p = PART(sp);
        if (p[0] == -INFINITY) continue;
        const float w = expf(p[0] - mx);
        total += w * p[1];
        const __m256 wv = _mm256_set1_ps(w);
        for (int d = 0; d < D; d += 8)
            _mm256_storeu_ps(o + d, _mm256_fmadd_ps(wv, _mm256_loadu_ps(p + 2 + d), _mm256_loadu_ps(o + d)));
    }
#undef PART
    const __m256 inv = _mm256_set1_ps(1.0f / total);
    for (int d = 0; d < D; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(inv, _mm256_loadu_ps(o + d)));
}

/* The planned sequences' attention in one parallel region: every sequence's tasks in one list,
 * each thread one contiguous range of it, then every sequence's rows merged. Returns 0, -1 out
 * of memory. One sequence: its tasks split as they always were (equal counts; with rows' own
 * splits by cost); several: by cost. Why one region for a batch: a region per sequence and layer
 * paid its start, its barriers and its first tasks' requests (waited on, with nothing before them
 * to hide behind) once per sequence; here a task requests the keys of the task AHEAD after it
 * whichever sequence that is. */
static int run_seqs(seq_att *ss, int n, int threads) {
    const int half = ss[0].a.half; /* one pool for every sequence */
    int64_t total = 0, rows = 0;
    for (int b = 0; b < n; b++) total += ss[b].tasks, rows += (int64_t)ss[b].a.T * ss[b].a.H;
    if (total == 0) return 0;
    /* the tasks in one list (pointers), their costs, and each sequence's first row: one allocation */
    char *mem = malloc(sizeof(task *) * (size_t)total + sizeof(int64_t) * (size_t)(total + n + 2));
    if (!mem) return -1;
    const task **all = (const task **)mem;
    int64_t *gcum = (int64_t *)(mem + sizeof(task *) * (size_t)total), *row0 = gcum + total + 1;
    gcum[0] = 0;
    row0[0] = 0;
    for (int b = 0, i = 0; b < n; b++) {
        for (int64_t k = 0; k < ss[b].tasks; k++, i++) {
            all[i] = &ss[b].tk[k];
            gcum[i + 1] = gcum[i] + (ss[b].cum[k + 1] - ss[b].cum[k]);
        }
        row0[b + 1] = row0[b] + (int64_t)ss[b].a.T * ss[b].a.H;
    }
    const int by_cost = n > 1 || ss[0].own;
    if (threads > total) threads = (int)total;
    if (threads < 1) threads = 1;
#pragma omp parallel num_threads(threads)
    {
        /* each thread takes one contiguous range of tasks: the kv heads of a split, then the next
         * split's, so that its keys and values are one run of memory, 768-byte rows used whole
         * (round robin over tasks had both threads stride through rows a third used: attention
         * at 4-16 rows took 22-26% longer over 1,500 keys, 4-17% over 512, bench/results/
         * 2026-11-26-cpu-attention-ranges/NOTES.md); with rows' own splits (a task of one row),
         * or several sequences, ranges of about equal cost. The first AHEAD tasks' keys and values
         * are requested before the first starts, each later one's while the task AHEAD before it
         * scores its keys (split_task). Which thread computes a task does not change its numbers. */
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t lo = by_cost ? lower_bound(gcum, total, gcum[total] * t / nt) : total * t / nt,
                      hi = by_cost ? lower_bound(gcum, total, gcum[total] * (t + 1) / nt) : total * (t + 1) / nt;
        for (int64_t p = lo; p < lo + AHEAD && p < hi; p++) prefetch_keys(all[p]->a, all[p], 0, all[p]->n);
        void (*const run)(const job *, const task *, const task *) = half ? split_task_f16 : split_task_f32;
        for (int64_t i = lo; i < hi; i++) run(all[i]->a, all[i], i + AHEAD < hi ? all[i + AHEAD] : NULL);
#pragma omp barrier
        /* merge the splits of each (row, head) in split order: the shared ones, then the row's
         * own; the (row, head) pairs shared between the threads (merged by the calling thread
         * alone, this took about 3% of an 8-token forward over 512 keys: an expf and a weighted
         * sum per split, rows x heads x splits of them; bench/results/2026-11-28-cpu-attention-reduce/
         * NOTES.md), each the same operations wherever it runs */
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            int b = 0;
            while (row0[b + 1] <= r) b++;
            merge_row(&ss[b], r - row0[b]);
        }
    }
    free(mem);
    return 0;
}

static int attention(const float *q, int64_t q_stride, int T, int H, int KV, int D, const void *kc, const void *vc,
                     const int32_t *blocks, int bs, int64_t L, const uint8_t *mask, int causal, float scale,
                     float *out, int threads, int half) {
    seq_att s;
    int rc = seq_plan(&s, q, q_stride, T, H, KV, D, kc, vc, blocks, bs, L, mask, causal, scale, out, half);
    if (rc == 0) rc = run_seqs(&s, 1, threads);
    seq_free(&s);
    return rc;
}

/* A batch's attention in one call, the same numbers as skinny_attention(_kv16) per sequence:
 * sequence b's rows seq_start[b] .. seq_start[b + 1] - 1 of q (at q_stride) and out ((rows, H,
 * D) contiguous), over seq_len[b] keys in its blocks seq_blocks[b], its mask seq_mask[b] (or
 * NULL) or, where seq_causal is given and seq_causal[b] is set, the causal rule. half: fp16 pools.
 * 0, -1 out of memory (out then incomplete), -2 shapes it does not take or fp16 without F16C. */
int skinny_attention_seqs(int n_seq, const float *q, int64_t q_stride, const int32_t *seq_start, int H, int KV,
                          int D, const void *kc, const void *vc, const int32_t *const *seq_blocks, int bs,
                          const int64_t *seq_len, const uint8_t *const *seq_mask, const uint8_t *seq_causal,
                          float scale, float *out, int threads, int half) {
#ifndef __F16C__
    if (half) return -2;
#endif
    if (n_seq < 1) return 0;
    seq_att *ss = calloc((size_t)n_seq, sizeof(seq_att));
    if (!ss) return -1;
    int rc = 0, m = 0; /* m: the sequences planned (those with rows) */
    for (int b = 0; b < n_seq && rc == 0; b++) {
        const int r0 = seq_start[b], T = seq_start[b + 1] - r0;
        if (T < 1) continue;
        rc = seq_plan(&ss[m], q + (int64_t)r0 * q_stride, q_stride, T, H, KV, D, kc, vc, seq_blocks[b], bs,
                      seq_len[b], seq_mask[b], seq_causal ? seq_causal[b] : 0, scale, out + (int64_t)r0 * H * D,
                      half);
        if (rc == 0) m++;
    }
    if (rc == 0 && m > 0) rc = run_seqs(ss, m, threads);
    for (int b = 0; b < m; b++) seq_free(&ss[b]);
    free(ss);
    return rc;
}

/* returns 0, -1 when a buffer could not be allocated (out is then incomplete), -2 on shapes it
 * does not take */
int skinny_attention(const float *q, int64_t q_stride, int T, int H, int KV, int D, const float *kc,
                     const float *vc, const int32_t *blocks, int bs, int64_t L, const uint8_t *mask, int causal,
                     float scale, float *out, int threads) {
    return attention(q, q_stride, T, H, KV, D, kc, vc, blocks, bs, L, mask, causal, scale, out, threads, 0);
}

/* the same over fp16 pools (uint16_t bits): each key's and value's fp16 numbers are widened to
 * fp32 exactly, so a row's result is bit for bit skinny_attention's over fp32 pools holding the
 * same numbers; -2 in a build without F16C */
int skinny_attention_kv16(const float *q, int64_t q_stride, int T, int H, int KV, int D, const void *kc,
                          const void *vc, const int32_t *blocks, int bs, int64_t L, const uint8_t *mask, int causal,
                          float scale, float *out, int threads) {
#ifdef __F16C__
    return attention(q, q_stride, T, H, KV, D, kc, vc, blocks, bs, L, mask, causal, scale, out, threads, 1);
#else
    (void)q, (void)q_stride, (void)T, (void)H, (void)KV, (void)D, (void)kc, (void)vc, (void)blocks, (void)bs;
    (void)L, (void)mask, (void)causal, (void)scale, (void)out, (void)threads;
    return -2;
#endif
}

/* whether this build reads fp16 pools (skinny_attention_kv16, prefill_attention_kv16, the layer
 * stack's fp16 cache) */
int skinny_kv16_available(void) {
#ifdef __F16C__
    return 1;
#else
    return 0;
#endif
}

/* The (T, C + T) visibility bytes skinny_attention reads for a tree step's rows: row t sees the C
 * committed keys and key C + j of the step where bit j of its mask words is set (bit j % 32 of
 * word j / 32 of row t: kernels/mask.py's layout), 1 = visible. kernels/torch_plan.py plans a
 * step with it (a few microseconds, where unpacking the words with torch took some ten ops a
 * sequence). */
void skinny_visibility(const int32_t *words, int64_t n_words, int64_t T, int64_t C, uint8_t *out) {
    const int64_t L = C + T;
    for (int64_t t = 0; t < T; t++) {
        uint8_t *row = out + t * L;
        memset(row, 1, (size_t)C);
        const uint32_t *w = (const uint32_t *)words + t * n_words;
        for (int64_t j = 0; j < T; j++) row[C + j] = (uint8_t)((w[j >> 5] >> (j & 31)) & 1u);
    }
}
