/* The decoding host path's glue as a CPython extension: Python objects read where they are and
 * the compiled libraries' functions called through the addresses their ctypes handles give (one
 * copy of each computation). The Python glue beside each function builds arrays from lists and
 * makes a ctypes call of many arguments; tests hold the two equal.
 *
 * - The step planner (decoding/compiled.py, ``PlannerCore``): a step's trees read from their
 *   fields (a tree built in C: its arrays, through the buffer protocol; any other: its lists),
 *   flattened, planner.c called; the outcomes' paths and rows read from their lists and dicts
 *   (tests/test_compiled.py).
 * - The recycled table's refresh from a step (decoding/recycle.py, ``learn_from``): every row's
 *   token and top-k gathered in the reference's order into tables.c's ``table_refresh``
 *   (tests/test_compiled_draft.py).
 * - The lookahead window's update (decoding/lookahead.py, ``Lookahead.update``): the new tokens'
 *   n-grams and the closed columns into the compiled pool, the window slid one level
 *   (tests/test_compiled_draft.py).
 * - A lookahead-family proposer's step tree for one sequence (decoding/lookahead.py,
 *   ``Lookahead.propose_compiled``): the window's levels read from their lists, draft.c called.
 * - A step's new tokens appended to a C history or suffix trie from the sequence's list
 *   (decoding/compiled_draft.py, ``CHistory.extend_from``, ``CSuffixTrie.extend_from``).
 *
 * A function answers None where it does not take the call (a field that is not what it should
 * be, a node outside its tree): the Python glue then does, and says what is wrong. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int (*select_fn)(const void *c, const void *s, const void *accs, int B, const int32_t *offsets,
                         const int32_t *parents, const int32_t *depths, const int32_t *sources, const int32_t *group,
                         const uint8_t *candidate, const uint8_t *pinned, const double *chance, double calibration,
                         double window_rate, int32_t *kept, int32_t *n_kept, double *expected);
typedef int (*observe_fn)(const void *c, void *accs, int B, const int32_t *offsets, const int32_t *parents,
                          const int32_t *depths, const int32_t *sources, const int32_t *group,
                          const uint8_t *candidate, const int32_t *row_offsets, const int32_t *rows,
                          const uint8_t *on_path, int *credit, int *columns);
typedef int (*max_depth_fn)(const void *c, const void *s, const void *accs, int B, int sources, double calibration,
                            int32_t *out);

static PyObject *s_flat, *s_parents, *s_depths, *s_sources, *s_group, *s_candidate, *s_path, *s_rows;

static void *addr(PyObject *o) { return PyLong_AsVoidPtr(o); }

/* The flattened step (bytes): int32 B, N, offsets[B + 1], parents, depths, sources, group [N each], then
 * uint8 candidate [N]. */
typedef struct {
    int B, N;
    int32_t *offsets, *parents, *depths, *sources, *group;
    uint8_t *candidate;
} Flat;

static size_t flat_size(int B, int N) { return sizeof(int32_t) * (size_t)(2 + B + 1 + 4 * N) + (size_t)N; }

static void flat_view(char *p, Flat *f) {
    int32_t *q = (int32_t *)p;
    f->B = q[0];
    f->N = q[1];
    f->offsets = q + 2;
    f->parents = f->offsets + f->B + 1;
    f->depths = f->parents + f->N;
    f->sources = f->depths + f->N;
    f->group = f->sources + f->N;
    f->candidate = (uint8_t *)(f->group + f->N);
}

