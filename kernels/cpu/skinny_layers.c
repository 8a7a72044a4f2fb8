/* A decoding step's whole stack of decoder layers in one call, fp32: for each layer
 *   x = rms_norm(h) ; qkv = x Wqkv^T (+ b) ; RoPE on q, k ; k, v -> the cache slots ;
 *   o = attention of each sequence's rows over its paged keys ; h += o Wo^T ;
 *   x = rms_norm(h) ; h += (silu(x Wg^T) * x Wu^T) Wd^T
 * with the kernels of the other files of this folder, in the order models/llama.py issues
 * them, so the result is bit for bit the per-op path's. A product's weight is fp32
 * (skinny_gemm.c) or block-quantized (quant_gemm.c), per product. It exists because on a small CPU the
 * per-op dispatch (a Python call, a ctypes call, a tensor allocation, each with cold caches
 * after a weight has streamed through) cost about a quarter of a one-token step.
 * kernels/skinny.py calls it; models/llama.py's Block.forward is the reference.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "side_prefetch.h"

__thread side_stream *skinny_side = NULL;

void skinny_linear(const float *x, const float *W, const float *b, float *y, int64_t M, int64_t N, int64_t K,
                   int threads);
int skinny_attention_seqs(int n_seq, const float *q, int64_t q_stride, const int32_t *seq_start, int H, int KV,
                          int D, const void *kc, const void *vc, const int32_t *const *seq_blocks, int bs,
                          const int64_t *seq_len, const uint8_t *const *seq_mask, const uint8_t *seq_causal,
                          float scale, float *out, int threads, int half);
void skinny_rms_norm(const float *x, const float *w, float *out, int64_t rows, int64_t n, float eps, int threads);
void skinny_silu_mul(const float *gu, float *out, int64_t rows, int64_t n, int threads);
void skinny_rope(float *x, const float *cos, const float *sin, int64_t rows, int64_t row_stride, int64_t heads,
                 int64_t D);

int quant_linear(const float *x, int64_t x_stride, int fmt, const uint8_t *W, const float *b, float *y, int64_t M,
                 int64_t N, int64_t K, int threads);

typedef struct { /* one layer's weights and cache pools (pointers into torch tensors) */
    const void *attn_norm, *wqkv, *bqkv /* or NULL */, *wo, *mlp_norm, *w_gate_up, *w_down;
    void *k_cache, *v_cache; /* [num_blocks * block_size, KV, D], fp32 or (the step's kv_half) fp16 */
    /* each product's weight (qkv, o, gate_up, down): 0 = fp32 (N, K), else quant_gemm.c's format
     * code and its packed panels */
    int32_t fmt[4];
} skinny_layer;

typedef struct { /* the step: shared by every layer */
    int T, d, H, KV, D, I, n_seq, block_size, threads;
    float eps, scale;
    const float *cos, *sin;      /* (T, D), or with positions tables (positions, D) read by position */
    const int64_t *slots;        /* (T,) cache row of each step row, -1 = not stored */
    const int32_t *seq_start;    /* (n_seq + 1,) rows of each sequence */
    const int64_t *seq_len;      /* (n_seq,) keys each sequence attends over */
    const int32_t *const *seq_blocks;  /* (n_seq,) its physical blocks */
    const uint8_t *const *seq_mask;    /* (n_seq,) (rows, keys) visibility or NULL */
    int kv_half;                       /* the caches hold fp16 */
    const int32_t *positions;          /* (T,) each row's position in cos / sin, or NULL (rows of its own) */
    /* the final norm (its weight, or NULL: none) of the rows out_rows (n_out of them; NULL: every
     * row) into out (n_out, d), after the last layer */
    const float *final_norm;
    const int64_t *out_rows;
    int64_t n_out;
    float *out;
    /* request each next layer's keys and values while the products before its attention stream
     * (side_prefetch.h); 0: not (kernels/skinny.py side_stream says when) */
    int side;
    /* (n_seq,) 1 where a sequence's rows see the keys by the causal rule after its committed
     * prefix (row t: keys j <= t + seq_len - rows), its mask then NULL; or NULL: none does */
    const uint8_t *seq_causal;
    /* the step's token ids (T,) and the embedding table (vocab, d): h is their rows, gathered
     * here; or tokens NULL: h holds them already */
    const int64_t *tokens;
    const float *embed;
    int64_t vocab;
} skinny_step;

/* Where a stack's time goes, for bench/model_speed.py: seconds summed per phase while
 * skinny_profile_on is set (off: one branch per phase). */
enum { P_NORM, P_QKV, P_ROPE_KV, P_ATTN, P_O, P_GATE_UP, P_SILU, P_DOWN, P_ADD, P_N };
int skinny_profile_on = 0;
double skinny_profile[P_N];
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#define PHASE(p, ...)                                              \
    do {                                                           \
        if (skinny_profile_on) {                                   \
            const double t0_ = now();                              \
            __VA_ARGS__;                                           \
            skinny_profile[p] += now() - t0_;                      \
        } else {                                                   \
            __VA_ARGS__;                                                  \
        }                                                          \
    } while (0)

