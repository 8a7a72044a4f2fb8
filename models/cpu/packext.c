/* The glue of a CPU step's packing as a CPython extension (models/packing.py, ``pack`` with a
 * ``Staging``): the step's StepInputs read straight from their Python lists, checked
 * (pack_check), the cache room reserved in the cache's own lists and the step written into the
 * staging buffers (pack_step), in one call. The Python glue beside it builds a dozen arrays and
 * two ctypes calls of 15 and 28 arguments for the same work; tests/test_kv_cache.py holds the
 * two equal (buffers, cache lists, the tensors returned).
 *
 * It takes the common case only and answers None, having changed nothing, for anything else:
 * an explicit mask, a value that is not an int32 / int64 integer, a list of the wrong length,
 * an input pack_check refuses, a pool without the blocks the step needs. The Python glue then
 * takes the step and says what is wrong. A layout the staging has not met is made by its
 * ``layout`` method (tensor views), called from here. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

int pack_check(int B, const int32_t *T, const int32_t *off, const int64_t *tokens, const int32_t *depths,
               const int32_t *parents, const uint8_t *has_depths, const uint8_t *has_parents, const int64_t *ctx,
               const int32_t *n_rows, const int32_t *rows_off, const int32_t *rows, const uint8_t *all_rows,
               int64_t vocab, int64_t max_context);
void pack_step(int B, const int32_t *T, const int32_t *off, const int64_t *tokens, const int32_t *depths,
               const int32_t *parents, const uint8_t *has_depths, const uint8_t *has_parents, const int64_t *ctx,
               const int32_t *n_rows, const int32_t *rows_off, const int32_t *rows, const uint8_t *all_rows,
               const int32_t *blocks, const int32_t *block_off, const int32_t *n_blocks, int block_size, int width,
               int n_words, int with_idx, int rows_pad, int batch_pad, int r_pad, const int64_t *at32,
               const int64_t *at64, int32_t *i32, int64_t *i64, uint8_t *causal);

static PyObject *s_seq_id, *s_tokens, *s_depths, *s_mask, *s_logits_rows, *s_parents, *s_steps, *s_i32, *s_i64,
    *s_at32, *s_at64, *s_max_seqlen_q, *s_layout;

/* The step's arrays (one allocation; sized from the inputs' lengths). */
typedef struct {
    void *mem;
    int32_t *T, *off, *depths, *parents, *n_rows, *rows_off, *rows, *blocks, *block_off, *n_blocks, *extra;
    int64_t *tokens, *ctx;
    uint8_t *has_d, *has_p, *all_rows;
    PyObject **block_lists;
} Step;

/* the items of a list or tuple (borrowed) in *items, their number in *n; 0 where o is neither (the
 * caller answers None). An empty list's items pointer may be NULL: it is never read. */
static inline int items_of(PyObject *o, PyObject ***items, Py_ssize_t *n) {
    if (PyList_CheckExact(o)) {
        *n = PyList_GET_SIZE(o);
        *items = ((PyListObject *)o)->ob_item;
        return 1;
    }
    if (PyTuple_CheckExact(o)) {
        *n = PyTuple_GET_SIZE(o);
        *items = ((PyTupleObject *)o)->ob_item;
        return 1;
    }
    return 0;
}

/* v as an integer in [lo, hi]; 0 and no error set where it is not one */
static inline int as_int(PyObject *v, long long lo, long long hi, long long *out) {
    if (!PyLong_Check(v)) return 0;  /* an int (or bool): floats, numpy scalars ... go to the Python glue */
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (x < lo || x > hi) return 0;
    *out = x;
    return 1;
}

/* ints of a list / tuple into dst (int32 or int64); 0 where one is not */
static int copy_ints(PyObject **it, Py_ssize_t n, int32_t *d32, int64_t *d64) {
    for (Py_ssize_t i = 0; i < n; i++) {
        long long x;
        if (d32) {
            if (!as_int(it[i], INT32_MIN, INT32_MAX, &x)) return 0;
            d32[i] = (int32_t)x;
        } else {
            if (!as_int(it[i], INT64_MIN, INT64_MAX, &x)) return 0;
            d64[i] = (int64_t)x;
        }
    }
    return 1;
}

