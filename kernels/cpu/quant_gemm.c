/* y = x @ W.T (+ b) for few rows of x with W quantized in blocks of 32 along K (GGUF's Q4_1 and
 * Q8_0), OpenMP over panels of 16 rows of W. kernels/quant.py packs the weights, launches this
 * and holds the torch reference.
 *
 * Formats (w = one weight, u its stored unsigned integer, d and m its block's fp16 scales):
 *   Q4_1: w = d u + m, u in 0..15 (GGUF's values: the weights equal the file's dequantized ones);
 *   Q8_0: w = d (u - 128), u = q + 128 for GGUF's int8 q (unsigned: the integer dot product
 *         below takes the weight as its unsigned operand);
 *   Q4_1F: Q4_1 with fp32 d and m: GGUF's Q4_K, whose 32-weight sub-blocks are w = (D sc) u -
 *         (Dmin mn) with fp16 D, Dmin and 6-bit sc, mn, products fp16 cannot hold but fp32
 *         holds exactly (the weights again equal the file's dequantized ones).
 * Each row of x is quantized here per block, as llama.cpp's q8_0 does for activations:
 * s = max |x| / 127, q = round-to-nearest-even(x * (1 / s)) in int8, all in fp32; then
 *   y = sum_b d_b s_b dot_b(u, q) (+ m_b s_b sum_b(q) for Q4_1) (+ bias),
 * every dot_b an exact int32.
 *
 * Layout: rows of W in panels of 16 (the last padded with zero weights), each panel's blocks in
 * order, a panel-block being (bytes)
 *   Q8_0: 8 x 64: vector c holds elements 4c..4c+3 of the block for each of the 16 rows (row r
 *         at bytes 4r..4r+3); then the 16 rows' d (fp16)                       -> 544 bytes;
 *   Q4_1: 4 x 64: vector t's low nibbles hold elements 4t.. of the 16 rows as above, its high
 *         nibbles elements 16 + 4t..; then 16 d and 16 m (fp16)               -> 320 bytes;
 *   Q4_1F: Q4_1's nibbles, then 16 d and 16 m (fp32)                          -> 384 bytes,
 * the file's own bytes per weight. So an int32 lane of a vector is one row of W, and one
 * vpdpbusd (AVX512-VNNI: u8 x s8, four products a lane) against 4 bytes of x broadcast to every
 * lane adds 4 products to 16 rows at once: a block's dot is 8 of them into one register, with
 * no horizontal sums, and the float work (convert, scale, add) is one vector per 16 rows and a
 * block instead of one per row. Q8_0's offset of 128 is taken back exactly by starting the sum at
 * -128 times the block's sum of q. Without VNNI, maddubs + madd (Q8_0 as |q| x sign-moved x, so
 * no int16 sum saturates). The AVX2 build holds a panel as two 8-lane halves.
 *
 * Every output y[i, n] is lane n % 16 of one accumulator, computed by the same operations
 * whatever M, i, the tile and the thread: for the blocks in order, acc = fma(float(dot), d s,
 * acc) (then, Q4_1, acc = fma(m, s sum(q), acc)), then + bias. A row's result does not depend
 * on the step it is in, bit for bit, so greedy speculation stays lossless; the builds (AVX-512
 * with or without VNNI, AVX2) compute the same sums in the same order, the integer parts exact.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "side_prefetch.h"

enum { QF_Q4_1 = 1, QF_Q8_0 = 2, QF_Q4_1F = 3 }; /* kernels/quant.py FORMATS */
/* A tile requests each panel's bytes this far ahead of its reads, into L2. A thread streams its
 * panels as a few short runs (a panel is K / 32 x 320 bytes: 5.8 KB at K = 576), each crossing a
 * 4 KB page, where the hardware prefetchers stop and train again. Over 30 cold weights per run
 * (bench/results/2026-11-27-cpu-side-prefetch/NOTES.md) 16 KB ahead took 12% off a one-row
 * (3072 x 576) Q4_1 product and 24% off an 8-row one; 2-4 KB ahead or the L1 hint gained
 * nothing, 64 KB less than 16. */
#define QPF 16384
#define PANEL 16                   /* rows of W a panel holds */