/* an int32 from a Python int; 0 (no error set) where it is not one */
static int as_i32(PyObject *v, int32_t *out) {
    if (!PyLong_Check(v)) return 0;
    int overflow = 0;
    const long x = PyLong_AsLongAndOverflow(v, &overflow);
    if (overflow || x < INT32_MIN || x > INT32_MAX || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = (int32_t)x;
    return 1;
}

/* n int32 values of a field into dst: from an array's buffer (itemsize 4, or 1 for candidate) or a
 * list's ints (candidate: truth values). 0 (no error set) where it is neither. */
static int read_field(PyObject *o, Py_ssize_t n, int32_t *d32, uint8_t *d8) {
    if (PyList_CheckExact(o)) {
        if (PyList_GET_SIZE(o) != n) return 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *v = PyList_GET_ITEM(o, i);
            if (d8) {
                const int t = PyObject_IsTrue(v);
                if (t < 0) {
                    PyErr_Clear();
                    return 0;
                }
                d8[i] = (uint8_t)t;
            } else if (!as_i32(v, d32 + i)) {
                return 0;
            }
        }
        return 1;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(o, &view, PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        return 0;
    }
    int ok = 0;
    const char *fmt = view.format ? view.format : "B";
    if (d8 && view.itemsize == 1 && (fmt[0] == 'b' || fmt[0] == 'B') && view.len == n) {
        const int8_t *src = view.buf;
        for (Py_ssize_t i = 0; i < n; i++) d8[i] = src[i] != 0;
        ok = 1;
    } else if (d32 && view.itemsize == 4 && (fmt[0] == 'i' || fmt[0] == 'l') && view.len == 4 * n) {
        memcpy(d32, view.buf, 4 * (size_t)n);
        ok = 1;
    }
    PyBuffer_Release(&view);
    return ok;
}

/* select(fn, cfg, cost, accs, trees, calibration, window_rate) -> (kept, expected, flat) or None */
static PyObject *select_trees(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "select takes 7 arguments");
        return NULL;
    }
    select_fn fn = (select_fn)addr(args[0]);
    void *cfg = addr(args[1]), *cost = addr(args[2]), *accs = addr(args[3]);
    PyObject *trees = args[4];
    const double calibration = PyFloat_AsDouble(args[5]), window_rate = PyFloat_AsDouble(args[6]);
    if (PyErr_Occurred()) return NULL;
    if (!PyList_CheckExact(trees) || PyList_GET_SIZE(trees) < 1 || PyList_GET_SIZE(trees) > 1 << 20) Py_RETURN_NONE;
    const int B = (int)PyList_GET_SIZE(trees);
    /* sizes first (each tree's parents list) */
    Py_ssize_t N = 0;
    for (int b = 0; b < B; b++) {
        PyObject *p = PyObject_GetAttr(PyList_GET_ITEM(trees, b), s_parents);
        if (!p) return NULL;
        const Py_ssize_t n = PyList_CheckExact(p) ? PyList_GET_SIZE(p) : -1;
        Py_DECREF(p);
        if (n < 1 || N + n > INT32_MAX / 8) Py_RETURN_NONE;
        N += n;
    }
    PyObject *blob = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)flat_size(B, (int)N));
    if (!blob) return NULL;
    char *raw = PyBytes_AS_STRING(blob);
    ((int32_t *)raw)[0] = B;
    ((int32_t *)raw)[1] = (int32_t)N;
    Flat f;
    flat_view(raw, &f);
    PyObject *names[5] = {s_parents, s_depths, s_sources, s_group, s_candidate};
    int o = 0;
    for (int b = 0; b < B; b++) {
        PyObject *t = PyList_GET_ITEM(trees, b);
        PyObject *p = PyObject_GetAttr(t, s_parents);
        if (!p) goto error;
        const Py_ssize_t n = PyList_CheckExact(p) ? PyList_GET_SIZE(p) : -1;
        Py_DECREF(p);
        if (n < 1 || o + n > N) goto none;
        f.offsets[b] = o;
        /* a tree built in C keeps its arrays (parents, depths, sources, group, candidate): read them where
         * they are the tree's (compiled.PlannerCore.flatten's rule) */
        PyObject *flat = PyObject_GetAttrString(t, "flat");
        if (!flat) {
            PyErr_Clear();
        } else if (flat != Py_None && PyTuple_Check(flat) && PyTuple_GET_SIZE(flat) == 5 &&
                   PyObject_Length(PyTuple_GET_ITEM(flat, 0)) == n) {
            int ok = 1;
            ok &= read_field(PyTuple_GET_ITEM(flat, 0), n, f.parents + o, NULL);
            ok &= read_field(PyTuple_GET_ITEM(flat, 1), n, f.depths + o, NULL);
            ok &= read_field(PyTuple_GET_ITEM(flat, 2), n, f.sources + o, NULL);
            ok &= read_field(PyTuple_GET_ITEM(flat, 3), n, f.group + o, NULL);
            ok &= read_field(PyTuple_GET_ITEM(flat, 4), n, NULL, f.candidate + o);
            Py_DECREF(flat);
            if (!ok) goto none;
            o += (int)n;
            continue;
        } else {
            PyErr_Clear();
            Py_DECREF(flat);
        }
        int32_t *dst[4] = {f.parents + o, f.depths + o, f.sources + o, f.group + o};
        for (int j = 0; j < 5; j++) {
            PyObject *v = PyObject_GetAttr(t, names[j]);
            if (!v) goto error;
            const int ok = read_field(v, n, j < 4 ? dst[j] : NULL, j == 4 ? f.candidate + o : NULL);
            Py_DECREF(v);
            if (!ok) goto none;
        }
        o += (int)n;
    }
    f.offsets[B] = o;
    {
        int32_t *kept = malloc(sizeof(int32_t) * ((size_t)N + (size_t)B));
        double *expected = malloc(sizeof(double) * (size_t)B);
        if (!kept || !expected) {
            free(kept);
            free(expected);
            PyErr_NoMemory();
            goto error;
        }
        int32_t *n_kept = kept + N;
        const int rc = fn(cfg, cost, accs, B, f.offsets, f.parents, f.depths, f.sources, f.group, f.candidate, NULL,
                          NULL, calibration, window_rate, kept, n_kept, expected);
        PyObject *out = NULL;
        if (rc == 0) {
            PyObject *lists = PyList_New(B), *exp = PyList_New(B);
            for (int b = 0; lists && exp && b < B; b++) {
                PyObject *l = PyList_New(n_kept[b]);
                PyObject *e = PyFloat_FromDouble(expected[b]);
                if (!l || !e) {
                    Py_XDECREF(l);
                    Py_XDECREF(e);
                    Py_CLEAR(lists);
                    break;
                }
                for (int i = 0; i < n_kept[b]; i++) {
                    PyObject *v = PyLong_FromLong(kept[f.offsets[b] + i]);
                    if (!v) {
                        Py_DECREF(l);
                        l = NULL;
                        break;
                    }
                    PyList_SET_ITEM(l, i, v);
                }
                if (!l) {
                    Py_DECREF(e);
                    Py_CLEAR(lists);
                    break;
                }
                PyList_SET_ITEM(lists, b, l);
                PyList_SET_ITEM(exp, b, e);
            }
            if (lists && exp) out = PyTuple_Pack(3, lists, exp, blob);
            Py_XDECREF(lists);
            Py_XDECREF(exp);
        }
        free(kept);
        free(expected);
        Py_DECREF(blob);
        if (rc != 0 && !PyErr_Occurred()) Py_RETURN_NONE;  /* short cost tables: the Python glue grows them */
        return out;
    }
none:
    Py_DECREF(blob);
    Py_RETURN_NONE;
error:
    Py_DECREF(blob);
    return NULL;
}

/* observe(fn, cfg, accs, flat, outcomes) -> (credit, columns) or None; the outcomes are of the flattened
 * trees, in their order (the caller checked) */
/* planner_observe_batch over the flattened step and its outcomes' paths and rows: 1 and the
 * window's credit and columns, 0 where it does not take the step (no error set), -1 on an error */
static int observe_core(observe_fn fn, void *cfg, void *accs, PyObject *blob, PyObject *outcomes, int *credit_out,
                        int *columns_out) {
    if (!PyBytes_CheckExact(blob) || !PyList_CheckExact(outcomes)) return 0;
    Flat f;
    flat_view(PyBytes_AS_STRING(blob), &f);
    if ((Py_ssize_t)flat_size(f.B, f.N) != PyBytes_GET_SIZE(blob) || PyList_GET_SIZE(outcomes) != f.B) return 0;
    /* rows: every outcome's dict keys, in order */
    PyObject **rows_of = calloc((size_t)f.B, sizeof(PyObject *));
    if (!rows_of) {
        PyErr_NoMemory();
        return -1;
    }
    int result = -1;
    Py_ssize_t R = 0;
    uint8_t *on_path = NULL;
    int32_t *rows = NULL;
    for (int b = 0; b < f.B; b++) {
        rows_of[b] = PyObject_GetAttr(PyList_GET_ITEM(outcomes, b), s_rows);
        if (!rows_of[b]) goto done;
        if (!PyDict_CheckExact(rows_of[b])) goto none;
        R += PyDict_GET_SIZE(rows_of[b]);
    }
    on_path = calloc((size_t)f.N + 1, 1);
    rows = malloc(sizeof(int32_t) * ((size_t)R + (size_t)f.B + 2));
    if (!on_path || !rows) {
        PyErr_NoMemory();
        goto done;
    }
    int32_t *row_offsets = rows + R;
    Py_ssize_t r = 0;
    for (int b = 0; b < f.B; b++) {
        const int o = f.offsets[b], n = f.offsets[b + 1] - o;
        PyObject *path = PyObject_GetAttr(PyList_GET_ITEM(outcomes, b), s_path);
        if (!path) goto done;
        if (!PyList_CheckExact(path)) {
            Py_DECREF(path);
            goto none;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(path); i++) {
            const long node = PyLong_Check(PyList_GET_ITEM(path, i)) ? PyLong_AsLong(PyList_GET_ITEM(path, i)) : -1;
            if (node < 0 || node >= n) {  /* not a node of the tree: the Python glue says so */
                PyErr_Clear();
                Py_DECREF(path);
                goto none;
            }
            on_path[o + node] = 1;
        }
        Py_DECREF(path);
        row_offsets[b] = (int32_t)r;
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(rows_of[b], &pos, &key, &value)) {
            const long node = PyLong_Check(key) ? PyLong_AsLong(key) : -1;
            if (node < INT32_MIN || node > INT32_MAX || (node == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                goto none;
            }
            rows[r++] = (int32_t)node;
        }
    }
    row_offsets[f.B] = (int32_t)r;
    if (fn(cfg, accs, f.B, f.offsets, f.parents, f.depths, f.sources, f.group, f.candidate, row_offsets,
           R ? rows : NULL, on_path, credit_out, columns_out) != 0) {
        PyErr_SetString(PyExc_MemoryError, "planner_observe_batch could not allocate its buffers");
        goto done;
    }
    result = 1;
    goto done;
none:
    result = 0;
done:
    for (int b = 0; b < f.B; b++) Py_XDECREF(rows_of[b]);
    free(rows_of);
    free(on_path);
    free(rows);
    return result;
}

