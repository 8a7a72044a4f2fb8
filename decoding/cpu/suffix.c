/* The suffix trie and its draft trees (decoding/suffix.py's SuffixTrie and grow_tree), compiled.
 *
 * The Python classes are the reference and this is their twin, equal to them bit for bit
 * (tests/test_compiled_suffix.py): the same node ids (creation order), the same once-seen
 * entries, the same size accounting and bound, the same continuations in the same order, and
 * the same trees, the probabilities computed in their order in doubles.
 *
 * Layout. A node (a substring seen more than once, or the root) has count, last, level and the
 * head of its list of entries. An entry is a (parent node, token) child: the child's node id,
 * or ~end for a substring seen once (as in the reference's dicts); entries are linked per
 * parent (continuations enumerate them) and found by one open-addressing hash table keyed by
 * (parent, token) (extend and find look one up per step; a per-node sorted array would move
 * entries on every insert and the root holds one per distinct token). A once-seen entry that
 * becomes a node keeps its entry: only the value changes, so the table never deletes.
 *
 * Places. A place is a node (node >= 0; its length is the node's level) or a once-seen
 * substring: node == -1 with (end, len), where its one occurrence ends in the text and its
 * length, the reference's (end, length) tuple.
 *
 * Memory. Every array grows geometrically; extend reserves what one token may add before it
 * changes anything, so an allocation failure returns SUFFIX_NOMEM with the trie intact (the
 * tokens before it taken, the rest not).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tree.h"

enum { SEP = -1 };         /* in the text: the end of a stream (decoding/suffix.py's SEP) */
enum { SUFFIX_NOMEM = -3 }; /* an allocation failed (TREE_NONE and TREE_FULL are -1, -2) */
enum { SUFFIX_BAD_PLACE = -4 }; /* a place that is none of this trie's (it would read outside its arrays) */
#define EMPTY_KEY UINT64_MAX /* no (parent, token) packs to it: parents are >= 0 */

typedef struct {
    int32_t depth;
    int64_t max_nodes, size; /* size: nodes + once-seen entries + text tokens (SuffixTrie.size) */
    /* nodes */
    int32_t n_nodes, nodes_cap;
    int32_t *count, *last, *level, *first_entry;
    /* entries: token, value (a node id, or ~end), the next entry of the same parent */
    int32_t n_entries, entries_cap;
    int32_t *e_token, *e_value, *e_next;
    /* the table: slot -> (key, entry); capacity a power of two, at most half full */
    uint64_t *keys;
    int32_t *slots;
    int32_t table_bits;
    /* the text of every stream, each new one after a SEP */
    int32_t *text;
    int32_t text_len, text_cap;
    /* the nodes among the suffixes ending at the end of the current stream, shortest first
     * (their levels differ: at most depth + 1 of them); the next token's list is built in spare */
    int32_t *active, *spare;
    int32_t n_active;
    /* grow's scratch: the continuations of one place, and the heap */
    int32_t *c_token, *c_node, *c_end, *c_len, *c_count, *c_last, *c_order;
    int32_t c_cap;
    void *heap;
    int32_t heap_cap;
} SuffixTrie;

/* ---- memory */

/* *p holding *cap elements of `size` bytes grown (doubling) to hold `need`; 0 or SUFFIX_NOMEM */
static int reserve(void **p, int32_t *cap, int64_t need, size_t size) {
    if (need <= *cap) return 0;
    int64_t c = *cap > 0 ? *cap : 16;
    while (c < need) c *= 2;
    if (c > INT32_MAX) c = INT32_MAX;
    if (c < need) return SUFFIX_NOMEM;
    void *q = realloc(*p, (size_t)c * size);
    if (q == NULL) return SUFFIX_NOMEM;
    *p = q;
    *cap = (int32_t)c;
    return 0;
}

/* the arrays that share one capacity grown together: the capacity moves only if all did */
static int reserve_all(int32_t **arrays[], int n, int32_t *cap, int64_t need) {
    if (need <= *cap) return 0;
    for (int i = 0; i < n; i++) {
        int32_t c = *cap;
        if (reserve((void **)arrays[i], &c, need, sizeof(int32_t))) return SUFFIX_NOMEM;
    }
    int64_t c = *cap > 0 ? *cap : 16;
    while (c < need) c *= 2;
    *cap = (int32_t)(c > INT32_MAX ? INT32_MAX : c);
    return 0;
}

static int reserve_nodes(SuffixTrie *t, int64_t need) {
    int32_t **a[] = {&t->count, &t->last, &t->level, &t->first_entry};
    return reserve_all(a, 4, &t->nodes_cap, need);
}

