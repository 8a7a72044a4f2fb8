/* The token-keyed tables of a step's drafting, in C, beside their Python references:
 *   - the lookahead n-gram pool (decoding/ngram_pool.py NgramPool) and the loop of
 *     decoding/lookahead.py Lookahead.propose that merges its n-grams into the step tree;
 *   - the token-recycling table (decoding/recycle.py: seed_table, refresh, grow_tree, and the
 *     setdefault merge of Recycle.init_state / Hybrid.init_state);
 *   - a sequence's token history and the prompt-lookup search over it
 *     (kernels/ngram_match.py ngram_match_lists), with its chains merged into the step tree.
 * Each function does what its reference does in the reference's order, so that the tables and
 * the trees are equal, not merely alike (tests/test_compiled_tables.py). Where the reference
 * slices a Python list with a count that may be negative (xs[:d]), py_cut gives the same length.
 *
 * Tokens used as keys are >= 0 (a negative one is refused: TAB_BADARG); token -> entry maps are
 * open-addressing hash tables grown by doubling. Allocation failures return TAB_NOMEM and leave
 * the structure as it was before the failing insertion. Errors are negative and distinct from
 * tree.h's TREE_NONE / TREE_FULL.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tree.h"

enum { TAB_NOMEM = -3, TAB_BADARG = -4 };
enum { POOL = 2 }; /* decoding/tree.py's source bit of an n-gram taken from the text */

/* len(xs[:cut]) for a list of `len` items (Python's rule for a negative cut) */
static int py_cut(int len, int cut) {
    if (cut < 0) cut += len;
    if (cut < 0) return 0;
    return cut < len ? cut : len;
}

/* Grows *buf (of *cap items of `size` bytes) to hold at least `need`, doubling. */
static int reserve(void **buf, int32_t *cap, int64_t need, size_t size) {
    if (need <= *cap) return 0;
    int64_t c = *cap > 0 ? *cap : 4;
    while (c < need) c *= 2;
    if (c > INT32_MAX) return TAB_NOMEM;
    void *p = realloc(*buf, (size_t)c * size);
    if (!p) return TAB_NOMEM;
    *buf = p;
    *cap = (int32_t)c;
    return 0;
}

/* ---- token -> int map (open addressing, linear probing, at most half full) ---------------- */
typedef struct {
    int32_t *keys, *vals; /* keys[i] < 0: empty */
    int bits;             /* 2^bits slots */
    int32_t count;
} IMap;

static uint32_t home(int32_t key, int bits) { return ((uint32_t)key * 2654435761u) >> (32 - bits); }

static int imap_init(IMap *m, int bits) {
    size_t n = (size_t)1 << bits;
    m->keys = malloc(n * sizeof *m->keys);
    m->vals = malloc(n * sizeof *m->vals);
    if (!m->keys || !m->vals) {
        free(m->keys);
        free(m->vals);
        m->keys = m->vals = NULL;
        return TAB_NOMEM;
    }
    memset(m->keys, 0xff, n * sizeof *m->keys);
    m->bits = bits;
    m->count = 0;
    return 0;
}

static void imap_free(IMap *m) {
    free(m->keys);
    free(m->vals);
}

/* the value of `key`, or -1 */
static int32_t imap_get(const IMap *m, int32_t key) {
    if (key < 0) return -1;
    const uint32_t mask = (1u << m->bits) - 1;
    for (uint32_t i = home(key, m->bits);; i = (i + 1) & mask) {
        if (m->keys[i] == key) return m->vals[i];
        if (m->keys[i] < 0) return -1;
    }
}

static void place(IMap *m, int32_t key, int32_t val) {
    const uint32_t mask = (1u << m->bits) - 1;
    uint32_t i = home(key, m->bits);
    while (m->keys[i] >= 0) i = (i + 1) & mask;
    m->keys[i] = key;
    m->vals[i] = val;
    m->count++;
}

