/* The generate loop's own glue (decoding/generate.py), in the CPython extension of glue.c:
 *
 * - send(trees, keep, sids, make_tree, make_input) -> (sent, rows, inputs) or None: ``send``'s loop
 *   in one call. Per sequence the tree sent (the proposer's, or ``StepTree.subtree`` of the kept
 *   nodes, made as the reference makes it: the same objects in its lists, its dicts and sets
 *   filled in the same order, the class called with the same fields), its nodes' logits rows
 *   (``logit_nodes`` numbered in order) and the runner's ``StepInput``.
 * - record(active, outcomes, stats_cls, source_names) -> (gained, sent, sids) or None: ``record``'s
 *   loop in one call, each sequence's ``SeqStats.record`` of its outcome (the sent candidates
 *   tallied by (source bits, accepted) in the order the rows meet them, each tally added to its
 *   sources' names in ``SOURCE_NAMES``' order: the counters gain their keys in the reference's
 *   order too).
 * - outcomes(active, trees, sent, rows, verdicts, reduced, keep, eos, seq_cls, make_outcome, update) ->
 *   outcomes or None: ``settle``'s loop in one call, sequence by sequence: the accepted tokens and
 *   the bonus appended as ``Sequence.append`` appends them (cut at EOS or the length, ``finish``
 *   set alike), the sent subtree's path and rows renamed, the ``Outcome`` made, then the
 *   proposer's ``update`` (None: none) called with it before the next sequence.
 * - paths(sent, rows, reduced) -> verdicts or None: decode_step's greedy walks (``greedy_path`` per
 *   sequence) in one call.
 *
 * make_*: a class, or (class, field names) from decoding/compiled.py ``maker`` (``make`` below).
 *
 * Why: after a forward each Python call of a step pays its lines from memory; these loops were a
 * fifth to a quarter of a planned tree step's host time on the host-step oracle (`pld` 0.026 of
 * 0.117 ms, `hybrid` 0.046 of 0.17: bench/results/2026-11-28-cpu-one-step/NOTES.md).
 * Each answers None, having changed nothing, where an object is not what the reference's fast
 * case expects (a tree or sequence of another class with its own methods, a keep list that is
 * not increasing or drops a kept node's parent, a statistics object of another class, a node
 * outside its tree): the Python reference then runs, and raises what it raises. tests/test_compiled_step.py holds
 * both equal. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static PyObject *a_tokens, *a_parents, *a_depths, *a_sources, *a_candidate, *a_group, *a_extra, *a_chance, *a_pinned;
static PyObject *a_subtree, *a_logit_nodes, *a_is_chain, *a_children;
static PyObject *a_prompt_len, *a_max_new, *a_finish, *a_top1, *a_topk, *s_eos, *s_length;
static PyObject *a_stats, *a_state, *a_sid, *a_tree, *a_path, *a_rows, *a_new_tokens, *a_sent, *a_forwards,
    *a_step_tokens, *a_accepted_hist, *a_proposed, *a_accepted, *a_accept_lengths;

static PyObject *no_args; /* () */

int glue_step_init(void) {
    const char *names[] = {"tokens", "parents", "depths", "sources", "candidate", "group", "extra_logits", "chance",
                           "pinned", "subtree", "logit_nodes", "is_chain", "stats", "state", "sid", "tree", "path",
                           "rows", "new_tokens", "sent", "forwards", "step_tokens", "accepted_hist", "proposed",
                           "accepted", "accept_lengths", "prompt_len", "max_new_tokens", "finish", "_top1", "_topk",
                           "eos", "length", "children"};
    PyObject **slots[] = {&a_tokens, &a_parents, &a_depths, &a_sources, &a_candidate, &a_group, &a_extra, &a_chance,
                          &a_pinned, &a_subtree, &a_logit_nodes, &a_is_chain, &a_stats, &a_state, &a_sid, &a_tree,
                          &a_path, &a_rows, &a_new_tokens, &a_sent, &a_forwards, &a_step_tokens, &a_accepted_hist,
                          &a_proposed, &a_accepted, &a_accept_lengths, &a_prompt_len, &a_max_new, &a_finish, &a_top1,
                          &a_topk, &s_eos, &s_length, &a_children};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!(*slots[i] = PyUnicode_InternFromString(names[i]))) return -1;
    return (no_args = PyTuple_New(0)) ? 0 : -1;
}

/* NULL with no error set: "not taken here" (the reference runs) */
#define NOT_TAKEN NULL

/* a list attribute of exactly n items (n < 0: any length), new reference; NULL: error set, or none
 * such (no error) */
static PyObject *list_attr(PyObject *o, PyObject *name, Py_ssize_t n) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v) return NULL;
    if (!PyList_CheckExact(v) || (n >= 0 && PyList_GET_SIZE(v) != n)) {
        Py_DECREF(v);
        return NOT_TAKEN;
    }
    return v;
}

/* an exact int's value in [0, n), else -1 */
static Py_ssize_t node_of(PyObject *v, Py_ssize_t n) {
    if (!PyLong_CheckExact(v)) return -1;
    const Py_ssize_t x = PyLong_AsSsize_t(v);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return x >= 0 && x < n ? x : -1;
}

/* whether the tree's class computes subtree, logit_nodes and is_chain as tree_cls does */
static PyObject *plain_seen[2]; /* the last subclass found plain and its tree_cls (held: an address is not reused) */