/* A step gathered from its StepInputs (``Gathered``): the fields (new references), the arrays, the
 * cache room each sequence needs. */
typedef struct {
    Py_ssize_t B, n, r_n, maxT, need, width, widest, R;
    int n_words, any_tree;
    long bs;
    PyObject **f;
    Step s;
} Gathered;

static void gathered_free(Gathered *g) {
    if (g->f)
        for (Py_ssize_t j = 0; j < g->B * 6; j++) Py_XDECREF(g->f[j]);
    free(g->f);
    free(g->s.mem);
}

/* models/packing.py's _gather and pack_check over inputs (args: inputs, lengths, blocks, free_blocks,
 * block_size, vocab, max_context), then the room each sequence needs (KVCache.reserve, checked before
 * anything changes: the pool holds it). 1: gathered; 0: not taken (nothing set); -1: an error. */
static int gather(PyObject *const *args, Gathered *g) {
    PyObject *inputs = args[0], *lengths = args[1], *blocks = args[2], *free_blocks = args[3];
    const long bs = PyLong_AsLong(args[4]);
    const long long vocab = PyLong_AsLongLong(args[5]), max_context = PyLong_AsLongLong(args[6]);
    memset(g, 0, sizeof *g);
    if (PyErr_Occurred()) return -1;
    if (!PyList_CheckExact(inputs) || !PyDict_CheckExact(lengths) || !PyDict_CheckExact(blocks) ||
        !PyList_CheckExact(free_blocks) || bs < 1)
        return 0;
    const Py_ssize_t B = PyList_GET_SIZE(inputs);
    if (B < 1 || B > 1 << 20) return 0;
    g->B = B;
    g->bs = bs;
    /* the inputs' fields (new references, released by gathered_free) */
    PyObject **f = g->f = calloc((size_t)B * 6, sizeof(PyObject *));
    if (!f) {
        PyErr_NoMemory();
        return -1;
    }
    Step *sp = &g->s;
    Py_ssize_t n_total = 0, rows_total = 0, blocks_total = 0;
    PyObject *names[6] = {s_seq_id, s_tokens, s_depths, s_mask, s_logits_rows, s_parents};
    for (Py_ssize_t b = 0; b < B; b++) {
        PyObject *inp = PyList_GET_ITEM(inputs, b);
        for (int j = 0; j < 6; j++)
            if (!(f[b * 6 + j] = PyObject_GetAttr(inp, names[j]))) return -1;
        Py_ssize_t t, k;
        PyObject **it;
        if (f[b * 6 + 3] != Py_None || !items_of(f[b * 6 + 1], &it, &t)) return 0;
        n_total += t;
        if (f[b * 6 + 4] != Py_None) {
            if (!items_of(f[b * 6 + 4], &it, &k)) return 0;
            rows_total += k;
        }
        PyObject *own = PyDict_GetItemWithError(blocks, f[b * 6]);
        if (!own) return PyErr_Occurred() ? -1 : 0;  /* not in the cache: the Python glue says so */
        if (!PyList_CheckExact(own)) return 0;
        for (Py_ssize_t a = 0; a < b; a++) { /* a sequence twice in the step: the Python glue says so */
            const int same = PyObject_RichCompareBool(f[a * 6], f[b * 6], Py_EQ);
            if (same) return same < 0 ? -1 : 0;
        }
        blocks_total += PyList_GET_SIZE(own) + t / bs + 2;
    }
    const size_t nb = (size_t)B;
    const size_t bytes32 = sizeof(int32_t) * (8 * nb + 2 * (size_t)n_total + (size_t)rows_total + (size_t)blocks_total),
                 bytes64 = sizeof(int64_t) * ((size_t)n_total + nb), bytes8 = 3 * nb,
                 bytesp = sizeof(PyObject *) * nb;
    sp->mem = malloc(bytes64 + bytes32 + bytesp + bytes8 + 64);
    if (!sp->mem) {
        PyErr_NoMemory();
        return -1;
    }
    {
        char *m = sp->mem;
        sp->tokens = (int64_t *)m; m += sizeof(int64_t) * (size_t)n_total;
        sp->ctx = (int64_t *)m; m += sizeof(int64_t) * nb;
        sp->block_lists = (PyObject **)m; m += bytesp;
        int32_t *q = (int32_t *)m;
        sp->T = q; q += nb;
        sp->off = q; q += nb;
        sp->n_rows = q; q += nb;
        sp->rows_off = q; q += nb;
        sp->block_off = q; q += nb;
        sp->n_blocks = q; q += nb;
        sp->extra = q; q += nb;
        q += nb;  /* spare */
        sp->depths = q; q += n_total;
        sp->parents = q; q += n_total;
        sp->rows = q; q += rows_total;
        sp->blocks = q; q += blocks_total;
        uint8_t *u = (uint8_t *)q;
        sp->has_d = u; u += nb;
        sp->has_p = u; u += nb;
        sp->all_rows = u;
    }
    /* gather, as models/packing.py's _gather */
    Py_ssize_t n = 0, r_n = 0, maxT = 0;
    for (Py_ssize_t b = 0; b < B; b++) {
        PyObject **fb = f + b * 6;
        PyObject *len_obj = PyDict_GetItemWithError(lengths, fb[0]);
        long long ctx;
        if (!len_obj) return PyErr_Occurred() ? -1 : 0;
        if (!as_int(len_obj, 0, INT64_MAX, &ctx)) return 0;
        Py_ssize_t t = 0, k = 0;
        PyObject **tok = NULL, **d, **p, **r = NULL;
        if (!items_of(fb[1], &tok, &t) || t > INT32_MAX / 2 || !copy_ints(tok, t, NULL, sp->tokens + n)) return 0;
        sp->T[b] = (int32_t)t;
        sp->off[b] = (int32_t)n;
        sp->ctx[b] = ctx;
        sp->has_d[b] = 1;
        if (fb[2] == Py_None) {
            for (Py_ssize_t i = 0; i < t; i++) sp->depths[n + i] = (int32_t)i;
        } else if (!items_of(fb[2], &d, &k) || k != t || !copy_ints(d, t, sp->depths + n, NULL)) {
            return 0;
        }
        if (fb[5] == Py_None) {
            memset(sp->parents + n, 0, sizeof(int32_t) * (size_t)t);
            sp->has_p[b] = 0;
        } else {
            if (!items_of(fb[5], &p, &k) || k != t || !copy_ints(p, t, sp->parents + n, NULL)) return 0;
            sp->has_p[b] = 1;
        }
        sp->rows_off[b] = (int32_t)r_n;
        if (fb[4] == Py_None) {
            sp->n_rows[b] = (int32_t)t;
            sp->all_rows[b] = 1;
        } else {
            if (!items_of(fb[4], &r, &k) || !copy_ints(r, k, sp->rows + r_n, NULL)) return 0;
            sp->n_rows[b] = (int32_t)k;
            sp->all_rows[b] = 0;
            r_n += k;
        }
        n += t;
        if (t > maxT) maxT = t;
    }
    if (pack_check((int)B, sp->T, sp->off, sp->tokens, sp->depths, sp->parents, sp->has_d, sp->has_p, sp->ctx,
                   sp->n_rows, sp->rows_off, r_n ? sp->rows : NULL, sp->all_rows, vocab, max_context) != 0)
        return 0;
    /* the room each sequence needs (KVCache.reserve), checked before anything changes */
    Py_ssize_t need = 0, width = 1, R = 0;
    int any_tree = 0, n_words = 0;
    for (Py_ssize_t b = 0; b < B; b++) {
        PyObject *own = PyDict_GetItem(blocks, f[b * 6]);  /* present: checked above */
        sp->block_lists[b] = own;
        const Py_ssize_t have = PyList_GET_SIZE(own), want = (Py_ssize_t)((sp->ctx[b] + sp->T[b] + bs - 1) / bs);
        sp->extra[b] = want > have ? (int32_t)(want - have) : 0;
        if (sp->extra[b] > sp->T[b] / bs + 2) return 0;  /* a length beyond its blocks (the room sized above) */
        need += sp->extra[b];
        if (have + sp->extra[b] > width) width = have + sp->extra[b];
        R += sp->n_rows[b];
        if (sp->has_p[b]) {
            any_tree = 1;
            if ((sp->T[b] + 31) / 32 > n_words) n_words = (sp->T[b] + 31) / 32;
        }
    }
    if (need > PyList_GET_SIZE(free_blocks)) return 0;  /* the Python glue raises KVCacheFull */
    g->n = n;
    g->r_n = r_n;
    g->maxT = maxT;
    g->need = need;
    g->widest = width;
    /* the table's width rounded up to a power of two: a step's layout (its tensor views, kept by
       the staging) then stays the same while a sequence grows, instead of changing every block */
    Py_ssize_t w2 = 1;
    while (w2 < width) w2 <<= 1;
    g->width = w2;
    g->R = R;
    g->n_words = n_words;
    g->any_tree = any_tree;
    return 1;
}