/* adds `key` (absent, >= 0) */
static int imap_put(IMap *m, int32_t key, int32_t val) {
    if (2 * ((int64_t)m->count + 1) > ((int64_t)1 << m->bits)) {
        IMap bigger;
        if (m->bits >= 30 || imap_init(&bigger, m->bits + 1)) return TAB_NOMEM;
        for (uint32_t i = 0; i < (1u << m->bits); i++)
            if (m->keys[i] >= 0) place(&bigger, m->keys[i], m->vals[i]);
        imap_free(m);
        *m = bigger;
    }
    place(m, key, val);
    return 0;
}

/* ==== the lookahead n-gram pool ============================================================= */
/* Per first token, a slot: its continuations (n - 1 tokens each) and their origins, least
 * recently added or refreshed first -- the OrderedDict's order. A slot holds at most
 * `capacity` (the pool's G, a handful), so a lookup is a scan and a move is a memmove. */
typedef struct {
    int32_t len, cap;
    int32_t *rest;   /* cap * (n - 1) */
    int32_t *origin; /* cap */
} PoolSlot;

typedef struct {
    int n, capacity;
    IMap index; /* first token -> slot */
    PoolSlot *slots;
    int32_t n_slots, slots_cap;
    int64_t total; /* continuations held (len(NgramPool)) */
} Pool;

Pool *pool_create(int n, int capacity) {
    if (n < 1 || capacity < 0) return NULL;
    Pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n;
    p->capacity = capacity;
    if (imap_init(&p->index, 4)) {
        free(p);
        return NULL;
    }
    return p;
}

void pool_free(Pool *p) {
    if (!p) return;
    for (int32_t s = 0; s < p->n_slots; s++) {
        free(p->slots[s].rest);
        free(p->slots[s].origin);
    }
    free(p->slots);
    imap_free(&p->index);
    free(p);
}

int64_t pool_total(const Pool *p) { return p->total; }

/* NgramPool.add: an existing continuation moves to the end (a POOL origin stays POOL); a new
 * one is appended and the least recent dropped beyond `capacity`. Returns 0 or an error. */
int pool_add(Pool *p, const int32_t *ngram, int len, int32_t origin) {
    if (p->capacity == 0 || len != p->n) return 0;
    const int32_t key = ngram[0];
    if (key < 0) return TAB_BADARG;
    const int m = p->n - 1;
    const int32_t *rest = ngram + 1;
    int32_t s = imap_get(&p->index, key);
    if (s < 0) {
        int rc = reserve((void **)&p->slots, &p->slots_cap, (int64_t)p->n_slots + 1, sizeof *p->slots);
        if (rc) return rc;
        if ((rc = imap_put(&p->index, key, p->n_slots))) return rc;
        s = p->n_slots++;
        memset(&p->slots[s], 0, sizeof p->slots[s]);
    }
    PoolSlot *sl = &p->slots[s];
    for (int j = 0; j < sl->len; j++) {
        if (memcmp(sl->rest + (size_t)j * m, rest, (size_t)m * sizeof *rest) != 0) continue;
        if (sl->origin[j] == POOL) origin = POOL;
        const int after = sl->len - 1 - j;
        memmove(sl->rest + (size_t)j * m, sl->rest + (size_t)(j + 1) * m, (size_t)after * m * sizeof *rest);
        memmove(sl->origin + j, sl->origin + j + 1, (size_t)after * sizeof *sl->origin);
        memcpy(sl->rest + (size_t)(sl->len - 1) * m, rest, (size_t)m * sizeof *rest);
        sl->origin[sl->len - 1] = origin;
        return 0;
    }
    if (sl->len == p->capacity) { /* appended then the first popped: shift the rest down */
        memmove(sl->rest, sl->rest + m, (size_t)(sl->len - 1) * m * sizeof *rest);
        memmove(sl->origin, sl->origin + 1, (size_t)(sl->len - 1) * sizeof *sl->origin);
        sl->len--;
        p->total--;
    }
    if (sl->len == sl->cap) { /* grow by doubling up to capacity (G may be large, slots many) */
        int64_t c = sl->cap ? 2 * (int64_t)sl->cap : 2;
        if (c > p->capacity) c = p->capacity;
        int32_t *r = realloc(sl->rest, (size_t)(c * (m > 0 ? m : 1)) * sizeof *r);
        if (!r) return TAB_NOMEM;
        sl->rest = r;
        int32_t *o = realloc(sl->origin, (size_t)c * sizeof *o);
        if (!o) return TAB_NOMEM;
        sl->origin = o;
        sl->cap = (int32_t)c;
    }
    memcpy(sl->rest + (size_t)sl->len * m, rest, (size_t)m * sizeof *rest);
    sl->origin[sl->len++] = origin;
    p->total++;
    return 0;
}