/* y = x W^T (+ b) in the weight's format; 0, or -1 out of memory */
static int product(int fmt, const float *x, const void *W, const void *b, float *y, int64_t M, int64_t N, int64_t K,
                   int threads) {
    if (fmt == 0) {
        skinny_linear(x, W, b, y, M, N, K, threads);
        return 0;
    }
    return quant_linear(x, K, fmt, W, b, y, M, N, K, threads) == 0 ? 0 : -1;
}

/* bytes a product streams from its weight where it requests side lines (the quantized products,
 * quant_gemm.c's panels: 16 rows, per 32 weights 320 bytes in Q4_1, 544 in Q8_0); 0 elsewhere */
static int64_t side_bytes(int fmt, int64_t N, int64_t K) {
    return fmt == 0 ? 0 : (N + 15) / 16 * (K / 32) * (fmt == 1 ? 320 : fmt == 3 ? 384 : 544);
}

/* Points the stream at layer w's pools, for the attention after `window` bytes of products: each
 * thread's regions are its share of each sequence's cache blocks, as the attention's ranges of
 * tasks split them (the first share to thread 0). Asked to finish a little before the window
 * ends (x1.15), so that the last lines have arrived. Returns the stream, or NULL where nothing
 * streams. */
static side_stream *side_start(side_stream *sd, const skinny_layer *w, int64_t window) {
    const int64_t total = sd->first[sd->nt];
    if (window <= 0 || total == 0) return NULL;
    sd->k = (const char *)w->k_cache;
    sd->v = (const char *)w->v_cache;
    sd->ratio = 1.15f * (float)(2 * total * sd->region_lines) / ((float)window / 64);
    for (int t = 0; t < sd->nt; t++) sd->cur[t] = (side_cursor){sd->first[t], 0, 0.0f, {0}};
    return sd;
}

/* n numbers rounded to fp16 (to nearest, ties to even, as torch's .half()); the caller checked
 * that the build has F16C (skinny_kv16_available) */
static void store_half(uint16_t *dst, const float *src, int64_t n) {
#ifdef __F16C__
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
#else
    (void)dst, (void)src, (void)n;
#endif
}

static void add_into(float *h, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] = h[i] + y[i];
}

/* h (T, d) in place through `n_layers` layers (first gathered from the embedding where s->tokens
 * is set). 0, -1 out of memory, -3 a token id outside 0 .. vocab - 1 (nothing done), or an
 * attention error. */
