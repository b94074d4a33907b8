/* A rule's minimal DFA straight from its expression objects (automata/expr.py): a CPython extension
 * that encodes the expression as dfa_native.encode does (the same int32 code: each distinct node once,
 * after its children), builds it with agentkv_expr_to_dfa (nfa_build.c, linked in) and hands the result
 * back as Python objects. In Python, encoding and copying the result out were ~half of a rule's build.
 * Built where Python's headers are (native.py, expr_module()); elsewhere dfa_native encodes in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../dfa.h"

agentkv_dfa *agentkv_expr_to_dfa(const int32_t *code, int32_t root, const int32_t *dfa_off, const int32_t *tables,
                                 const uint8_t *accepts, int32_t max_nfa_states, int32_t max_states, double seconds);
void agentkv_dfa_free(agentkv_dfa *r);

enum { X_LIT = 0, X_RANGES = 1, X_SEQ = 2, X_ALT = 3, X_REPEAT = 4, X_REF = 5, X_DFA = 6 };
enum { T_LIT, T_CHARS, T_BYTESET, T_SEQ, T_ALT, T_REPEAT, T_REF, T_INTERSECT, T_DIFF, T_MACHINE, N_TYPES };

/* Set once by configure(): the expression classes in T_* order, and two Python functions: the X_RANGES
 * node of a character or byte set (dfa_native._ranges_node, cached there) and what raises for any other
 * object (an anchor left in a pattern, or not an expression). */
static PyObject *types[N_TYPES], *ranges_node, *refuse;
static PyObject *s_data, *s_items, *s_ranges, *s_item, *s_min, *s_max, *s_name, *s_table, *s_accept;

/* Open addressing from an object's address to its node's offset: each distinct node is encoded once. */
typedef struct { PyObject **key; int32_t *at; int64_t cap, n; } Seen;

static int64_t seen_slot(const Seen *m, PyObject *o) {
    uint64_t h = ((uint64_t)(uintptr_t)o >> 4) * 0x9E3779B97F4A7C15ull;
    int64_t i = (int64_t)(h >> 20) & (m->cap - 1);
    while (m->key[i] && m->key[i] != o) i = (i + 1) & (m->cap - 1);
    return i;
}

static int seen_grow(Seen *m) {
    Seen big = {calloc((size_t)m->cap * 2, sizeof(PyObject *)), malloc((size_t)m->cap * 2 * sizeof(int32_t)),
                m->cap * 2, m->n};
    if (!big.key || !big.at) { free(big.key); free(big.at); return -1; }
    for (int64_t i = 0; i < m->cap; i++)
        if (m->key[i]) {
            int64_t j = seen_slot(&big, m->key[i]);
            big.key[j] = m->key[i];
            big.at[j] = m->at[i];
        }
    free(m->key); free(m->at);
    *m = big;
    return 0;
}

typedef struct {
    Vec code;
    Seen seen;
    PyObject *names;    /* dict: rule name -> index in the order met */
    Vec ref_args;       /* where in `code` a REF's name index is (renumbered sorted at the end) */
    PyObject *embedded; /* list: minimal DFAs of intersections, differences and machines */
    PyObject *minimal, *deadline;
    int depth;
} Enc;

static int32_t put(Enc *e, PyObject *o);

static int32_t put_int(Enc *e, PyObject *o, PyObject *attr, int32_t none_as, int32_t *out) {
    PyObject *v = PyObject_GetAttr(o, attr);
    if (!v) return -1;
    long x = v == Py_None ? none_as : PyLong_AsLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (x < INT32_MIN || x > INT32_MAX) { PyErr_SetString(PyExc_OverflowError, "a repetition bound past int32"); return -1; }
    *out = (int32_t)x;
    return 0;
}

static int push_all(Enc *e, const int32_t *v, Py_ssize_t n) {
    if (vreserve(&e->code, e->code.n + n)) { PyErr_NoMemory(); return -1; }
    memcpy(e->code.v + e->code.n, v, (size_t)n * sizeof *v);
    e->code.n += n;
    return 0;
}

