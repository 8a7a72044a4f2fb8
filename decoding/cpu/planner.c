/* The step planner's per-step work (decoding/planner.py), compiled: the deepest chain worth
 * sending (Planner.max_depth), the nodes a step sends (Planner.select with node_estimates) and
 * what a step teaches (Planner.observe with node_keys). The Python methods are the reference;
 * each function here does their arithmetic in their order, in doubles, so that the plans are
 * the same bit for bit (tests/test_compiled.py). Built with -ffp-contract=off: a product and a
 * sum written apart stay apart, as in Python.
 *
 * Acceptance estimates are dense arrays of N_KEYS doubles (hits, trials) per sequence and for
 * the batch's shared estimate, indexed by key_index() below (decoding/compiled.py mirrors it).
 * A tree is given as flat arrays over its nodes in creation order (node 0 the root):
 * parents, depths, sources, group, candidate; several trees are concatenated, offsets[b] being
 * tree b's first node.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* decoding/tree.py's source bits and decoding/planner.py's key caps */
enum { DRAFT = 8, WINDOW = 16, HARVEST = 32, RECYCLE = 64 };
enum { MAX_DEPTH_KEY = 8, MAX_RANK_KEY = 3, BACKED_DEPTH = 1 };
#define MIN_OF_CURVE 0.5 /* decoding/planner.py's */
enum { NOT_BACKED = 0, BACKED = 1, NO_OPINION = 2 };
enum { N_BIT_IDX = 10, N_KEYS = N_BIT_IDX * (MAX_DEPTH_KEY + 1) * (MAX_RANK_KEY + 1) * 2 * 3 };

int planner_n_keys(void) { return N_KEYS; }

/* bit 0 -> 0, bit 1 << i -> i + 1 */
static int bit_index(int bit) {
    int i = 0;
    while (bit) {
        i++;
        bit >>= 1;
    }
    return i;
}

static int key_index(int bit, int depth, int rank, int streak, int backed) {
    return (((bit_index(bit) * (MAX_DEPTH_KEY + 1) + depth) * (MAX_RANK_KEY + 1) + rank) * 2 + streak) * 3 + backed;
}

typedef struct {                  /* PlannerConfig and the planner's learnt host time */
    double prior, prior_weight, explore, decay, min_gain;
    int max_tokens, max_step_tokens; /* max_step_tokens < 0: no limit */
    int learn_overhead;
    double overhead_ms, overhead_per_token, mean_x;
} plan_cfg;

typedef struct {                  /* models.cost.StepCost, tabulated by models' own methods */
    const double *curve;          /* curve[n] = StepCost.curve(n), n < curve_len */
    const double *slope;          /* slope[t] = StepCost.attention_slope(t), t < slope_len (or NULL) */
    int curve_len, slope_len;
    double per_seq_ms, floor_ms;  /* floor_ms = 0.5 * ms[0] */
    int64_t context, span;        /* span = long_context - context, 0: no context term */
    const int64_t *contexts;      /* (B,) committed tokens, or NULL */
} plan_cost;

typedef struct {                  /* one sequence's estimate and the batch's */
    double *hits, *trials;
    double *shared_hits, *shared_trials;
    int streak;
} plan_acc;

static double pmax(double a, double b) { return b > a ? b : a; } /* Python's max(a, b) */
static double pmin(double a, double b) { return b < a ? b : a; } /* Python's min(a, b) */

/* Acceptance._rates: (rate, optimistic) of key k */
static void rates(const plan_cfg *c, const plan_acc *a, int k, double *rate, double *opt) {
    const double w = c->prior_weight;
    const double base = (a->shared_hits[k] + c->prior * w) / (a->shared_trials[k] + w);
    const double n = a->trials[k] + w;
    const double p = (a->hits[k] + base * w) / n;
    *rate = p;
    *opt = pmin(p + c->explore * pow(p * (1 - p) / n, 0.5), 0.99);
}

/* StepCost.__call__ */
static double cost_of(const plan_cost *s, const int *tokens, int B, int *bad) {
    int64_t total = 0;
    for (int b = 0; b < B; b++) total += tokens[b];
    if (total >= s->curve_len) {
        *bad = 1;
        return 0.0;
    }
    double ms = s->curve[total] + s->per_seq_ms * (double)(B - 1 > 0 ? B - 1 : 0);
    if (s->contexts != NULL && s->span > 0) {
        for (int b = 0; b < B; b++) {
            if (tokens[b] >= s->slope_len) {
                *bad = 1;
                return 0.0;
            }
            ms += s->slope[tokens[b]] * (double)(s->contexts[b] - s->context) / (double)s->span;
        }
    }
    return pmax(ms, s->floor_ms);
}