static int reserve_entries(SuffixTrie *t, int64_t need) {
    int32_t **a[] = {&t->e_token, &t->e_value, &t->e_next};
    return reserve_all(a, 3, &t->entries_cap, need);
}

/* ---- the table */

static uint64_t key_of(int32_t parent, int32_t token) { return (uint64_t)(uint32_t)parent << 32 | (uint32_t)token; }

static uint32_t home(uint64_t key, int bits) { return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - bits)); }

/* the slot of (parent, token): its entry's, or the empty one where it would go */
static uint32_t slot_of(const SuffixTrie *t, uint64_t key) {
    const uint32_t mask = (1u << t->table_bits) - 1;
    uint32_t s = home(key, t->table_bits);
    while (t->keys[s] != key && t->keys[s] != EMPTY_KEY) s = (s + 1) & mask;
    return s;
}

/* room in the table for `need` entries (at most half full); 0 or SUFFIX_NOMEM */
static int reserve_table(SuffixTrie *t, int64_t need) {
    int bits = t->table_bits;
    while (bits < 31 && (int64_t)1 << (bits - 1) < need) bits++;
    if ((int64_t)1 << (bits - 1) < need) return SUFFIX_NOMEM;
    if (bits == t->table_bits && t->keys != NULL) return 0;
    const size_t n = (size_t)1 << bits;
    uint64_t *keys = malloc(n * sizeof(uint64_t));
    int32_t *slots = malloc(n * sizeof(int32_t));
    if (keys == NULL || slots == NULL) {
        free(keys);
        free(slots);
        return SUFFIX_NOMEM;
    }
    memset(keys, 0xff, n * sizeof(uint64_t)); /* EMPTY_KEY */
    uint64_t *old_keys = t->keys;
    int32_t *old_slots = t->slots;
    const size_t old_n = old_keys != NULL ? (size_t)1 << t->table_bits : 0;
    t->keys = keys;
    t->slots = slots;
    t->table_bits = bits;
    for (size_t i = 0; i < old_n; i++)
        if (old_keys[i] != EMPTY_KEY) {
            const uint32_t s = slot_of(t, old_keys[i]);
            keys[s] = old_keys[i];
            slots[s] = old_slots[i];
        }
    free(old_keys);
    free(old_slots);
    return 0;
}

/* the entry of (parent, token), or -1 */
static int32_t entry_of(const SuffixTrie *t, int32_t parent, int32_t token) {
    const uint64_t key = key_of(parent, token);
    const uint32_t s = slot_of(t, key);
    return t->keys[s] == key ? t->slots[s] : -1;
}

/* a new entry at the empty slot s (room reserved) */
static void add_entry(SuffixTrie *t, uint32_t s, int32_t parent, int32_t token, int32_t value) {
    const int32_t e = t->n_entries++;
    t->e_token[e] = token;
    t->e_value[e] = value;
    t->e_next[e] = t->first_entry[parent];
    t->first_entry[parent] = e;
    t->keys[s] = key_of(parent, token);
    t->slots[s] = e;
}

/* ---- the trie */

void suffix_free(SuffixTrie *t) {
    if (t == NULL) return;
    free(t->count), free(t->last), free(t->level), free(t->first_entry);
    free(t->e_token), free(t->e_value), free(t->e_next);
    free(t->keys), free(t->slots), free(t->text), free(t->active), free(t->spare);
    free(t->c_token), free(t->c_node), free(t->c_end), free(t->c_len), free(t->c_count), free(t->c_last);
    free(t->c_order), free(t->heap);
    free(t);
}

/* SuffixTrie(depth, max_nodes): the root alone; NULL if out of memory */
SuffixTrie *suffix_new(int depth, int64_t max_nodes) {
    SuffixTrie *t = calloc(1, sizeof(SuffixTrie));
    if (t == NULL) return NULL;
    t->depth = depth;
    t->max_nodes = max_nodes;
    t->size = 1;
    t->table_bits = 6;
    const int32_t n_active = depth > 0 ? depth + 2 : 2;
    t->active = malloc(sizeof(int32_t) * (size_t)n_active);
    t->spare = malloc(sizeof(int32_t) * (size_t)n_active);
    if (t->active == NULL || t->spare == NULL || reserve_nodes(t, 1) || reserve_entries(t, 1) ||
        reserve_table(t, 1)) {
        suffix_free(t);
        return NULL;
    }
    t->count[0] = 0;
    t->last[0] = -1;
    t->level[0] = 0;
    t->first_entry[0] = -1;
    t->n_nodes = 1;
    t->active[0] = 0;
    t->n_active = 1;
    return t;
}