static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else /* no F16C: by the bits (normal, subnormal, zero, inf / NaN) */
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (e == 0) {
        const float f = (float)man * 0x1p-24f;
        return sign ? -f : f;
    }
    const uint32_t bits = e == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((e + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

/* ---- one row of x quantized: q (K int8, in order), s per block, S = s * sum(q) per block,
 * xc = -128 * sum(q) per block (Q8_0's offset, where the dot product starts). In vectors: with
 * a scalar loop storing each byte it took 4% of an 8-token forward's samples; packed, the
 * products at 8 rows took 4-12% less time, the same bytes (bench/results/
 * 2026-11-28-cpu-attention-reduce/NOTES.md) ---- */
static void quant_row(const float *x, int64_t K, int8_t *q, float *s, float *S, int32_t *xc) {
    for (int64_t b = 0; b < K / 32; b++) {
        const float *xb = x + b * 32;
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(xb + 8 * j);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
        }
        float lanes[8], a = 0.0f;
        _mm256_storeu_ps(lanes, amax);
        for (int j = 0; j < 8; j++) a = lanes[j] > a ? lanes[j] : a;
        const float d = a / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        /* cvtps rounds to nearest even (the default mode), as torch.round; |x / d| <= 127 (up to
         * rounding of x * (1 / d), never past 127.5), so the saturating packs keep every value but
         * cvtps's answer to a NaN (INT32_MIN), stored as its low byte (0), as a cast to int8 does:
         * a row with an inf or NaN keeps the NaN logits it had, summed in with INT32_MIN */
        __m256i total = _mm256_setzero_si256();
        const __m256i bad = _mm256_set1_epi32(INT32_MIN);
        for (int j = 0; j < 4; j++) {
            const __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], _mm256_set1_ps(id)));
            total = _mm256_add_epi32(total, r);
            const __m256i rq = _mm256_andnot_si256(_mm256_cmpeq_epi32(r, bad), r);
            const __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(rq), _mm256_extracti128_si256(rq, 1));
            _mm_storel_epi64((__m128i *)(q + b * 32 + 8 * j), _mm_packs_epi16(h, h));
        }
        uint32_t lanes_i[8], sum = 0; /* wrapping, as the int32 sums of INT32_MIN wrap */
        _mm256_storeu_si256((__m256i *)lanes_i, total);
        for (int j = 0; j < 8; j++) sum += lanes_i[j];
        s[b] = d;
        S[b] = d * (float)(int32_t)sum;
        xc[b] = (int32_t)(sum * (uint32_t)-128);
    }
}

