/* The machine's roofline, measured: the peak FMA rate at each vector width and the memory read
 * bandwidth, every thread at once (bench/model_speed.py reports a step's time against them).
 *
 * fma_peak: each thread runs ACC independent FMA chains on registers (enough chains to cover
 * the FMA latency on both pipes), nothing loaded or stored inside the loop; GFLOP/s counts 2
 * flops per lane per FMA. The 512-bit loop is compiled for AVX-512F whatever the build's flags
 * (a function attribute) and must be called only where the CPU has it.
 * read_bandwidth: every thread sums its share of a buffer much larger than the caches; GB/s
 * counts the bytes read.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#define ACC 12

static double fma256(int64_t iters) {
    __m256 a[ACC];
    const __m256 x = _mm256_set1_ps(1.0000001f), y = _mm256_set1_ps(0.9999999f);
    for (int i = 0; i < ACC; i++) a[i] = _mm256_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++) {
        _Pragma("GCC unroll 12") for (int i = 0; i < ACC; i++) a[i] = _mm256_fmadd_ps(a[i], x, y);
    }
    __m256 s = a[0];
    for (int i = 1; i < ACC; i++) s = _mm256_add_ps(s, a[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0];
}

__attribute__((target("avx512f"))) static double fma512(int64_t iters) {
    __m512 a[ACC];
    const __m512 x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
    for (int i = 0; i < ACC; i++) a[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++) {
        _Pragma("GCC unroll 12") for (int i = 0; i < ACC; i++) a[i] = _mm512_fmadd_ps(a[i], x, y);
    }
    __m512 s = a[0];
    for (int i = 1; i < ACC; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}

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