/* Planner._time */
static double time_of(const plan_cfg *c, const plan_cost *s, const int *tokens, int B, int *bad) {
    int64_t total = 0;
    for (int b = 0; b < B; b++) total += tokens[b];
    if (c->max_step_tokens >= 0 && total > c->max_step_tokens) return INFINITY;
    const double ms = cost_of(s, tokens, B, bad);
    if (!c->learn_overhead) return ms;
    /* the learnt time beyond the curve may be below zero (a curve measured on a slower machine
     * state), never below MIN_OF_CURVE of the curve (decoding/planner.py) */
    const double extra = c->overhead_ms + c->overhead_per_token * ((double)total - c->mean_x);
    return ms + extra > MIN_OF_CURVE * ms ? ms + extra : MIN_OF_CURVE * ms;
}

/* Planner.max_depth: out[b] for each of the B sequences. 0, or -2 when the cost tables are short. */
int planner_max_depth(const plan_cfg *c, const plan_cost *s, const plan_acc *accs, int B, int sources,
                      double calibration, int32_t *out) {
    int bits[N_BIT_IDX], n_bits = 0, bad = 0;
    const int usable = sources & ~WINDOW;
    for (int i = 0; i < 31; i++)
        if (usable >> i & 1) bits[n_bits++] = 1 << i;
    if (n_bits == 0) bits[n_bits++] = 0;
    const int n_opinions = (sources & RECYCLE) ? 2 : 1;
    const int opinions[2] = {NO_OPINION, BACKED};
    int *tokens = malloc(sizeof(int) * (size_t)(B > 0 ? B : 1));
    if (tokens == NULL) return -1;
    for (int b = 0; b < B; b++) {
        const plan_acc *a = accs + b;
        for (int i = 0; i < B; i++) tokens[i] = 1;
        double qs[MAX_DEPTH_KEY];
        for (int d = 1; d <= MAX_DEPTH_KEY; d++) {
            double best = 0.0;
            int first = 1;
            for (int i = 0; i < n_bits; i++)
                for (int o = 0; o < (d <= BACKED_DEPTH ? n_opinions : 1); o++) {
                    double r, q;
                    rates(c, a, key_index(bits[i], d, 0, a->streak, opinions[o]), &r, &q);
                    if (first || q > best) best = q;
                    first = 0;
                }
            qs[d - 1] = best;
        }
        double best = (double)B / time_of(c, s, tokens, B, &bad) * (1 + c->min_gain), p = 1.0, gain = (double)B;
        int best_d = 0;
        for (int d = 1; d < c->max_tokens; d++) {
            const double q = qs[(d < MAX_DEPTH_KEY ? d : MAX_DEPTH_KEY) - 1];
            p *= q;
            gain += calibration * p;
            tokens[b] += 1;
            const double t = time_of(c, s, tokens, B, &bad);
            if (gain / t > best) {
                best = gain / t;
                best_d = d;
            }
            if (p < 1e-3) break;
            if (d >= MAX_DEPTH_KEY && (gain + p * q / (1.0 - q)) / t <= best) break;
        }
        out[b] = best_d;
    }
    free(tokens);
    return bad ? -2 : 0;
}

/* rank of each node among its parent's candidate children (their order of creation: the
 * order of StepTree.children), and whether a recycled prediction is among each node's
 * candidate children */
static void ranks_opinions(int n, const int32_t *parents, const int32_t *sources, const uint8_t *candidate,
                           int32_t *rank, uint8_t *opinion, int32_t *kids) {
    memset(kids, 0, sizeof(int32_t) * (size_t)n);
    memset(opinion, 0, (size_t)n);
    rank[0] = 0;
    for (int i = 1; i < n; i++) {
        rank[i] = 0;
        if (!candidate[i]) continue;
        rank[i] = kids[parents[i]]++;
        if (sources[i] & RECYCLE) opinion[parents[i]] = 1;
    }
}

static int backing(int bits, int depth, int opinion) {
    if (!opinion || depth > BACKED_DEPTH) return NO_OPINION;
    return (bits & RECYCLE) ? BACKED : NOT_BACKED;
}