/* The node of a Seq or Alt: its kind, its count, its children's offsets (children first). */
static int32_t put_items(Enc *e, PyObject *o, int32_t kind, int32_t *node_buf, Py_ssize_t cap, int32_t **node,
                         Py_ssize_t *len) {
    PyObject *items = PyObject_GetAttr(o, s_items);
    if (!items) return -1;
    PyObject *seq = PySequence_Fast(items, "a Seq's or Alt's items must be a tuple");
    Py_DECREF(items);
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int32_t *buf = n + 2 <= cap ? node_buf : malloc((size_t)(n + 2) * sizeof(int32_t));
    if (!buf) { Py_DECREF(seq); PyErr_NoMemory(); return -1; }
    buf[0] = kind;
    buf[1] = (int32_t)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t at = put(e, PySequence_Fast_GET_ITEM(seq, i));
        if (at < 0) { Py_DECREF(seq); if (buf != node_buf) free(buf); return -1; }
        buf[2 + i] = at;
    }
    Py_DECREF(seq);
    *node = buf;
    *len = n + 2;
    return 0;
}

static int32_t put(Enc *e, PyObject *o) {
    int64_t slot = seen_slot(&e->seen, o);
    if (e->seen.key[slot]) return e->seen.at[slot];
    if (++e->depth > 5000) {  /* (the C stack, not Python's limit, bounds this recursion) */
        PyErr_SetString(PyExc_RecursionError, "a grammar expression nested too deeply");
        return -1;
    }
    PyTypeObject *t = Py_TYPE(o);
    int32_t small[64], *node = small;
    Py_ssize_t len = 0;
    if (t == (PyTypeObject *)types[T_LIT]) {
        PyObject *data = PyObject_GetAttr(o, s_data);
        if (!data) return -1;
        if (!PyBytes_Check(data)) { Py_DECREF(data); PyErr_SetString(PyExc_TypeError, "Lit.data must be bytes"); return -1; }
        Py_ssize_t n = PyBytes_GET_SIZE(data);
        const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
        if (n + 2 > 64 && !(node = malloc((size_t)(n + 2) * sizeof(int32_t)))) { Py_DECREF(data); PyErr_NoMemory(); return -1; }
        node[0] = X_LIT;
        node[1] = (int32_t)n;
        for (Py_ssize_t i = 0; i < n; i++) node[2 + i] = p[i];
        len = n + 2;
        Py_DECREF(data);
    } else if (t == (PyTypeObject *)types[T_SEQ] || t == (PyTypeObject *)types[T_ALT]) {
        if (put_items(e, o, t == (PyTypeObject *)types[T_SEQ] ? X_SEQ : X_ALT, small, 64, &node, &len)) return -1;
    } else if (t == (PyTypeObject *)types[T_CHARS] || t == (PyTypeObject *)types[T_BYTESET]) {
        PyObject *ranges = PyObject_GetAttr(o, s_ranges);
        if (!ranges) return -1;
        PyObject *tup = PyObject_CallFunctionObjArgs(ranges_node, ranges,
                                                     t == (PyTypeObject *)types[T_CHARS] ? Py_True : Py_False, NULL);
        Py_DECREF(ranges);
        if (!tup) return -1;
        PyObject *seq = PySequence_Fast(tup, "a ranges node is a tuple");
        Py_DECREF(tup);
        if (!seq) return -1;
        len = PySequence_Fast_GET_SIZE(seq);
        if (len > 64 && !(node = malloc((size_t)len * sizeof(int32_t)))) { Py_DECREF(seq); PyErr_NoMemory(); return -1; }
        for (Py_ssize_t i = 0; i < len; i++) node[i] = (int32_t)PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        Py_DECREF(seq);
        if (PyErr_Occurred()) { if (node != small) free(node); return -1; }
    } else if (t == (PyTypeObject *)types[T_REPEAT]) {
        PyObject *item = PyObject_GetAttr(o, s_item);
        if (!item) return -1;
        int32_t child = put(e, item);
        Py_DECREF(item);  /* (the Repeat holds it: its address stays a valid key) */
        if (child < 0) return -1;
        node[0] = X_REPEAT;
        if (put_int(e, o, s_min, 0, &node[1]) || put_int(e, o, s_max, -1, &node[2])) return -1;
        node[3] = child;
        len = 4;
    } else if (t == (PyTypeObject *)types[T_REF]) {
        PyObject *name = PyObject_GetAttr(o, s_name);
        if (!name) return -1;
        PyObject *ix = PyDict_GetItemWithError(e->names, name);
        if (!ix) {
            if (PyErr_Occurred() || !(ix = PyLong_FromSsize_t(PyDict_Size(e->names)))) { Py_DECREF(name); return -1; }
            int bad = PyDict_SetItem(e->names, name, ix);
            Py_DECREF(ix);
            if (bad) { Py_DECREF(name); return -1; }
        }
        Py_DECREF(name);
        if (vpush(&e->ref_args, (int32_t)e->code.n + 1)) { PyErr_NoMemory(); return -1; }
        node[0] = X_REF;
        node[1] = (int32_t)PyLong_AsLong(ix);
        len = 2;
    } else if (t == (PyTypeObject *)types[T_INTERSECT] || t == (PyTypeObject *)types[T_DIFF] ||
               t == (PyTypeObject *)types[T_MACHINE]) {
        PyObject *d = PyObject_CallFunctionObjArgs(e->minimal, o, e->deadline, NULL);
        if (!d) return -1;
        int bad = PyList_Append(e->embedded, d);
        Py_DECREF(d);
        if (bad) return -1;
        node[0] = X_DFA;
        node[1] = (int32_t)PyList_GET_SIZE(e->embedded) - 1;
        len = 2;
    } else {
        PyObject *r = PyObject_CallOneArg(refuse, o);  /* raises */
        Py_XDECREF(r);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "not a grammar expression");
        return -1;
    }
    int32_t at = (int32_t)e->code.n;
    int bad = push_all(e, node, len);
    if (node != small) free(node);
    if (bad) return -1;
    /* (the slot looked up on entry may since hold a child, or the table have grown: look again) */
    if (e->seen.n * 2 >= e->seen.cap && seen_grow(&e->seen)) { PyErr_NoMemory(); return -1; }
    slot = seen_slot(&e->seen, o);
    e->seen.key[slot] = o;
    e->seen.at[slot] = at;
    e->seen.n++;
    e->depth--;
    return at;
}

