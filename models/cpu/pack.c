/* A step's integers packed for the forward (ModelRunner.prepare), compiled: the checks of
 * each sequence's input, then the positions, cache slots, row offsets, block table, tree mask
 * words and logits rows, written into the two flat buffers the runner turns into tensors.
 * models/packing.py calls it; the Python code there is the reference, held equal to it by
 * tests/test_kv_cache.py.
 *
 * Per sequence b of the B: T[b] step tokens starting at off[b] in tokens / depths / parents
 * (depths and parents only where has_depths[b] / has_parents[b]), its committed length ctx[b],
 * its cache blocks (n_blocks[b] of them at block_off[b] in blocks) and its logits rows
 * (n_rows[b] at rows_off[b] in rows, or all rows where all_rows[b]).
 */
#include <stdint.h>
#include <string.h>

/* 0 when every sequence's input is well formed, else 1 + the first bad sequence (the caller
 * then runs the Python checks for the message) */
int pack_check(int B, const int32_t *T, const int32_t *off, const int64_t *tokens, const int32_t *depths,
               const int32_t *parents, const uint8_t *has_depths, const uint8_t *has_parents, const int64_t *ctx,
               const int32_t *n_rows, const int32_t *rows_off, const int32_t *rows, const uint8_t *all_rows,
               int64_t vocab, int64_t max_context) {
    for (int b = 0; b < B; b++) {
        const int n = T[b], o = off[b];
        if (n < 1) return b + 1;
        int64_t deepest = 0;
        for (int i = 0; i < n; i++) {
            const int64_t d = has_depths[b] ? depths[o + i] : i;
            if (d < 0) return b + 1;
            if (d > deepest) deepest = d;
            if (tokens[o + i] < 0 || tokens[o + i] >= vocab) return b + 1;
            if (has_parents[b] && (i == 0 ? parents[o] != -1 : parents[o + i] < 0 || parents[o + i] >= i))
                return b + 1;
        }
        if (ctx[b] + deepest >= max_context) return b + 1;
        if (!all_rows[b])
            for (int r = 0; r < n_rows[b]; r++)
                if (rows[rows_off[b] + r] < 0 || rows[rows_off[b] + r] >= n) return b + 1;
    }
    return 0;
}

/* Fills i32 = cu (B + 1) | positions (N) | lens (B) | table (B, width) | mask (N, n_words), and
 * i64 = tokens (N) | slots (N) | logits rows (R, only when with_idx), each piece starting at the
 * offsets the caller computed (at32[5], at64[3]); n_words is 0 when no sequence is a tree (a
 * chain's rows in a tree step get zero words). Every element of each piece is written, so a
 * buffer may be written again by any later step. A CUDA graph's static inputs are padded
 * (models/graphs.py): rows_pad >= N rows (token 0, position 0, slot -1, zero mask words),
 * batch_pad >= B sequences (no tokens: cu = N, length 0, table -1) and r_pad >= R logits rows
 * (row 0); ``causal`` (NULL: none) gets 1 per sequence that is not a tree, and per padded
 * one. Exact steps pass rows_pad = N, batch_pad = B, r_pad = R. The reserved blocks must
 * cover ctx + T of each sequence. */