/* node_estimates: p (rates) and q (optimistic bounds) of one tree's nodes */
static void estimates(const plan_cfg *c, const plan_acc *a, int n, const int32_t *parents, const int32_t *depths,
                      const int32_t *sources, const uint8_t *candidate, const double *chance, const int32_t *rank,
                      const uint8_t *opinion, double *p, double *q, double *left_p, double *left_q) {
    for (int i = 0; i < n; i++) {
        p[i] = q[i] = i == 0 ? 1.0 : 0.0;
        left_p[i] = left_q[i] = 1.0;
    }
    for (int i = 1; i < n; i++) {
        if (!candidate[i]) continue;
        const int parent = parents[i], bits = sources[i] & ~WINDOW;
        const int backed = backing(bits, depths[i], opinion[parent]);
        const int depth = depths[i] < MAX_DEPTH_KEY ? depths[i] : MAX_DEPTH_KEY;
        const int r = rank[i] < MAX_RANK_KEY ? rank[i] : MAX_RANK_KEY;
        double est_p = 0.0, est_q = 0.0;
        for (int k = 0; k < 31; k++) {
            if (!(bits >> k & 1)) continue;
            double ra, rb;
            rates(c, a, key_index(1 << k, depth, r, a->streak, backed), &ra, &rb);
            est_p = pmax(est_p, ra);
            est_q = pmax(est_q, rb);
        }
        if (chance != NULL && !isnan(chance[i])) {
            const double ch = chance[i];
            if (sources[i] == DRAFT) {
                est_p = est_q = ch;
            } else {
                est_p = pmax(est_p, ch);
                est_q = pmax(est_q, ch);
            }
        }
        double cond = pmin(est_p, left_p[parent]);
        left_p[parent] -= cond;
        p[i] = p[parent] * cond;
        cond = pmin(est_q, left_q[parent]);
        left_q[parent] -= cond;
        q[i] = q[parent] * cond;
    }
}

typedef struct {   /* Planner.select's Item */
    double order_value, value;
    int kind, a, b, seq, tokens;  /* order = (kind, a, b); a node (0, depth, node), a group (1, g, 0) */
    int first, count;             /* its nodes: node ids first .. (a node: 1; a group: listed in members) */
} item;

static int item_cmp(const void *x, const void *y) {
    const item *u = x, *v = y;
    if (u->order_value != v->order_value) return u->order_value < v->order_value ? -1 : 1;
    if (u->kind != v->kind) return u->kind < v->kind ? -1 : 1;
    if (u->a != v->a) return u->a < v->a ? -1 : 1;
    if (u->b != v->b) return u->b < v->b ? -1 : 1;
    return u->seq < v->seq ? -1 : u->seq > v->seq;
}

/* Planner.select over B trees (concatenated; offsets (B + 1,)). pinned: per node, 1 for the
 * pinned nodes and their ancestors (root excluded), or NULL. chance: per node, NaN where the
 * proposer gave none, or NULL. Writes each tree's kept nodes, increasing, into kept (tree b's
 * at kept + offsets[b], n_kept[b] of them) and the expected tokens of what it keeps
 * (rates, root included) into expected. 0; -1 out of memory; -2 the cost tables are short. */