/* observe_all(fn, cfg, accs, flat, outcomes) -> (credit, columns) or None */
static PyObject *observe_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "observe takes 5 arguments");
        return NULL;
    }
    observe_fn fn = (observe_fn)addr(args[0]);
    void *cfg = addr(args[1]), *accs = addr(args[2]);
    if (PyErr_Occurred()) return NULL;
    int credit = 0, columns = 0;
    const int rc = observe_core(fn, cfg, accs, args[3], args[4], &credit, &columns);
    if (rc < 0) return NULL;
    if (rc == 0) Py_RETURN_NONE;
    return Py_BuildValue("(ii)", credit, columns);
}

/* planner.c's plan_cfg and plan_acc, field for field (decoding/compiled.py PlanCfg, PlanAcc) */
typedef struct {
    double prior, prior_weight, explore, decay, min_gain;
    int max_tokens, max_step_tokens, learn_overhead;
    double overhead_ms, overhead_per_token, mean_x;
} plan_cfg;

typedef struct {
    double *hits, *trials, *shared_hits, *shared_trials;
    int streak;
} plan_acc;

/* planner.c's plan_cost, field for field (decoding/compiled.py PlanCost) */
typedef struct {
    const double *curve, *slope;
    int curve_len, slope_len;
    double per_seq_ms, floor_ms;
    int64_t context, span;
    const int64_t *contexts;
} plan_cost;

static double pmax(double a, double b) { return b > a ? b : a; } /* Python's max(a, b) */
static double pmin(double a, double b) { return b < a ? b : a; } /* Python's min(a, b) */

/* the float of a Python float or int, through *ok (0 where it is neither) */
static double num(PyObject *v, int *ok) {
    if (!v || !(PyFloat_Check(v) || PyLong_Check(v))) {
        *ok = 0;
        return 0.0;
    }
    const double x = PyFloat_AsDouble(v);
    if (x == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        *ok = 0;
    }
    return x;
}

/* obj.name = value (a new reference, stolen); 0 on an error */
static int set_new(PyObject *obj, PyObject *name, PyObject *value) {
    if (!value) return 0;
    const int rc = PyObject_SetAttr(obj, name, value);
    Py_DECREF(value);
    return rc == 0;
}

/* d[key] += add (add: a new reference, stolen; NULL: an error already set); 0 on an error */
static int dict_add(PyObject *d, PyObject *key, PyObject *add) {
    PyObject *old = add ? PyDict_GetItemWithError(d, key) : NULL;
    if (!old) {
        if (add && !PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
        Py_XDECREF(add);
        return 0;
    }
    PyObject *sum = PyNumber_Add(old, add);
    Py_DECREF(add);
    if (!sum) return 0;
    const int rc = PyDict_SetItem(d, key, sum);
    Py_DECREF(sum);
    return rc == 0;
}

/* a list of the n ints of v, or NULL on an error */
static PyObject *int32_list(const int32_t *v, Py_ssize_t n) {
    PyObject *list = PyList_New(n);
    for (Py_ssize_t i = 0; list && i < n; i++) {
        PyObject *x = PyLong_FromLong(v[i]);
        if (!x) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, x);
    }
    return list;
}

/* d[key] += add, a float and a double; 0 on an error */
static int dict_add_float(PyObject *d, PyObject *key, double add) {
    PyObject *old = PyDict_GetItemWithError(d, key);
    if (!old) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
        return 0;
    }
    int ok = 1;
    const double v = num(old, &ok);
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "the planner's log holds a value that is not a number");
        return 0;
    }
    PyObject *sum = PyFloat_FromDouble(v + add);
    if (!sum) return 0;
    const int rc = PyDict_SetItem(d, key, sum);
    Py_DECREF(sum);
    return rc == 0;
}

static PyObject *s_window_credit, *s_window_columns, *s_window_rate_, *s_seq_acc, *s_streak, *s_version, *s_sent_expect,
    *s_cal, *s_calibration_, *s_ovh, *s_overhead_ms, *s_overhead_per_token, *s_log, *s_acceptance, *k_steps, *k_seq_steps,
    *k_step_tokens, *k_new_tokens, *k_predicted_ms, *k_measured_ms, *k_one_token_ms;
static PyObject *s_contexts;

/* observe_step's plan of the next step (see there): (depths, contexts), True where it cannot, NULL on
 * an error. o: the host-time fit's sums; calibration: the one just learnt, or < 0 (unchanged). */