static int plain_tree(PyObject *t, PyObject *tree_cls) {
    PyObject *type = (PyObject *)Py_TYPE(t);
    if (type == tree_cls) return 1;
    /* a subclass's methods are looked up once, not each step (a C-built tree's class every step); a
     * method assigned to the class later is not seen (the tests' classes define theirs in the body) */
    if (type == plain_seen[0] && tree_cls == plain_seen[1]) return 1;
    if (!PyObject_TypeCheck(t, (PyTypeObject *)tree_cls)) return 0;
    PyObject *names[3] = {a_subtree, a_logit_nodes, a_is_chain};
    for (int i = 0; i < 3; i++) {
        PyObject *mine = PyObject_GetAttr(type, names[i]), *theirs = PyObject_GetAttr(tree_cls, names[i]);
        const int same = mine && theirs && mine == theirs;
        Py_XDECREF(mine);
        Py_XDECREF(theirs);
        if (!same) {
            PyErr_Clear();
            return 0;
        }
    }
    Py_INCREF(type);
    Py_INCREF(tree_cls);
    Py_XDECREF(plain_seen[0]);
    Py_XDECREF(plain_seen[1]);
    plain_seen[0] = type;
    plain_seen[1] = tree_cls;
    return 1;
}

/* the nodes of a set or dict of exact ints mapped through new_of (kept ones only, in iteration order)
 * into out (a set, or a dict taking the source dict's values); 0 where an item is not an exact int */
static int remap(PyObject *src, const int32_t *new_of, Py_ssize_t n, PyObject *out, int is_dict) {
    if (is_dict) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(src, &pos, &key, &value)) {
            if (!PyLong_CheckExact(key)) return 0;
            const Py_ssize_t old = node_of(key, n);
            if (old < 0) { /* an int outside the tree is not kept, as `n in new_of` says */
                if (PyErr_Occurred()) return -1;
                continue;
            }
            if (new_of[old] < 0) continue;
            PyObject *k = PyLong_FromLong(new_of[old]);
            if (!k || PyDict_SetItem(out, k, value) < 0) {
                Py_XDECREF(k);
                return -1;
            }
            Py_DECREF(k);
        }
        return 1;
    }
    PyObject *it = PyObject_GetIter(src), *item;
    if (!it) return -1;
    int ok = 1;
    while ((item = PyIter_Next(it))) {
        if (!PyLong_CheckExact(item)) {
            Py_DECREF(item);
            ok = 0;
            break;
        }
        const Py_ssize_t old = node_of(item, n);
        Py_DECREF(item);
        if (old < 0 || new_of[old] < 0) continue;
        PyObject *k = PyLong_FromLong(new_of[old]);
        if (!k || PySet_Add(out, k) < 0) {
            Py_XDECREF(k);
            ok = -1;
            break;
        }
        Py_DECREF(k);
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) return -1;
    return ok;
}

/* l[0] = v (a new reference, stolen; NULL: an error is set) */
static int set_first(PyObject *l, PyObject *v) { return v ? PyList_SetItem(l, 0, v) : -1; }

/* An instance made as ``how`` says: a class, called with the first n_init values (the rest then set
 * as the attributes late names); or (cls, names) for a dataclass whose generated __init__ only
 * assigns its fields (decoding/compiled.py ``maker``): object.__new__(cls), then names[i] = values[i]
 * in order, the instance that __init__ and the late assignments make, without __init__'s Python
 * frame. New reference, or NULL with an error set. */
static PyObject *make(PyObject *how, PyObject *const *values, Py_ssize_t n_init, Py_ssize_t n, PyObject *const *late) {
    if (PyTuple_CheckExact(how)) {
        PyObject *cls = PyTuple_GET_ITEM(how, 0), *names = PyTuple_GET_ITEM(how, 1);
        PyObject *obj = PyBaseObject_Type.tp_new((PyTypeObject *)cls, no_args, NULL);
        for (Py_ssize_t i = 0; obj && i < n; i++)
            if (PyObject_SetAttr(obj, PyTuple_GET_ITEM(names, i), values[i]) < 0) Py_CLEAR(obj);
        return obj;
    }
    PyObject *obj = PyObject_Vectorcall(how, values, n_init, NULL);
    for (Py_ssize_t i = n_init; obj && i < n; i++)
        if (PyObject_SetAttr(obj, late[i - n_init], values[i]) < 0) Py_CLEAR(obj);
    return obj;
}

/* the class of a ``how`` (make's), or NULL where it is neither a class nor (class, names of n) */
static PyObject *class_of(PyObject *how, Py_ssize_t n) {
    if (PyType_Check(how)) return how;
    if (!PyTuple_CheckExact(how) || PyTuple_GET_SIZE(how) != 2 || !PyType_Check(PyTuple_GET_ITEM(how, 0))) return NULL;
    PyObject *names = PyTuple_GET_ITEM(how, 1);
    if (!PyTuple_CheckExact(names) || PyTuple_GET_SIZE(names) != n) return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(names, i))) return NULL;
    return PyTuple_GET_ITEM(how, 0);
}

