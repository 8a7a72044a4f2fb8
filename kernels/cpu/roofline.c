/* The machine's roofline, measured: the peak FMA rate at each vector width and the memory read
 * bandwidth, every thread at once (bench/model_speed.py reports a step's time against them).
 *
 * fma_peak: each thread runs ACC independent FMA chains on registers (enough chains to cover
 * the FMA latency on both pipes), nothing loaded or stored inside the loop; GFLOP/s counts 2
 * flops per lane per FMA. The 512-bit loop is compiled for AVX-512F whatever the build's flags
 * (a function attribute) and must be called only where the CPU has it.
 * int8_peak: the same for the quantized products' integer dot products (cpu/quant_gemm.c), in
 * the form the build takes them: vpdpbusd at 512 bits (AVX512-VNNI: 64 u8 x s8 products summed
 * into 16 int32 lanes), else maddubs + madd + add at 512 bits (AVX512-BW) or 256 bits (AVX2).
 * GOP/s counts 2 per u8 x s8 product (a multiply and an add, as a weight's flops are counted).
 * The maddubs chains pass their input through an empty volatile asm each step, so that the
 * compiler cannot hoist the loop-invariant maddubs out of the loop.
 * read_bandwidth: every thread sums its share of a buffer much larger than the caches; GB/s
 * counts the bytes read.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#define ACC 12

/* ACC independent FMA chains of one vector type, iters times; returns a lane of their sum (so the
 * work cannot be dropped). One body for both widths: only the type and the intrinsics differ. */
#define FMA_CHAINS(name, attr, vec, set1, fmadd, add, storeu, lanes)                                     \
    attr static double name(int64_t iters) {                                                          \
        vec a[ACC];                                                                                   \
        const vec x = set1(1.0000001f), y = set1(0.9999999f);                                         \
        for (int i = 0; i < ACC; i++) a[i] = set1((float)i);                                          \
        for (int64_t it = 0; it < iters; it++) {                                                      \
            _Pragma("GCC unroll 12") for (int i = 0; i < ACC; i++) a[i] = fmadd(a[i], x, y);         \
        }                                                                                             \
        vec s = a[0];                                                                                 \
        for (int i = 1; i < ACC; i++) s = add(s, a[i]);                                               \
        float out[lanes];                                                                             \
        storeu(out, s);                                                                               \
        return out[0];                                                                                \
    }

FMA_CHAINS(fma256, , __m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps, 8)
/* compiled for AVX-512F whatever the build's flags; called only where the CPU has it */
FMA_CHAINS(fma512, __attribute__((target("avx512f"))), __m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps,
           _mm512_storeu_ps, 16)

/* GFLOP/s of `threads` threads each running `iters` iterations at `bits` (256 or 512); 0 for
 * another width */
double roofline_fma_peak(int bits, int64_t iters, int threads) {
    if (bits != 256 && bits != 512) return 0.0;
    volatile double sink = 0.0;
    double secs = 0.0;
#pragma omp parallel num_threads(threads)
    {
#pragma omp barrier
        const double t0 = omp_get_wtime();
        const double r = bits == 512 ? fma512(iters) : fma256(iters);
#pragma omp barrier
        const double t1 = omp_get_wtime();
#pragma omp critical
        {
            sink += r;
            if (t1 - t0 > secs) secs = t1 - t0;
        }
    }
    const double lanes = bits / 32;
    return 2.0 * lanes * ACC * (double)iters * threads / secs / 1e9;
}

/* vpdpbusd chains: acc += u8 x s8, four products a lane */
__attribute__((target("avx512f,avx512vnni"))) static int64_t dpbusd512(int64_t iters) {
    __m512i a[ACC];
    const __m512i x = _mm512_set1_epi32(0x01020304), y = _mm512_set1_epi32(0x01FF01FF);
    for (int i = 0; i < ACC; i++) a[i] = _mm512_set1_epi32(i);
    for (int64_t it = 0; it < iters; it++) {
        _Pragma("GCC unroll 12") for (int i = 0; i < ACC; i++) a[i] = _mm512_dpbusd_epi32(a[i], x, y);
    }
    __m512i s = a[0];
    for (int i = 1; i < ACC; i++) s = _mm512_add_epi32(s, a[i]);
    return _mm512_reduce_add_epi32(s);
}