int64_t suffix_size(const SuffixTrie *t) { return t->size; }
int suffix_n_nodes(const SuffixTrie *t) { return t->n_nodes; }
int suffix_text_len(const SuffixTrie *t) { return t->text_len; }
const int32_t *suffix_text(const SuffixTrie *t) { return t->text; }
int suffix_n_active(const SuffixTrie *t) { return t->n_active; }
const int32_t *suffix_active(const SuffixTrie *t) { return t->active; }
/* a node's count and level; SUFFIX_BAD_PLACE if it is not a node */
int suffix_count(const SuffixTrie *t, int node) {
    return node >= 0 && node < t->n_nodes ? t->count[node] : SUFFIX_BAD_PLACE;
}

int suffix_level(const SuffixTrie *t, int node) {
    return node >= 0 && node < t->n_nodes ? t->level[node] : SUFFIX_BAD_PLACE;
}

/* a node, or a once-seen place whose end is in the text (the places the trie gives out are) */
static int valid(const SuffixTrie *t, int32_t node, int32_t end) {
    return node >= 0 ? node < t->n_nodes : node == -1 && end >= 0 && end < t->text_len;
}

/* SuffixTrie.extend: 0, or SUFFIX_NOMEM (the tokens before the one it could not take are in) */
int suffix_extend(SuffixTrie *t, const int32_t *tokens, int n) {
    const int32_t depth = t->depth;
    for (int i = 0; i < n; i++) {
        if (t->size >= t->max_nodes) break;
        /* one token adds at most one node and one entry per active node, and one text token */
        const int32_t na = t->n_active;
        if (reserve((void **)&t->text, &t->text_cap, (int64_t)t->text_len + 1, sizeof(int32_t)) ||
            reserve_nodes(t, (int64_t)t->n_nodes + na) || reserve_entries(t, (int64_t)t->n_entries + na) ||
            reserve_table(t, (int64_t)t->n_entries + na))
            return SUFFIX_NOMEM;
        const int32_t x = tokens[i], e = t->text_len;
        t->text[t->text_len++] = x;
        int64_t added = 1;
        int32_t *next = t->spare, n_next = 0;
        next[n_next++] = 0;
        for (int32_t k = 0; k < na; k++) {
            const int32_t a = t->active[k], la = t->level[a];
            if (la >= depth) continue;
            const uint64_t key = key_of(a, x);
            const uint32_t s = slot_of(t, key);
            if (t->keys[s] != key) { /* first seen here (and so are the longer ones) */
                add_entry(t, s, a, x, ~e);
                added += 1;
                continue;
            }
            const int32_t entry = t->slots[s];
            int32_t c = t->e_value[entry];
            if (c < 0) { /* seen once before, ending at ~c: a node now, with that occurrence's continuation */
                const int32_t first = ~c;
                c = t->n_nodes++;
                t->e_value[entry] = c;
                t->count[c] = 1;
                t->last[c] = first;
                t->level[c] = la + 1;
                t->first_entry[c] = -1;
                if (la + 1 < depth && t->text[first + 1] != SEP) { /* first + 1 <= e: it exists */
                    const int32_t y = t->text[first + 1];
                    add_entry(t, slot_of(t, key_of(c, y)), c, y, ~(first + 1));
                    added += 1;
                }
                added += 1;
            }
            t->count[c] += 1;
            t->last[c] = e;
            next[n_next++] = c;
        }
        t->spare = t->active;
        t->active = next;
        t->n_active = n_next;
        t->size += added;
    }
    return 0;
}

/* SuffixTrie.new_stream: 0 or SUFFIX_NOMEM */
int suffix_new_stream(SuffixTrie *t) {
    if (t->text_len > 0 && t->text[t->text_len - 1] != SEP) {
        if (reserve((void **)&t->text, &t->text_cap, (int64_t)t->text_len + 1, sizeof(int32_t))) return SUFFIX_NOMEM;
        t->text[t->text_len++] = SEP;
        t->size += 1;
    }
    t->active[0] = 0;
    t->n_active = 1;
    return 0;
}

/* SuffixTrie.own_match: a node, or -1 */
int suffix_own_match(const SuffixTrie *t, int max_match) {
    for (int32_t k = t->n_active - 1; k >= 0; k--) {
        const int32_t node = t->active[k];
        if (t->level[node] > 0 && t->level[node] <= max_match && t->first_entry[node] >= 0) return node;
    }
    return -1;
}

/* SuffixTrie.find: 1 and out = (node, end, len) of the pattern's place, or 0 if it never
 * occurred (or is longer than depth) */
