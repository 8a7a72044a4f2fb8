/* skinny_attention_kv16 from C: T rows after C context keys (smollm2's heads, fp16 pools, 2 threads), a causal
 * chain or a random tree with its mask; the fastest of 5 x n calls. Build: gcc (the library's flags) -shared
 * kernels/cpu/skinny_attention.c -o attn.so; gcc -O2 abench.c attn.so -o abench; abench T C n tree.
 * ../../2026-11-28-cpu-side-off/attention8/bench.c with a context apart from the step and a tree mask. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
int skinny_attention_kv16(const float *q, int64_t q_stride, int T, int H, int KV, int D, const void *kc,
                          const void *vc, const int32_t *blocks, int bs, int64_t L, const uint8_t *mask, int causal,
                          float scale, float *out, int threads);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
/* abench T C n tree : C context keys then T step keys (chain, or a random tree with its mask) */
int main(int argc, char **argv){
  int T = atoi(argv[1]), C = atoi(argv[2]), n = atoi(argv[3]), tree = atoi(argv[4]);
  int L = C + T;
  const int H = 9, KV = 3, D = 64, bs = 16, nb = L / bs + 1;
  uint16_t *kc = malloc(2 * (size_t)nb * bs * KV * D), *vc = malloc(2 * (size_t)nb * bs * KV * D);
  for (size_t i = 0; i < (size_t)nb * bs * KV * D; i++) { kc[i] = 0x3c00 ^ (rand() & 0x83ff); vc[i] = 0x3c00 ^ (rand() & 0x83ff); }
  int32_t *blocks = malloc(4 * nb); for (int i = 0; i < nb; i++) blocks[i] = (i * 7) % nb;
  float *q = malloc(4 * T * H * D), *out = malloc(4 * T * H * D);
  for (int i = 0; i < T * H * D; i++) q[i] = (rand() % 1000) / 1000.0f - 0.5f;
  uint8_t *mask = NULL;
  if (tree) {
    mask = calloc((size_t)T * L, 1); int par[256];
    for (int t = 0; t < T; t++) {
      par[t] = t == 0 ? -1 : rand() % t;
      memset(mask + (size_t)t * L, 1, C);
      for (int a = t; a >= 0; a = par[a]) mask[(size_t)t * L + C + a] = 1;
    }
  }
  double best = 1e9;
  for (int r = 0; r < 5; r++) {
    double t0 = now();
    for (int i = 0; i < n; i++) skinny_attention_kv16(q, H * D, T, H, KV, D, kc, vc, blocks, bs, L, mask, mask ? 0 : 1, 0.125f, out, 2);
    double dt = (now() - t0) / n; if (dt < best) best = dt;
  }
  printf("T %d C %d %s: %.1f us\n", T, C, tree ? "tree" : "chain", best * 1e6);
}
