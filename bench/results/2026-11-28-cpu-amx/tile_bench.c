#include "qg.c"
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    int M = argc > 1 ? atoi(argv[1]) : 8, amx = argc > 2 ? atoi(argv[2]) : 1, T = argc > 3 ? atoi(argv[3]) : 1;
    int64_t N = 3072, K = 576, nb = K / 32;
    int64_t panels = N / 16;
    uint8_t *W = aligned_alloc(64, panels * nb * 544);
    for (int64_t i = 0; i < panels * nb * 544; i++) W[i] = (uint8_t)(i * 7 + 3);
    for (int64_t p = 0; p < panels * nb; p++) memset(W + p * 544 + 512, 0, 32); /* scales 0 (fp16) -> fine */
    float *x = malloc(sizeof(float) * M * K), *y = malloc(sizeof(float) * M * N);
    for (int64_t i = 0; i < M * K; i++) x[i] = (float)((i * 13) % 17) - 8.0f;
    quant_amx_enable(amx);
    double best = 1e9;
    for (int r = 0; r < 2000; r++) {
        double t0 = now();
        quant_linear(x, K, QF_Q8_0, W, NULL, y, M, N, K, T);
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    printf("M %d amx %d: %.1f us (1 thread)\n", M, amx, best * 1e6);
    return 0;
}