/* StepTree.subtree(keep)[0] of tree t (n nodes): new reference; NULL with an error set, or NOT_TAKEN */
static PyObject *subtree(PyObject *t, PyObject *keep, Py_ssize_t n, PyObject *make_tree) {
    const Py_ssize_t m = PyList_GET_SIZE(keep);
    PyObject *src[6] = {NULL}, *dst[7] = {NULL}, *extra = NULL, *chance = NULL, *pinned = NULL, *out = NULL;
    PyObject *names[6] = {a_tokens, a_candidate, a_parents, a_depths, a_sources, a_group};
    int32_t *new_of = NULL;
    Py_ssize_t *old = NULL;
    for (int j = 0; j < 6; j++)
        if (!(src[j] = list_attr(t, names[j], n))) goto done;
    extra = PyObject_GetAttr(t, a_extra);
    chance = extra ? PyObject_GetAttr(t, a_chance) : NULL;
    pinned = chance ? PyObject_GetAttr(t, a_pinned) : NULL;
    if (!pinned) goto done;
    if (!PyAnySet_CheckExact(extra) || !PyDict_CheckExact(chance) || !PyAnySet_CheckExact(pinned)) goto done;
    new_of = malloc(sizeof(int32_t) * (size_t)n);
    old = malloc(sizeof(Py_ssize_t) * (size_t)m);
    if (!new_of || !old) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) new_of[i] = -1;
    for (Py_ssize_t i = 0; i < m; i++) { /* increasing from the root, every kept node's parent kept */
        old[i] = node_of(PyList_GET_ITEM(keep, i), n);
        if (old[i] < 0 || (i == 0 ? old[i] != 0 : old[i] <= old[i - 1])) goto done;
        if (i > 0) {
            const Py_ssize_t p = node_of(PyList_GET_ITEM(src[2], old[i]), n);
            if (p < 0 || new_of[p] < 0) goto done;
        }
        new_of[old[i]] = (int32_t)i;
    }
    /* tokens, candidate, depths, sources, group: the kept items themselves, then the root's fields
     * as the reference sets them; parents renumbered; children: a dict per node */
    const int from[5] = {0, 1, 3, 4, 5};
    for (int j = 0; j < 7; j++)
        if (!(dst[j] = PyList_New(m))) goto done;
    for (int j = 0; j < 5; j++) {
        PyObject *l = dst[j == 0 ? 0 : j == 1 ? 1 : j + 1];
        for (Py_ssize_t i = 0; i < m; i++) {
            PyObject *v = PyList_GET_ITEM(src[from[j]], old[i]);
            Py_INCREF(v);
            PyList_SET_ITEM(l, i, v);
        }
    }
    /* dst: 0 tokens, 1 candidate, 2 parents, 3 depths, 4 sources, 5 group, 6 children */
    if (set_first(dst[3], PyLong_FromLong(0)) < 0 || set_first(dst[4], PyLong_FromLong(0)) < 0 ||
        set_first(dst[1], (Py_INCREF(Py_True), Py_True)) < 0 || set_first(dst[5], PyLong_FromLong(-1)) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *p = PyLong_FromLong(i == 0 ? -1 : new_of[node_of(PyList_GET_ITEM(src[2], old[i]), n)]);
        PyObject *kids = PyDict_New();
        if (!p || !kids) {
            Py_XDECREF(p);
            Py_XDECREF(kids);
            goto done;
        }
        PyList_SET_ITEM(dst[2], i, p);
        PyList_SET_ITEM(dst[6], i, kids);
    }
    for (Py_ssize_t i = 1; i < m; i++) {
        const int cand = PyObject_IsTrue(PyList_GET_ITEM(dst[1], i));
        if (cand < 0) goto done;
        if (!cand) continue;
        PyObject *kids = PyList_GET_ITEM(dst[6], PyLong_AsSsize_t(PyList_GET_ITEM(dst[2], i)));
        PyObject *node = PyLong_FromSsize_t(i);
        if (!node || PyDict_SetItem(kids, PyList_GET_ITEM(dst[0], i), node) < 0) {
            Py_XDECREF(node);
            goto done;
        }
        Py_DECREF(node);
    }
    {
        PyObject *sub_extra = PySet_New(NULL), *sub_chance = PyDict_New(), *sub_pinned = PySet_New(NULL);
        int ok = sub_extra && sub_chance && sub_pinned ? 1 : -1;
        if (ok == 1) ok = remap(extra, new_of, n, sub_extra, 0);
        if (ok == 1) ok = remap(chance, new_of, n, sub_chance, 1);
        if (ok == 1) ok = remap(pinned, new_of, n, sub_pinned, 0);
        if (ok == 1) {
            PyObject *args[10] = {dst[0], dst[2], dst[3], dst[4], dst[1], dst[6], sub_extra, dst[5], sub_chance,
                                  sub_pinned};
            out = make(make_tree, args, 10, 10, NULL);
        }
        Py_XDECREF(sub_extra);
        Py_XDECREF(sub_chance);
        Py_XDECREF(sub_pinned);
    }
done:
    for (int j = 0; j < 6; j++) Py_XDECREF(src[j]);
    for (int j = 0; j < 7; j++) Py_XDECREF(dst[j]);
    Py_XDECREF(extra);
    Py_XDECREF(chance);
    Py_XDECREF(pinned);
    free(new_of);
    free(old);
    return out;
}

/* the sent tree's logits rows (node -> row) and their nodes, and whether it is a chain: 1, 0 where
 * not taken (no error set), -1 on an error */
