/* Times the four products of a layer (qkv 960 x 576, o 576 x 576, gate_up 3072 x 576, down 576 x
 * 1536, Q4_1, random weights) over 30 copies each, M rows, 2 threads, and prints per product the
 * means of when (us after the call began) each thread entered the region and ended its tiles and
 * when the region was over. threads/run.sh builds it against make_qg.py's copy of quant_gemm.c. */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
int quant_linear(const float *x, int64_t x_stride, int fmt, const uint8_t *W, const float *b, float *y, int64_t M,
                 int64_t N, int64_t K, int threads);
extern double qt_stamp[4][4]; extern double qt_call0;
int main(int argc, char **argv) {
    int M = argc > 1 ? atoi(argv[1]) : 1, L = 30, reps = 40;
    int64_t shapes[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
    uint8_t *W[4][30];
    for (int s = 0; s < 4; s++) for (int l = 0; l < L; l++) {
        int64_t N = shapes[s][0], K = shapes[s][1], bytes = (N + 15) / 16 * (K / 32) * 320;
        W[s][l] = aligned_alloc(64, bytes);
        for (int64_t i = 0; i < bytes; i++) W[s][l][i] = rand();
        for (int64_t p = 0; p < (N + 15) / 16 * (K / 32); p++) { uint16_t *sc = (uint16_t *)(W[s][l] + p * 320 + 256); for (int j = 0; j < 32; j++) sc[j] = 0x2000 + (rand() & 0xff); }
    }
    float *x = malloc(sizeof(float) * 64 * 1536), *y = malloc(sizeof(float) * 64 * 3072);
    for (int i = 0; i < 64 * 1536; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    double st[4][5] = {{0}}; int n[4] = {0};
    for (int r = 0; r < reps; r++)
        for (int l = 0; l < L; l++)
            for (int s = 0; s < 4; s++) {
                quant_linear(x, shapes[s][1], 1, W[s][l], NULL, y, M, shapes[s][0], shapes[s][1], 2);
                if (r < 5) continue;
                double c0 = qt_call0;
                st[s][0] += (qt_stamp[0][0] - c0) * 1e6;  /* main enters */
                st[s][1] += (qt_stamp[1][0] - c0) * 1e6;  /* worker enters */
                st[s][2] += (qt_stamp[0][1] - c0) * 1e6;  /* main done */
                st[s][3] += (qt_stamp[1][1] - c0) * 1e6;  /* worker done */
                st[s][4] += (qt_stamp[0][2] - c0) * 1e6;  /* region over */
                n[s]++;
            }
    const char *names[] = {"qkv", "o", "gate_up", "down"};
    printf("M=%d, us after the call's start (means): main enters, worker enters, main done, worker done, region over\n", M);
    for (int s = 0; s < 4; s++) printf("%-8s %6.2f %6.2f %7.2f %7.2f %7.2f\n", names[s], st[s][0]/n[s], st[s][1]/n[s], st[s][2]/n[s], st[s][3]/n[s], st[s][4]/n[s]);
}
__thread void *skinny_side = 0;
int skinny_topk_range(const float *x, int64_t lo, int64_t hi, int k, float *val, int64_t *idx, int *filled) { return 0; }
int skinny_topk_merge(int parts, const float *val, const int64_t *idx, const int *filled, int k, int64_t *out) { return 0; }