/* NgramPool.add_all: the n-grams of tokens[0:len] ending at an index >= start, oldest first */
int pool_add_all(Pool *p, const int32_t *tokens, int len, int start) {
    int lo = start - p->n + 1;
    if (lo < 0) lo = 0;
    for (int i = lo; i + p->n <= len; i++) {
        int rc = pool_add(p, tokens + i, p->n, POOL);
        if (rc) return rc;
    }
    return 0;
}

/* pool_add of `count` n-grams back to back in `ngrams` (n tokens each), in order */
int pool_add_many(Pool *p, const int32_t *ngrams, int count, int32_t origin) {
    for (int i = 0; i < count; i++) {
        int rc = pool_add(p, ngrams + (size_t)i * p->n, p->n, origin);
        if (rc) return rc;
    }
    return 0;
}

/* how many continuations follow `key` */
int pool_count(const Pool *p, int32_t key) {
    int32_t s = imap_get(&p->index, key);
    return s < 0 ? 0 : p->slots[s].len;
}

/* NgramPool.items: the continuations after `key` (rest: count * (n - 1)) and their origins,
 * most recent first; returns the count (pool_count(key): the caller sizes the buffers). */
int pool_items(const Pool *p, int32_t key, int32_t *rest, int32_t *origin) {
    int32_t s = imap_get(&p->index, key);
    if (s < 0) return 0;
    const PoolSlot *sl = &p->slots[s];
    const int m = p->n - 1;
    for (int c = 0; c < sl->len; c++) {
        const int j = sl->len - 1 - c;
        memcpy(rest + (size_t)c * m, sl->rest + (size_t)j * m, (size_t)m * sizeof *rest);
        origin[c] = sl->origin[j];
    }
    return sl->len;
}

/* Lookahead.propose's verification branch from the pool:
 *     for ngram, origin in pool.items(key)[:guesses]: tree.add_chain(list(ngram[:max_depth]), origin, max_nodes)
 * Returns the chains merged, or TREE_FULL. */
int pool_add_chains(const Pool *p, Tree *t, int32_t key, int guesses, int max_depth, int max_nodes) {
    int32_t s = imap_get(&p->index, key);
    if (s < 0) return 0;
    const PoolSlot *sl = &p->slots[s];
    const int m = p->n - 1, count = py_cut(sl->len, guesses), len = py_cut(m, max_depth);
    for (int c = 0; c < count; c++) {
        const int j = sl->len - 1 - c;
        if (tree_add_chain(t, sl->rest + (size_t)j * m, len, sl->origin[j], max_nodes, NULL) == TREE_FULL)
            return TREE_FULL;
    }
    return count;
}

/* ==== the token-recycling table ============================================================= */
/* token -> its row (at most top_k next tokens, best first), entries in the order their tokens
 * first entered the table: the order of the reference's dict (nothing is ever removed). */
typedef struct {
    int top_k;
    IMap index;      /* token -> entry */
    int32_t *keys;   /* per entry: its token */
    int32_t *lens;   /* per entry: its row's length */
    int32_t *rows;   /* per entry: top_k slots */
    int32_t n, cap;  /* entries; capacity of keys / lens (rows: cap * top_k) */
    int32_t *level, *next; /* grow_tree's breadth-first frontiers */
    int32_t level_cap, next_cap;
} Table;

Table *table_create(int top_k) {
    if (top_k < 1) return NULL;
    Table *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->top_k = top_k;
    if (imap_init(&t->index, 4)) {
        free(t);
        return NULL;
    }
    return t;
}