int planner_select(const plan_cfg *c, const plan_cost *s, const plan_acc *accs, int B, const int32_t *offsets,
                   const int32_t *parents, const int32_t *depths, const int32_t *sources, const int32_t *group,
                   const uint8_t *candidate, const uint8_t *pinned, const double *chance, double calibration,
                   double window_rate, int32_t *kept, int32_t *n_kept, double *expected) {
    if (B < 1) return 0;
    const int N = offsets[B];
    int rc = 0, bad = 0;
    double *p = malloc(sizeof(double) * (size_t)N), *q = malloc(sizeof(double) * (size_t)N);
    double *lp = malloc(sizeof(double) * (size_t)N), *lq = malloc(sizeof(double) * (size_t)N);
    double *unit = malloc(sizeof(double) * (size_t)B);
    int32_t *rank = malloc(sizeof(int32_t) * (size_t)N), *kids = malloc(sizeof(int32_t) * (size_t)N);
    int32_t *members = malloc(sizeof(int32_t) * (size_t)N), *gsize = malloc(sizeof(int32_t) * (size_t)N);
    int32_t *gorder = malloc(sizeof(int32_t) * (size_t)N);
    int *tokens = malloc(sizeof(int) * (size_t)B), *ones = malloc(sizeof(int) * (size_t)B);
    uint8_t *opinion = malloc((size_t)N), *keep = malloc((size_t)N);
    item *items = malloc(sizeof(item) * (size_t)N);
    if (!p || !q || !lp || !lq || !unit || !rank || !kids || !members || !gsize || !gorder || !tokens || !ones ||
        !opinion || !keep || !items) {
        rc = -1;
        goto done;
    }
    for (int b = 0; b < B; b++) {
        const int o = offsets[b], n = offsets[b + 1] - o;
        ranks_opinions(n, parents + o, sources + o, candidate + o, rank + o, opinion + o, kids + o);
        estimates(c, accs + b, n, parents + o, depths + o, sources + o, candidate + o,
                  chance != NULL ? chance + o : NULL, rank + o, opinion + o, p + o, q + o, lp + o, lq + o);
        if (calibration != 1.0)
            for (int i = 1; i < n; i++) q[o + i] = q[o + i] * calibration;
    }
    for (int b = 0; b < B; b++) ones[b] = 1;
    const double base = cost_of(s, ones, B, &bad);
    for (int b = 0; b < B; b++) {
        ones[b] = 2;
        unit[b] = pmax(1e-6, cost_of(s, ones, B, &bad) - base);
        ones[b] = 1;
    }
    /* the items: candidate nodes that are not pinned, and window groups (in order of first node) */
    int n_items = 0, n_members = 0;
    double pinned_gain = 0.0;
    for (int b = 0; b < B; b++) {
        const int o = offsets[b], n = offsets[b + 1] - o;
        const double u = unit[b];
        int n_groups = 0;
        tokens[b] = 1;
        for (int i = 1; i < n; i++) {
            if (pinned != NULL && pinned[o + i]) {
                tokens[b] += 1;
                pinned_gain += q[o + i];
            }
        }
        for (int i = 1; i < n; i++) {
            if (candidate[o + i]) {
                if (pinned == NULL || !pinned[o + i])
                    items[n_items++] = (item){-q[o + i] / u, q[o + i], 0, depths[o + i], i, b, 1, i, 1};
            } else if (group[o + i] >= 0) {
                int g = 0;
                while (g < n_groups && gorder[g] != group[o + i]) g++;
                if (g == n_groups) {
                    gorder[n_groups] = group[o + i];
                    gsize[n_groups++] = 0;
                }
                gsize[g]++;
            }
        }
        for (int g = 0; g < n_groups; g++) {  /* members listed group by group, in node order */
            const int first = n_members;
            for (int i = 1; i < n; i++)
                if (!candidate[o + i] && group[o + i] == gorder[g]) members[n_members++] = i;
            items[n_items++] = (item){-window_rate / ((double)gsize[g] * u), window_rate, 1, gorder[g], 0, b,
                                      gsize[g], first, gsize[g]};
        }
    }
    qsort(items, (size_t)n_items, sizeof(item), item_cmp);
    double gain = (double)B + pinned_gain;  /* pinned_gain: 0.0 plus each pinned node's chance, in order */
    double best = gain / time_of(c, s, tokens, B, &bad) * (1 + c->min_gain), rest = 0.0;
    int best_k = 0, n_taken = 0;
    for (int i = 0; i < n_items; i++) rest += items[i].value;
    for (int i = 0; i < n_items; i++) {
        item *it = items + i;
        rest -= it->value;
        if (tokens[it->seq] + it->tokens > c->max_tokens) continue;
        tokens[it->seq] += it->tokens;
        gain += it->value;
        items[n_taken++] = *it;  /* taken items, in order (never ahead of i) */
        const double t = time_of(c, s, tokens, B, &bad);
        const double r = gain / t;
        if (r > best) {
            best = r;
            best_k = n_taken;
        } else if ((gain + rest) / t <= best) {
            break;
        }
    }
    memset(keep, 0, (size_t)N);
    for (int b = 0; b < B; b++) {
        keep[offsets[b]] = 1;
        if (pinned != NULL)
            for (int i = offsets[b] + 1; i < offsets[b + 1]; i++) keep[i] |= pinned[i];
    }
    for (int k = 0; k < best_k; k++) {
        const item *it = items + k;
        const int o = offsets[it->seq];
        if (it->kind == 0) keep[o + it->first] = 1;
        else
            for (int m = 0; m < it->count; m++) keep[o + members[it->first + m]] = 1;
    }
    for (int b = 0; b < B; b++) {
        const int o = offsets[b], n = offsets[b + 1] - o;
        double e = 0.0;
        int m = 0;
        for (int i = 0; i < n; i++)
            if (keep[o + i]) {
                kept[o + m++] = i;
                e += p[o + i];
            }
        n_kept[b] = m;
        expected[b] = e;
    }
    if (bad) rc = -2;
done:
    free(p);
    free(q);
    free(lp);
    free(lq);
    free(unit);
    free(rank);
    free(kids);
    free(members);
    free(gsize);
    free(gorder);
    free(tokens);
    free(ones);
    free(opinion);
    free(keep);
    free(items);
    return rc;
}

