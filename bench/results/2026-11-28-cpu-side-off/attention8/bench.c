#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int skinny_attention_kv16(const float *q, int64_t q_stride, int T, int H, int KV, int D, const void *kc,
                          const void *vc, const int32_t *blocks, int bs, int64_t L, const uint8_t *mask, int causal,
                          float scale, float *out, int threads);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
int main(int argc, char **argv){
  int T = atoi(argv[1]), L = atoi(argv[2]), n = atoi(argv[3]);
  const int H = 9, KV = 3, D = 64, bs = 16, nb = L / bs + 1;
  uint16_t *kc = malloc(2 * (size_t)nb * bs * KV * D), *vc = malloc(2 * (size_t)nb * bs * KV * D);
  for (size_t i = 0; i < (size_t)nb * bs * KV * D; i++) { kc[i] = 0x3c00 ^ (rand() & 0x83ff); vc[i] = 0x3c00 ^ (rand() & 0x83ff); }
  int32_t *blocks = malloc(4 * nb); for (int i = 0; i < nb; i++) blocks[i] = (i * 7) % nb;
  float *q = malloc(4 * T * H * D), *out = malloc(4 * T * H * D);
  for (int i = 0; i < T * H * D; i++) q[i] = (rand() % 1000) / 1000.0f - 0.5f;
  double best = 1e9;
  for (int r = 0; r < 5; r++) {
    double t0 = now();
    for (int i = 0; i < n; i++) skinny_attention_kv16(q, H * D, T, H, KV, D, kc, vc, blocks, bs, L, NULL, 1, 0.125f, out, 2);
    double dt = (now() - t0) / n; if (dt < best) best = dt;
  }
  printf("T %d L %d: %.1f us\n", T, L, best * 1e6);
}