/* Encode `expr`: (code as bytes of int32, root, sorted names, embedded DFAs); NULL with an exception set. */
static PyObject *encode_into(Enc *e, PyObject *expr, int32_t *root, PyObject **order) {
    if (!refuse) { PyErr_SetString(PyExc_RuntimeError, "agentkv_expr: call configure() first"); return NULL; }
    e->seen.cap = 64;
    e->seen.key = calloc(64, sizeof(PyObject *));
    e->seen.at = malloc(64 * sizeof(int32_t));
    e->names = PyDict_New();
    e->embedded = PyList_New(0);
    if (!e->seen.key || !e->seen.at || !e->names || !e->embedded) { PyErr_NoMemory(); return NULL; }
    if ((*root = put(e, expr)) < 0) return NULL;
    /* Names sorted, a REF's argument renumbered to its place among them (as encode does). */
    PyObject *keys = PyDict_Keys(e->names);
    if (!keys || PyList_Sort(keys)) { Py_XDECREF(keys); return NULL; }
    Py_ssize_t nn = PyList_GET_SIZE(keys);
    if (nn > 1) {
        int32_t *renumber = malloc((size_t)nn * sizeof(int32_t));
        if (!renumber) { Py_DECREF(keys); PyErr_NoMemory(); return NULL; }
        for (Py_ssize_t i = 0; i < nn; i++)
            renumber[PyLong_AsLong(PyDict_GetItem(e->names, PyList_GET_ITEM(keys, i)))] = (int32_t)i;
        for (int64_t i = 0; i < e->ref_args.n; i++) e->code.v[e->ref_args.v[i]] = renumber[e->code.v[e->ref_args.v[i]]];
        free(renumber);
    }
    *order = PyList_AsTuple(keys);
    Py_DECREF(keys);
    return *order;
}

static void enc_free(Enc *e) {
    free(e->code.v); free(e->seen.key); free(e->seen.at); free(e->ref_args.v);
    Py_XDECREF(e->names); Py_XDECREF(e->embedded);
}

/* encode(expr, deadline, minimal) -> (code bytes, root, names, embedded): dfa_native.encode's result, for
 * the tests that hold the two equal. */