/* ---- a panel's 16 lanes: one 512-bit vector, or two 256-bit halves in the AVX2 build ---- */
#if defined(__AVX512F__)
typedef __m512i pint;
typedef __m512 pflt;
static inline pint p_load(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline pint p_lo(pint v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0f)); }
static inline pint p_hi(pint v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0f)); }
static inline pint p_bcast(const int8_t *x4) {
    int32_t t;
    memcpy(&t, x4, 4);
    return _mm512_set1_epi32(t);
}
static inline pint p_seti(int32_t v) { return _mm512_set1_epi32(v); }
static inline pflt p_half(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline pflt p_f32(const uint8_t *p) { return _mm512_loadu_ps((const void *)p); }
static inline pflt p_setf(float v) { return _mm512_set1_ps(v); }
static inline pflt p_zero(void) { return _mm512_setzero_ps(); }
static inline pflt p_mul(pflt a, pflt b) { return _mm512_mul_ps(a, b); }
static inline pflt p_fma(pflt a, pflt b, pflt c) { return _mm512_fmadd_ps(a, b, c); }
static inline pflt p_cvt(pint v) { return _mm512_cvtepi32_ps(v); }
#if defined(__AVX512VNNI__)
static inline pint dot4(pint acc, pint w, pint x) { return _mm512_dpbusd_epi32(acc, w, x); }
static inline pint dot8(pint acc, pint w, pint x) { return _mm512_dpbusd_epi32(acc, w, x); }
#define Q8_OFFSET_IN_START 1 /* dot8 takes u = q + 128: its sum starts at -128 sum(x) */
#else
static inline pint dot4(pint acc, pint w, pint x) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
}
static inline pint dot8(pint acc, pint w, pint x) { /* q = u ^ 0x80; |q| x (x with q's sign) */
    const __m512i q = _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80));
    const __m512i xs = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(q), _mm512_setzero_si512(), x);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(q), xs),
                                                   _mm512_set1_epi16(1)));
}
#define Q8_OFFSET_IN_START 0
#endif
/* y[0..nc) = v + b[0..nc) (b may be NULL) */
static inline void p_store(float *y, pflt v, const float *b, int nc) {
    const __mmask16 k = nc >= 16 ? 0xffff : (__mmask16)((1u << nc) - 1);
    if (b) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, b));
    _mm512_mask_storeu_ps(y, k, v);
}
#else
typedef struct { __m256i a, b; } pint;
typedef struct { __m256 a, b; } pflt;
static inline pint p_load(const uint8_t *p) {
    return (pint){_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)(p + 32))};
}
static inline pint p_lo(pint v) {
    const __m256i m = _mm256_set1_epi8(0x0f);
    return (pint){_mm256_and_si256(v.a, m), _mm256_and_si256(v.b, m)};
}
static inline pint p_hi(pint v) {
    const __m256i m = _mm256_set1_epi8(0x0f);
    return (pint){_mm256_and_si256(_mm256_srli_epi16(v.a, 4), m), _mm256_and_si256(_mm256_srli_epi16(v.b, 4), m)};
}
static inline pint p_bcast(const int8_t *x4) {
    int32_t t;
    memcpy(&t, x4, 4);
    return (pint){_mm256_set1_epi32(t), _mm256_set1_epi32(t)};
}
static inline pint p_seti(int32_t v) { return (pint){_mm256_set1_epi32(v), _mm256_set1_epi32(v)}; }
static inline pflt p_half(const uint8_t *p) {
#if defined(__F16C__)
    return (pflt){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
                  _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)))};
#else
    float f[16];
    uint16_t h[16];
    memcpy(h, p, 32);
    for (int i = 0; i < 16; i++) f[i] = half_to_float(h[i]);
    return (pflt){_mm256_loadu_ps(f), _mm256_loadu_ps(f + 8)};