static int rows_of(PyObject *t, PyObject **rows, PyObject **nodes, PyObject **parents, int *is_chain) {
    PyObject *cand = NULL, *extra = NULL;
    *rows = *nodes = *parents = NULL;
    int rc = -1;
    if (!(cand = list_attr(t, a_candidate, -1))) goto fail;
    const Py_ssize_t n = PyList_GET_SIZE(cand);
    PyObject *tokens = list_attr(t, a_tokens, n); /* logit_nodes counts the tokens */
    if (!tokens) goto fail;
    Py_DECREF(tokens);
    if (!(*parents = list_attr(t, a_parents, n))) goto fail;
    if (!(extra = PyObject_GetAttr(t, a_extra))) goto fail;
    if (!PyAnySet_Check(extra)) goto fail;
    const int any_extra = PySet_GET_SIZE(extra) > 0;
    if (!(*rows = PyDict_New()) || !(*nodes = PyList_New(0))) goto fail;
    *is_chain = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyList_GET_ITEM(*parents, i);
        if (!PyLong_CheckExact(p)) goto fail;
        if (*is_chain) {
            const long pv = PyLong_AsLong(p);
            if (pv == -1 && PyErr_Occurred()) PyErr_Clear();
            *is_chain = pv == (long)i - 1;
        }
        int want = PyObject_IsTrue(PyList_GET_ITEM(cand, i));
        if (want < 0) goto fail;
        PyObject *node = PyLong_FromSsize_t(i);
        if (!node) goto fail;
        if (!want && any_extra && (want = PySet_Contains(extra, node)) < 0) {
            Py_DECREF(node);
            goto fail;
        }
        if (want) {
            PyObject *row = PyLong_FromSsize_t(PyList_GET_SIZE(*nodes));
            if (!row || PyDict_SetItem(*rows, node, row) < 0 || PyList_Append(*nodes, node) < 0) {
                Py_XDECREF(row);
                Py_DECREF(node);
                goto fail;
            }
            Py_DECREF(row);
        }
        Py_DECREF(node);
    }
    rc = 1;
    goto out;
fail:
    if (!PyErr_Occurred()) rc = 0;
    Py_CLEAR(*rows);
    Py_CLEAR(*nodes);
    Py_CLEAR(*parents);
out:
    Py_XDECREF(cand);
    Py_XDECREF(extra);
    return rc;
}

PyObject *glue_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "send takes 5 arguments");
        return NULL;
    }
    PyObject *trees = args[0], *keep = args[1], *sids = args[2], *make_tree = args[3], *make_input = args[4];
    PyObject *tree_cls = class_of(make_tree, 10);
    if (!PyList_CheckExact(trees) || !PyList_CheckExact(sids) || !tree_cls || !class_of(make_input, 6)) Py_RETURN_NONE;
    const Py_ssize_t B = PyList_GET_SIZE(trees);
    if (PyList_GET_SIZE(sids) != B || (keep != Py_None && (!PyList_CheckExact(keep) || PyList_GET_SIZE(keep) != B)))
        Py_RETURN_NONE;
    PyObject *sent = PyList_New(B), *rows = PyList_New(B), *inputs = PyList_New(B), *out = NULL;
    if (!sent || !rows || !inputs) goto done;
    for (Py_ssize_t b = 0; b < B; b++) {
        PyObject *t = PyList_GET_ITEM(trees, b), *k = keep == Py_None ? NULL : PyList_GET_ITEM(keep, b);
        if (!plain_tree(t, tree_cls) || (k && !PyList_CheckExact(k))) goto not_taken;
        PyObject *tokens = list_attr(t, a_tokens, -1);
        if (!tokens) goto not_taken;
        const Py_ssize_t n = PyList_GET_SIZE(tokens);
        Py_DECREF(tokens);
        PyObject *st;
        if (k && PyList_GET_SIZE(k) != n) {
            if (!(st = subtree(t, k, n, make_tree))) goto not_taken;
        } else {
            Py_INCREF(t);
            st = t;
        }
        PyList_SET_ITEM(sent, b, st);
        PyObject *r, *nodes, *parents;
        int chain = 0;
        const int rc = rows_of(st, &r, &nodes, &parents, &chain);
        if (rc <= 0) goto not_taken;
        PyList_SET_ITEM(rows, b, r);
        PyObject *st_tokens = PyObject_GetAttr(st, a_tokens), *st_depths = NULL, *in = NULL;
        if (st_tokens && (st_depths = PyObject_GetAttr(st, a_depths))) {
            PyObject *in_args[6] = {PyList_GET_ITEM(sids, b), st_tokens, st_depths, Py_None, nodes,
                                    chain ? Py_None : parents};
            in = make(make_input, in_args, 6, 6, NULL);
        }
        Py_XDECREF(st_tokens);
        Py_XDECREF(st_depths);
        Py_DECREF(nodes);
        Py_DECREF(parents);
        if (!in) goto not_taken; /* an error is set */
        PyList_SET_ITEM(inputs, b, in);
    }
    out = PyTuple_Pack(3, sent, rows, inputs);
    goto done;
not_taken:
    if (!PyErr_Occurred()) {
        Py_INCREF(Py_None);
        out = Py_None;
    }
done:
    Py_XDECREF(sent);
    Py_XDECREF(rows);
    Py_XDECREF(inputs);
    return out;
}

/* ---- record ---- */

typedef struct {
    PyObject *stats, *sid, *tree, *path, *rows, *new_tokens, *sent, *candidate, *sources; /* new references */
} seq_step;

static void release(seq_step *s) {
    Py_XDECREF(s->stats);
    Py_XDECREF(s->sid);
    Py_XDECREF(s->tree);
    Py_XDECREF(s->path);
    Py_XDECREF(s->rows);
    Py_XDECREF(s->new_tokens);
    Py_XDECREF(s->sent);
    Py_XDECREF(s->candidate);
    Py_XDECREF(s->sources);
}