static PyObject *next_depths(PyObject *planner, PyObject *outcomes, Py_ssize_t B, max_depth_fn fn, long sources,
                             PyObject *buf, plan_cfg *c, const plan_cost *cost, plan_acc *accs, const int *streaks,
                             const double *o, double calibration) {
    if (!fn || sources < 0) Py_RETURN_TRUE;
    PyObject *ctx = PyObject_GetAttr(planner, s_contexts), *result = NULL, *depths = NULL, *next = NULL;
    int32_t *out = NULL;
    Py_buffer view = {0};
    int viewed = 0;
    if (!ctx) return NULL;
    if (!PyList_CheckExact(ctx) || PyList_GET_SIZE(ctx) != B) {
        result = Py_True;
        Py_INCREF(result);
        goto done;
    }
    if (PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE | PyBUF_FORMAT) != 0) goto done;
    viewed = 1;
    if (view.itemsize != 8 || view.len != 8 * B || !view.format || view.format[0] != 'q') {
        PyErr_SetString(PyExc_ValueError, "next_contexts must be an int64 array of one entry a sequence");
        goto done;
    }
    int64_t *grown = view.buf;
    next = PyList_New(B);
    if (!next) goto done;
    for (Py_ssize_t b = 0; b < B; b++) {
        PyObject *tokens = PyObject_GetAttr(PyList_GET_ITEM(outcomes, b), k_new_tokens);
        if (!tokens) goto done;
        const Py_ssize_t n = PyObject_Length(tokens);
        Py_DECREF(tokens);
        const long long was = PyLong_AsLongLong(PyList_GET_ITEM(ctx, b));
        if (n < 0 || (was == -1 && PyErr_Occurred())) goto done;
        grown[b] = was + n;
        PyObject *v = PyLong_FromLongLong(grown[b]);
        if (!v) goto done;
        PyList_SET_ITEM(next, b, v);
    }
    /* what PlannerCore._prepare would set: the learnt host time and the streaks */
    c->mean_x = o[0] > 0 ? o[1] / o[0] : 0.0;
    {
        int ok = 1;
        PyObject *v = PyObject_GetAttr(planner, s_overhead_ms), *w = PyObject_GetAttr(planner, s_overhead_per_token);
        c->overhead_ms = num(v, &ok);
        c->overhead_per_token = num(w, &ok);
        Py_XDECREF(v);
        Py_XDECREF(w);
        if (calibration < 0.0) {
            PyObject *cal = PyObject_GetAttr(planner, s_calibration_);
            calibration = num(cal, &ok);
            Py_XDECREF(cal);
        }
        if (!ok) goto done;
    }
    for (Py_ssize_t b = 0; b < B; b++) accs[b].streak = streaks[b];
    plan_cost at = *cost;
    at.contexts = grown;
    out = malloc(sizeof(int32_t) * (size_t)B);
    if (!out) {
        PyErr_NoMemory();
        goto done;
    }
    if (fn(c, &at, accs, (int)B, (int)sources, calibration, out) != 0) {
        result = Py_True; /* short tables: the next max_depth grows them */
        Py_INCREF(result);
        goto done;
    }
    if (!(depths = int32_list(out, B))) goto done;
    result = PyTuple_Pack(2, depths, next);
done:
    if (viewed) PyBuffer_Release(&view);
    Py_XDECREF(ctx);
    Py_XDECREF(depths);
    Py_XDECREF(next);
    free(out);
    return result;
}

/* observe_step(fn, cfg, accs, flat, outcomes, planner, sids, step_tokens, wall_ms, new_tokens, model_ms, cost,
 *              constants, max_depth_fn, sources, next_contexts) -> True, (depths, contexts) or None (nothing
 *              changed: the planner's Python then takes the step)
 *
 * Planner.observe_all then Planner.observe_time in one call, the reference's arithmetic in its
 * order: planner_observe_batch; the window's credit, columns and rate; each sequence's streak and
 * the calibration's decayed sums; the forward's predicted and one-token time from the cost's
 * tables (PlannerCore.forward_ms); the host time's decayed least-squares fit; the log. constants:
 * (CAL_DECAY, CAL_WEIGHT, CAL_FLOOR, cfg.window_rate, cfg.window_weight, cfg.calibrate). Every
 * field is read and checked before any changes. With sources >= 0 (the proposer's, as the step's
 * max_depth had them) and the planner's contexts those of this step's B sequences, it then plans
 * the next step's depths as Planner.max_depth would if every sequence goes on, over each
 * sequence's context grown by its new tokens (written to next_contexts, an int64 buffer of B):
 * the learnt streaks and host time put where PlannerCore._prepare would put them, planner.c's
 * max_depth called; it answers (depths, contexts as a list) then, True where the tables are short
 * or the contexts are not this step's. */