#endif
}
static inline pflt p_f32(const uint8_t *p) {
    return (pflt){_mm256_loadu_ps((const float *)p), _mm256_loadu_ps((const float *)(p + 32))};
}
static inline pflt p_setf(float v) { return (pflt){_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
static inline pflt p_zero(void) { return (pflt){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline pflt p_mul(pflt x, pflt y) { return (pflt){_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
static inline pflt p_fma(pflt x, pflt y, pflt z) {
    return (pflt){_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)};
}
static inline pflt p_cvt(pint v) { return (pflt){_mm256_cvtepi32_ps(v.a), _mm256_cvtepi32_ps(v.b)}; }
static inline __m256i dot4h(__m256i acc, __m256i w, __m256i x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}
static inline __m256i dot8h(__m256i acc, __m256i w, __m256i x) {
    const __m256i q = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q)),
                                                   _mm256_set1_epi16(1)));
}
static inline pint dot4(pint acc, pint w, pint x) { return (pint){dot4h(acc.a, w.a, x.a), dot4h(acc.b, w.b, x.b)}; }
static inline pint dot8(pint acc, pint w, pint x) { return (pint){dot8h(acc.a, w.a, x.a), dot8h(acc.b, w.b, x.b)}; }
#define Q8_OFFSET_IN_START 0
static inline void p_store(float *y, pflt v, const float *b, int nc) {
    float t[16];
    _mm256_storeu_ps(t, v.a);
    _mm256_storeu_ps(t + 8, v.b);
    for (int j = 0; j < nc; j++) y[j] = b ? t[j] + b[j] : t[j];
}
#endif

/* the activations of a call, quantized: per row K bytes of q, and per block s, S, xc */
typedef struct {
    const int8_t *q;
    const float *s, *S;
    const int32_t *xc;
} qrows;

/* R rows of x (from row i0) times C panels of W (from panel p0: W + p0 * nb * BPB) -> y */
#define QTILE(FMT, R, C)                                                                                     \
    static inline void qtile##FMT##_##R##x##C(const qrows *a, int64_t i0, const uint8_t *W, const float *bias,   \
                                              float *y, int64_t N, int64_t K, int64_t p0, int np) {           \
        const int64_t nb = K / 32, BPB = FMT == 4 ? 320 : FMT == 5 ? 384 : 544;                                \
        const uint8_t *wp[C];                                                                                 \
        _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) wp[j] = W + (p0 + (j < np ? j : 0)) * nb * BPB;   \
        pflt acc[R][C];                                                                                       \
        _Pragma("GCC unroll 8") for (int i = 0; i < R; i++)                                                  \
            _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) acc[i][j] = p_zero();                         \
        for (int64_t b = 0; b < nb; b++) {                                                                    \
            _Pragma("GCC unroll 8") for (int j = 0; j < C; j++)                                              \
                _Pragma("GCC unroll 9") for (int o = 0; o < BPB; o += 64)                                    \
                    _mm_prefetch((const char *)wp[j] + b * BPB + QPF + o, _MM_HINT_T1);                       \
            pint dot[R][C];                                                                                   \
            _Pragma("GCC unroll 8") for (int i = 0; i < R; i++) {                                            \
                const pint start = p_seti(FMT == 8 && Q8_OFFSET_IN_START ? a->xc[(i0 + i) * nb + b] : 0);     \
                _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) dot[i][j] = start;                        \
            }                                                                                                 \
            if (FMT != 8) {                                                                                   \
                _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {                                        \
                    pint wl[C], wh[C];                                                                        \
                    _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) {                                    \
                        const pint v = p_load(wp[j] + b * BPB + 64 * t);                                      \
                        wl[j] = p_lo(v);                                                                      \
                        wh[j] = p_hi(v);                                                                      \
                    }                                                                                         \
                    _Pragma("GCC unroll 8") for (int i = 0; i < R; i++) {                                    \
                        const int8_t *xq = a->q + (i0 + i) * K + b * 32;                                      \
                        const pint xl = p_bcast(xq + 4 * t), xh = p_bcast(xq + 16 + 4 * t);                   \
                        _Pragma("GCC unroll 8") for (int j = 0; j < C; j++)                                  \
                            dot[i][j] = dot4(dot4(dot[i][j], wl[j], xl), wh[j], xh);                          \
                    }                                                                                         \
                }                                                                                             \
            } else {                                                                                          \
                _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) {                                        \
                    pint wv[C];                                                                               \
                    _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) wv[j] = p_load(wp[j] + b * BPB + 64 * c); \
                    _Pragma("GCC unroll 8") for (int i = 0; i < R; i++) {                                    \
                        const pint xv = p_bcast(a->q + (i0 + i) * K + b * 32 + 4 * c);                        \
                        _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) dot[i][j] = dot8(dot[i][j], wv[j], xv); \
                    }                                                                                         \
                }                                                                                             \
            }                                                                                                 \
            _Pragma("GCC unroll 8") for (int j = 0; j < C; j++) {                                            \
                const uint8_t *sc = wp[j] + b * BPB + (FMT == 8 ? 512 : 256);                                 \
                const pflt d = FMT == 5 ? p_f32(sc) : p_half(sc);                                             \
                _Pragma("GCC unroll 8") for (int i = 0; i < R; i++)                                          \
                    acc[i][j] = p_fma(p_cvt(dot[i][j]), p_mul(d, p_setf(a->s[(i0 + i) * nb + b])), acc[i][j]); \
                if (FMT != 8) {                                                                               \
                    const pflt m = FMT == 5 ? p_f32(sc + 64) : p_half(sc + 32);                               \
                    _Pragma("GCC unroll 8") for (int i = 0; i < R; i++)                                      \
                        acc[i][j] = p_fma(m, p_setf(a->S[(i0 + i) * nb + b]), acc[i][j]);                     \
                }                                                                                             \
            }                                                                                                 \
        }                                                                                                     \
        for (int i = 0; i < R; i++)                                                                           \
            for (int j = 0; j < np; j++) {                                                                    \
                const int64_t n = (p0 + j) * PANEL, nc = N - n < PANEL ? N - n : PANEL;                       \
                p_store(y + (i0 + i) * N + n, acc[i][j], bias ? bias + n : NULL, (int)nc);                    \
            }                                                                                                 \
    }

