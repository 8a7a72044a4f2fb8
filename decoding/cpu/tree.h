/* A step tree (decoding/tree.py's StepTree) built in C on buffers the caller owns.
 *
 * Nodes in creation order, node 0 the root. Per node: token, parent (-1 for the root), depth,
 * source bits, group (-1 unless a private node of a lookahead window column), candidate (1:
 * may be accepted; 0: private). A candidate's candidate children are linked in creation order
 * (first_child / next_sibling / last_child), which is the order of StepTree.children's dicts:
 * merging a chain into the trie looks a token up among them.
 *
 * The functions mirror StepTree.add_child / add_chain / add_private_chain exactly. Where the
 * buffers are full (n == cap) they return TREE_FULL and the caller grows them and starts the
 * tree again (it sizes them so that this does not happen).
 */
#ifndef SPECDEC_TREE_H
#define SPECDEC_TREE_H
#include <stdint.h>

typedef struct {
    int32_t *tokens, *parents, *depths, *sources, *group;
    int8_t *candidate;
    int32_t *first_child, *next_sibling, *last_child;
    int32_t n, cap, n_cand; /* nodes; capacity of every array; candidate nodes but the root */
} Tree;

enum { TREE_NONE = -1, TREE_FULL = -2 };

/* the tree of the root alone; TREE_FULL if cap < 1 */
int tree_reset(Tree *t, int32_t root_token);

/* The candidate child `token` of `parent`: an existing one gets `source` OR-ed into its bits;
 * else one is created unless the tree holds max_nodes candidates already (max_nodes < 0: no
 * limit), TREE_NONE then. */
int tree_add_child(Tree *t, int parent, int32_t token, int32_t source, int max_nodes);

/* A candidate chain merged below the root; stops at the first node it may not create.
 * Returns how many of the chain's tokens have nodes (path[i] their nodes when path is not
 * NULL), or TREE_FULL. */
int tree_add_chain(Tree *t, const int32_t *chain, int len, int32_t source, int max_nodes, int32_t *path);

/* Private (non-candidate) nodes below `parent`, one per token, each the child of the one
 * before, in `group`; path[i] their nodes (path may be NULL). Returns len or TREE_FULL. */
int tree_add_private(Tree *t, int parent, const int32_t *chain, int len, int32_t source, int32_t group,
                     int32_t *path);

/* The lookahead window (decoding/lookahead.py, Lookahead.propose): levels is (n_levels, W)
 * row-major, n_levels = N - 1 >= 1. Column c (group c) is a trunk token levels[0][c] at depth
 * c for c >= 1 (the trunk first, each the child of the one before, the root standing for
 * column 0), then below each column's trunk node its chain levels[1..][c]. tips[c] is the
 * column's last node. Returns the nodes added or TREE_FULL. */
int tree_add_window(Tree *t, const int32_t *levels, int n_levels, int W, int32_t source, int32_t *tips);

#endif
