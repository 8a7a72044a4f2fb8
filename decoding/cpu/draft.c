/* A proposer's whole step tree for one sequence in one call: what
 * decoding/lookahead.py's ``Lookahead.propose_compiled`` composes from one call per source, in
 * its order (decoding/hybrid.py adds the first and the last; decoding/prompt_lookup.py's
 * ``PromptLookup`` drafts with prompt lookup alone):
 *
 *     reset the tree to the root
 *     if max_depth > 0:
 *         the sequence's own suffix continuations (hybrid: first_compiled)
 *         prompt lookup's continuations (lookahead+pld, hybrid: extra_compiled)
 *         the pool's n-grams after the root
 *     the window (where it fits the context)
 *     the recycled tree (hybrid: last_compiled, if max_depth > 0)
 *
 * Each part is the library's own function (suffix.c, tables.c, tree.c), so the tree is the one
 * the calls one by one build, node for node (tests/test_compiled_draft.py holds every method's
 * trees equal on both). A part whose handle is NULL is not in the method. Called through the C
 * glue (decoding/cpu/glue.c) or ctypes.
 *
 * The parts' objects are defined in their own files; here they are opaque pointers (the
 * functions' declarations below name them void *: the same pointer either way). */
#include <stdint.h>

#include "tree.h"

int suffix_own_match(const void *t, int max_match);
int suffix_grow(void *t, Tree *tree, int32_t node, int32_t end, int32_t len, int max_depth, int max_nodes,
                double min_prob, int32_t source);
int hist_add_to_tree(void *h, Tree *t, int min_n, int max_n, int k, int num_candidates, int recent, int partial,
                     int max_depth, int max_nodes, int32_t source);
int pool_add_chains(const void *p, Tree *t, int32_t key, int guesses, int max_depth, int max_nodes);
int table_grow(void *t, Tree *tree, const int32_t *widths, int n_widths, int max_depth, int max_nodes,
               int32_t source);

/* A sequence's sources (decoding/compiled_draft.py ``DraftSources``, same layout) */
typedef struct {
    void *own; /* its suffix trie, or NULL */
    double own_min_prob;
    int32_t own_max_match;
    void *hist; /* its prompt-lookup history, or NULL */
    int32_t min_n, max_n, k, num_candidates, recent, partial;
    void *pool; /* its n-gram pool, or NULL (prompt lookup alone) */
    int32_t guesses;
    void *table; /* its recycled table, or NULL */
    const int32_t *widths;
    int32_t n_widths;
    int32_t suffix_source, pld_source, window_source, recycle_source; /* decoding/tree.py's bits */
} DraftSources;

/* The parts that can fail, for the caller's message (stage) */
enum { STAGE_SUFFIX = 1, STAGE_PLD = 2, STAGE_POOL = 3, STAGE_WINDOW = 4, STAGE_RECYCLE = 5 };

/* The tree of root, capped as the calls one by one cap it: cap (min(max_verify, the budget's
 * nodes)) for the suffix, prompt-lookup and pool parts, max_nodes (the budget's) for the recycled
 * tree; levels (n_levels, W) the window, NULL: none (tips untouched). Returns 0, or the first
 * part's negative code with *stage saying which part; the tree is then incomplete. */
int draft_lookahead(Tree *t, const DraftSources *s, int32_t root, int max_depth, int cap, int max_nodes,
                    const int32_t *levels, int n_levels, int W, int32_t *tips, int *stage) {
    int rc = tree_reset(t, root);
    *stage = 0;
    if (rc < 0) return rc;
    if (max_depth > 0) {
        if (s->own) {
            const int node = suffix_own_match(s->own, s->own_max_match);
            if (node >= 0 &&
                (rc = suffix_grow(s->own, t, node, 0, 0, max_depth, cap, s->own_min_prob, s->suffix_source)) < 0) {
                *stage = STAGE_SUFFIX;
                return rc;
            }
        }
        if (s->hist && (rc = hist_add_to_tree(s->hist, t, s->min_n, s->max_n, s->k, s->num_candidates, s->recent,
                                              s->partial, max_depth, cap, s->pld_source)) < 0) {
            *stage = STAGE_PLD;
            return rc;
        }
        if (s->pool && (rc = pool_add_chains(s->pool, t, root, s->guesses, max_depth, cap)) < 0) {
            *stage = STAGE_POOL;
            return rc;
        }
    }
    if (levels && (rc = tree_add_window(t, levels, n_levels, W, s->window_source, tips)) < 0) {
        *stage = STAGE_WINDOW;
        return rc;
    }
    if (max_depth > 0 && s->table &&
        (rc = table_grow(s->table, t, s->widths, s->n_widths, max_depth, max_nodes, s->recycle_source)) < 0) {
        *stage = STAGE_RECYCLE;
        return rc;
    }
    return 0;
}
