/* Per-row argmax and top-k of a step's logits, fp32, AVX2, one thread (a step has a few rows
 * of a vocabulary: one pass over a row is a few microseconds, several times less than torch's
 * general CPU reductions take on them).
 *
 * argmax: torch.argmax's answer: the first index of the largest value. top-k: the k largest
 * values, largest first, equal values in index order (torch.topk leaves their order open).
 * A row holding a NaN is not handled here: its answer is -1 and kernels/skinny.py asks torch
 * for it (torch ranks NaN above every number). kernels/skinny.py calls these and holds the
 * torch references; quant_gemm.c ranks its LM head's logits with them (quant_linear_topk).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

/* first index of the largest value of x[0:n]; -1 when x holds a NaN. Two passes: the largest
 * value (four independent 8-lane maxima, no chain through one register), then the first index
 * holding it. */
static int64_t argmax_row(const float *x, int64_t n) {
    const int64_t n32 = n & ~(int64_t)31;
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0, nan = _mm256_setzero_ps();
    for (int64_t i = 0; i < n32; i += 32) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8), c = _mm256_loadu_ps(x + i + 16),
                     d = _mm256_loadu_ps(x + i + 24);
        nan = _mm256_or_ps(nan, _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q), _mm256_cmp_ps(c, d, _CMP_UNORD_Q)));
        m0 = _mm256_max_ps(m0, a);
        m1 = _mm256_max_ps(m1, b);
        m2 = _mm256_max_ps(m2, c);
        m3 = _mm256_max_ps(m3, d);
    }
    if (!_mm256_testz_ps(nan, nan)) return -1;
    float lanes[8], best = -INFINITY;
    _mm256_storeu_ps(lanes, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
    for (int l = 0; l < 8; l++) best = lanes[l] > best ? lanes[l] : best;
    for (int64_t i = n32; i < n; i++) {
        if (isnan(x[i])) return -1;
        best = x[i] > best ? x[i] : best;
    }
    const __m256 bv = _mm256_set1_ps(best);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), bv, _CMP_EQ_OQ));
        if (m) return i + __builtin_ctz(m);
    }
    for (; i < n; i++)
        if (x[i] == best) return i;
    return 0; /* not reached: best is one of the values */
}

/* out[r] = argmax of row r of x (rows of n floats, row_stride apart); -1 for a row with a NaN */
void skinny_argmax(const float *x, int64_t rows, int64_t n, int64_t row_stride, int64_t *out) {
    for (int64_t r = 0; r < rows; r++) out[r] = argmax_row(x + r * row_stride, n);
}

/* x[lo:hi] ranked into a kept list (val, idx: its *filled entries, largest first, equal values in
 * index order, every kept index below lo): the k largest of the kept and x[lo:hi] after it, in
 * that order. Returns 0, or -1 when x[lo:hi] holds a NaN (the list is then not to be used). One
 * row is ranked in one call (topk_row), or in ranges by the threads that wrote them, their lists
 * merged after (skinny_topk_merge: quant_gemm.c's head with its top-k). */