static PyObject *observe_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 16) {
        PyErr_SetString(PyExc_TypeError, "observe_step takes 16 arguments");
        return NULL;
    }
    observe_fn fn = (observe_fn)addr(args[0]);
    void *cfg = addr(args[1]), *accs = addr(args[2]);
    const plan_cost *cost = addr(args[11]);
    max_depth_fn md_fn = (max_depth_fn)addr(args[13]);
    const long sources = PyLong_AsLong(args[14]);
    if (PyErr_Occurred()) return NULL;
    PyObject *planner = args[5], *sids = args[6], *steps = args[7], *outcomes = args[4], *k = args[12];
    int ok = 1;
    const double wall_ms = num(args[8], &ok), model_ms = num(args[10], &ok);
    if (!ok || !PyLong_Check(args[9]) || !PyList_CheckExact(sids) || !PyList_CheckExact(steps) ||
        !PyList_CheckExact(outcomes) || !PyTuple_CheckExact(k) || PyTuple_GET_SIZE(k) != 6)
        Py_RETURN_NONE;
    const Py_ssize_t B = PyList_GET_SIZE(sids);
    if (B < 1 || PyList_GET_SIZE(steps) != B || PyList_GET_SIZE(outcomes) != B) Py_RETURN_NONE;
    const double cal_decay = num(PyTuple_GET_ITEM(k, 0), &ok), cal_weight = num(PyTuple_GET_ITEM(k, 1), &ok),
                 cal_floor = num(PyTuple_GET_ITEM(k, 2), &ok), wrate = num(PyTuple_GET_ITEM(k, 3), &ok),
                 wweight = num(PyTuple_GET_ITEM(k, 4), &ok);
    const int calibrate = PyObject_IsTrue(PyTuple_GET_ITEM(k, 5));
    if (!ok || calibrate < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    /* the step's tokens, and the cost's tables long enough for them (else forward_ms asks the cost) */
    long long total = 0;
    int32_t longest = 0;
    for (Py_ssize_t b = 0; b < B; b++) {
        int32_t t;
        if (!as_i32(PyList_GET_ITEM(steps, b), &t) || t < 0) Py_RETURN_NONE;
        total += t;
        longest = t > longest ? t : longest;
    }
    if (total >= cost->curve_len || B >= cost->curve_len || (cost->span > 0 && longest >= cost->slope_len))
        Py_RETURN_NONE;
    /* the planner's fields this writes, each what the reference keeps there */
    PyObject *fields[8] = {NULL};
    int *streaks = NULL;
    PyObject *names[8] = {s_window_credit, s_window_columns, s_seq_acc, s_sent_expect, s_cal, s_ovh, s_log, s_version};
    PyObject *result = NULL;
    for (int i = 0; i < 8; i++)
        if (!(fields[i] = PyObject_GetAttr(planner, names[i]))) goto done;
    PyObject *credit0 = fields[0], *columns0 = fields[1], *seq_acc = fields[2], *sent = fields[3], *cal = fields[4],
             *ovh = fields[5], *log = fields[6], *version = fields[7];
    if (!(PyFloat_Check(credit0) || PyLong_Check(credit0)) || !PyLong_Check(columns0) || !PyDict_CheckExact(seq_acc) ||
        !PyDict_CheckExact(sent) || !PyList_CheckExact(cal) || PyList_GET_SIZE(cal) != 2 || !PyList_CheckExact(ovh) ||
        PyList_GET_SIZE(ovh) != 5 || !PyDict_CheckExact(log) || !PyLong_Check(version))
        goto none;
    double c[2], o[5];
    for (int i = 0; i < 2; i++) c[i] = num(PyList_GET_ITEM(cal, i), &ok);
    for (int i = 0; i < 5; i++) o[i] = num(PyList_GET_ITEM(ovh, i), &ok);
    if (!ok) goto none;
    for (Py_ssize_t b = 0; b < B; b++) {
        PyObject *sid = PyList_GET_ITEM(sids, b), *e = PyDict_GetItemWithError(sent, sid);
        if (!e && PyErr_Occurred()) goto done;
        if (e && !(PyFloat_Check(e) || PyLong_Check(e))) goto none;
    }
    int credit = 0, columns = 0;
    const int rc = observe_core(fn, cfg, accs, args[3], outcomes, &credit, &columns);
    if (rc < 0) goto done;
    if (rc == 0) goto none;
    /* from here on the step is learnt: an error below leaves it half learnt, as the reference's would */
    /* observe_all: the window's credit, columns and rate */
    const double wc = num(credit0, &ok) + (double)credit;
    PyObject *inc = PyLong_FromLong(columns), *cols = inc ? PyNumber_Add(columns0, inc) : NULL;
    Py_XDECREF(inc);
    if (!cols) goto done;
    const double wcol = PyLong_AsDouble(cols);
    if (!set_new(planner, s_window_columns, cols)) goto done;
    if (!set_new(planner, s_window_credit, PyFloat_FromDouble(wc))) goto done;
    if (!set_new(planner, s_window_rate_, PyFloat_FromDouble((wc + wrate * wweight) / (wcol + wweight)))) goto done;
    /* each sequence: its streak, and what its step promised against what came */
    double calibration = -1.0;
    streaks = malloc(sizeof(int) * (size_t)B);
    if (!streaks) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t b = 0; b < B; b++) {
        PyObject *sid = PyList_GET_ITEM(sids, b), *path = PyObject_GetAttr(PyList_GET_ITEM(outcomes, b), s_path);
        if (!path) goto done;
        const Py_ssize_t accepted = PyObject_Length(path) - 1;
        Py_DECREF(path);
        if (accepted < -1 || PyErr_Occurred()) goto done;
        PyObject *acc = PyDict_GetItemWithError(seq_acc, sid);
        if (acc) {
            Py_INCREF(acc);
        } else {
            if (PyErr_Occurred()) goto done;
            acc = PyObject_CallMethodOneArg(planner, s_acceptance, sid);
            if (!acc) goto done;
        }
        streaks[b] = accepted > 0;
        const int set = PyObject_SetAttr(acc, s_streak, accepted > 0 ? Py_True : Py_False);
        Py_DECREF(acc);
        if (set != 0) goto done;
        PyObject *e = PyDict_GetItemWithError(sent, sid);
        double expected = 0.0;
        if (e) {
            expected = num(e, &ok);
            if (PyDict_DelItem(sent, sid) != 0) goto done;
        } else if (PyErr_Occurred()) {
            goto done;
        }
        if (expected > 0) {
            c[0] = cal_decay * c[0] + expected;
            c[1] = cal_decay * c[1] + (double)accepted;
            if (calibrate) calibration = pmin(1.0, pmax(cal_floor, (c[1] + cal_weight) / (c[0] + cal_weight)));
        }
    }
    for (int i = 0; i < 2; i++) {
        PyObject *v = PyFloat_FromDouble(c[i]);
        if (!v || PyList_SetItem(cal, i, v) != 0) goto done;
    }
    if (calibration >= 0.0 && !set_new(planner, s_calibration_, PyFloat_FromDouble(calibration))) goto done;
    /* observe_time: the forward's predicted and one-token time (PlannerCore.forward_ms), the host's
     * time fitted as a + b x step tokens by decayed least squares, the log */
    const double extra = cost->per_seq_ms * (double)(B - 1 > 0 ? B - 1 : 0);
    double ms = cost->curve[total] + extra, one = cost->curve[B] + extra;
    if (cost->contexts && cost->span > 0) {
        for (Py_ssize_t b = 0; b < B; b++) {
            const long t = PyLong_AsLong(PyList_GET_ITEM(steps, b));
            ms += cost->slope[t] * (double)(cost->contexts[b] - cost->context) / (double)cost->span;
        }
        for (Py_ssize_t b = 0; b < B; b++)
            one += cost->slope[1] * (double)(cost->contexts[b] - cost->context) / (double)cost->span;
    }
    const double predicted = pmax(ms, cost->floor_ms), one_token = pmax(one, cost->floor_ms);
    const double x = (double)total, y = wall_ms - model_ms - predicted, v[5] = {1.0, x, y, x * x, x * y};
    for (int i = 0; i < 5; i++) {
        o[i] = 0.9 * o[i] + v[i];
        PyObject *f = PyFloat_FromDouble(o[i]);
        if (!f || PyList_SetItem(ovh, i, f) != 0) goto done;
    }
    const double mx = o[1] / o[0], my = o[2] / o[0], var = o[3] / o[0] - mx * mx;
    if (!set_new(planner, s_overhead_per_token, PyFloat_FromDouble(var > 1.0 ? pmax(0.0, (o[4] / o[0] - mx * my) / var)
                                                                                : 0.0)))
        goto done;
    if (!set_new(planner, s_overhead_ms, PyFloat_FromDouble(my))) goto done;
    PyObject *bumps = PyLong_FromSsize_t(B + 1), *bumped = bumps ? PyNumber_Add(version, bumps) : NULL;
    Py_XDECREF(bumps);
    if (!set_new(planner, s_version, bumped)) goto done;
    if (!dict_add(log, k_steps, PyLong_FromLong(1)) || !dict_add(log, k_seq_steps, PyLong_FromSsize_t(B)) ||
        !dict_add(log, k_step_tokens, PyLong_FromLongLong(total)) || !dict_add(log, k_new_tokens, Py_NewRef(args[9])))
        goto done;
    if (!dict_add_float(log, k_predicted_ms, predicted + model_ms) || !dict_add_float(log, k_measured_ms, wall_ms) ||
        !dict_add_float(log, k_one_token_ms, one_token))
        goto done;
    result = next_depths(planner, outcomes, B, md_fn, sources, args[15], (plan_cfg *)cfg, cost, (plan_acc *)accs,
                         streaks, o, calibration);
    goto done;
none:
    PyErr_Clear();
    result = Py_None;
    Py_INCREF(result);
done:
    for (int i = 0; i < 8; i++) Py_XDECREF(fields[i]);
    free(streaks);
    return result;
}

/* max_depth(fn, cfg, cost, accs, B, sources, calibration) -> list of B depths, or None (short tables) */
static PyObject *max_depth(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "max_depth takes 7 arguments");
        return NULL;
    }
    max_depth_fn fn = (max_depth_fn)addr(args[0]);
    void *cfg = addr(args[1]), *cost = addr(args[2]), *accs = addr(args[3]);
    const long B = PyLong_AsLong(args[4]), sources = PyLong_AsLong(args[5]);
    const double calibration = PyFloat_AsDouble(args[6]);
    if (PyErr_Occurred()) return NULL;
    if (B < 1 || B > 1 << 20) Py_RETURN_NONE;
    int32_t *out = malloc(sizeof(int32_t) * (size_t)B);
    if (!out) return PyErr_NoMemory();
    PyObject *result;
    if (fn(cfg, cost, accs, (int)B, (int)sources, calibration, out) != 0) {
        result = Py_None;
        Py_INCREF(result);
    } else {
        result = int32_list(out, B);
    }
    free(out);
    return result;
}