/* The room reserved (the last free blocks, popped one by one as KVCache.reserve does) and every
 * sequence's blocks flattened; 0, or -1 with an error set. */
static int reserve(Gathered *g, PyObject *free_blocks) {
    Step *sp = &g->s;
    Py_ssize_t bo = 0;
    for (Py_ssize_t b = 0; b < g->B; b++) {
        PyObject *own = sp->block_lists[b];
        for (int e = 0; e < sp->extra[b]; e++) {
            const Py_ssize_t last = PyList_GET_SIZE(free_blocks) - 1;
            PyObject *blk = PyList_GET_ITEM(free_blocks, last);
            Py_INCREF(blk);
            const int bad = PyList_SetSlice(free_blocks, last, last + 1, NULL) != 0 || PyList_Append(own, blk) != 0;
            Py_DECREF(blk);
            if (bad) return -1;
        }
        const Py_ssize_t have = PyList_GET_SIZE(own);
        sp->block_off[b] = (int32_t)bo;
        sp->n_blocks[b] = (int32_t)have;
        for (Py_ssize_t j = 0; j < have; j++) {
            long long x;
            if (!as_int(PyList_GET_ITEM(own, j), INT32_MIN, INT32_MAX, &x)) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a cache block id is not an int32");
                return -1;
            }
            sp->blocks[bo + j] = (int32_t)x;
        }
        bo += have;
    }
    return 0;
}