#if defined(__AVX512F__)
#define TILES(F)                                                                                              \
    QTILE(F, 1, 4) QTILE(F, 2, 3) QTILE(F, 6, 2) QTILE(F, 5, 2) QTILE(F, 4, 2) QTILE(F, 3, 2) QTILE(F, 2, 2)  \
        QTILE(F, 1, 2)
#define Q_WIDE 4   /* M = 1: panels in flight (64 rows of W) */
#define Q_MID 3    /* M = 2: one 2-row tile over three panels */
/* M >= 3: two panels, in 6-row tiles (2 x 6 x 2 accumulators + the panels' vectors: 28 of the 32
 * registers, none spilled in the block loop), the rest in one tile of 5, 4, .. 1 rows. Per block
 * a tile unpacks its panels' nibbles once for all its rows and does one float step per row and
 * panel, so the more rows a tile holds, the more of the vector ports' work is vpdpbusd: at 5-6
 * rows 0.83-0.87x the time of a 4-row tile and the rest, at 9-14 rows 0.87-0.94x, at 7-8 rows
 * 0.94-0.98x (Q4_1, the default model's layer shapes; an even split into tiles of at most 6 was
 * no faster: bench/results/2026-11-29-cpu-six-row-tiles/NOTES.md). Each output's arithmetic is
 * the same in every tile. */
#define Q_NARROW 2
#define T_6(F) qtile##F##_6x2
#define T_5(F) qtile##F##_5x2
#define T_ONE(F) qtile##F##_1x4
#define T_MID2(F) qtile##F##_2x3
#define T_4(F) qtile##F##_4x2
#define T_3(F) qtile##F##_3x2
#define T_2(F) qtile##F##_2x2
#define T_1(F) qtile##F##_1x2
#else /* 16 registers hold little of a two-half panel: one panel, one or two rows at a time */
#define TILES(F) QTILE(F, 1, 2) QTILE(F, 2, 1) QTILE(F, 1, 1)
#define Q_WIDE 2
#define Q_MID 1
#define Q_NARROW 1
#define T_6(F) qtile##F##_2x1
#define T_5(F) qtile##F##_2x1
#define T_ONE(F) qtile##F##_1x2
#define T_MID2(F) qtile##F##_2x1
#define T_4(F) qtile##F##_2x1
#define T_3(F) qtile##F##_2x1
#define T_2(F) qtile##F##_2x1
#define T_1(F) qtile##F##_1x1
#endif
TILES(4)
TILES(5)
TILES(8)
/* from 3 rows on the NARROW tiles: three rows in one 3 x 2 tile took 0.69-0.82x the time of a 2 x 3
 * tile then a 1 x 3 one (unpacking the panels twice), at two rows a 2 x 2 tile was no faster */
#define Q_MID_ROWS 3

static int q_tile_panels(int64_t M) { return M == 1 ? Q_WIDE : M < Q_MID_ROWS ? Q_MID : Q_NARROW; }

#define ROWS(F)                                                                                               \
    static void qrows##F(const qrows *a, const uint8_t *W, const float *b, float *y, int64_t M, int64_t N,   \
                         int64_t K, int64_t p0, int64_t p1, side_stream *sd, int t) {                         \
        const int C = q_tile_panels(M);                                                                       \
        const int64_t panel_bytes = K / 32 * (F == 4 ? 320 : F == 5 ? 384 : 544);                             \
        for (int64_t p = p0; p < p1; p += C) {                                                                \
            const int np = p1 - p < C ? (int)(p1 - p) : C;                                                    \
            side_prefetch(sd, t, np * panel_bytes);                                                           \
            int64_t m = 0;                                                                                    \
            if (M == 1) {                                                                                     \
                T_ONE(F)(a, 0, W, b, y, N, K, p, np);                                                         \
            } else if (M < Q_MID_ROWS) {                                                                      \
                T_MID2(F)(a, 0, W, b, y, N, K, p, np); /* M = 2 */                                            \
            } else if (Q_NARROW == 1) {                                                                       \
                for (; m + 2 <= M; m += 2) T_2(F)(a, m, W, b, y, N, K, p, np);                                \
                if (m < M) T_1(F)(a, m, W, b, y, N, K, p, np);                                                \
            } else {                                                                                          \
                for (; m + 6 <= M; m += 6) T_6(F)(a, m, W, b, y, N, K, p, np);                                \
                if (M - m == 5) T_5(F)(a, m, W, b, y, N, K, p, np);                                           \
                else if (M - m == 4) T_4(F)(a, m, W, b, y, N, K, p, np);                                      \
                else if (M - m == 3) T_3(F)(a, m, W, b, y, N, K, p, np);                                      \
                else if (M - m == 2) T_2(F)(a, m, W, b, y, N, K, p, np);                                      \
                else if (M - m == 1) T_1(F)(a, m, W, b, y, N, K, p, np);                                      \
            }                                                                                                 \
        }                                                                                                     \
    }