void table_free(Table *t) {
    if (!t) return;
    imap_free(&t->index);
    free(t->keys);
    free(t->lens);
    free(t->rows);
    free(t->level);
    free(t->next);
    free(t);
}

int table_len(const Table *t) { return t->n; }
int table_top_k(const Table *t) { return t->top_k; }

/* the entry of `token`, added (empty row) at the end of the order if absent; < 0: an error */
static int32_t entry_of(Table *t, int32_t token) {
    int32_t e = imap_get(&t->index, token);
    if (e >= 0) return e;
    if (token < 0) return TAB_BADARG;
    if (t->n == t->cap) {
        int32_t c = t->cap ? 2 * t->cap : 16;
        if ((int64_t)c * t->top_k > INT32_MAX) return TAB_NOMEM;
        int32_t *k = realloc(t->keys, (size_t)c * sizeof *k);
        if (!k) return TAB_NOMEM;
        t->keys = k;
        int32_t *l = realloc(t->lens, (size_t)c * sizeof *l);
        if (!l) return TAB_NOMEM;
        t->lens = l;
        int32_t *r = realloc(t->rows, (size_t)c * t->top_k * sizeof *r);
        if (!r) return TAB_NOMEM;
        t->rows = r;
        t->cap = c;
    }
    int rc = imap_put(&t->index, token, t->n);
    if (rc) return rc;
    e = t->n++;
    t->keys[e] = token;
    t->lens[e] = 0;
    return e;
}

/* seed_table(tokens, top_k, table): each token's successors, most recent first, distinct */
int table_seed(Table *t, const int32_t *tokens, int len) {
    for (int i = 0; i + 1 < len; i++) {
        const int32_t e = entry_of(t, tokens[i]), b = tokens[i + 1];
        if (e < 0) return e;
        int32_t *row = t->rows + (size_t)e * t->top_k;
        int n = t->lens[e];
        for (int j = 0; j < n; j++)
            if (row[j] == b) { /* row.remove(b) */
                memmove(row + j, row + j + 1, (size_t)(n - 1 - j) * sizeof *row);
                n--;
                break;
            }
        if (n == t->top_k) n--; /* row.insert(0, b); del row[top_k:] */
        memmove(row + 1, row, (size_t)n * sizeof *row);
        row[0] = b;
        t->lens[e] = n + 1;
    }
    return 0;
}

/* for tok, row in src.items(): dst.setdefault(tok, row) -- a row dst holds wins; the new ones
 * enter dst in src's order. Returns how many were added, or an error (TAB_BADARG, nothing
 * added: a row of src longer than dst's top_k). */
int table_merge_into(const Table *src, Table *dst) {
    for (int32_t e = 0; e < src->n; e++)
        if (src->lens[e] > dst->top_k) return TAB_BADARG;
    int added = 0;
    for (int32_t e = 0; e < src->n; e++) {
        if (imap_get(&dst->index, src->keys[e]) >= 0) continue;
        const int32_t d = entry_of(dst, src->keys[e]);
        if (d < 0) return d;
        memcpy(dst->rows + (size_t)d * dst->top_k, src->rows + (size_t)e * src->top_k,
               (size_t)src->lens[e] * sizeof *dst->rows);
        dst->lens[d] = src->lens[e];
        added++;
    }
    return added;
}

/* refresh(table, tokens, rows): table[tokens[i]] = rows[i] (k tokens each, rows_flat holding
 * them back to back), later rows overwriting earlier ones. k > top_k or a negative token:
 * TAB_BADARG with nothing changed. */
int table_refresh(Table *t, const int32_t *tokens, const int32_t *rows_flat, int n_rows, int k) {
    if (k < 0 || k > t->top_k || n_rows < 0) return TAB_BADARG;
    for (int i = 0; i < n_rows; i++)
        if (tokens[i] < 0) return TAB_BADARG;
    for (int i = 0; i < n_rows; i++) {
        const int32_t e = entry_of(t, tokens[i]);
        if (e < 0) return e;
        if (k > 0) /* rows of none may come as a null pointer */
            memcpy(t->rows + (size_t)e * t->top_k, rows_flat + (size_t)i * k, (size_t)k * sizeof *rows_flat);
        t->lens[e] = k;
    }
    return 0;
}