static PyObject *py_encode(PyObject *self, PyObject *args) {
    PyObject *expr, *order = NULL;
    Enc e = {0};
    if (!PyArg_ParseTuple(args, "OOO", &expr, &e.deadline, &e.minimal)) return NULL;
    int32_t root;
    PyObject *out = NULL;
    if (encode_into(&e, expr, &root, &order))
        out = Py_BuildValue("(y#iNO)", (const char *)e.code.v, (Py_ssize_t)(e.code.n * 4), root, order, e.embedded);
    enc_free(&e);
    return out;
}

/* The embedded DFAs' tables and accepts, concatenated as agentkv_expr_to_dfa reads them. */
static int gather(PyObject *embedded, int32_t **off, int32_t **tables, uint8_t **accepts) {
    Py_ssize_t m = PyList_GET_SIZE(embedded);
    int64_t rows = 0;
    *off = malloc((size_t)(m + 1) * sizeof(int32_t));
    if (!*off) { PyErr_NoMemory(); return -1; }
    Py_buffer *tb = calloc((size_t)m + 1, sizeof(Py_buffer)), *ab = calloc((size_t)m + 1, sizeof(Py_buffer));
    int ok = tb && ab, got = 0;
    if (!ok) PyErr_NoMemory();
    for (Py_ssize_t i = 0; ok && i < m; i++, got++) {
        PyObject *d = PyList_GET_ITEM(embedded, i), *t = PyObject_GetAttr(d, s_table), *a = t ? PyObject_GetAttr(d, s_accept) : NULL;
        ok = t && a && !PyObject_GetBuffer(t, &tb[i], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT);
        if (ok && PyObject_GetBuffer(a, &ab[i], PyBUF_C_CONTIGUOUS)) { PyBuffer_Release(&tb[i]); ok = 0; }
        Py_XDECREF(t); Py_XDECREF(a);
        if (ok && (tb[i].itemsize != 4 || tb[i].len != ab[i].len * 1024 || ab[i].itemsize != 1)) {
            PyErr_SetString(PyExc_TypeError, "an embedded DFA needs an int32 table of 256 columns and a bool accept");
            PyBuffer_Release(&tb[i]); PyBuffer_Release(&ab[i]);
            ok = 0;
        }
        if (!ok) break;
        (*off)[i] = (int32_t)rows;
        rows += ab[i].len;
    }
    if (ok) {
        (*off)[m] = (int32_t)rows;
        *tables = malloc((size_t)(rows ? rows : 1) * 1024);
        *accepts = malloc((size_t)(rows ? rows : 1));
        if (!*tables || !*accepts) { PyErr_NoMemory(); ok = 0; }
        for (Py_ssize_t i = 0; ok && i < m; i++) {
            memcpy(*tables + (int64_t)(*off)[i] * 256, tb[i].buf, (size_t)tb[i].len);
            memcpy(*accepts + (*off)[i], ab[i].buf, (size_t)ab[i].len);
        }
    }
    for (int i = 0; i < got; i++) { PyBuffer_Release(&tb[i]); PyBuffer_Release(&ab[i]); }
    free(tb); free(ab);
    return ok ? 0 : -1;
}

/* The result as (n, k, table, accept, ctab, class_of, calls, error): bytearrays numpy views without a
 * copy, calls as dfa_native._result makes them (per state: a tuple of (rule name, return state)). */
static PyObject *result_tuple(agentkv_dfa *r, PyObject *names) {
    if (r->error) return Py_BuildValue("(iiOOOOOi)", 0, 0, Py_None, Py_None, Py_None, Py_None, Py_None, r->error);
    int32_t n = r->n, k = r->k;
    PyObject *empty = PyTuple_New(0), *calls = PyList_New(n);
    if (!empty || !calls) { Py_XDECREF(empty); Py_XDECREF(calls); return NULL; }
    for (int32_t s = 0; s < n; s++) { Py_INCREF(empty); PyList_SET_ITEM(calls, s, empty); }
    Py_DECREF(empty);
    for (int32_t i = 0; i < r->n_calls;) {  /* (by state, then rule) */
        int32_t s = r->calls[3 * i], j = i;
        while (j < r->n_calls && r->calls[3 * j] == s) j++;
        PyObject *row = PyTuple_New(j - i);
        if (!row) { Py_DECREF(calls); return NULL; }
        for (int32_t q = i; q < j; q++) {
            PyObject *pair = Py_BuildValue("(Oi)", PyTuple_GET_ITEM(names, r->calls[3 * q + 1]), r->calls[3 * q + 2]);
            if (!pair) { Py_DECREF(row); Py_DECREF(calls); return NULL; }
            PyTuple_SET_ITEM(row, q - i, pair);
        }
        PyList_SetItem(calls, s, row);  /* (drops the empty tuple it held) */
        i = j;
    }
    return Py_BuildValue("(iiNNNNNi)", n, k, PyByteArray_FromStringAndSize((const char *)r->table, (Py_ssize_t)n * 1024),
                         PyByteArray_FromStringAndSize((const char *)r->accept, n),
                         PyByteArray_FromStringAndSize((const char *)r->ctab, (Py_ssize_t)n * k * 4),
                         PyByteArray_FromStringAndSize((const char *)r->class_of, 256), calls, 0);
}