ROWS(4)
ROWS(5)
ROWS(8)

int skinny_topk_range(const float *x, int64_t lo, int64_t hi, int k, float *val, int64_t *idx, int *filled);
int skinny_topk_merge(int parts, const float *val, const int64_t *idx, const int *filled, int k, int64_t *out);

/* quant_linear, and with k >= 1 each row's top-k of y (largest first, equal values in index
 * order: skinny_reduce.c's answer) into idx (M, k): each thread ranks the part of every row it
 * wrote, while it is in its cache, and the calling thread merges the threads' lists. A row
 * holding a NaN is listed in bad (its idx left unset). Returns the number of bad rows, -1 out
 * of memory, -2 a format it does not know. */
static int64_t linear_topk(const float *x, int64_t x_stride, int fmt, const uint8_t *W, const float *b, float *y,
                           int64_t M, int64_t N, int64_t K, int threads, int k, int64_t *idx, int64_t *bad) {
    if (fmt != QF_Q4_1 && fmt != QF_Q8_0 && fmt != QF_Q4_1F) return -2;
    if (M <= 0) return 0;
    const int64_t nb = K / 32;
    const int64_t C = q_tile_panels(M), panels = (N + PANEL - 1) / PANEL, tiles = (panels + C - 1) / C;
    int nt = threads > tiles ? (int)tiles : threads;
    if (nt < 1) nt = 1;
    if (k > 0 && nt > 256) nt = 256; /* skinny_topk_merge takes at most 256 lists a row */
    /* the activations' quantization, then per thread and row a kept list: k values, k indices,
     * its length and whether the part held a NaN */
    const size_t qb = ((size_t)(M * K) + 63) & ~(size_t)63, sb = ((size_t)(M * nb) * 4 + 63) & ~(size_t)63;
    const size_t lists = k > 0 ? (size_t)nt * (size_t)M : 0, tb = lists * (size_t)k * 12 + lists * 8;
    char *buf = aligned_alloc(64, qb + 3 * sb + ((tb + 63) & ~(size_t)63));
    if (!buf) return -1;
    const qrows a = {(const int8_t *)buf, (const float *)(buf + qb), (const float *)(buf + qb + sb),
                     (const int32_t *)(buf + qb + 2 * sb)};
    int64_t *const tidx = (int64_t *)(buf + qb + 3 * sb);  /* list (t, r) at (t M + r) k */
    float *const tval = (float *)(tidx + lists * (size_t)k);
    int *const tfill = (int *)(tval + lists * (size_t)k), *const tnan = tfill + lists;
    memset(tfill, 0, sizeof(int) * 2 * lists); /* threads OpenMP did not start leave empty lists */
    side_stream *const sd = skinny_side; /* the calling thread's (thread-local) */
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < M; r++)
            quant_row(x + r * x_stride, K, (int8_t *)a.q + r * K, (float *)a.s + r * nb, (float *)a.S + r * nb,
                      (int32_t *)a.xc + r * nb);
        const int64_t t = omp_get_thread_num(), ntt = omp_get_num_threads();
        const int64_t p0 = tiles * t / ntt * C, p1e = tiles * (t + 1) / ntt * C, p1 = p1e < panels ? p1e : panels;
        if (p0 < p1) {
            if (fmt == QF_Q4_1) qrows4(&a, W, b, y, M, N, K, p0, p1, sd, (int)t);
            else if (fmt == QF_Q4_1F) qrows5(&a, W, b, y, M, N, K, p0, p1, sd, (int)t);
            else qrows8(&a, W, b, y, M, N, K, p0, p1, sd, (int)t);
        }
        if (k > 0) { /* this thread's columns of every row, as its own writes left them in its cache */
            const int64_t lo = p0 * PANEL < N ? p0 * PANEL : N, hi = p1 * PANEL < N ? p1 * PANEL : N;
            for (int64_t r = 0; r < M; r++) {
                const size_t l = (size_t)t * (size_t)M + (size_t)r;
                tnan[l] = lo < hi && skinny_topk_range(y + r * N, lo, hi, k, tval + l * k, tidx + l * k,
                                                       &tfill[l]) != 0;
            }
        }
    }
    int64_t n_bad = 0;
    if (k > 0) {
        int fill[256];
        float *val = malloc(sizeof(float) * (size_t)nt * (size_t)k);
        int64_t *ix = malloc(sizeof(int64_t) * (size_t)nt * (size_t)k);
        if (!val || !ix) {
            free(val);
            free(ix);
            free(buf);
            return -1;
        }
        for (int64_t r = 0; r < M; r++) {
            int nan = 0;
            for (int t = 0; t < nt; t++) { /* the row's lists side by side, lowest range first */
                const size_t l = (size_t)t * (size_t)M + (size_t)r;
                nan |= tnan[l];
                fill[t] = tfill[l];
                memcpy(val + (size_t)t * k, tval + l * k, sizeof(float) * (size_t)k);
                memcpy(ix + (size_t)t * k, tidx + l * k, sizeof(int64_t) * (size_t)k);
            }
            if (nan) bad[n_bad++] = r;
            else skinny_topk_merge(nt, val, ix, fill, k, idx + r * k);
        }
        free(val);
        free(ix);
    }
    free(buf);
    return n_bad;
}