int suffix_find(const SuffixTrie *t, const int32_t *pattern, int len, int32_t *out) {
    if (len > t->depth) return 0;
    int32_t node = 0;
    for (int i = 0; i < len; i++) {
        const int32_t entry = entry_of(t, node, pattern[i]);
        if (entry < 0) return 0;
        const int32_t c = t->e_value[entry];
        if (c < 0) { /* seen once: the rest must follow that occurrence */
            int32_t end = ~c;
            for (int j = i + 1; j < len; j++) {
                end += 1;
                if (end >= t->text_len || t->text[end] != pattern[j]) return 0;
            }
            out[0] = -1, out[1] = end, out[2] = len;
            return 1;
        }
        node = c;
    }
    out[0] = node, out[1] = 0, out[2] = t->level[node];
    return 1;
}

/* whether the place has a continuation: SuffixTrie.continuations(place) is not empty */
static int has_continuation(const SuffixTrie *t, int32_t node, int32_t end, int32_t len) {
    if (node >= 0) return t->first_entry[node] >= 0;
    return len < t->depth && end + 1 < t->text_len && t->text[end + 1] != SEP;
}

/* SuffixTrie.store_match of the text's last len tokens: 1 and out = its place, or 0 */
int suffix_store_match(const SuffixTrie *t, const int32_t *text, int len, int max_match, int32_t *out) {
    for (int m = max_match < len ? max_match : len; m > 0; m--) {
        int32_t place[3];
        if (suffix_find(t, text + len - m, m, place) && has_continuation(t, place[0], place[1], place[2])) {
            memcpy(out, place, sizeof(place));
            return 1;
        }
    }
    return 0;
}

/* before: (count, last) larger first, as continuations sorts (-count, -last); lasts of siblings
 * differ (each ends where its own token is), so the order is total */
static int before(const SuffixTrie *t, int32_t i, int32_t j) {
    return t->c_count[i] != t->c_count[j] ? t->c_count[i] > t->c_count[j] : t->c_last[i] > t->c_last[j];
}

/* c_order[0 .. n) sorted by before() (heapsort: in place, no context-free comparator as qsort
 * would need, and ctypes calls run without the GIL, so no global either) */
static void sift(const SuffixTrie *t, int32_t *o, int32_t i, int32_t n) {
    const int32_t k = o[i];
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && before(t, o[c], o[c + 1])) c++; /* the later of the two in the order */
        if (!before(t, k, o[c])) break;
        o[i] = o[c];
        i = c;
    }
    o[i] = k;
}

static void sort_order(const SuffixTrie *t, int32_t n) {
    int32_t *o = t->c_order;
    if (n <= 16) { /* insertion sort: a node has a few continuations as a rule */
        for (int32_t i = 1; i < n; i++) {
            const int32_t k = o[i];
            int32_t j = i;
            for (; j > 0 && before(t, k, o[j - 1]); j--) o[j] = o[j - 1];
            o[j] = k;
        }
        return;
    }
    for (int32_t i = n / 2 - 1; i >= 0; i--) sift(t, o, i, n); /* the last in the order on top */
    for (int32_t m = n - 1; m > 0; m--) {
        const int32_t k = o[0];
        o[0] = o[m];
        o[m] = k;
        sift(t, o, 0, m);
    }
}

/* the continuations of a place in the scratch arrays, c_order their order (SuffixTrie.continuations):
 * how many, or SUFFIX_NOMEM */
static int collect(SuffixTrie *t, int32_t node, int32_t end, int32_t len) {
    int32_t n = 0;
    if (node < 0) {
        if (!has_continuation(t, node, end, len)) return 0;
        int32_t **a[] = {&t->c_token, &t->c_node, &t->c_end, &t->c_len, &t->c_count, &t->c_last, &t->c_order};
        if (reserve_all(a, 7, &t->c_cap, 1)) return SUFFIX_NOMEM;
        t->c_token[0] = t->text[end + 1];
        t->c_node[0] = -1, t->c_end[0] = end + 1, t->c_len[0] = len + 1;
        t->c_count[0] = 1, t->c_last[0] = end + 1, t->c_order[0] = 0;
        return 1;
    }
    const int32_t level = t->level[node] + 1;
    for (int32_t e = t->first_entry[node]; e >= 0; e = t->e_next[e]) {
        int32_t **a[] = {&t->c_token, &t->c_node, &t->c_end, &t->c_len, &t->c_count, &t->c_last, &t->c_order};
        if (reserve_all(a, 7, &t->c_cap, (int64_t)n + 1)) return SUFFIX_NOMEM;
        const int32_t c = t->e_value[e];
        t->c_token[n] = t->e_token[e];
        if (c >= 0) {
            t->c_node[n] = c, t->c_end[n] = 0, t->c_len[n] = t->level[c];
            t->c_count[n] = t->count[c], t->c_last[n] = t->last[c];
        } else {
            t->c_node[n] = -1, t->c_end[n] = ~c, t->c_len[n] = level;
            t->c_count[n] = 1, t->c_last[n] = ~c;
        }
        t->c_order[n] = n;
        n++;
    }
    sort_order(t, n);
    return n;
}