int skinny_layers(float *h, const skinny_layer *layers, int n_layers, const skinny_step *s) {
    const int T = s->T, d = s->d, H = s->H, KV = s->KV, D = s->D, I = s->I;
    if (s->tokens) {
        for (int t = 0; t < T; t++)
            if (s->tokens[t] < 0 || s->tokens[t] >= s->vocab) return -3;
        for (int t = 0; t < T; t++) memcpy(h + (int64_t)t * d, s->embed + s->tokens[t] * d, sizeof(float) * (size_t)d);
    }
    const int64_t nq = (int64_t)(H + 2 * KV) * D;
    float *x = malloc(sizeof(float) * (size_t)T * d), *y = malloc(sizeof(float) * (size_t)T * d);
    float *qkv = malloc(sizeof(float) * (size_t)(T * nq)), *o = malloc(sizeof(float) * (size_t)T * H * D);
    float *gu = malloc(sizeof(float) * (size_t)T * 2 * I), *act = malloc(sizeof(float) * (size_t)T * I);
    /* the side stream's regions: the cache blocks of every sequence's keys, split per thread */
    int64_t n_blocks = 0;
    for (int b = 0; b < s->n_seq; b++) n_blocks += (s->seq_len[b] + s->block_size - 1) / s->block_size;
    const int snt = s->threads < 1 ? 1 : s->threads > SIDE_MAXT ? SIDE_MAXT : s->threads;
    side_stream *sd = aligned_alloc(64, (sizeof(side_stream) + 63) / 64 * 64);
    int64_t *soff = malloc(sizeof(int64_t) * (size_t)(n_blocks + snt + 2));
    /* each row's cos / sin gathered from the tables once for all layers (models/llama.py keeps a
     * table of every position: no per-step op to make the rows) */
    float *rope = s->positions ? malloc(sizeof(float) * (size_t)(2 * T * D)) : NULL;
    const float *cos = s->cos, *sin = s->sin;
    int rc = (x && y && qkv && o && gu && act && sd && soff && (rope || !s->positions)) ? 0 : -1;
    if (rc == 0 && rope) {
        for (int t = 0; t < T; t++) {
            memcpy(rope + (int64_t)t * D, s->cos + (int64_t)s->positions[t] * D, sizeof(float) * (size_t)D);
            memcpy(rope + (int64_t)(T + t) * D, s->sin + (int64_t)s->positions[t] * D, sizeof(float) * (size_t)D);
        }
        cos = rope;
        sin = rope + (int64_t)T * D;
    }
    if (rc == 0) {
        int64_t *first = soff + n_blocks, i = 0;
        const int64_t region = (int64_t)s->block_size * KV * D * (s->kv_half ? 2 : 4);
        for (int t = 0; t < snt; t++) {
            first[t] = i;
            for (int b = 0; b < s->n_seq; b++) {
                const int64_t nb = (s->seq_len[b] + s->block_size - 1) / s->block_size;
                for (int64_t j = nb * t / snt; j < nb * (t + 1) / snt; j++) soff[i++] = s->seq_blocks[b][j] * region;
            }
        }
        first[snt] = i;
        sd->off = soff;
        sd->first = first;
        sd->region_lines = region / 64;
        sd->nt = snt;
    }
    for (int l = 0; l < n_layers && rc == 0; l++) {
        const skinny_layer *w = layers + l;
        if (l == 0 && s->side) skinny_side = side_start(sd, w, side_bytes(w->fmt[0], nq, d));
        PHASE(P_NORM, skinny_rms_norm(h, w->attn_norm, x, T, d, s->eps, s->threads));
        PHASE(P_QKV, rc = product(w->fmt[0], x, w->wqkv, w->bqkv, qkv, T, nq, d, s->threads));
        if (rc) break;
        PHASE(P_ROPE_KV, {
            skinny_rope(qkv, cos, sin, T, nq, H + KV, D);
            for (int t = 0; t < T; t++) {
                if (s->slots[t] < 0) continue;
                const float *k = qkv + t * nq + (int64_t)H * D, *v = k + (int64_t)KV * D;
                if (s->kv_half) {
                    store_half((uint16_t *)w->k_cache + s->slots[t] * KV * D, k, (int64_t)KV * D);
                    store_half((uint16_t *)w->v_cache + s->slots[t] * KV * D, v, (int64_t)KV * D);
                } else {
                    memcpy((float *)w->k_cache + s->slots[t] * KV * D, k, sizeof(float) * (size_t)(KV * D));
                    memcpy((float *)w->v_cache + s->slots[t] * KV * D, v, sizeof(float) * (size_t)(KV * D));
                }
            }
        });
        skinny_side = NULL;
        /* every sequence's attention in one call (one parallel region for the batch) */
        PHASE(P_ATTN, rc = skinny_attention_seqs(s->n_seq, qkv, nq, s->seq_start, H, KV, D, w->k_cache, w->v_cache,
                                                 s->seq_blocks, s->block_size, s->seq_len, s->seq_mask,
                                                 s->seq_causal, s->scale, o, s->threads, s->kv_half));
        if (rc) break;
        if (l + 1 < n_layers && s->side) {
            const skinny_layer *n = w + 1;
            skinny_side = side_start(sd, n, side_bytes(w->fmt[1], d, (int64_t)H * D) +
                                                   side_bytes(w->fmt[2], 2 * (int64_t)I, d) +
                                                   side_bytes(w->fmt[3], d, I) + side_bytes(n->fmt[0], nq, d));
        }
        PHASE(P_O, rc = product(w->fmt[1], o, w->wo, NULL, y, T, d, (int64_t)H * D, s->threads));
        if (rc) break;
        PHASE(P_ADD, add_into(h, y, (int64_t)T * d));
        PHASE(P_NORM, skinny_rms_norm(h, w->mlp_norm, x, T, d, s->eps, s->threads));
        PHASE(P_GATE_UP, rc = product(w->fmt[2], x, w->w_gate_up, NULL, gu, T, 2 * (int64_t)I, d, s->threads));
        if (rc) break;
        PHASE(P_SILU, skinny_silu_mul(gu, act, T, I, s->threads));
        PHASE(P_DOWN, rc = product(w->fmt[3], act, w->w_down, NULL, y, T, d, I, s->threads));
        if (rc) break;
        PHASE(P_ADD, add_into(h, y, (int64_t)T * d));
    }
    if (rc == 0 && s->final_norm) /* the rows the head needs, each normed as skinny_rms_norm of all rows would */
        for (int64_t r = 0; r < s->n_out; r++)
            skinny_rms_norm(h + (s->out_rows ? s->out_rows[r] : r) * d, s->final_norm, s->out + r * d, 1, d, s->eps, 1);
    skinny_side = NULL;
    free(rope);
    free(sd);
    free(soff);
    free(x);
    free(y);
    free(qkv);
    free(o);
    free(gu);
    free(act);
    return rc;
}
