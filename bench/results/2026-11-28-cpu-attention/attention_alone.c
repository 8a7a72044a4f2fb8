/* One layer's skinny attention alone, called from C (no Python in the timing): the default
 * model's shape (9 query heads, 3 kv heads, head dim 64, fp16 pools of 16-key blocks, the blocks
 * shuffled), T rows over L keys: one row causal, more rows under a random tree's mask after the
 * context (as a speculative step sends them).
 *
 *   attention_alone LIB.so T L REPS        (env TH: threads, default 2; FLUSH: MB read by both
 *                                           threads before every call, 0 = hot; L3=1: after the
 *                                           flush the pools read, then 4 MB, so that the keys and
 *                                           values wait in the L3, not in L1 / L2, as the side
 *                                           stream leaves them in a forward; DUMP: write out)
 *
 * Prints the fastest call and the mean of the second half of the calls, in us, and GFLOP/s of
 * the fastest (4 H D flops per row and key). attention.sh builds the start code's kernel and
 * this code's and alternates them. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*attention_fn)(const float *, int64_t, int, int, int, int, const void *, const void *, const int32_t *,
                            int, int64_t, const uint8_t *, int, float, float *, int);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s LIB.so T L REPS\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    const attention_fn f = (attention_fn)dlsym(lib, "skinny_attention_kv16");
    const int T = atoi(argv[2]), L = atoi(argv[3]), reps = atoi(argv[4]);
    const int H = 9, KV = 3, D = 64, BS = 16, nb = (L + BS - 1) / BS + 4;
    const int threads = getenv("TH") ? atoi(getenv("TH")) : 2;
    srand(1);
    const size_t pool = (size_t)nb * BS * KV * D;
    uint16_t *kc = malloc(pool * 2), *vc = malloc(pool * 2);
    for (size_t i = 0; i < pool; i++) { /* fp16 numbers in [-2, 2) */
        kc[i] = (uint16_t)(0x3c00 + (rand() & 0x3ff) - 0x800 * (rand() & 1));
        vc[i] = (uint16_t)(0x3800 + (rand() & 0x3ff));
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)nb);
    for (int i = 0; i < nb; i++) ids[i] = (i * 7) % nb;
    float *q = malloc(sizeof(float) * (size_t)(T * H * D)), *out = malloc(sizeof(float) * (size_t)(T * H * D));
    for (int i = 0; i < T * H * D; i++) q[i] = (float)(rand() % 2000) / 1000.0f - 1.0f;
    uint8_t *mask = NULL;
    if (T > 1) { /* the context, then each row its ancestors (a random half of the rows before it) and itself */
        mask = malloc((size_t)T * (size_t)L);
        memset(mask, 1, (size_t)T * (size_t)L);
        for (int t = 0; t < T; t++)
            for (int j = 0; j < T; j++) mask[(size_t)t * L + L - T + j] = (uint8_t)(j == t || (j < t && rand() % 2));
    }
    const size_t flush = getenv("FLUSH") ? (size_t)atoi(getenv("FLUSH")) << 18 : 0; /* floats */
    float *fb = flush ? malloc(flush * sizeof(float)) : NULL;
    for (size_t i = 0; i < flush; i++) fb[i] = 1.0f;
    volatile float sink = 0.0f;
    double best = 1e9, late = 0.0;
    for (int r = 0; r < reps; r++) {
        if (flush) {
            float acc = 0.0f;
#pragma omp parallel for reduction(+ : acc) num_threads(2)
            for (size_t i = 0; i < flush; i += 16) acc += fb[i];
            sink += acc;
            if (getenv("L3")) {
                uint32_t t = 0;
                for (size_t i = 0; i < pool; i += 32) t += kc[i] + vc[i];
                for (size_t i = 0; i < ((size_t)4 << 18); i += 16) t += (uint32_t)fb[i];
                sink += (float)t;
            }
        }
        const double t0 = now();
        f(q, H * D, T, H, KV, D, kc, vc, ids, BS, L, mask, T == 1, 0.125f, out, threads);
        const double dt = now() - t0;
        best = dt < best ? dt : best;
        if (r >= reps / 2) late += dt;
    }
    if (getenv("DUMP")) {
        FILE *fo = fopen(getenv("DUMP"), "wb");
        fwrite(out, sizeof(float), (size_t)(T * H * D), fo);
        fclose(fo);
    }
    printf("T=%d L=%d fastest %.1f us mean(2nd half) %.1f us %.1f GFLOP/s\n", T, L, best * 1e6,
           late / (reps - reps / 2) * 1e6, 4.0 * H * D * T * L / best / 1e9);
    return 0;
}
