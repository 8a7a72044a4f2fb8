/* The Q4_1 product alone: qbench N K copies reps threads M... (weights random, scales small); each
 * M: the fastest and the mean per call over reps passes through the copies, GMAC/s and weight GB/s. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
int quant_linear(const float *x, int64_t x_stride, int fmt, const uint8_t *W, const float *b, float *y, int64_t M,
                 int64_t N, int64_t K, int threads);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
/* usage: qbench N K copies reps T M... ; Q4_1, weights random nibbles, scales small */
int main(int argc, char **argv) {
    int64_t N = atoll(argv[1]), K = atoll(argv[2]);
    int copies = atoi(argv[3]), reps = atoi(argv[4]), T = atoi(argv[5]);
    int64_t nb = K / 32, panels = (N + 15) / 16, bytes = panels * nb * 320;
    uint8_t *W = aligned_alloc(64, (size_t)bytes * copies);
    for (int64_t i = 0; i < bytes * copies; i++) W[i] = (uint8_t)(rand());
    for (int64_t c = 0; c < copies; c++)
        for (int64_t p = 0; p < panels * nb; p++) {
            uint16_t *s = (uint16_t *)(W + c * bytes + p * 320 + 256);
            for (int j = 0; j < 32; j++) s[j] = 0x2000 + (rand() & 0xff);
        }
    float *x = malloc(sizeof(float) * 64 * K), *y = malloc(sizeof(float) * 64 * N);
    for (int64_t i = 0; i < 64 * K; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int a = 6; a < argc; a++) {
        int M = atoi(argv[a]);
        double best = 1e9, sum = 0;
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            for (int c = 0; c < copies; c++) quant_linear(x, K, 1, W + (int64_t)c * bytes, NULL, y, M, N, K, T);
            double dt = (now() - t0) / copies;
            sum += dt;
            if (dt < best) best = dt;
        }
        double macs = (double)N * K * M;
        printf("N %ld K %ld copies %d T %d M %2d: best %7.1f us mean %7.1f us  %6.1f GMAC/s  %5.1f GB/s\n", N, K, copies, T, M,
               best * 1e6, sum / reps * 1e6, macs / best * 1e-9, bytes / best * 1e-9);
    }
    return 0;
}