/* pack_staged(inputs, lengths, blocks, free_blocks, block_size, vocab, max_context, staging)
 * -> the staged (tokens, meta, logits rows) of the step, or None (nothing changed). */
static PyObject *pack_staged(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "pack_staged takes 8 arguments");
        return NULL;
    }
    PyObject *staging = args[7], *result = NULL, *packed = NULL;
    Gathered g;
    const int got_it = gather(args, &g);
    if (got_it <= 0) goto end;
    Step *sp = &g.s;
    const int with_idx = g.R != g.n;
    /* the staging's layout (Staging.layout: made where it is new) */
    PyObject *trees = PyTuple_New(g.any_tree ? g.B : 0);
    if (!trees) goto end;
    for (Py_ssize_t b = 0; g.any_tree && b < g.B; b++) {
        PyObject *v = sp->has_p[b] ? Py_True : Py_False;
        Py_INCREF(v);
        PyTuple_SET_ITEM(trees, b, v);
    }
    PyObject *key = Py_BuildValue("(nnninN)", g.B, g.n, g.width, g.n_words, with_idx ? g.R : (Py_ssize_t)-1, trees);
    if (!key) goto end;
    PyObject *steps = PyObject_GetAttr(staging, s_steps);
    if (!steps) {
        Py_DECREF(key);
        goto end;
    }
    packed = PyDict_CheckExact(steps) ? PyDict_GetItemWithError(steps, key) : NULL;
    Py_XINCREF(packed);
    Py_DECREF(steps);
    if (!packed && !PyErr_Occurred())  /* a layout not met yet: the staging makes it (and may grow its buffers) */
        packed = PyObject_CallMethodOneArg(staging, s_layout, key);
    Py_DECREF(key);
    if (!packed) goto end;
    /* the staging's buffers */
    PyObject *bufs[4] = {PyObject_GetAttr(staging, s_i32), PyObject_GetAttr(staging, s_i64),
                         PyObject_GetAttr(staging, s_at32), PyObject_GetAttr(staging, s_at64)};
    Py_buffer view[4];
    int held = 0;
    while (held < 4 && bufs[held] && PyObject_GetBuffer(bufs[held], &view[held], PyBUF_WRITABLE) == 0) held++;
    const int ok = held == 4 && reserve(&g, args[3]) == 0;
    if (ok)
        pack_step((int)g.B, sp->T, sp->off, sp->tokens, sp->depths, sp->parents, sp->has_d, sp->has_p, sp->ctx,
                  sp->n_rows, sp->rows_off, g.r_n ? sp->rows : NULL, sp->all_rows, sp->blocks, sp->block_off,
                  sp->n_blocks, (int)g.bs, (int)g.width, g.n_words, with_idx, (int)g.n, (int)g.B,
                  with_idx ? (int)g.R : 0, view[2].buf, view[3].buf, view[0].buf, view[1].buf, NULL);
    for (int j = 0; j < 4; j++) {
        if (j < held) PyBuffer_Release(&view[j]);
        Py_XDECREF(bufs[j]);
    }
    if (!ok) goto end;
    PyObject *meta = PyTuple_Check(packed) && PyTuple_GET_SIZE(packed) == 3 ? PyTuple_GET_ITEM(packed, 1) : NULL;
    PyObject *m = meta ? PyLong_FromSsize_t(g.maxT) : NULL;
    if (!m || PyObject_SetAttr(meta, s_max_seqlen_q, m) != 0) {
        Py_XDECREF(m);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a staged step is not (tokens, meta, rows)");
        goto end;
    }
    Py_DECREF(m);
    result = packed;
    packed = NULL;