/* table[token] into out (top_k slots): its length, or -1 if the table has no row for it */
int table_get(const Table *t, int32_t token, int32_t *out) {
    const int32_t e = imap_get(&t->index, token);
    if (e < 0) return -1;
    memcpy(out, t->rows + (size_t)e * t->top_k, (size_t)t->lens[e] * sizeof *out);
    return t->lens[e];
}

/* entry e (0 <= e < table_len, in the dict's order): its token, its row into out; the length */
int table_entry(const Table *t, int e, int32_t *token, int32_t *out) {
    if (e < 0 || e >= t->n) return TAB_BADARG;
    *token = t->keys[e];
    memcpy(out, t->rows + (size_t)e * t->top_k, (size_t)t->lens[e] * sizeof *out);
    return t->lens[e];
}

/* recycle.grow_tree: breadth-first from the root, each node at depth d getting its token's
 * first widths[d] recycled successors as children, parents in the order they were reached
 * (a node reached twice is expanded twice, as in the reference), until add_child declines
 * (max_nodes) or min(n_widths, max_depth) levels. Returns 0, TREE_FULL or TAB_NOMEM. */
int table_grow(Table *t, Tree *tree, const int32_t *widths, int n_widths, int max_depth, int max_nodes,
               int32_t source) {
    const int levels = n_widths < max_depth ? n_widths : max_depth;
    int rc = reserve((void **)&t->level, &t->level_cap, 1, sizeof *t->level);
    if (rc) return rc;
    t->level[0] = 0;
    int32_t n_level = 1;
    for (int d = 0; d < levels; d++) {
        int32_t n_next = 0;
        for (int32_t i = 0; i < n_level; i++) {
            const int32_t node = t->level[i], e = imap_get(&t->index, tree->tokens[node]);
            if (e < 0) continue;
            const int32_t *row = t->rows + (size_t)e * t->top_k;
            const int w = py_cut(t->lens[e], widths[d]);
            for (int j = 0; j < w; j++) {
                const int child = tree_add_child(tree, node, row[j], source, max_nodes);
                if (child == TREE_FULL) return TREE_FULL;
                if (child == TREE_NONE) return 0;
                if ((rc = reserve((void **)&t->next, &t->next_cap, (int64_t)n_next + 1, sizeof *t->next))) return rc;
                t->next[n_next++] = child;
            }
        }
        int32_t *swap = t->level, swap_cap = t->level_cap;
        t->level = t->next;
        t->level_cap = t->next_cap;
        t->next = swap;
        t->next_cap = swap_cap;
        n_level = n_next;
    }
    return 0;
}

/* ==== a sequence's history and the prompt-lookup search ===================================== */
typedef struct {
    int32_t *tok;
    int32_t len, cap;
    int32_t *found_start, *found_len; /* the search's continuations, as spans of the history */
    int32_t found_cap, found_len_cap;
    int32_t *at, at_cap; /* the search's scratch: where the last token occurs before */
} History;

History *hist_create(void) { return calloc(1, sizeof(History)); }

void hist_free(History *h) {
    if (!h) return;
    free(h->tok);
    free(h->found_start);
    free(h->found_len);
    free(h->at);
    free(h);
}

int hist_len(const History *h) { return h->len; }

/* appends tokens[0:n]; returns the new length or TAB_NOMEM */
int hist_append(History *h, const int32_t *tokens, int n) {
    if (n < 0) return TAB_BADARG;
    if (n == 0) return h->len;
    int rc = reserve((void **)&h->tok, &h->cap, (int64_t)h->len + n, sizeof *h->tok);
    if (rc) return rc;
    memcpy(h->tok + h->len, tokens, (size_t)n * sizeof *tokens);
    h->len += n;
    return h->len;
}

/* keeps the first n tokens (n <= length) */
int hist_truncate(History *h, int n) {
    if (n < 0 || n > h->len) return TAB_BADARG;
    h->len = n;
    return n;
}