typedef int (*refresh_fn)(void *table, const int32_t *tokens, const int32_t *rows_flat, int n_rows, int k);

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* learn(fn, table, tokens, rows, path, top) -> table_refresh's code, or None: recycle.learn_from on a
 * compiled table. The rows' nodes in increasing order, those off the accepted path first, each
 * giving (tokens[node], top[rows[node]]) to the table in that order (later rows overwrite earlier
 * ones, as the reference's dict assignments). */
static PyObject *learn(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "learn takes 6 arguments");
        return NULL;
    }
    refresh_fn fn = (refresh_fn)addr(args[0]);
    void *table = addr(args[1]);
    if (PyErr_Occurred()) return NULL;
    PyObject *tokens = args[2], *rows = args[3], *path = args[4], *top = args[5];
    if (!PyList_CheckExact(tokens) || !PyDict_CheckExact(rows) || !PyList_CheckExact(path) || !PyList_CheckExact(top))
        Py_RETURN_NONE;
    const Py_ssize_t n_nodes = PyList_GET_SIZE(tokens), R = PyDict_GET_SIZE(rows);
    if (R == 0) return PyLong_FromLong(0);
    const Py_ssize_t k = PyList_CheckExact(PyList_GET_ITEM(top, 0)) ? PyList_GET_SIZE(PyList_GET_ITEM(top, 0)) : -1;
    if (PyList_GET_SIZE(top) < 1 || k < 0) Py_RETURN_NONE;
    int32_t *nodes = malloc(sizeof(int32_t) * (size_t)(2 * R + R * k + 1));
    uint8_t *on = calloc((size_t)n_nodes + 1, 1);
    int32_t *row_of = malloc(sizeof(int32_t) * ((size_t)n_nodes + 1));
    PyObject *result = NULL;
    if (!nodes || !on || !row_of) {
        PyErr_NoMemory();
        goto done;
    }
    int32_t *order = nodes + R, *flat = order + R;
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    while (PyDict_Next(rows, &pos, &key, &value)) {
        const long node = PyLong_Check(key) ? PyLong_AsLong(key) : -1;
        const long row = PyLong_Check(value) ? PyLong_AsLong(value) : -1;
        if (node < 0 || node >= n_nodes || row < 0 || row >= PyList_GET_SIZE(top)) goto none;
        nodes[i++] = (int32_t)node;
        row_of[node] = (int32_t)row;
    }
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(path); j++) {
        PyObject *v = PyList_GET_ITEM(path, j);
        const long node = PyLong_Check(v) ? PyLong_AsLong(v) : -1;
        if (node < 0 || node >= n_nodes) goto none;
        on[node] = 1;
    }
    int sorted = 1;
    for (Py_ssize_t j = 1; j < R && sorted; j++) sorted = nodes[j - 1] < nodes[j];
    if (!sorted) qsort(nodes, (size_t)R, sizeof(int32_t), cmp_i32);
    Py_ssize_t m = 0;
    for (int pass = 0; pass < 2; pass++)
        for (Py_ssize_t j = 0; j < R; j++)
            if (on[nodes[j]] == pass) order[m++] = nodes[j];
    for (Py_ssize_t j = 0; j < R; j++) {
        const int32_t node = order[j];
        long long x;
        PyObject *tok = PyList_GET_ITEM(tokens, node), *row = PyList_GET_ITEM(top, row_of[node]);
        if (!PyLong_Check(tok) || !PyList_CheckExact(row) || PyList_GET_SIZE(row) != k) goto none;
        x = PyLong_AsLongLong(tok);
        if (x < INT32_MIN || x > INT32_MAX || (x == -1 && PyErr_Occurred())) goto none;
        nodes[j] = (int32_t)x;  /* the order's tokens, over the nodes (read before) */
        for (Py_ssize_t c = 0; c < k; c++) {
            PyObject *v = PyList_GET_ITEM(row, c);
            const long long y = PyLong_Check(v) ? PyLong_AsLongLong(v) : INT64_MIN;
            if (y < INT32_MIN || y > INT32_MAX || (y == -1 && PyErr_Occurred())) goto none;
            flat[j * k + c] = (int32_t)y;
        }
    }
    result = PyLong_FromLong(fn(table, nodes, flat, (int)R, (int)k));
    goto done;
none:
    PyErr_Clear();
    result = Py_None;
    Py_INCREF(result);
done:
    free(nodes);
    free(on);
    free(row_of);
    return result;
}

typedef int (*add_all_fn)(void *pool, const int32_t *tokens, int len, int start);
typedef int (*add_many_fn)(void *pool, const int32_t *ngrams, int count, int32_t origin);

/* window_update(add_all, add_many, pool, n, tokens, n_new, levels, real, tips, rows, top1, root, origin,
 *               from_output) -> (code, levels, real) or None: Lookahead.update on a compiled pool, the
 * window sliding one level (decoding/lookahead.py: the pool learns the n-grams holding the step's
 * n_new tokens, then the window's closed columns (``harvest``) with `origin`, and the window
 * slides (``slide``, skip 0)). Everything is read and checked before the pool changes: None
 * leaves it as it was, for the Python glue. code: the first negative code of tables.c, else 0. */