end:
    Py_XDECREF(packed);
    gathered_free(&g);
    if (!result && !PyErr_Occurred()) {
        result = Py_None;
        Py_INCREF(result);
    }
    return result;
}

/* pack_padded(inputs, lengths, blocks, free_blocks, block_size, vocab, max_context, dims, at32, at64, i32, i64,
 * causal) -> (rows, logits rows) or None (nothing changed): models/packing.py's pack_padded (a CUDA graph's
 * static inputs written on the host), dims = (rows, batch, width, mask words, logits rows) of its padded
 * shape, at32 / at64 the pieces' offsets (arrays of int64), i32 / i64 / causal addresses (causal: or None). */
static PyObject *pack_padded(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "pack_padded takes 13 arguments");
        return NULL;
    }
    Py_ssize_t rows_pad, batch_pad, width, words, r_pad;
    if (!PyArg_ParseTuple(args[7], "nnnnn", &rows_pad, &batch_pad, &width, &words, &r_pad)) return NULL;
    void *i32 = PyLong_AsVoidPtr(args[10]), *i64 = PyLong_AsVoidPtr(args[11]);
    void *causal = args[12] == Py_None ? NULL : PyLong_AsVoidPtr(args[12]);
    if (PyErr_Occurred()) return NULL;
    PyObject *result = NULL;
    Gathered g;
    const int got_it = gather(args, &g);
    if (got_it <= 0) goto end;
    Step *sp = &g.s;
    if (g.B > batch_pad || g.n > rows_pad || g.R > r_pad || (words && (g.maxT + 31) / 32 > words) ||
        (g.any_tree && !words) || g.widest > width)  /* a sequence's blocks beyond the graph's table */
        goto end;
    Py_buffer v32, v64;
    if (PyObject_GetBuffer(args[8], &v32, PyBUF_SIMPLE) != 0) goto end;
    if (PyObject_GetBuffer(args[9], &v64, PyBUF_SIMPLE) != 0) {
        PyBuffer_Release(&v32);
        goto end;
    }
    if (v32.len >= 5 * 8 && v64.len >= 3 * 8 && reserve(&g, args[3]) == 0) {
        pack_step((int)g.B, sp->T, sp->off, sp->tokens, sp->depths, sp->parents, sp->has_d, sp->has_p, sp->ctx,
                  sp->n_rows, sp->rows_off, g.r_n ? sp->rows : NULL, sp->all_rows, sp->blocks, sp->block_off,
                  sp->n_blocks, (int)g.bs, (int)width, (int)words, 1, (int)rows_pad, (int)batch_pad, (int)r_pad,
                  v32.buf, v64.buf, i32, i64, causal);
        result = Py_BuildValue("(nn)", g.n, g.R);
    }
    PyBuffer_Release(&v32);
    PyBuffer_Release(&v64);