#define MADD_ACC 8 /* 8 accumulators + the input copy + 3 constants fit AVX2's 16 registers */
/* maddubs + madd chains: acc += sum of pairs of (u8 x s8 summed in pairs to int16) */
#define MADD_CHAINS(name, attr, vec, set1, maddubs, madd, add, storeu, lanes)                              \
    attr static int64_t name(int64_t iters) {                                                         \
        vec a[MADD_ACC];                                                                              \
        const vec x = set1(0x01020304), y = set1(0x01FF01FF), ones = set1(0x00010001);                \
        for (int i = 0; i < MADD_ACC; i++) a[i] = set1(i);                                            \
        for (int64_t it = 0; it < iters; it++) {                                                      \
            _Pragma("GCC unroll 8") for (int i = 0; i < MADD_ACC; i++) {                              \
                vec t = x;                                                                            \
                __asm__ volatile("" : "+v"(t));                                                       \
                a[i] = add(a[i], madd(maddubs(t, y), ones));                                          \
            }                                                                                         \
        }                                                                                             \
        vec s = a[0];                                                                                 \
        for (int i = 1; i < MADD_ACC; i++) s = add(s, a[i]);                                          \
        int32_t out[lanes];                                                                           \
        storeu((vec *)out, s);                                                                        \
        return out[0];                                                                                \
    }

MADD_CHAINS(maddubs256, __attribute__((target("avx2"))), __m256i, _mm256_set1_epi32, _mm256_maddubs_epi16,
            _mm256_madd_epi16, _mm256_add_epi32, _mm256_storeu_si256, 8)
MADD_CHAINS(maddubs512, __attribute__((target("avx512f,avx512bw"))), __m512i, _mm512_set1_epi32,
            _mm512_maddubs_epi16, _mm512_madd_epi16, _mm512_add_epi32, _mm512_storeu_si512, 16)

/* GOP/s (2 per u8 x s8 product) of `threads` threads each running `iters` iterations of `kind`:
 * 0 maddubs + madd at 256 bits (AVX2), 1 the same at 512 bits (AVX512-BW), 2 vpdpbusd at 512
 * bits (AVX512-VNNI); the CPU must have the instructions. 0 for another kind. */
double roofline_int8_peak(int kind, int64_t iters, int threads) {
    if (kind < 0 || kind > 2) return 0.0;
    volatile int64_t sink = 0;
    double secs = 0.0;
#pragma omp parallel num_threads(threads)
    {
#pragma omp barrier
        const double t0 = omp_get_wtime();
        const int64_t r = kind == 2 ? dpbusd512(iters) : kind == 1 ? maddubs512(iters) : maddubs256(iters);
#pragma omp barrier
        const double t1 = omp_get_wtime();
#pragma omp critical
        {
            sink += r;
            if (t1 - t0 > secs) secs = t1 - t0;
        }
    }
    const double products = kind == 0 ? 32.0 * MADD_ACC : kind == 1 ? 64.0 * MADD_ACC : 64.0 * ACC; /* a step */
    return 2.0 * products * (double)iters * threads / secs / 1e9;
}

/* GB/s of `threads` threads summing x[0:n] (floats): each thread takes a contiguous share and
 * reads it as STREAMS interleaved streams (one cache line of each per step), as a matrix product
 * reads several rows of W at once: one stream per thread leaves memory idle between misses. The
 * sum goes to *out (so the reads cannot be dropped). */
#define STREAMS 8
double roofline_read_bandwidth(const float *x, int64_t n, int threads, float *out) {
    double secs = 0.0;
    float total = 0.0f;
    int64_t done = 0;
#pragma omp parallel num_threads(threads)
    {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t lo = n * t / nt, len = (n * (t + 1) / nt - lo) / (16 * STREAMS) * 16; /* per stream */
        const float *p[STREAMS];
        for (int s = 0; s < STREAMS; s++) p[s] = x + lo + s * len;
        __m256 a[STREAMS];
        for (int s = 0; s < STREAMS; s++) a[s] = _mm256_setzero_ps();
#pragma omp barrier
        const double t0 = omp_get_wtime();
        for (int64_t i = 0; i < len; i += 16) {
            _Pragma("GCC unroll 8") for (int s = 0; s < STREAMS; s++)
                a[s] = _mm256_add_ps(a[s], _mm256_add_ps(_mm256_loadu_ps(p[s] + i), _mm256_loadu_ps(p[s] + i + 8)));
        }
#pragma omp barrier
        const double t1 = omp_get_wtime();
        float lanes[8];
        for (int s = 1; s < STREAMS; s++) a[0] = _mm256_add_ps(a[0], a[s]);
        _mm256_storeu_ps(lanes, a[0]);
#pragma omp critical
        {
            for (int l = 0; l < 8; l++) total += lanes[l];
            done += len * STREAMS;
            if (t1 - t0 > secs) secs = t1 - t0;
        }
    }
    if (out) *out = total;
    return (double)done * sizeof(float) / secs / 1e9;
}