/* Planner.observe for one sequence's step: trials for every sent candidate (rows, in the
 * outcome's order) whose parent was accepted (on_path), under the sequence's streak before
 * the step. Returns the accepted nodes that only the window's harvest proposed in *credit and
 * the distinct window groups sent in *columns. 0, or -1 out of memory. */
int planner_observe(const plan_cfg *c, plan_acc *a, int n, const int32_t *parents, const int32_t *depths,
                    const int32_t *sources, const int32_t *group, const uint8_t *candidate, const int32_t *rows,
                    int n_rows, const uint8_t *on_path, int *credit, int *columns) {
    int32_t *rank = malloc(sizeof(int32_t) * (size_t)n), *kids = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *groups = malloc(sizeof(int32_t) * (size_t)n);
    uint8_t *opinion = malloc((size_t)n);
    if (!rank || !kids || !opinion || !groups) {
        free(rank);
        free(kids);
        free(opinion);
        free(groups);
        return -1;
    }
    ranks_opinions(n, parents, sources, candidate, rank, opinion, kids);
    const double d = c->decay;
    *credit = *columns = 0;
    for (int j = 0; j < n_rows; j++) {
        const int i = rows[j];
        if (!candidate[i] && group[i] >= 0) {  /* a group not counted yet */
            int g = 0;
            while (g < *columns && groups[g] != group[i]) g++;
            if (g == *columns) groups[(*columns)++] = group[i];
        }
        if (i == 0 || !candidate[i] || !on_path[parents[i]]) continue;
        const int depth = depths[i] < MAX_DEPTH_KEY ? depths[i] : MAX_DEPTH_KEY;
        const int r = rank[i] < MAX_RANK_KEY ? rank[i] : MAX_RANK_KEY;
        const int bits = sources[i] & ~WINDOW;
        const int backed = backing(bits, depth, depth <= BACKED_DEPTH && opinion[parents[i]]);
        const int hit = on_path[i] ? 1 : 0;
        for (int k = 0; k < 31; k++) {
            if (!(bits >> k & 1)) continue;
            const int key = key_index(1 << k, depth, r, a->streak, backed);
            a->hits[key] = d * a->hits[key] + (double)hit;
            a->trials[key] = d * a->trials[key] + 1.0;
            a->shared_hits[key] = d * a->shared_hits[key] + (double)hit;
            a->shared_trials[key] = d * a->shared_trials[key] + 1.0;
        }
        if (hit && sources[i] == HARVEST) (*credit)++;
    }
    free(rank);
    free(kids);
    free(opinion);
    free(groups);
    return 0;
}

/* planner_observe for the B sequences of a step, whose trees select flattened (offsets):
 * rows of sequence b at rows + row_offsets[b], its on_path flags at on_path + offsets[b].
 * Sums the credits and columns of all. 0, or -1 out of memory. */
int planner_observe_batch(const plan_cfg *c, plan_acc *accs, int B, const int32_t *offsets, const int32_t *parents,
                          const int32_t *depths, const int32_t *sources, const int32_t *group,
                          const uint8_t *candidate, const int32_t *row_offsets, const int32_t *rows,
                          const uint8_t *on_path, int *credit, int *columns) {
    *credit = *columns = 0;
    for (int b = 0; b < B; b++) {
        const int o = offsets[b], r = row_offsets[b];
        int cr, co;
        if (planner_observe(c, accs + b, offsets[b + 1] - o, parents + o, depths + o, sources + o, group + o,
                            candidate + o, rows + r, row_offsets[b + 1] - r, on_path + o, &cr, &co) != 0)
            return -1;
        *credit += cr;
        *columns += co;
    }
    return 0;
}
