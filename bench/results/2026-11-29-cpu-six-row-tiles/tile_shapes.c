#include "qg.c"
#include <stdio.h>
#include <time.h>
__thread side_stream *skinny_side = NULL;
int skinny_topk_range(const float *x, int64_t lo, int64_t hi, int k, float *val, int64_t *idx, int *filled){return 0;}
int skinny_topk_merge(int parts, const float *val, const int64_t *idx, const int *filled, int k, int64_t *out){return 0;}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    int T = argc > 1 ? atoi(argv[1]) : 2;
    int nv = argc > 2 ? atoi(argv[2]) : 3;
    int fmt = argc > 3 ? atoi(argv[3]) : QF_Q4_1; int BPBx = fmt == QF_Q8_0 ? 544 : 320;
    int64_t shapes[3][2] = {{960, 576}, {3072, 576}, {576, 1536}};
    if (fmt == QF_Q8_0) { shapes[0][0] = 49152; shapes[0][1] = 576; }
    int Ms[] = {6, 8, 12, 16, 24, 32, 64, 128};
    for (int s = 0; s < (fmt == QF_Q8_0 ? 1 : 3); s++) {
        int64_t N = shapes[s][0], K = shapes[s][1], nb = K / 32, panels = (N + 15) / 16;
        int copies = fmt == QF_Q8_0 ? 2 : 30;
        size_t wb = panels * nb * BPBx;
        uint8_t *W = aligned_alloc(64, wb * copies);
        for (size_t i = 0; i < wb * copies; i++) W[i] = (uint8_t)(i * 7 + 3);
        for (int c = 0; c < copies; c++) for (int64_t p = 0; p < panels * nb; p++) for (int q = 0; q < 32; q++) { uint16_t h = 0x2c00 + (p * 31 + q * 17) % 512; if (fmt == QF_Q8_0) { if (q < 16) memcpy(W + c * wb + p * 544 + 512 + 2 * q, &h, 2); } else memcpy(W + c * wb + p * 320 + 256 + 2 * q, &h, 2); }
        float *x = malloc(sizeof(float) * 128 * K), *y = malloc(sizeof(float) * 128 * N), *y0 = malloc(sizeof(float) * 128 * N);
        for (int64_t i = 0; i < 128 * K; i++) x[i] = (float)((i * 13) % 17) - 8.0f + 0.01f * (i % 7);
        for (int mi = 0; mi < 8; mi++) {
            int M = Ms[mi];
            double best[5] = {1e9, 1e9, 1e9, 1e9, 1e9};
            variant = 0; quant_linear(x, K, fmt, W, NULL, y0, M, N, K, T);
            for (int v = 1; v < nv; v++) { variant = v; memset(y, 0, 4 * M * N); quant_linear(x, K, fmt, W, NULL, y, M, N, K, T);
                if (memcmp(y, y0, 4 * M * N)) printf("variant %d differs!\n", v); }
            for (int r = 0; r < (M > 32 ? 15 : 40); r++) for (int v = 0; v < nv; v++) {
                variant = v;
                double t0 = now();
                for (int c = 0; c < copies; c++) quant_linear(x, K, fmt, W + c * wb, NULL, y, M, N, K, T);
                double dt = (now() - t0) / copies;
                if (dt < best[v]) best[v] = dt;
            }
            printf("%5ld x %4ld M %3d: 4x2 %7.1f us | 8x1 %.2f 6x2 %.2f 5x2 %.2f 7x2 %.2f\n", N, K, M, best[0]*1e6, best[1]/best[0], best[2]/best[0], best[3]/best[0], best[4]/best[0]);
        }
    }
    return 0;
}