/* x (M, K) rows at x_stride floats; W (ceil(N / 16) panels) in the layout above; b (N,) or NULL;
 * y (M, N). K a multiple of 32. Returns 0, -1 out of memory, -2 a format it does not know. */
int quant_linear(const float *x, int64_t x_stride, int fmt, const uint8_t *W, const float *b, float *y, int64_t M,
                 int64_t N, int64_t K, int threads) {
    return (int)linear_topk(x, x_stride, fmt, W, b, y, M, N, K, threads, 0, NULL, NULL);
}

/* quant_linear and each row's top-k (1 <= k <= 64, k <= N) of y into idx (M, k): returns how many
 * rows hold a NaN (listed in bad, their idx unset: the caller asks torch), -1 out of memory, -2 a
 * format it does not know, -3 k out of range. An LM head's greedy answers come with its logits,
 * ranked by the threads that wrote them (kernels/quant.py quant_linear_topk). */
int64_t quant_linear_topk(const float *x, int64_t x_stride, int fmt, const uint8_t *W, const float *b, float *y,
                          int64_t M, int64_t N, int64_t K, int threads, int k, int64_t *idx, int64_t *bad) {
    if (k < 1 || k > 64 || k > N) return -3;
    return linear_topk(x, x_stride, fmt, W, b, y, M, N, K, threads, k, idx, bad);
}

/* x's rows quantized as quant_linear does: q (M, K) int8, s (M, K / 32) */
void quant_rows(const float *x, int64_t x_stride, int64_t M, int64_t K, int8_t *q, float *s) {
    const int64_t nb = K / 32;
    float *S = malloc(sizeof(float) * (size_t)nb);
    int32_t *xc = malloc(sizeof(int32_t) * (size_t)nb);
    if (S && xc)
        for (int64_t r = 0; r < M; r++) quant_row(x + r * x_stride, K, q + r * K, s + r * nb, S, xc);
    free(S);
    free(xc);
}

/* whether this build takes the integer dot products with AVX512-VNNI (1) or maddubs (0) */
int quant_vnni(void) {
#if defined(__AVX512VNNI__)
    return 1;
#else
    return 0;
#endif
}
