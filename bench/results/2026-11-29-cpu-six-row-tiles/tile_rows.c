#include "qg.c"
#include <stdio.h>
#include <time.h>
__thread side_stream *skinny_side = NULL;
int skinny_topk_range(const float *x, int64_t lo, int64_t hi, int k, float *val, int64_t *idx, int *filled){return 0;}
int skinny_topk_merge(int parts, const float *val, const int64_t *idx, const int *filled, int k, int64_t *out){return 0;}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
/* candidate plans: strings of digits per M */
int main(int argc, char **argv) {
    int T = 2;
    int64_t shapes[3][2] = {{960, 576}, {3072, 576}, {576, 1536}};
    const char *plans[][6] = {
        {"4", "4", 0}, {"5", "41", "5", 0}, {"6", "42", "6", "51", 0}, {"7", "43", "61", "52", 0},
        {"8", "44", "62", "53", 0}, {"9", "441", "63", "54", 0}, {"10", "442", "64", "55", 0},
        {"11", "443", "65", "641", 0}, {"12", "444", "66", 0}, {"13", "4441", "661", "643", "553", 0},
        {"14", "4442", "662", "644", "5540", 0}};
    for (int s = 0; s < 3; s++) {
        int64_t N = shapes[s][0], K = shapes[s][1], nb = K / 32, panels = (N + 15) / 16;
        int copies = 30;
        size_t wb = panels * nb * 320;
        uint8_t *W = aligned_alloc(64, wb * copies);
        for (size_t i = 0; i < wb * copies; i++) W[i] = (uint8_t)(i * 7 + 3);
        for (int c = 0; c < copies; c++) for (int64_t p = 0; p < panels * nb; p++) for (int q = 0; q < 32; q++) { uint16_t h = 0x2c00 + (p * 31 + q * 17) % 512; memcpy(W + c * wb + p * 320 + 256 + 2 * q, &h, 2); }
        float *x = malloc(sizeof(float) * 64 * K), *y = malloc(sizeof(float) * 64 * N), *y0 = malloc(sizeof(float) * 64 * N);
        for (int64_t i = 0; i < 64 * K; i++) x[i] = (float)((i * 13) % 17) - 8.0f + 0.01f * (i % 7);
        for (int pi = 0; pi < 11; pi++) {
            int M = atoi(plans[pi][0]);
            int np_ = 0; while (plans[pi][np_ + 1]) np_++;
            double best[8]; for (int v = 0; v < 8; v++) best[v] = 1e9;
            variant = 0; quant_linear(x, K, QF_Q4_1, W, NULL, y0, M, N, K, T);
            for (int r = 0; r < 40; r++) for (int v = 0; v < np_; v++) {
                const char *pl = plans[pi][v + 1]; int q = 0, tot = 0;
                for (; pl[q]; q++) { plan_rows[q] = pl[q] - '0'; tot += plan_rows[q]; }
                plan_rows[q] = 0;
                variant = 9;
                if (r == 0) { memset(y, 0, 4 * M * N); quant_linear(x, K, QF_Q4_1, W, NULL, y, M, N, K, T); if (memcmp(y, y0, 4 * M * N)) printf("plan %s differs\n", pl); }
                double t0 = now();
                for (int c = 0; c < copies; c++) quant_linear(x, K, QF_Q4_1, W + c * wb, NULL, y, M, N, K, T);
                double dt = (now() - t0) / copies;
                if (dt < best[v]) best[v] = dt;
            }
            printf("%5ld x %4ld M %2d:", N, K, M);
            for (int v = 0; v < np_; v++) printf("  %s %.2f", plans[pi][v + 1], best[v] / best[0]);
            printf("   (base %.1f us)\n", best[0] * 1e6);
        }
    }
    return 0;
}