static PyObject *window_update(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError, "window_update takes 14 arguments");
        return NULL;
    }
    add_all_fn add_all = (add_all_fn)addr(args[0]);
    add_many_fn add_many = (add_many_fn)addr(args[1]);
    void *pool = addr(args[2]);
    if (PyErr_Occurred()) return NULL;
    PyObject *tokens = args[4], *levels = args[6], *real = args[7], *tips = args[8], *rows = args[9], *top1 = args[10];
    int32_t n, n_new, root, origin;
    const int from_output = PyObject_IsTrue(args[13]);
    if (from_output < 0) return NULL;
    if (!as_i32(args[3], &n) || !as_i32(args[5], &n_new) || !as_i32(args[11], &root) || !as_i32(args[12], &origin) ||
        !PyList_CheckExact(tokens) || !PyList_CheckExact(levels) || !PyList_CheckExact(real) || n < 2)
        Py_RETURN_NONE;
    const Py_ssize_t L = PyList_GET_SIZE(levels), T = PyList_GET_SIZE(tokens);
    if (L < 1 || PyList_GET_SIZE(real) != L || L + 1 != n || n_new < 0 || n_new > T) Py_RETURN_NONE;
    PyObject *first = PyList_GET_ITEM(levels, 0);
    if (!PyList_CheckExact(first)) Py_RETURN_NONE;
    const Py_ssize_t W = PyList_GET_SIZE(first);
    const int has_tips = tips != Py_None;
    if (W < 1 || (has_tips && (!PyList_CheckExact(tips) || PyList_GET_SIZE(tips) != W || !PyDict_CheckExact(rows) ||
                               !PyList_CheckExact(top1))))
        Py_RETURN_NONE;
    /* the new tokens' n-grams: the tail of tokens from n - 1 before the first new one */
    const Py_ssize_t start = T - n_new, low = start - (n - 1) > 0 ? start - (n - 1) : 0;
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)((T - low) + 2 * L * W + 2 * W + W * n + 1));
    if (!buf) return PyErr_NoMemory();
    int32_t *tail = buf, *lv = tail + (T - low), *made = lv + L * W, *newtok = made + L * W, *sent = newtok + W,
            *grams = sent + W;
    PyObject *result = NULL, *new_levels = NULL, *new_real = NULL, *newest = NULL, *newest_real = NULL;
    if (from_output)
        for (Py_ssize_t i = low; i < T; i++)
            if (!as_i32(PyList_GET_ITEM(tokens, i), tail + (i - low))) goto none;
    for (Py_ssize_t j = 0; j < L; j++) {
        PyObject *a = PyList_GET_ITEM(levels, j), *b = PyList_GET_ITEM(real, j);
        if (!PyList_CheckExact(a) || !PyList_CheckExact(b) || PyList_GET_SIZE(a) != W || PyList_GET_SIZE(b) != W)
            goto none;
        for (Py_ssize_t c = 0; c < W; c++) {
            const int t = PyObject_IsTrue(PyList_GET_ITEM(b, c));
            if (t < 0 || !as_i32(PyList_GET_ITEM(a, c), lv + j * W + c)) goto none;
            made[j * W + c] = t;
        }
    }
    int count = 0;
    if (has_tips) {
        const Py_ssize_t R = PyList_GET_SIZE(top1);
        for (Py_ssize_t c = 0; c < W; c++) { /* the tips' predictions: the argmax of each one sent */
            PyObject *row = PyDict_GetItemWithError(rows, PyList_GET_ITEM(tips, c));
            sent[c] = row != NULL;
            if (!row) {
                if (PyErr_Occurred()) goto none;
                continue;
            }
            int32_t r;
            if (!as_i32(row, &r) || r < 0 || r >= R || !as_i32(PyList_GET_ITEM(top1, r), newtok + c)) goto none;
        }
        for (Py_ssize_t c = 0; c < W; c++) { /* harvest: the closed columns whose levels are all real */
            if (!sent[c]) continue;
            int all = 1;
            for (Py_ssize_t j = c == 0 ? 1 : 0; j < L; j++) all &= made[j * W + c] != 0;
            if (!all) continue;
            int32_t *g = grams + (size_t)count++ * n;
            g[0] = c == 0 ? root : lv[c];
            for (Py_ssize_t j = 1; j < L; j++) g[j] = lv[j * W + c];
            g[L] = newtok[c];
        }
        /* the slid window's lists, made before the pool changes (only memory can fail here) */
        if (!(new_levels = PyList_New(L)) || !(new_real = PyList_New(L)) || !(newest = PyList_New(W)) ||
            !(newest_real = PyList_New(W)))
            goto fail;
        for (Py_ssize_t c = 0; c < W; c++) {
            PyObject *tok = sent[c] ? PyLong_FromLong(newtok[c]) : Py_NewRef(PyList_GET_ITEM(PyList_GET_ITEM(levels, L - 1), c));
            if (!tok) goto fail;
            PyList_SET_ITEM(newest, c, tok);
            PyList_SET_ITEM(newest_real, c, Py_NewRef(sent[c] ? Py_True : Py_False));
        }
        for (Py_ssize_t j = 0; j + 1 < L; j++) {
            PyList_SET_ITEM(new_levels, j, Py_NewRef(PyList_GET_ITEM(levels, j + 1)));
            PyList_SET_ITEM(new_real, j, Py_NewRef(PyList_GET_ITEM(real, j + 1)));
        }
        PyList_SET_ITEM(new_levels, L - 1, newest);
        PyList_SET_ITEM(new_real, L - 1, newest_real);
        newest = newest_real = NULL;
    }
    int rc = from_output ? add_all(pool, tail, (int)(T - low), (int)(start - low)) : 0;
    if (rc >= 0 && count) rc = add_many(pool, grams, count, origin);
    if (has_tips)
        result = Py_BuildValue("(iNN)", rc < 0 ? rc : 0, new_levels, new_real);
    else
        result = Py_BuildValue("(iOO)", rc < 0 ? rc : 0, levels, real);
    new_levels = new_real = NULL;
    goto done;
none:
    PyErr_Clear();
    result = Py_NewRef(Py_None);
    goto done;
fail:
    result = NULL;
done:
    Py_XDECREF(new_levels);
    Py_XDECREF(new_real);
    Py_XDECREF(newest);
    Py_XDECREF(newest_real);
    free(buf);
    return result;
}

typedef int (*append_fn)(void *to, const int32_t *tokens, int n);

/* append_tail(fn, to, tokens, start) -> fn's code, or None: fn(to, tokens[start:] as int32, n), the
 * list's ints read in place (a history's hist_append, a suffix trie's suffix_extend: a step's few new
 * tokens, where building an array and a ctypes call cost more than the append). None where tokens is
 * not a list, start is outside it or an item is not an int32: the Python glue then does it and says
 * what is wrong. */
static PyObject *append_tail(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "append_tail takes 4 arguments");
        return NULL;
    }
    append_fn fn = (append_fn)addr(args[0]);
    void *to = addr(args[1]);
    if (PyErr_Occurred()) return NULL;
    PyObject *tokens = args[2];
    int32_t start;
    if (!PyList_CheckExact(tokens) || PyBool_Check(args[3]) || !as_i32(args[3], &start)) Py_RETURN_NONE;
    const Py_ssize_t T = PyList_GET_SIZE(tokens);
    if (start < 0 || start > T || T - start > INT32_MAX) Py_RETURN_NONE;
    const Py_ssize_t n = T - start;
    int32_t small[64], *buf = n <= 64 ? small : malloc(sizeof(int32_t) * (size_t)n);
    if (!buf) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++)
        if (!as_i32(PyList_GET_ITEM(tokens, start + i), buf + i)) {
            if (buf != small) free(buf);
            Py_RETURN_NONE;
        }
    const int rc = fn(to, buf, (int)n);
    if (buf != small) free(buf);
    return PyLong_FromLong(rc);
}

typedef int (*draft_fn)(void *tree, const void *sources, int32_t root, int max_depth, int cap, int max_nodes,
                        const int32_t *levels, int n_levels, int W, int32_t *tips, int *stage);