int skinny_topk_range(const float *x, int64_t lo, int64_t hi, int k, float *val, int64_t *idx, int *filled_io) {
    int filled = *filled_io;
    /* insert x[i]: after every kept value >= it (those came earlier: index order among equals) */
#define PUSH(i)                                                                                           \
    do {                                                                                                  \
        const float v_ = x[i];                                                                            \
        int p_ = filled < k ? filled : k - 1;                                                             \
        while (p_ > 0 && val[p_ - 1] < v_) {                                                              \
            if (p_ < k) {                                                                                 \
                val[p_] = val[p_ - 1];                                                                    \
                idx[p_] = idx[p_ - 1];                                                                    \
            }                                                                                             \
            p_--;                                                                                         \
        }                                                                                                 \
        val[p_] = v_;                                                                                     \
        idx[p_] = (i);                                                                                    \
        if (filled < k) filled++;                                                                         \
    } while (0)
    int64_t i = lo;
    for (; i < hi && filled < k; i++) {
        if (isnan(x[i])) return -1;
        PUSH(i);
    }
    /* 32 values per test against the k-th kept one (their maximum: past the first few hundred
     * values almost no block holds one that enters); a block that does is looked at by 8s */
    const int64_t n32 = i + ((hi - i) & ~(int64_t)31);
    __m256 nan = _mm256_setzero_ps();
    for (; i < n32; i += 32) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8), c = _mm256_loadu_ps(x + i + 16),
                     d = _mm256_loadu_ps(x + i + 24);
        nan = _mm256_or_ps(nan, _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q), _mm256_cmp_ps(c, d, _CMP_UNORD_Q)));
        const __m256 top = _mm256_max_ps(_mm256_max_ps(a, b), _mm256_max_ps(c, d));
        if (!_mm256_movemask_ps(_mm256_cmp_ps(top, _mm256_set1_ps(val[k - 1]), _CMP_GT_OQ))) continue;
        for (int j = 0; j < 32; j += 8) {
            /* only values above the k-th kept one enter (an equal one comes later: it stays out) */
            int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i + j), _mm256_set1_ps(val[k - 1]), _CMP_GT_OQ));
            while (m) {
                const int l = __builtin_ctz(m);
                m &= m - 1;
                if (x[i + j + l] > val[k - 1]) PUSH(i + j + l); /* the threshold may have risen within the 8 */
            }
        }
    }
    if (!_mm256_testz_ps(nan, nan)) return -1;
    for (; i < hi; i++) {
        if (isnan(x[i])) return -1;
        if (x[i] > val[k - 1]) PUSH(i);
    }
#undef PUSH
    *filled_io = filled;
    return 0;
}

/* the k (<= n) largest of x[0:n], largest first, equal values in index order, into idx[0:k];
 * returns 0, or -1 when x holds a NaN */
static int topk_row(const float *x, int64_t n, int k, int64_t *idx) {
    float val[64];
    int filled = 0;
    return skinny_topk_range(x, 0, n, k, val, idx, &filled);
}

/* out[0:k] = the k largest of `parts` kept lists (skinny_topk_range's, list p at val + p k, idx
 * + p k, filled[p] entries) of consecutive index ranges, lowest range first: largest first,
 * equal values in index order, i.e. what one list over the whole row keeps. Returns how many it
 * wrote (k, or every entry where the lists hold fewer). */
int skinny_topk_merge(int parts, const float *val, const int64_t *idx, const int *filled, int k, int64_t *out) {
    int head[256] = {0}, n = 0;
    if (parts > 256) parts = 256;
    for (; n < k; n++) {
        int best = -1;
        for (int p = 0; p < parts; p++) /* strictly larger: an equal value of a later range stays behind */
            if (head[p] < filled[p] && (best < 0 || val[p * k + head[p]] > val[best * k + head[best]])) best = p;
        if (best < 0) break;
        out[n] = idx[best * k + head[best]++];
    }
    return n;
}

/* idx (rows, k) = the top-k indices of each row of x, 1 <= k <= 64 and k <= n; returns the number
 * of rows it did not answer, listed in nan_rows (a NaN in the row, or k out of range: all rows) */
int64_t skinny_topk(const float *x, int64_t rows, int64_t n, int64_t row_stride, int k, int64_t *idx,
                    int64_t *nan_rows) {
    int64_t bad = 0;
    if (k < 1 || k > 64 || k > n) { /* not taken here: every row back to the caller */
        for (int64_t r = 0; r < rows; r++) nan_rows[r] = r;
        return rows;
    }
    for (int64_t r = 0; r < rows; r++)
        if (topk_row(x + r * row_stride, n, k, idx + r * k) != 0) nan_rows[bad++] = r;
    return bad;
}