/* SuffixTrie.continuations of (node, end, len): the number n of them, or SUFFIX_NOMEM; when
 * n <= cap, out[5 i .. 5 i + 4] = (token, node, end, len, occurrences) of the i-th, best first;
 * SUFFIX_BAD_PLACE */
int suffix_continuations(SuffixTrie *t, int32_t node, int32_t end, int32_t len, int32_t *out, int cap) {
    if (!valid(t, node, end)) return SUFFIX_BAD_PLACE;
    const int n = collect(t, node, end, len);
    if (n < 0 || n > cap) return n;
    for (int i = 0; i < n; i++) {
        const int32_t k = t->c_order[i];
        int32_t *o = out + 5 * i;
        o[0] = t->c_token[k], o[1] = t->c_node[k], o[2] = t->c_end[k], o[3] = t->c_len[k], o[4] = t->c_count[k];
    }
    return n;
}

/* ---- grow_tree */

typedef struct {
    double neg_p; /* -probability along the path */
    int64_t tick; /* order of creation: ties pop first-made first */
    int32_t node, end, len; /* the trie place */
    int32_t tree_node;
} Item;

/* heapq's order on (-p, tick, ...): the ticks differ, so the rest never counts */
static int less(const Item *a, const Item *b) {
    return a->neg_p < b->neg_p || (a->neg_p == b->neg_p && a->tick < b->tick);
}

static int push(SuffixTrie *t, int32_t *n, Item item) {
    if (reserve(&t->heap, &t->heap_cap, (int64_t)*n + 1, sizeof(Item))) return SUFFIX_NOMEM;
    Item *h = t->heap;
    int32_t i = (*n)++;
    while (i > 0) {
        const int32_t up = (i - 1) / 2;
        if (!less(&item, &h[up])) break;
        h[i] = h[up];
        i = up;
    }
    h[i] = item;
    return 0;
}

static Item pop(SuffixTrie *t, int32_t *n) {
    Item *h = t->heap;
    const Item top = h[0], item = h[--*n];
    int32_t i = 0;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && less(&h[c + 1], &h[c])) c++;
        if (!less(&h[c], &item)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = item;
    return top;
}

/* grow_tree(tree, trie, place, max_depth, max_nodes, min_prob, source): best-first by path
 * frequency from the place (node, end, len), hung under the tree's root (which may hold nodes
 * already). 0; TREE_FULL where the tree's buffers are full; SUFFIX_NOMEM; SUFFIX_BAD_PLACE. */
int suffix_grow(SuffixTrie *t, Tree *tree, int32_t node, int32_t end, int32_t len, int max_depth, int max_nodes,
                double min_prob, int32_t source) {
    if (!valid(t, node, end)) return SUFFIX_BAD_PLACE;
    int32_t n_heap = 0;
    int64_t tick = 0;
    const Item start = {-1.0, 0, node, end, len, 0};
    if (push(t, &n_heap, start)) return SUFFIX_NOMEM;
    while (n_heap > 0) {
        const Item it = pop(t, &n_heap);
        if (tree->depths[it.tree_node] >= max_depth) continue;
        const int n = collect(t, it.node, it.end, it.len);
        if (n < 0) return n;
        int64_t total = 0;
        for (int i = 0; i < n; i++) total += t->c_count[i];
        for (int i = 0; i < n; i++) {
            const int32_t k = t->c_order[i];
            /* -neg_p * n / total: the product, then the quotient */
            const double p = -it.neg_p * (double)t->c_count[k] / (double)total;
            if (p < min_prob) break;
            const int child = tree_add_child(tree, it.tree_node, t->c_token[k], source, max_nodes);
            if (child == TREE_FULL) return TREE_FULL;
            if (child == TREE_NONE) return 0;
            tick += 1;
            const Item next = {-p, tick, t->c_node[k], t->c_end[k], t->c_len[k], child};
            if (push(t, &n_heap, next)) return SUFFIX_NOMEM;
        }
    }
    return 0;
}