end:
    gathered_free(&g);
    if (!result && !PyErr_Occurred()) {
        result = Py_None;
        Py_INCREF(result);
    }
    return result;
}

void pack_kv_move(char *k, char *v, int64_t layers, int64_t layer_bytes, int64_t row_bytes, const int64_t *src,
                  const int64_t *dst, int n);

/* commit_host(accepted, lengths, blocks, block_size, k, v, layers, layer_bytes, row_bytes) -> True or None:
 * ModelRunner.commit on a contiguous host cache (models/runner.py; its Python is the reference), in one call.
 * accepted: a dict, sequence -> its accepted step rows (a list of ints). Every sequence is checked first (in
 * the cache, rows increasing from >= 0, the last within the reserved room); then the accepted rows that move
 * are copied in every layer (pack_kv_move, in models.packing.compact's order) and each committed length grows
 * by its rows. None, having changed nothing, where a check fails or a value is not what it should be: the
 * Python then raises, naming it. */
static PyObject *commit_host(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "commit_host takes 9 arguments");
        return NULL;
    }
    PyObject *accepted = args[0], *lengths = args[1], *blocks = args[2];
    const long long bs = PyLong_AsLongLong(args[3]), layers = PyLong_AsLongLong(args[6]),
                    layer_bytes = PyLong_AsLongLong(args[7]), row_bytes = PyLong_AsLongLong(args[8]);
    char *k = PyLong_AsVoidPtr(args[4]), *v = PyLong_AsVoidPtr(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (!PyDict_CheckExact(accepted) || !PyDict_CheckExact(lengths) || !PyDict_CheckExact(blocks) || bs < 1)
        Py_RETURN_NONE;
    /* the checks, and how many rows move */
    Py_ssize_t pos = 0, moves = 0;
    PyObject *sid, *rows;
    while (PyDict_Next(accepted, &pos, &sid, &rows)) {
        PyObject *own = PyDict_GetItemWithError(blocks, sid), *len = own ? PyDict_GetItemWithError(lengths, sid) : NULL;
        long long ctx;
        if (!own || !len || !PyList_CheckExact(own) || !PyList_CheckExact(rows) ||
            !as_int(len, 0, INT64_MAX / 2, &ctx)) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        const Py_ssize_t n = PyList_GET_SIZE(rows);
        long long prev = -1, r = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!as_int(PyList_GET_ITEM(rows, i), 0, INT32_MAX, &r) || r <= prev) Py_RETURN_NONE;
            prev = r;
            moves += r != i;
        }
        if (n && ctx + r + 1 > (long long)PyList_GET_SIZE(own) * bs) Py_RETURN_NONE;
    }
    /* the moving rows' slots, in the accepted dict's order (models.packing.compact) */
    if (moves) {
        int64_t *src = malloc(sizeof(int64_t) * 2 * (size_t)moves);
        if (!src) return PyErr_NoMemory();
        int64_t *dst = src + moves;
        Py_ssize_t m = 0;
        pos = 0;
        while (PyDict_Next(accepted, &pos, &sid, &rows)) {
            PyObject *own = PyDict_GetItem(blocks, sid);
            long long ctx, r, ba, bb;
            as_int(PyDict_GetItem(lengths, sid), 0, INT64_MAX / 2, &ctx); /* checked above */
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
                as_int(PyList_GET_ITEM(rows, i), 0, INT32_MAX, &r);
                if (r == i) continue;
                const long long a = ctx + r, b = ctx + i;
                if (!as_int(PyList_GET_ITEM(own, a / bs), 0, INT32_MAX, &ba) ||
                    !as_int(PyList_GET_ITEM(own, b / bs), 0, INT32_MAX, &bb)) {
                    free(src);
                    Py_RETURN_NONE;
                }
                src[m] = ba * bs + a % bs;
                dst[m++] = bb * bs + b % bs;
            }
        }
        pack_kv_move(k, v, layers, layer_bytes, row_bytes, src, dst, (int)moves);
        free(src);
    }
    pos = 0;
    while (PyDict_Next(accepted, &pos, &sid, &rows)) {
        const Py_ssize_t n = PyList_GET_SIZE(rows);
        if (!n) continue;
        long long ctx;
        as_int(PyDict_GetItem(lengths, sid), 0, INT64_MAX / 2, &ctx);
        PyObject *grown = PyLong_FromLongLong(ctx + n);
        if (!grown || PyDict_SetItem(lengths, sid, grown) != 0) { /* only memory can fail here */
            Py_XDECREF(grown);
            return NULL;
        }
        Py_DECREF(grown);
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"commit_host", (PyCFunction)(void (*)(void))commit_host, METH_FASTCALL,
     "commit_host(accepted, lengths, blocks, block_size, k, v, layers, layer_bytes, row_bytes): ModelRunner.commit "
     "on a contiguous host cache; True, or None (nothing changed) where the Python must take it"},
    {"pack_staged", (PyCFunction)(void (*)(void))pack_staged, METH_FASTCALL,
     "pack_staged(inputs, lengths, blocks, free_blocks, block_size, vocab, max_context, staging): a CPU step packed "
     "into the staging's buffers, its cache room reserved; None (nothing changed) where the Python glue must take it"},
    {"pack_padded", (PyCFunction)(void (*)(void))pack_padded, METH_FASTCALL,
     "pack_padded(inputs, lengths, blocks, free_blocks, block_size, vocab, max_context, dims, at32, at64, i32, i64, "
     "causal): a step written into a CUDA graph's padded inputs on the host, its cache room reserved; (rows, logits "
     "rows), or None (nothing changed) where the Python glue must take it"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_packext", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__packext(void) {
    const char *names[] = {"seq_id", "tokens", "depths", "mask", "logits_rows", "parents", "steps", "i32", "i64",
                           "at32", "at64", "max_seqlen_q", "layout"};
    PyObject **slots[] = {&s_seq_id, &s_tokens, &s_depths, &s_mask, &s_logits_rows, &s_parents, &s_steps, &s_i32,
                          &s_i64, &s_at32, &s_at64, &s_max_seqlen_q, &s_layout};
    for (int i = 0; i < 13; i++)
        if (!(*slots[i] = PyUnicode_InternFromString(names[i]))) return NULL;
    return PyModule_Create(&module);
}