/* d[key] += add (a missing key counts 0, as a Counter's); 0 or -1 */
static int counter_add(PyObject *d, PyObject *key, PyObject *add) {
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (!v && PyErr_Occurred()) return -1;
    PyObject *sum = v ? PyNumber_Add(v, add) : (Py_INCREF(add), add);
    if (!sum) return -1;
    const int rc = PyDict_SetItem(d, key, sum);
    Py_DECREF(sum);
    return rc;
}

/* obj.name += add; 0 or -1 */
static int attr_add(PyObject *obj, PyObject *name, PyObject *add) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v) return -1;
    PyObject *sum = PyNumber_Add(v, add);
    Py_DECREF(v);
    if (!sum) return -1;
    const int rc = PyObject_SetAttr(obj, name, sum);
    Py_DECREF(sum);
    return rc;
}

/* the fields of one sequence's step, checked: 1, 0 where not taken, -1 on an error */
static int read_seq(PyObject *seq, PyObject *o, PyObject *stats_cls, seq_step *s) {
    PyObject *state = NULL;
    if (!(s->stats = PyObject_GetAttr(seq, a_stats)) || !(state = PyObject_GetAttr(seq, a_state))) goto fail;
    s->sid = PyObject_GetAttr(state, a_sid);
    Py_DECREF(state);
    if (!s->sid || (PyObject *)Py_TYPE(s->stats) != stats_cls) goto fail;
    PyObject *fields[4] = {a_accepted_hist, a_proposed, a_accepted, a_accept_lengths};
    for (int j = 0; j < 4; j++) {
        PyObject *v = PyObject_GetAttr(s->stats, fields[j]);
        if (!v) goto fail;
        const int ok = j < 3 ? PyDict_Check(v) : PyList_CheckExact(v);
        Py_DECREF(v);
        if (!ok) goto fail;
    }
    if (!(s->tree = PyObject_GetAttr(o, a_tree)) || !(s->path = PyObject_GetAttr(o, a_path)) ||
        !(s->rows = PyObject_GetAttr(o, a_rows)) || !(s->new_tokens = PyObject_GetAttr(o, a_new_tokens)) ||
        !(s->sent = PyObject_GetAttr(o, a_sent)))
        goto fail;
    if (!PyList_CheckExact(s->path) || !PyDict_CheckExact(s->rows) || !PyList_CheckExact(s->new_tokens) ||
        !PyLong_CheckExact(s->sent))
        goto fail;
    if (!(s->candidate = list_attr(s->tree, a_candidate, -1)) ||
        !(s->sources = list_attr(s->tree, a_sources, PyList_GET_SIZE(s->candidate))))
        goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(s->path); i++)
        if (!PyLong_CheckExact(PyList_GET_ITEM(s->path, i))) goto fail;
    const Py_ssize_t n = PyList_GET_SIZE(s->candidate);
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(s->rows, &pos, &key, &value)) {
        if (!PyLong_CheckExact(key)) goto fail;
        if (node_of(key, n) < 0) goto fail; /* candidate[node]: another node's (a negative node), or it raises */
        if (!PyLong_CheckExact(PyList_GET_ITEM(s->sources, node_of(key, n)))) goto fail;
    }
    return 1;
fail:
    return PyErr_Occurred() ? -1 : 0;
}

typedef struct {
    long bits;
    int accepted;
    long n;
} tally_t;

/* SeqStats.record(outcome) for a checked sequence: 0 or -1 */
static int record_one(seq_step *s, PyObject *source_names) {
    const Py_ssize_t n = PyList_GET_SIZE(s->candidate), P = PyList_GET_SIZE(s->path);
    tally_t small[16], *tally = small;
    Py_ssize_t cap = 16, used = 0;
    int rc = -1;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(s->rows, &pos, &key, &value)) {
        const Py_ssize_t node = node_of(key, n);
        if (node == 0) continue;
        const int cand = PyObject_IsTrue(PyList_GET_ITEM(s->candidate, node));
        if (cand < 0) goto done;
        if (!cand) continue;
        const long bits = PyLong_AsLong(PyList_GET_ITEM(s->sources, node));
        if (bits == -1 && PyErr_Occurred()) goto done;
        int on = 0;
        for (Py_ssize_t i = 0; i < P && !on; i++) on = PyLong_AsSsize_t(PyList_GET_ITEM(s->path, i)) == node;
        PyErr_Clear(); /* a path node past Py_ssize_t is no node of the rows */
        Py_ssize_t j = 0;
        while (j < used && (tally[j].bits != bits || tally[j].accepted != on)) j++;
        if (j == used) {
            if (used == cap) {
                tally_t *more = malloc(sizeof(tally_t) * (size_t)(2 * cap));
                if (!more) {
                    PyErr_NoMemory();
                    goto done;
                }
                memcpy(more, tally, sizeof(tally_t) * (size_t)used);
                if (tally != small) free(tally);
                tally = more;
                cap *= 2;
            }
            tally[used++] = (tally_t){bits, on, 0};
        }
        tally[j].n++;
    }
    PyObject *proposed = PyObject_GetAttr(s->stats, a_proposed), *accepted = PyObject_GetAttr(s->stats, a_accepted);
    PyObject *hist = PyObject_GetAttr(s->stats, a_accepted_hist), *lengths = PyObject_GetAttr(s->stats, a_accept_lengths);
    PyObject *one = PyLong_FromLong(1), *len = PyLong_FromSsize_t(PyList_GET_SIZE(s->new_tokens));
    int ok = proposed && accepted && hist && lengths && one && len;
    ok = ok && attr_add(s->stats, a_forwards, one) == 0 && attr_add(s->stats, a_step_tokens, s->sent) == 0;
    for (Py_ssize_t j = 0; ok && j < used; j++) {
        PyObject *count = PyLong_FromLong(tally[j].n);
        ok = count != NULL;
        Py_ssize_t p = 0;
        PyObject *bit, *name;
        while (ok && PyDict_Next(source_names, &p, &bit, &name)) {
            const long b = PyLong_AsLong(bit);
            if (b == -1 && PyErr_Occurred()) {
                ok = 0;
                break;
            }
            if (!(tally[j].bits & b)) continue;
            ok = counter_add(proposed, name, count) == 0 && (!tally[j].accepted || counter_add(accepted, name, count) == 0);
        }
        Py_XDECREF(count);
    }
    ok = ok && counter_add(hist, len, one) == 0 && PyList_Append(lengths, len) == 0;
    Py_XDECREF(proposed);
    Py_XDECREF(accepted);
    Py_XDECREF(hist);
    Py_XDECREF(lengths);
    Py_XDECREF(one);
    Py_XDECREF(len);
    rc = ok ? 0 : -1;