/* expr_to_dfa(expr, deadline, seconds, minimal, max_nfa, max_dfa) -> (n, k, table, accept, ctab, class_of,
 * calls, error) and the rule names: dfa_native.expression without the encoding or the copies in Python. */
static PyObject *py_expr_to_dfa(PyObject *self, PyObject *args) {
    PyObject *expr, *order = NULL, *out = NULL;
    double seconds;
    int max_nfa, max_dfa;
    Enc e = {0};
    if (!PyArg_ParseTuple(args, "OOdOii", &expr, &e.deadline, &seconds, &e.minimal, &max_nfa, &max_dfa)) return NULL;
    int32_t root, *off = NULL, *tables = NULL;
    uint8_t *accepts = NULL;
    if (encode_into(&e, expr, &root, &order) && !gather(e.embedded, &off, &tables, &accepts)) {
        agentkv_dfa *r;
        Py_BEGIN_ALLOW_THREADS
        r = agentkv_expr_to_dfa(e.code.v, root, off, tables, accepts, max_nfa, max_dfa, seconds);
        Py_END_ALLOW_THREADS
        if (!r) PyErr_NoMemory();
        else {
            PyObject *res = result_tuple(r, order);
            agentkv_dfa_free(r);
            if (res) out = Py_BuildValue("(NO)", res, order);
        }
    }
    free(off); free(tables); free(accepts);
    Py_XDECREF(order);
    enc_free(&e);
    return out;
}

/* configure(types, ranges_node, refuse): the expression classes (Lit, Chars, ByteSet, Seq, Alt, Repeat,
 * Ref, Intersect, Diff, Machine) and the two helpers, once. */
static PyObject *py_configure(PyObject *self, PyObject *args) {
    PyObject *tup, *rn, *rf;
    if (!PyArg_ParseTuple(args, "O!OO", &PyTuple_Type, &tup, &rn, &rf)) return NULL;
    if (PyTuple_GET_SIZE(tup) != N_TYPES) { PyErr_SetString(PyExc_ValueError, "configure takes the 10 expression classes"); return NULL; }
    for (int i = 0; i < N_TYPES; i++) { Py_INCREF(PyTuple_GET_ITEM(tup, i)); Py_XSETREF(types[i], PyTuple_GET_ITEM(tup, i)); }
    Py_INCREF(rn); Py_XSETREF(ranges_node, rn);
    Py_INCREF(rf); Py_XSETREF(refuse, rf);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", py_configure, METH_VARARGS, "the expression classes and helpers"},
    {"encode", py_encode, METH_VARARGS, "an expression as dfa_native.encode writes it"},
    {"expr_to_dfa", py_expr_to_dfa, METH_VARARGS, "an expression's minimal DFA"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "agentkv_expr", NULL, -1, methods};

PyMODINIT_FUNC PyInit_agentkv_expr(void) {
    s_data = PyUnicode_InternFromString("data");
    s_items = PyUnicode_InternFromString("items");
    s_ranges = PyUnicode_InternFromString("ranges");
    s_item = PyUnicode_InternFromString("item");
    s_min = PyUnicode_InternFromString("min");
    s_max = PyUnicode_InternFromString("max");
    s_name = PyUnicode_InternFromString("name");
    s_table = PyUnicode_InternFromString("table");
    s_accept = PyUnicode_InternFromString("accept");
    return PyModule_Create(&module);
}