/* ngram_match_lists for this history: the continuations' spans into found_start / found_len,
 * their count returned. For n = min(max_n, L - 1) .. min_n, every earlier window h[i:i+n]
 * (i <= L - n - 1) equal to the last n tokens, i increasing ("first") or decreasing
 * ("recent"), gives h[i+n : i+n+k] -- cut at L when partial; else skipped unless
 * i + n + k <= L and i + n < L - n -- unless an equal continuation was found already; until
 * num_candidates are found.
 * A window ends with the last token, at j = i + n - 1 <= L - 2, whatever n: one pass over the
 * history lists those j (branch-free, so it costs about a cycle a token), and each n walks
 * the list instead of the history. */
static int search(History *h, int min_n, int max_n, int k, int num_candidates, int recent, int partial) {
    if (min_n < 1 || max_n < min_n || k < 1 || num_candidates < 1) return TAB_BADARG;
    int rc = reserve((void **)&h->found_start, &h->found_cap, num_candidates, sizeof(int32_t));
    if (rc) return rc;
    if ((rc = reserve((void **)&h->found_len, &h->found_len_cap, num_candidates, sizeof(int32_t)))) return rc;
    const int L = h->len, top = max_n < L - 1 ? max_n : L - 1;
    if (top < min_n) return 0;
    if ((rc = reserve((void **)&h->at, &h->at_cap, L, sizeof(int32_t)))) return rc;
    const int32_t *x = h->tok, last = x[L - 1];
    int32_t *at = h->at, *fs = h->found_start, *fl = h->found_len;
    int n_at = 0;
    for (int j = 0; j + 1 < L; j++) {
        at[n_at] = j;
        n_at += x[j] == last;
    }
    int found = 0;
    for (int n = top; n >= min_n && found < num_candidates; n--) {
        const int32_t *tail = x + L - n;
        for (int r = 0; r < n_at; r++) {
            const int i = (recent ? at[n_at - 1 - r] : at[r]) - n + 1;
            if (i < 0) {
                if (recent) break; /* every later j in this order is smaller */
                continue;
            }
            if (memcmp(x + i, tail, (size_t)(n - 1) * sizeof *x) != 0) continue;
            const int start = i + n;
            int64_t end = (int64_t)start + k;
            if (partial) {
                if (end > L) end = L;
            } else if (end > L || start >= L - n) {
                continue;
            }
            const int len = (int)(end - start);
            int dup = 0;
            for (int c = 0; c < found && !dup; c++)
                dup = fl[c] == len && memcmp(x + fs[c], x + start, (size_t)len * sizeof *x) == 0;
            if (dup) continue;
            fs[found] = start;
            fl[found] = len;
            if (++found == num_candidates) break;
        }
    }
    return found;
}

/* the search's continuations: continuation c into out_tokens[c * k ...], its length out_lens[c];
 * returns their count or an error (TAB_BADARG: the arguments ngram_match_lists refuses) */
int hist_search(History *h, int min_n, int max_n, int k, int num_candidates, int recent, int partial,
                int32_t *out_tokens, int32_t *out_lens) {
    const int found = search(h, min_n, max_n, k, num_candidates, recent, partial);
    for (int c = 0; c < found; c++) {
        memcpy(out_tokens + (size_t)c * k, h->tok + h->found_start[c], (size_t)h->found_len[c] * sizeof *out_tokens);
        out_lens[c] = h->found_len[c];
    }
    return found;
}

/* prompt lookup's part of a step tree: for chain in the search's continuations:
 * tree.add_chain(chain[:max_depth], source, max_nodes). Returns the chains or an error. */
int hist_add_to_tree(History *h, Tree *t, int min_n, int max_n, int k, int num_candidates, int recent, int partial,
                     int max_depth, int max_nodes, int32_t source) {
    const int found = search(h, min_n, max_n, k, num_candidates, recent, partial);
    for (int c = 0; c < found; c++)
        if (tree_add_chain(t, h->tok + h->found_start[c], py_cut(h->found_len[c], max_depth), source, max_nodes,
                           NULL) == TREE_FULL)
            return TREE_FULL;
    return found;
}