done:
    if (tally != small) free(tally);
    return rc;
}

PyObject *glue_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "record takes 4 arguments");
        return NULL;
    }
    PyObject *active = args[0], *outcomes = args[1], *stats_cls = args[2], *source_names = args[3];
    if (!PyList_CheckExact(active) || !PyList_CheckExact(outcomes) || !PyDict_CheckExact(source_names) ||
        PyList_GET_SIZE(active) != PyList_GET_SIZE(outcomes))
        Py_RETURN_NONE;
    const Py_ssize_t B = PyList_GET_SIZE(active);
    seq_step *steps = calloc((size_t)B + 1, sizeof(seq_step));
    if (!steps) return PyErr_NoMemory();
    PyObject *out = NULL;
    int rc = 1;
    /* every sequence read and checked before any statistic changes */
    for (Py_ssize_t b = 0; b < B && rc == 1; b++)
        rc = read_seq(PyList_GET_ITEM(active, b), PyList_GET_ITEM(outcomes, b), stats_cls, &steps[b]);
    if (rc == 1) {
        PyObject *sent = PyList_New(B), *sids = PyList_New(B);
        Py_ssize_t gained = 0;
        int ok = sent && sids;
        for (Py_ssize_t b = 0; ok && b < B; b++) {
            ok = record_one(&steps[b], source_names) == 0;
            gained += PyList_GET_SIZE(steps[b].new_tokens);
            Py_INCREF(steps[b].sent);
            Py_INCREF(steps[b].sid);
            PyList_SET_ITEM(sent, b, steps[b].sent);
            PyList_SET_ITEM(sids, b, steps[b].sid);
        }
        if (ok) out = Py_BuildValue("(nOO)", gained, sent, sids);
        Py_XDECREF(sent);
        Py_XDECREF(sids);
    } else if (rc == 0) {
        Py_INCREF(Py_None);
        out = Py_None;
    }
    for (Py_ssize_t b = 0; b < B; b++) release(&steps[b]);
    free(steps);
    return out;
}

/* ---- outcomes ---- */

/* one sequence's step, read and checked before anything changes (references borrowed from the
 * call's lists, or new where named) */
typedef struct {
    PyObject *seq, *state, *tokens, *tree, *sent_tokens, *rows, *path, *bonus, *lg, *top1, *topk, *kept;
    Py_ssize_t prompt_len, max_new;
} settle_t;

static void settle_release(settle_t *s) {
    Py_XDECREF(s->state);
    Py_XDECREF(s->tokens);
    Py_XDECREF(s->sent_tokens);
}

/* 1 taken, 0 not (no error set), -1 on an error */
static int settle_read(PyObject *const *args, Py_ssize_t b, PyObject *seq_cls, settle_t *s) {
    PyObject *active = args[0], *trees = args[1], *sent = args[2], *rows = args[3], *verdicts = args[4],
             *reduced = args[5], *keep = args[6];
    s->seq = PyList_GET_ITEM(active, b);
    s->tree = PyList_GET_ITEM(trees, b);
    s->rows = PyList_GET_ITEM(rows, b);
    PyObject *v = PyList_GET_ITEM(verdicts, b), *red = PyList_GET_ITEM(reduced, b);
    if ((PyObject *)Py_TYPE(s->seq) != seq_cls || !PyDict_CheckExact(s->rows) || !PyTuple_CheckExact(v) ||
        PyTuple_GET_SIZE(v) != 2 || !PyTuple_CheckExact(red) || PyTuple_GET_SIZE(red) != 3)
        return 0;
    s->path = PyTuple_GET_ITEM(v, 0);
    s->bonus = PyTuple_GET_ITEM(v, 1);
    s->lg = PyTuple_GET_ITEM(red, 0);
    s->top1 = PyTuple_GET_ITEM(red, 1);
    s->topk = PyTuple_GET_ITEM(red, 2);
    if (!PyList_CheckExact(s->path) || PyList_GET_SIZE(s->path) < 1) return 0;
    if (!(s->state = PyObject_GetAttr(s->seq, a_state))) return -1;
    if (!(s->tokens = list_attr(s->state, a_tokens, -1))) return PyErr_Occurred() ? -1 : 0;
    PyObject *pl = PyObject_GetAttr(s->state, a_prompt_len), *mx = pl ? PyObject_GetAttr(s->seq, a_max_new) : NULL;
    const int ints = mx && PyLong_CheckExact(pl) && PyLong_CheckExact(mx);
    s->prompt_len = ints ? PyLong_AsSsize_t(pl) : -1;
    s->max_new = ints ? PyLong_AsSsize_t(mx) : -1;
    Py_XDECREF(pl);
    Py_XDECREF(mx);
    if (PyErr_Occurred()) return -1;
    if (!ints) return 0;
    PyObject *st = PyList_GET_ITEM(sent, b);
    if (!(s->sent_tokens = list_attr(st, a_tokens, -1))) return PyErr_Occurred() ? -1 : 0;
    const Py_ssize_t n = PyList_GET_SIZE(s->sent_tokens);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(s->path); i++)
        if (node_of(PyList_GET_ITEM(s->path, i), n) < 0) return 0; /* tokens[n]: a node of the sent tree */
    s->kept = NULL;
    if (keep != Py_None) {
        PyObject *k = PyList_GET_ITEM(keep, b), *tt = list_attr(s->tree, a_tokens, -1);
        if (!tt) return PyErr_Occurred() ? -1 : 0;
        const Py_ssize_t tn = PyList_GET_SIZE(tt);
        Py_DECREF(tt);
        if (!PyList_CheckExact(k)) return 0;
        if (PyList_GET_SIZE(k) != tn) { /* renamed: every path node and row key a place in keep */
            const Py_ssize_t m = PyList_GET_SIZE(k);
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(s->path); i++)
                if (node_of(PyList_GET_ITEM(s->path, i), m) < 0) return 0;
            Py_ssize_t pos = 0;
            PyObject *key, *value;
            while (PyDict_Next(s->rows, &pos, &key, &value))
                if (node_of(key, m) < 0) return 0;
            s->kept = k;
        }
    }
    return 1;
}

