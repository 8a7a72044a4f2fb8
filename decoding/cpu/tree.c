/* Step trees in C: see tree.h (decoding/tree.py is the reference). */
#include "tree.h"

int tree_reset(Tree *t, int32_t root_token) {
    if (t->cap < 1) return TREE_FULL;
    t->tokens[0] = root_token;
    t->parents[0] = -1;
    t->depths[0] = 0;
    t->sources[0] = 0;
    t->group[0] = -1;
    t->candidate[0] = 1;
    t->first_child[0] = t->last_child[0] = t->next_sibling[0] = -1;
    t->n = 1;
    t->n_cand = 0;
    return 0;
}

static int new_node(Tree *t, int parent, int32_t token, int32_t source, int candidate, int32_t group) {
    if (t->n >= t->cap) return TREE_FULL;
    int node = t->n++;
    t->tokens[node] = token;
    t->parents[node] = parent;
    t->depths[node] = t->depths[parent] + 1;
    t->sources[node] = source;
    t->group[node] = group;
    t->candidate[node] = (int8_t)candidate;
    t->first_child[node] = t->last_child[node] = t->next_sibling[node] = -1;
    if (candidate) {
        t->n_cand++;
        if (t->last_child[parent] < 0) t->first_child[parent] = node;
        else t->next_sibling[t->last_child[parent]] = node;
        t->last_child[parent] = node;
    }
    return node;
}

int tree_add_child(Tree *t, int parent, int32_t token, int32_t source, int max_nodes) {
    for (int c = t->first_child[parent]; c >= 0; c = t->next_sibling[c])
        if (t->tokens[c] == token) {
            t->sources[c] |= source;
            return c;
        }
    if (max_nodes >= 0 && t->n_cand >= max_nodes) return TREE_NONE;
    return new_node(t, parent, token, source, 1, -1);
}

int tree_add_chain(Tree *t, const int32_t *chain, int len, int32_t source, int max_nodes, int32_t *path) {
    int node = 0;
    for (int i = 0; i < len; i++) {
        int next = tree_add_child(t, node, chain[i], source, max_nodes);
        if (next == TREE_FULL) return TREE_FULL;
        if (next == TREE_NONE) return i;
        if (path) path[i] = next;
        node = next;
    }
    return len;
}

int tree_add_private(Tree *t, int parent, const int32_t *chain, int len, int32_t source, int32_t group,
                     int32_t *path) {
    for (int i = 0; i < len; i++) {
        parent = new_node(t, parent, chain[i], source, 0, group);
        if (parent == TREE_FULL) return TREE_FULL;
        if (path) path[i] = parent;
    }
    return len;
}

int tree_add_window(Tree *t, const int32_t *levels, int n_levels, int W, int32_t source, int32_t *tips) {
    int start = t->n;
    tips[0] = 0; /* the column tops first: tips holds them until the columns' chains are added */
    for (int c = 1; c < W; c++) {
        int rc = tree_add_private(t, tips[c - 1], &levels[c], 1, source, c, &tips[c]);
        if (rc == TREE_FULL) return TREE_FULL;
    }
    for (int c = 0; c < W; c++) {
        int node = tips[c];
        for (int j = 1; j < n_levels; j++) {
            int rc = tree_add_private(t, node, &levels[j * W + c], 1, source, c, &node);
            if (rc == TREE_FULL) return TREE_FULL;
        }
        tips[c] = node;
    }
    return t->n - start;
}