/* draft(fn, tree, sources, root, max_depth, cap, max_nodes, levels) -> (code, stage, tips) or None: one
 * sequence's step tree of a lookahead-family proposer (decoding/cpu/draft.c, draft_lookahead), the
 * window's levels read from their lists (None: no window; tips None then). None where levels is
 * not a list of equal lists of int32 (the Python glue then does it and says what is wrong). */
static PyObject *draft(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "draft takes 8 arguments");
        return NULL;
    }
    draft_fn fn = (draft_fn)addr(args[0]);
    void *tree = addr(args[1]), *sources = addr(args[2]);
    if (PyErr_Occurred()) return NULL;
    int32_t root, max_depth, cap, max_nodes;
    if (!as_i32(args[3], &root) || !as_i32(args[4], &max_depth) || !as_i32(args[5], &cap) ||
        !as_i32(args[6], &max_nodes))
        Py_RETURN_NONE;
    PyObject *levels = args[7];
    Py_ssize_t L = 0, W = 0;
    int32_t small[256], *lv = NULL, *tips = NULL;
    if (levels != Py_None) {
        if (!PyList_CheckExact(levels) || (L = PyList_GET_SIZE(levels)) < 1) Py_RETURN_NONE;
        PyObject *first = PyList_GET_ITEM(levels, 0);
        if (!PyList_CheckExact(first) || (W = PyList_GET_SIZE(first)) < 1 || L * W > 1 << 20) Py_RETURN_NONE;
        lv = (L + 1) * W <= 256 ? small : malloc(sizeof(int32_t) * (size_t)((L + 1) * W));
        if (!lv) return PyErr_NoMemory();
        tips = lv + L * W;
        for (Py_ssize_t j = 0; j < L; j++) {
            PyObject *a = PyList_GET_ITEM(levels, j);
            if (!PyList_CheckExact(a) || PyList_GET_SIZE(a) != W) goto none;
            for (Py_ssize_t c = 0; c < W; c++)
                if (!as_i32(PyList_GET_ITEM(a, c), lv + j * W + c)) goto none;
        }
    }
    int stage = 0;
    const int rc = fn(tree, sources, root, max_depth, cap, max_nodes, lv, (int)L, (int)W, tips, &stage);
    PyObject *out = NULL;
    if (rc >= 0 && tips) {
        PyObject *t = PyList_New(W);
        if (t) {
            for (Py_ssize_t c = 0; c < W; c++) {
                PyObject *v = PyLong_FromLong(tips[c]);
                if (!v) {
                    Py_CLEAR(t);
                    break;
                }
                PyList_SET_ITEM(t, c, v);
            }
        }
        if (t) out = Py_BuildValue("(iiN)", rc, stage, t);
    } else {
        out = Py_BuildValue("(iiO)", rc, stage, Py_None);
    }
    if (lv != small) free(lv);
    return out;
none:
    if (lv != small) free(lv);
    Py_RETURN_NONE;
}

/* the generate loop's glue (glue_step.c) */
int glue_step_init(void);
PyObject *glue_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *glue_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *glue_outcomes(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *glue_paths(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

static PyMethodDef methods[] = {
    {"send", (PyCFunction)(void (*)(void))glue_send, METH_FASTCALL,
     "send(trees, keep, sids, make_tree, make_input): generate.send's (sent, rows, inputs), or None"},
    {"record", (PyCFunction)(void (*)(void))glue_record, METH_FASTCALL,
     "record(active, outcomes, stats_cls, source_names): generate.record's (gained, sent, sids), or None"},
    {"outcomes", (PyCFunction)(void (*)(void))glue_outcomes, METH_FASTCALL,
     "outcomes(active, trees, sent, rows, verdicts, reduced, keep, eos, seq_cls, make_outcome, update): "
     "generate.settle's outcomes, or None"},
    {"paths", (PyCFunction)(void (*)(void))glue_paths, METH_FASTCALL,
     "paths(sent, rows, reduced): decode_step's greedy verdicts (greedy_path per sequence), or None"},
    {"learn", (PyCFunction)(void (*)(void))learn, METH_FASTCALL,
     "learn(fn, table, tokens, rows, path, top): recycle.learn_from into a compiled table; its code or None"},
    {"select", (PyCFunction)(void (*)(void))select_trees, METH_FASTCALL,
     "select(fn, cfg, cost, accs, trees, calibration, window_rate): (kept, expected, flat) or None"},
    {"observe_all", (PyCFunction)(void (*)(void))observe_all, METH_FASTCALL,
     "observe_all(fn, cfg, accs, flat, outcomes): (credit, columns) or None"},
    {"window_update", (PyCFunction)(void (*)(void))window_update, METH_FASTCALL,
     "window_update(add_all, add_many, pool, n, tokens, n_new, levels, real, tips, rows, top1, root, origin, "
     "from_output): (code, levels, real) or None"},
    {"append_tail", (PyCFunction)(void (*)(void))append_tail, METH_FASTCALL,
     "append_tail(fn, to, tokens, start): fn(to, tokens[start:] as int32, n)'s code, or None"},
    {"draft", (PyCFunction)(void (*)(void))draft, METH_FASTCALL,
     "draft(fn, tree, sources, root, max_depth, cap, max_nodes, levels): (code, stage, tips) or None"},
    {"observe_step", (PyCFunction)(void (*)(void))observe_step, METH_FASTCALL,
     "observe_step(fn, cfg, accs, flat, outcomes, planner, sids, step_tokens, wall_ms, new_tokens, model_ms, cost, "
     "constants, max_depth_fn, sources, next_contexts): True, (depths, contexts) or None"},
    {"max_depth", (PyCFunction)(void (*)(void))max_depth, METH_FASTCALL,
     "max_depth(fn, cfg, cost, accs, B, sources, calibration): depths or None"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_decoding_glue", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__decoding_glue(void) {
    const char *names[] = {"flat", "parents", "depths", "sources", "group", "candidate", "path", "rows",
                           "window_credit", "window_columns", "_window_rate", "seq_acc", "streak", "version",
                           "_sent_expect", "_cal", "_calibration", "_ovh", "overhead_ms", "overhead_per_token", "log",
                           "acceptance", "steps", "seq_steps", "step_tokens", "new_tokens", "predicted_ms",
                           "measured_ms", "one_token_ms", "contexts"};
    PyObject **slots[] = {&s_flat, &s_parents, &s_depths, &s_sources, &s_group, &s_candidate, &s_path, &s_rows,
                          &s_window_credit, &s_window_columns, &s_window_rate_, &s_seq_acc, &s_streak, &s_version,
                          &s_sent_expect, &s_cal, &s_calibration_, &s_ovh, &s_overhead_ms, &s_overhead_per_token,
                          &s_log, &s_acceptance, &k_steps, &k_seq_steps, &k_step_tokens, &k_new_tokens,
                          &k_predicted_ms, &k_measured_ms, &k_one_token_ms, &s_contexts};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!(*slots[i] = PyUnicode_InternFromString(names[i]))) return NULL;
    if (glue_step_init() < 0) return NULL;
    return PyModule_Create(&module);
}