void pack_step(int B, const int32_t *T, const int32_t *off, const int64_t *tokens, const int32_t *depths,
               const int32_t *parents, const uint8_t *has_depths, const uint8_t *has_parents, const int64_t *ctx,
               const int32_t *n_rows, const int32_t *rows_off, const int32_t *rows, const uint8_t *all_rows,
               const int32_t *blocks, const int32_t *block_off, const int32_t *n_blocks, int block_size, int width,
               int n_words, int with_idx, int rows_pad, int batch_pad, int r_pad, const int64_t *at32,
               const int64_t *at64, int32_t *i32, int64_t *i64, uint8_t *causal) {
    int32_t *cu = i32 + at32[0], *pos = i32 + at32[1], *lens = i32 + at32[2], *table = i32 + at32[3];
    int32_t *mask = i32 + at32[4];
    int64_t *tok = i64 + at64[0], *slots = i64 + at64[1], *idx = i64 + at64[2];
    int start = 0, r_out = 0;
    cu[0] = 0;
    for (int b = 0; b < B; b++) {
        const int n = T[b], o = off[b];
        const int32_t *blk = blocks + block_off[b];
        for (int i = 0; i < n; i++) {
            const int64_t d = has_depths[b] ? depths[o + i] : i, j = ctx[b] + i;
            tok[start + i] = tokens[o + i];
            pos[start + i] = (int32_t)(ctx[b] + d);
            slots[start + i] = (int64_t)blk[j / block_size] * block_size + j % block_size;
        }
        if (n_words > 0 && has_parents[b]) {  /* row i sees its ancestors and itself */
            for (int i = 0; i < n; i++) {
                int32_t *row = mask + (int64_t)(start + i) * n_words;
                const int p = parents[o + i];
                if (p >= 0) memcpy(row, mask + (int64_t)(start + p) * n_words, sizeof(int32_t) * (size_t)n_words);
                else memset(row, 0, sizeof(int32_t) * (size_t)n_words);
                row[i / 32] = (int32_t)((uint32_t)row[i / 32] | (1u << (i % 32)));
            }
        } else if (n_words > 0) {  /* a causal sequence beside trees: its rows are not read */
            memset(mask + (int64_t)start * n_words, 0, sizeof(int32_t) * (size_t)n * (size_t)n_words);
        }
        if (causal) causal[b] = !has_parents[b];
        if (with_idx) {
            if (all_rows[b])
                for (int i = 0; i < n; i++) idx[r_out++] = start + i;
            else
                for (int r = 0; r < n_rows[b]; r++) idx[r_out++] = start + rows[rows_off[b] + r];
        }
        lens[b] = (int32_t)ctx[b];
        for (int k = 0; k < width; k++) table[(int64_t)b * width + k] = k < n_blocks[b] ? blk[k] : -1;
        start += n;
        cu[b + 1] = start;
    }
    for (int i = start; i < rows_pad; i++) {
        tok[i] = 0;
        pos[i] = 0;
        slots[i] = -1;
    }
    if (n_words > 0 && rows_pad > start)
        memset(mask + (int64_t)start * n_words, 0, sizeof(int32_t) * (size_t)(rows_pad - start) * (size_t)n_words);
    for (int b = B; b < batch_pad; b++) {
        cu[b + 1] = start;
        lens[b] = 0;
        for (int k = 0; k < width; k++) table[(int64_t)b * width + k] = -1;
        if (causal) causal[b] = 1;
    }
    if (with_idx)
        for (int r = r_out; r < r_pad; r++) idx[r] = 0;
}

/* The accepted K/V moved to the next contiguous positions (kernels.kv_ops.kv_compact_ref) in a
 * contiguous host cache of `layers` layers, each `layer_bytes` long, `row_bytes` per slot:
 * slot src[i] -> dst[i] for i = 0, 1, ... in every layer of k and v. A sequence's sources lie
 * after its destinations and are taken in increasing order, so no move overwrites a row still
 * to be read (two rows are never the same slot: memcpy). */
void pack_kv_move(char *k, char *v, int64_t layers, int64_t layer_bytes, int64_t row_bytes, const int64_t *src,
                  const int64_t *dst, int n) {
    for (int64_t l = 0; l < layers; l++) {
        char *kl = k + l * layer_bytes, *vl = v + l * layer_bytes;
        for (int i = 0; i < n; i++) {
            memcpy(kl + dst[i] * row_bytes, kl + src[i] * row_bytes, (size_t)row_bytes);
            memcpy(vl + dst[i] * row_bytes, vl + src[i] * row_bytes, (size_t)row_bytes);
        }
    }
}