/* Sequence.append(gained, eos): the tokens appended (a new list); NULL on an error */
static PyObject *append_seq(settle_t *s, PyObject *gained, PyObject *eos) {
    const Py_ssize_t room = s->max_new - (PyList_GET_SIZE(s->tokens) - s->prompt_len);
    const Py_ssize_t take = room < 0 ? 0 : room < PyList_GET_SIZE(gained) ? room : PyList_GET_SIZE(gained);
    PyObject *added = PyList_New(0), *finish = NULL;
    if (!added) return NULL;
    for (Py_ssize_t i = 0; i < take; i++) {
        PyObject *t = PyList_GET_ITEM(gained, i);
        if (PyList_Append(s->tokens, t) < 0 || PyList_Append(added, t) < 0) goto error;
        const int end = PySet_Contains(eos, t);
        if (end < 0) goto error;
        if (end) {
            finish = s_eos;
            break;
        }
    }
    if (!finish && room - PyList_GET_SIZE(added) <= 0) {
        PyObject *now = PyObject_GetAttr(s->seq, a_finish);
        if (!now) goto error;
        if (now == Py_None) finish = s_length;
        Py_DECREF(now);
    }
    if (finish && PyObject_SetAttr(s->seq, a_finish, finish) < 0) goto error;
    return added;
error:
    Py_DECREF(added);
    return NULL;
}

PyObject *glue_outcomes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "outcomes takes 11 arguments");
        return NULL;
    }
    PyObject *active = args[0], *keep = args[6], *eos = args[7], *seq_cls = args[8], *make_outcome = args[9],
             *update = args[10];
    if (!PyList_CheckExact(active) || !PyAnySet_Check(eos) || !class_of(make_outcome, 8)) Py_RETURN_NONE;
    const Py_ssize_t B = PyList_GET_SIZE(active);
    for (int j = 1; j < 6; j++)
        if (!PyList_CheckExact(args[j]) || PyList_GET_SIZE(args[j]) != B) Py_RETURN_NONE;
    if (keep != Py_None && (!PyList_CheckExact(keep) || PyList_GET_SIZE(keep) != B)) Py_RETURN_NONE;
    settle_t *steps = calloc((size_t)B + 1, sizeof(settle_t));
    if (!steps) return PyErr_NoMemory();
    PyObject *out = NULL;
    int rc = 1;
    for (Py_ssize_t b = 0; b < B && rc == 1; b++) rc = settle_read(args, b, seq_cls, &steps[b]);
    if (rc == 0) {
        Py_INCREF(Py_None);
        out = Py_None;
    }
    if (rc != 1) goto done;
    out = PyList_New(B);
    for (Py_ssize_t b = 0; out && b < B; b++) {
        settle_t *s = &steps[b];
        const Py_ssize_t P = PyList_GET_SIZE(s->path);
        PyObject *gained = PyList_New(P), *new = NULL, *path = s->path, *rows = s->rows, *o = NULL;
        if (!gained) goto fail;
        for (Py_ssize_t i = 1; i < P; i++) {
            PyObject *t = PyList_GET_ITEM(s->sent_tokens, node_of(PyList_GET_ITEM(s->path, i), PY_SSIZE_T_MAX));
            Py_INCREF(t);
            PyList_SET_ITEM(gained, i - 1, t);
        }
        Py_INCREF(s->bonus);
        PyList_SET_ITEM(gained, P - 1, s->bonus);
        new = append_seq(s, gained, eos);
        Py_DECREF(gained);
        if (!new) goto fail;
        Py_INCREF(path);
        Py_INCREF(rows);
        if (s->kept) { /* the sent subtree's nodes named as the proposer's */
            Py_DECREF(path);
            Py_DECREF(rows);
            path = PyList_New(P);
            rows = PyDict_New();
            if (!path || !rows) goto fail_new;
            for (Py_ssize_t i = 0; i < P; i++) {
                PyObject *k = PyList_GET_ITEM(s->kept, node_of(PyList_GET_ITEM(s->path, i), PY_SSIZE_T_MAX));
                Py_INCREF(k);
                PyList_SET_ITEM(path, i, k);
            }
            Py_ssize_t pos = 0;
            PyObject *key, *value;
            while (PyDict_Next(s->rows, &pos, &key, &value))
                if (PyDict_SetItem(rows, PyList_GET_ITEM(s->kept, node_of(key, PY_SSIZE_T_MAX)), value) < 0)
                    goto fail_new;
        }
        {
            PyObject *n_sent = PyLong_FromSsize_t(PyList_GET_SIZE(s->sent_tokens));
            if (!n_sent) goto fail_new;
            PyObject *o_args[8] = {s->tree, path, new, s->lg, rows, n_sent, s->top1, s->topk};
            PyObject *late[2] = {a_top1, a_topk};
            o = make(make_outcome, o_args, 6, 8, late);
            Py_DECREF(n_sent);
        }
        Py_DECREF(new);
        Py_DECREF(path);
        Py_DECREF(rows);
        if (!o) goto fail;
        PyList_SET_ITEM(out, b, o);
        if (update != Py_None) {
            PyObject *u_args[2] = {s->state, o};
            PyObject *r = PyObject_Vectorcall(update, u_args, 2, NULL);
            if (!r) goto fail;
            Py_DECREF(r);
        }
        continue;
    fail_new:
        Py_DECREF(new);
        Py_XDECREF(path);
        Py_XDECREF(rows);
    fail:
        Py_CLEAR(out);
    }
