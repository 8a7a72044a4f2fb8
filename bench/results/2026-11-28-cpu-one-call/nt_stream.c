#include <immintrin.h>
#include <stdint.h>
#include <stddef.h>
/* mode 0: plain loads; 1: prefetchnta 1 KB ahead + loads; 2: loads then clflushopt of each line;
   3: loads with vmovntdqa (streaming load hint) */
float stream(const float *p, size_t n, int mode) {
    __m256 acc = _mm256_setzero_ps();
    const char *c = (const char *)p;
    for (size_t i = 0; i < n; i += 16) {
        if (mode == 1) _mm_prefetch(c + i * 4 + 1024, _MM_HINT_NTA);
        __m256 a, b;
        if (mode == 3) {
            a = _mm256_castsi256_ps(_mm256_stream_load_si256((const __m256i *)(p + i)));
            b = _mm256_castsi256_ps(_mm256_stream_load_si256((const __m256i *)(p + i + 8)));
        } else {
            a = _mm256_loadu_ps(p + i);
            b = _mm256_loadu_ps(p + i + 8);
        }
        acc = _mm256_add_ps(acc, _mm256_add_ps(a, b));
        if (mode == 2) _mm_clflushopt((void *)(c + i * 4));
    }
    float t[8];
    _mm256_storeu_ps(t, acc);
    return t[0];
}
