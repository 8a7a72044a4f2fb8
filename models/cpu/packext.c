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

/* pack_staged(inputs, lengths, blocks, free_blocks, block_size, vocab, max_context, staging)
 * -> the staged (tokens, meta, logits rows) of the step, or None (nothing changed). */
static PyObject *pack_staged(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "pack_staged takes 8 arguments");
        return NULL;
    }
    PyObject *inputs = args[0], *lengths = args[1], *blocks = args[2], *free_blocks = args[3], *staging = args[7];
    const long bs = PyLong_AsLong(args[4]);
    const long long vocab = PyLong_AsLongLong(args[5]), max_context = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred()) return NULL;
    if (!PyList_CheckExact(inputs) || !PyDict_CheckExact(lengths) || !PyDict_CheckExact(blocks) ||
        !PyList_CheckExact(free_blocks) || bs < 1)
        Py_RETURN_NONE;
    const Py_ssize_t B = PyList_GET_SIZE(inputs);
    if (B < 1 || B > 1 << 20) Py_RETURN_NONE;

    /* the inputs' fields (new references, released at the end) */
    PyObject **f = calloc((size_t)B * 6, sizeof(PyObject *));
    if (!f) return PyErr_NoMemory();
    PyObject *result = NULL;
    Step s = {0};
    Py_ssize_t n_total = 0, rows_total = 0, blocks_total = 0;
    PyObject *names[6] = {s_seq_id, s_tokens, s_depths, s_mask, s_logits_rows, s_parents};
    for (Py_ssize_t b = 0; b < B; b++) {
        PyObject *inp = PyList_GET_ITEM(inputs, b);
        for (int j = 0; j < 6; j++)
            if (!(f[b * 6 + j] = PyObject_GetAttr(inp, names[j]))) goto error;
        Py_ssize_t t, k;
        PyObject **it;
        if (f[b * 6 + 3] != Py_None || !items_of(f[b * 6 + 1], &it, &t)) goto none;
        n_total += t;
        if (f[b * 6 + 4] != Py_None) {
            if (!items_of(f[b * 6 + 4], &it, &k)) goto none;
            rows_total += k;
        }
        PyObject *own = PyDict_GetItemWithError(blocks, f[b * 6]);
        if (!own) {
            if (PyErr_Occurred()) goto error;
            goto none;
        }
        if (!PyList_CheckExact(own)) goto none;
        blocks_total += PyList_GET_SIZE(own) + t / bs + 2;
    }
    const size_t nb = (size_t)B;
    const size_t bytes32 = sizeof(int32_t) * (8 * nb + 2 * (size_t)n_total + (size_t)rows_total + (size_t)blocks_total),
                 bytes64 = sizeof(int64_t) * ((size_t)n_total + nb), bytes8 = 3 * nb,
                 bytesp = sizeof(PyObject *) * nb;
    s.mem = malloc(bytes64 + bytes32 + bytesp + bytes8 + 64);
    if (!s.mem) {
        PyErr_NoMemory();
        goto error;
    }
    {
        char *m = s.mem;
        s.tokens = (int64_t *)m; m += sizeof(int64_t) * (size_t)n_total;
        s.ctx = (int64_t *)m; m += sizeof(int64_t) * nb;
        s.block_lists = (PyObject **)m; m += bytesp;
        int32_t *q = (int32_t *)m;
        s.T = q; q += nb;
        s.off = q; q += nb;
        s.n_rows = q; q += nb;
        s.rows_off = q; q += nb;
        s.block_off = q; q += nb;
        s.n_blocks = q; q += nb;
        s.extra = q; q += nb;
        q += nb;  /* spare: rows never empty below */
        s.depths = q; q += n_total;
        s.parents = q; q += n_total;
        s.rows = q; q += rows_total;
        s.blocks = q; q += blocks_total;
        uint8_t *u = (uint8_t *)q;
        s.has_d = u; u += nb;
        s.has_p = u; u += nb;
        s.all_rows = u;
    }
    /* gather, as models/packing.py's _gather */
    Py_ssize_t n = 0, r_n = 0, maxT = 0;
    for (Py_ssize_t b = 0; b < B; b++) {
        PyObject **fb = f + b * 6;
        PyObject *len_obj = PyDict_GetItemWithError(lengths, fb[0]);
        long long ctx;
        if (!len_obj) {
            if (PyErr_Occurred()) goto error;
            goto none;
        }
        if (!as_int(len_obj, 0, INT64_MAX, &ctx)) goto none;
        Py_ssize_t t = 0, k = 0;
        PyObject **tok = NULL, **d, **p, **r = NULL;
        if (!items_of(fb[1], &tok, &t) || t > INT32_MAX / 2 || !copy_ints(tok, t, NULL, s.tokens + n)) goto none;
        s.T[b] = (int32_t)t;
        s.off[b] = (int32_t)n;
        s.ctx[b] = ctx;
        s.has_d[b] = 1;
        if (fb[2] == Py_None) {
            for (Py_ssize_t i = 0; i < t; i++) s.depths[n + i] = (int32_t)i;
        } else {
            if (!items_of(fb[2], &d, &k) || k != t || !copy_ints(d, t, s.depths + n, NULL)) goto none;
        }
        if (fb[5] == Py_None) {
            memset(s.parents + n, 0, sizeof(int32_t) * (size_t)t);
            s.has_p[b] = 0;
        } else {
            if (!items_of(fb[5], &p, &k) || k != t || !copy_ints(p, t, s.parents + n, NULL)) goto none;
            s.has_p[b] = 1;
        }
        s.rows_off[b] = (int32_t)r_n;
        if (fb[4] == Py_None) {
            s.n_rows[b] = (int32_t)t;
            s.all_rows[b] = 1;
        } else {
            if (!items_of(fb[4], &r, &k) || !copy_ints(r, k, s.rows + r_n, NULL)) goto none;
            s.n_rows[b] = (int32_t)k;
            s.all_rows[b] = 0;
            r_n += k;
        }
        n += t;
        if (t > maxT) maxT = t;
    }
    if (pack_check((int)B, s.T, s.off, s.tokens, s.depths, s.parents, s.has_d, s.has_p, s.ctx, s.n_rows, s.rows_off,
                   r_n ? s.rows : NULL, s.all_rows, vocab, max_context) != 0)
        goto none;
    /* the room each sequence needs (KVCache.reserve), checked before anything changes */
    Py_ssize_t need = 0, width = 1, R = 0;
    int any_tree = 0, n_words = 0;
    for (Py_ssize_t b = 0; b < B; b++) {
        PyObject *own = PyDict_GetItem(blocks, f[b * 6]);  /* present: checked above */
        s.block_lists[b] = own;
        const Py_ssize_t have = PyList_GET_SIZE(own), want = (Py_ssize_t)((s.ctx[b] + s.T[b] + bs - 1) / bs);
        s.extra[b] = want > have ? (int32_t)(want - have) : 0;
        if (s.extra[b] > s.T[b] / bs + 2) goto none;  /* a length beyond its blocks (the room sized above) */
        need += s.extra[b];
        if (have + s.extra[b] > width) width = have + s.extra[b];
        R += s.n_rows[b];
        if (s.has_p[b]) {
            any_tree = 1;
            if ((s.T[b] + 31) / 32 > n_words) n_words = (s.T[b] + 31) / 32;
        }
    }
    if (need > PyList_GET_SIZE(free_blocks)) goto none;  /* the Python glue raises KVCacheFull */
    const int with_idx = R != n;
    /* the staging's layout (Staging.step), met before: else the Python glue makes it */
    PyObject *trees = PyTuple_New(any_tree ? B : 0);
    if (!trees) goto error;
    for (Py_ssize_t b = 0; any_tree && b < B; b++) {
        PyObject *v = s.has_p[b] ? Py_True : Py_False;
        Py_INCREF(v);
        PyTuple_SET_ITEM(trees, b, v);
    }
    PyObject *key = Py_BuildValue("(nnninN)", B, n, width, n_words, with_idx ? R : (Py_ssize_t)-1, trees);
    if (!key) goto error;
    PyObject *steps = PyObject_GetAttr(staging, s_steps);
    if (!steps) {
        Py_DECREF(key);
        goto error;
    }
    PyObject *packed = PyDict_CheckExact(steps) ? PyDict_GetItemWithError(steps, key) : NULL;
    Py_XINCREF(packed);
    Py_DECREF(steps);
    if (!packed && !PyErr_Occurred())  /* a layout not met yet: the staging makes it (and may grow its buffers) */
        packed = PyObject_CallMethodOneArg(staging, s_layout, key);
    Py_DECREF(key);
    if (!packed) goto error;
    /* the staging's buffers */
    PyObject *bufs[4] = {PyObject_GetAttr(staging, s_i32), PyObject_GetAttr(staging, s_i64),
                         PyObject_GetAttr(staging, s_at32), PyObject_GetAttr(staging, s_at64)};
    Py_buffer view[4];
    int got = 0;
    for (; got < 4; got++)
        if (!bufs[got] || PyObject_GetBuffer(bufs[got], &view[got], PyBUF_WRITABLE) != 0) break;
    if (got == 4) {
        /* reserve: the last free blocks, popped one by one as KVCache.reserve does */
        Py_ssize_t bo = 0;
        for (Py_ssize_t b = 0; b < B && got == 4; b++) {
            PyObject *own = s.block_lists[b];
            for (int e = 0; e < s.extra[b]; e++) {
                const Py_ssize_t last = PyList_GET_SIZE(free_blocks) - 1;
                PyObject *blk = PyList_GET_ITEM(free_blocks, last);
                Py_INCREF(blk);
                if (PyList_SetSlice(free_blocks, last, last + 1, NULL) != 0 || PyList_Append(own, blk) != 0) {
                    Py_DECREF(blk);
                    got = -1;
                    break;
                }
                Py_DECREF(blk);
            }
            if (got != 4) break;
            const Py_ssize_t have = PyList_GET_SIZE(own);
            s.block_off[b] = (int32_t)bo;
            s.n_blocks[b] = (int32_t)have;
            for (Py_ssize_t j = 0; j < have; j++) {
                long long x;
                if (!as_int(PyList_GET_ITEM(own, j), INT32_MIN, INT32_MAX, &x)) {
                    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a cache block id is not an int32");
                    got = -1;
                    break;
                }
                s.blocks[bo + j] = (int32_t)x;
            }
            bo += have;
        }
        if (got == 4) {
            pack_step((int)B, s.T, s.off, s.tokens, s.depths, s.parents, s.has_d, s.has_p, s.ctx, s.n_rows,
                      s.rows_off, r_n ? s.rows : NULL, s.all_rows, s.blocks, s.block_off, s.n_blocks, (int)bs,
                      (int)width, n_words, with_idx, (int)n, (int)B, with_idx ? (int)R : 0, view[2].buf,
                      view[3].buf, view[0].buf, view[1].buf, NULL);
        }
    }
    for (int j = 0; j < 4; j++) {
        if (j < (got < 0 ? 4 : got)) PyBuffer_Release(&view[j]);
        Py_XDECREF(bufs[j]);
    }
    if (got != 4) {
        Py_DECREF(packed);
        if (got < 0 || PyErr_Occurred()) goto error;
        goto none;
    }
    {
        PyObject *meta = PyTuple_Check(packed) && PyTuple_GET_SIZE(packed) == 3 ? PyTuple_GET_ITEM(packed, 1) : NULL;
        PyObject *m = meta ? PyLong_FromSsize_t(maxT) : NULL;
        if (!m || PyObject_SetAttr(meta, s_max_seqlen_q, m) != 0) {
            Py_XDECREF(m);
            Py_DECREF(packed);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a staged step is not (tokens, meta, rows)");
            goto error;
        }
        Py_DECREF(m);
    }
    result = packed;
    goto done;
none:
    result = Py_None;
    Py_INCREF(result);
    goto done;
error:
    result = NULL;
done:
    for (Py_ssize_t j = 0; j < B * 6; j++) Py_XDECREF(f[j]);
    free(f);
    free(s.mem);
    return result;
}

static PyMethodDef methods[] = {
    {"pack_staged", (PyCFunction)(void (*)(void))pack_staged, METH_FASTCALL,
     "pack_staged(inputs, lengths, blocks, free_blocks, block_size, vocab, max_context, staging): a CPU step packed "
     "into the staging's buffers, its cache room reserved; None (nothing changed) where the Python glue must take it"},
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