done:
    for (Py_ssize_t b = 0; b < B; b++) settle_release(&steps[b]);
    free(steps);
    return out;
}

/* paths(sent, rows, reduced) -> verdicts or None: decode_step's greedy loop in one call, per
 * sequence ``decoding.verify.greedy_path(sent[b], rows[b], reduced[b][1])``: from the root, the
 * child whose token is the argmax of its parent's row, while there is one; then (path, the
 * argmax after its last node). The same objects the reference returns (the bonus is top1's item).
 * None, having made nothing, where a tree's children are not a list of dicts, a node has no row,
 * a row is outside top1 or a value is not what the reference's walk reads: the reference then
 * runs and raises what it raises. */
PyObject *glue_paths(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2])) Py_RETURN_NONE;
    PyObject *sent = args[0], *rows = args[1], *reduced = args[2];
    const Py_ssize_t B = PyList_GET_SIZE(sent);
    if (PyList_GET_SIZE(rows) != B || PyList_GET_SIZE(reduced) != B) Py_RETURN_NONE;
    PyObject *out = PyList_New(B);
    if (!out) return NULL;
    for (Py_ssize_t b = 0; b < B; b++) {
        PyObject *red = PyList_GET_ITEM(reduced, b), *r = PyList_GET_ITEM(rows, b);
        if (!PyTuple_Check(red) || PyTuple_GET_SIZE(red) < 2 || !PyList_Check(PyTuple_GET_ITEM(red, 1)) ||
            !PyDict_CheckExact(r))
            goto not_taken;
        PyObject *top1 = PyTuple_GET_ITEM(red, 1);
        PyObject *children = PyObject_GetAttr(PyList_GET_ITEM(sent, b), a_children);
        if (!children) {
            PyErr_Clear();
            goto not_taken;
        }
        PyObject *path = PyList_New(0), *node = PyLong_FromLong(0), *bonus = NULL;
        if (!path || !node || PyList_Append(path, node) < 0) goto fail_walk;
        for (;;) {
            if (!PyList_Check(children)) goto walk_not_taken;
            PyObject *row = PyDict_GetItemWithError(r, node); /* borrowed */
            if (!row || !PyLong_CheckExact(row)) goto walk_not_taken;
            const Py_ssize_t ri = PyLong_AsSsize_t(row), ni = PyLong_AsSsize_t(node);
            if (ri < 0 || ri >= PyList_GET_SIZE(top1) || ni < 0 || ni >= PyList_GET_SIZE(children))
                goto walk_not_taken;
            PyObject *tok = PyList_GET_ITEM(top1, ri), *kids = PyList_GET_ITEM(children, ni);
            if (!PyDict_CheckExact(kids) || !PyLong_CheckExact(tok)) goto walk_not_taken;
            PyObject *child = PyDict_GetItemWithError(kids, tok); /* borrowed */
            if (!child) {
                if (PyErr_Occurred()) goto walk_not_taken;
                bonus = tok;
                break;
            }
            if (!PyLong_CheckExact(child) || PyList_Append(path, child) < 0) goto walk_not_taken;
            Py_INCREF(child);
            Py_SETREF(node, child);
        }
        PyObject *v = PyTuple_Pack(2, path, bonus);
        Py_DECREF(path);
        Py_DECREF(node);
        Py_DECREF(children);
        if (!v) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, b, v);
        continue;
    walk_not_taken:
        PyErr_Clear();
        Py_XDECREF(path);
        Py_XDECREF(node);
        Py_DECREF(children);
        goto not_taken;
    fail_walk:
        Py_XDECREF(path);
        Py_XDECREF(node);
        Py_DECREF(children);
        Py_DECREF(out);
        return NULL;
    }
    return out;
not_taken:
    Py_DECREF(out);
    Py_RETURN_NONE;
}
