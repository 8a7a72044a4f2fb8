/* The next layer's keys and values requested while the products before its attention stream
 * their weights.
 *
 * Why: a one-token step's attention over 512 keys read its keys and values (786 KB a layer, cold
 * after a whole step of weights has streamed through the caches) at 12-14 GB/s, about 60 us a
 * layer; with the same keys and values in the caches it took about 28 us. The products, the
 * quantized ones above all, stream their weights at about half the read bandwidth the machine
 * has. So while the products of one layer's attention output and MLP and the next layer's qkv
 * run, each thread requests the part of the next layer's pools that it will read in that
 * attention, a few lines after each tile of weights, in proportion to the weight bytes: by the
 * time the attention runs its keys and values sit in L2 / L3 (one-token attention 1.8 -> 0.7 ms
 * a forward, the products about 0.4 ms slower: bench/results/2026-11-27-cpu-side-prefetch/NOTES.md).
 *
 * Only where the step's bytes leave the last-level cache between steps (skinny_step.side, set by
 * kernels/skinny.py side_stream): where they stay there, these requests only compete with the
 * weights' loads (an Emerald Rapids' 300 MB L3: a one-token forward 5-23% slower with them).
 *
 * It changes no number: a prefetch loads nothing into a register. skinny_layers.c sets a stream
 * for the calling thread (skinny_side) and clears it before the attention it serves; a product
 * reads it once on the calling thread, before its parallel region. */
#ifndef SIDE_PREFETCH_H
#define SIDE_PREFETCH_H
#include <immintrin.h>
#include <stdint.h>

#define SIDE_MAXT 64

typedef struct { /* one thread's place in the stream, on a cache line of its own */
    int64_t region, line; /* the next line: line of the K (line < region_lines) or V region */
    float credit;         /* lines owed and not requested yet */
    char pad[64 - 2 * sizeof(int64_t) - sizeof(float)];
} side_cursor;

typedef struct {
    const char *k, *v;    /* the layer's key and value pools */
    const int64_t *off;   /* byte offsets of regions (cache blocks) in a pool, thread t's from first[t] */
    const int64_t *first; /* (nt + 1,) */
    int64_t region_lines; /* 64-byte lines in a region */
    int nt;
    float ratio; /* lines requested per 64 bytes of weights streamed */
    side_cursor cur[SIDE_MAXT];
} side_stream;

/* the stream of the calling thread's current layer stack; NULL: none */
extern __thread side_stream *skinny_side;

/* thread t has streamed weight_bytes of weights: request its share of the stream */
static inline void side_prefetch(side_stream *s, int t, int64_t weight_bytes) {
    if (!s || t >= s->nt) return;
    side_cursor *c = &s->cur[t];
    const float owed = c->credit + s->ratio * (float)weight_bytes * (1.0f / 64);
    int64_t n = (int64_t)owed;
    c->credit = owed - (float)n;
    int64_t r = c->region, l = c->line;
    const int64_t end = s->first[t + 1], RL = s->region_lines;
    r = r < s->first[t] ? s->first[t] : r;
    for (; n > 0 && r < end; n--) {
        const char *base = (l < RL ? s->k : s->v) + s->off[r] + 64 * (l < RL ? l : l - RL);
        _mm_prefetch(base, _MM_HINT_T1);
        if (++l == 2 * RL) {
            l = 0;
            r++;
        }
    }
    c->region = r;
    c->line = l;
}
#endif
