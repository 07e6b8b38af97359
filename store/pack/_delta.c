/*
 * _delta: the git-format delta encoder's hot loop, in C.
 *
 * The algorithm is specified in _delta_py.py (the pure-Python fallback); this file
 * runs the same algorithm and must return the same bytes for the same input
 * (tests/store/test_delta.py asserts it). In short: aligned 16-byte blocks of the base go
 * into hash buckets (at most BUCKET_CAP per bucket, evenly spaced); every target
 * position's 16-byte window is looked up, candidates are verified byte-wise and
 * extended forwards, the longest (lowest offset on a tie) wins and is extended
 * backwards into the pending insert bytes; copies and inserts are emitted in git's
 * delta format.
 *
 * Memory safety: every read of base or target is bounded by its length (a window
 * is read only when pos + BLOCK <= target length; an indexed block only when it
 * lies wholly inside the base; extensions are limited by both remaining lengths);
 * the output buffer grows with overflow checks and never beyond the caller's size
 * limit. The index's memory is (buckets + 1 + kept blocks) * 4 bytes, with
 * buckets < 2 * blocks and blocks = base size / 16.
 *
 * The GIL is released around index building and encoding: they touch only the
 * base buffer the index holds an export of (so it cannot be resized or freed),
 * the target buffer held for the call, and memory allocated with PyMem_Raw*.
 * An index is immutable once built, so threads may share it.
 *
 * The delta search's window loop (_search.c, same extension module) calls the index and the
 * encoder through _delta.h.
 */
#include "_delta.h"
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 16
#define BUCKET_CAP 64
#define STOP_LEN 0x10000
#define MAX_COPY 0x10000
#define MAX_INSERT 127
#define MAX_BASE 0xFFFFFFFFULL

#define K1 0x9E3779B97F4A7C15ULL
#define K2 0xC2B2AE3D27D4EB4FULL
#define K3 0x165667B19E3779F9ULL

static inline uint64_t
load64le(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* Bucket of the 16 bytes at p (p[0..15] must be readable). */
static inline size_t
bucket_of(const uint8_t *p, unsigned shift)
{
    uint64_t h = (load64le(p) * K1) ^ (load64le(p + 8) * K2);
    h ^= h >> 29;
    h *= K3;
    return (size_t)(h >> shift);
}

/* Length of the common prefix of a[0..limit) and b[0..limit). */
static inline size_t
common_prefix(const uint8_t *a, const uint8_t *b, size_t limit)
{
    size_t n = 0;
    while (limit - n >= 8) {
        uint64_t x = load64le(a + n) ^ load64le(b + n);
        if (x)
            return n + ((size_t)__builtin_ctzll(x) >> 3);
        n += 8;
    }
    while (n < limit && a[n] == b[n])
        n++;
    return n;
}

/* ---- the index ------------------------------------------------------------------ */

void
pd_dindex_free(dindex *ix)
{
    PyMem_RawFree(ix->starts);
    PyMem_RawFree(ix->offsets);
    ix->starts = NULL;
    ix->offsets = NULL;
    ix->nbuckets = 0;
    ix->kept = 0;
}

/* Build the index of base[0..len); len <= MAX_BASE. Needs no GIL. 0, or -1 when out of memory. */
int
pd_dindex_build(dindex *ix, const uint8_t *base, size_t len)
{
    size_t nblocks = len / BLOCK, nb, b, i, sum, w;
    unsigned bits = 1;

    memset(ix, 0, sizeof(*ix));
    ix->base = base;
    ix->base_len = len;
    if (nblocks == 0)
        return 0;
    while (((size_t)1 << bits) < nblocks)
        bits++;
    nb = (size_t)1 << bits;
    ix->shift = 64 - bits;
    ix->starts = PyMem_RawCalloc(nb + 1, sizeof(uint32_t));
    ix->offsets = PyMem_RawMalloc(nblocks * sizeof(uint32_t));
    if (!ix->starts || !ix->offsets) {
        pd_dindex_free(ix);
        return -1;
    }
    ix->nbuckets = nb;
    /* Count per bucket, then exclusive prefix sums: starts[b] = first slot of bucket b. */
    for (i = 0; i < nblocks; i++)
        ix->starts[bucket_of(base + i * BLOCK, ix->shift)]++;
    sum = 0;
    for (b = 0; b <= nb; b++) {
        size_t c = ix->starts[b];
        ix->starts[b] = (uint32_t)sum;
        sum += c;
    }
    /* Fill in ascending offset order, advancing starts[b] as a cursor ... */
    for (i = 0; i < nblocks; i++) {
        b = bucket_of(base + i * BLOCK, ix->shift);
        ix->offsets[ix->starts[b]++] = (uint32_t)(i * BLOCK);
    }
    /* ... which leaves starts[b] at the start of bucket b + 1: shift back by one. */
    for (b = nb; b > 0; b--)
        ix->starts[b] = ix->starts[b - 1];
    ix->starts[0] = 0;
    /* Cap each bucket at BUCKET_CAP evenly spaced entries, compacting in place: the
     * write slot w + k never passes the read slot s + k * n / CAP >= s + k >= w + k. */
    w = 0;
    for (b = 0; b < nb; b++) {
        size_t s = ix->starts[b], n = ix->starts[b + 1] - s, k;
        ix->starts[b] = (uint32_t)w;
        if (n > BUCKET_CAP) {
            for (k = 0; k < BUCKET_CAP; k++)
                ix->offsets[w++] = ix->offsets[s + (size_t)((uint64_t)k * n / BUCKET_CAP)];
        } else {
            for (k = 0; k < n; k++)
                ix->offsets[w++] = ix->offsets[s + k];
        }
    }
    ix->starts[nb] = (uint32_t)w;
    ix->kept = w;
    if (w < nblocks) {
        uint32_t *shrunk = PyMem_RawRealloc(ix->offsets, w * sizeof(uint32_t));
        if (shrunk)
            ix->offsets = shrunk;
    }
    return 0;
}

size_t
pd_dindex_memory(const dindex *ix)
{
    return ix->nbuckets ? 4 * (ix->nbuckets + 1) + 4 * ix->kept : 0;
}

/* ---- the output buffer ------------------------------------------------------------ */

/* Room for n more bytes: OUT_OVER when that would pass the limit. */
static int
ob_reserve(obuf *o, size_t n)
{
    size_t need, cap;
    uint8_t *p;

    if (n > o->limit - o->len)
        return OUT_OVER;
    need = o->len + n;
    if (need <= o->cap)
        return OUT_OK;
    cap = o->cap < 256 ? 256 : o->cap;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    if (cap > o->limit)
        cap = o->limit;
    p = PyMem_RawRealloc(o->p, cap);
    if (!p)
        return OUT_NOMEM;
    o->p = p;
    o->cap = cap;
    return OUT_OK;
}

static int
emit_varint(obuf *o, size_t v)
{
    uint8_t tmp[10];
    int n = 0, r;

    while (v >= 0x80) {
        tmp[n++] = (uint8_t)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    tmp[n++] = (uint8_t)v;
    if ((r = ob_reserve(o, (size_t)n)) != OUT_OK)
        return r;
    memcpy(o->p + o->len, tmp, (size_t)n);
    o->len += (size_t)n;
    return OUT_OK;
}

static int
emit_inserts(obuf *o, const uint8_t *p, size_t n)
{
    int r;

    while (n) {
        size_t k = n > MAX_INSERT ? MAX_INSERT : n;
        if ((r = ob_reserve(o, k + 1)) != OUT_OK)
            return r;
        o->p[o->len++] = (uint8_t)k;
        memcpy(o->p + o->len, p, k);
        o->len += k;
        p += k;
        n -= k;
    }
    return OUT_OK;
}

static int
emit_copies(obuf *o, size_t off, size_t n)
{
    int r, i;

    while (n) {
        size_t k = n > MAX_COPY ? MAX_COPY : n;
        uint8_t op[8];
        size_t m = 1;
        op[0] = 0x80;
        for (i = 0; i < 4; i++) {
            uint8_t byte = (uint8_t)((off >> (8 * i)) & 0xFF);
            if (byte) {
                op[m++] = byte;
                op[0] |= (uint8_t)(1 << i);
            }
        }
        if (k != 0x10000) {
            for (i = 0; i < 3; i++) {
                uint8_t byte = (uint8_t)((k >> (8 * i)) & 0xFF);
                if (byte) {
                    op[m++] = byte;
                    op[0] |= (uint8_t)(0x10 << i);
                }
            }
        }
        if ((r = ob_reserve(o, m)) != OUT_OK)
            return r;
        memcpy(o->p + o->len, op, m);
        o->len += m;
        off += k;
        n -= k;
    }
    return OUT_OK;
}

/* ---- the encoder ------------------------------------------------------------------ */

/* Encode the delta from ix's base to t[0..tlen) into o. Needs no GIL. */
int
pd_encode(const dindex *ix, const uint8_t *t, size_t tlen, obuf *o)
{
    const uint8_t *base = ix->base;
    size_t blen = ix->base_len, pos = 0, ins = 0;
    int r;

    if ((r = emit_varint(o, blen)) != OUT_OK || (r = emit_varint(o, tlen)) != OUT_OK)
        return r;
    if (ix->nbuckets && tlen >= BLOCK) {
        size_t last = tlen - BLOCK;
        while (pos <= last) {
            const uint8_t *w = t + pos;
            size_t b = bucket_of(w, ix->shift);
            size_t k, end = ix->starts[b + 1];
            size_t best_len = 0, best_off = 0, back, most;
            for (k = ix->starts[b]; k < end; k++) {
                size_t off = ix->offsets[k], n, room_b, room_t;
                /* off + BLOCK <= blen: only whole blocks are indexed. */
                if (memcmp(base + off, w, BLOCK) != 0)
                    continue;
                room_b = blen - off - BLOCK;
                room_t = tlen - pos - BLOCK;
                n = BLOCK + common_prefix(base + off + BLOCK, w + BLOCK, room_b < room_t ? room_b : room_t);
                if (n > best_len) {
                    best_len = n;
                    best_off = off;
                    if (n >= STOP_LEN)
                        break;
                }
            }
            if (!best_len) {
                pos++;
                continue;
            }
            back = 0;
            most = pos - ins < best_off ? pos - ins : best_off;
            while (back < most && base[best_off - back - 1] == t[pos - back - 1])
                back++;
            if ((r = emit_inserts(o, t + ins, pos - back - ins)) != OUT_OK)
                return r;
            if ((r = emit_copies(o, best_off - back, best_len + back)) != OUT_OK)
                return r;
            pos += best_len;
            ins = pos;
        }
    }
    return emit_inserts(o, t + ins, tlen - ins);
}

/* ---- the Python type ------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    Py_buffer view;       /* the base, exported for the index's whole life */
    int has_view;
    dindex ix;
    Py_ssize_t base_size;
    Py_ssize_t memory;
} DeltaIndexObject;

static void
DeltaIndex_dealloc(DeltaIndexObject *self)
{
    pd_dindex_free(&self->ix);
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
DeltaIndex_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *base;
    DeltaIndexObject *self;
    int rc;

    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "DeltaIndex() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O:DeltaIndex", &base))
        return NULL;
    self = (DeltaIndexObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    if (PyObject_GetBuffer(base, &self->view, PyBUF_SIMPLE) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->has_view = 1;
    if ((unsigned long long)self->view.len > MAX_BASE) {
        PyErr_Format(PyExc_OverflowError, "delta base of %zd bytes is larger than %llu bytes",
                     self->view.len, MAX_BASE);
        Py_DECREF(self);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = pd_dindex_build(&self->ix, (const uint8_t *)self->view.buf, (size_t)self->view.len);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->base_size = self->view.len;
    self->memory = (Py_ssize_t)pd_dindex_memory(&self->ix);
    return (PyObject *)self;
}

PyDoc_STRVAR(create_delta_doc,
"create_delta(target, max_size=-1, /)\n--\n\n"
"The delta from this index's base to target (a bytes-like object), in git's format;\n"
"None when it would be longer than max_size bytes (-1: no limit).");

static PyObject *
DeltaIndex_create_delta(DeltaIndexObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer tv;
    Py_ssize_t max_size = -1;
    obuf o = {NULL, 0, 0, SIZE_MAX};
    PyObject *result;
    int r;

    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "create_delta() takes 1 or 2 positional arguments (%zd given)", nargs);
        return NULL;
    }
    if (nargs == 2) {
        max_size = PyLong_AsSsize_t(args[1]);
        if (max_size == -1 && PyErr_Occurred())
            return NULL;
        if (max_size < -1) {
            PyErr_Format(PyExc_ValueError, "max_size must be >= 0, or -1 for no limit, not %zd", max_size);
            return NULL;
        }
        if (max_size >= 0)
            o.limit = (size_t)max_size;
    }
    if (PyObject_GetBuffer(args[0], &tv, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    r = pd_encode(&self->ix, (const uint8_t *)tv.buf, (size_t)tv.len, &o);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&tv);
    if (r == OUT_OK)
        result = PyBytes_FromStringAndSize((const char *)o.p, (Py_ssize_t)o.len);
    else if (r == OUT_OVER)
        result = Py_NewRef(Py_None);
    else
        result = PyErr_NoMemory();
    PyMem_RawFree(o.p);
    return result;
}

static PyMethodDef DeltaIndex_methods[] = {
    {"create_delta", (PyCFunction)(void (*)(void))DeltaIndex_create_delta, METH_FASTCALL, create_delta_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef DeltaIndex_members[] = {
    {"base_size", T_PYSSIZET, offsetof(DeltaIndexObject, base_size), READONLY, "length of the base in bytes"},
    {"memory", T_PYSSIZET, offsetof(DeltaIndexObject, memory), READONLY,
     "bytes taken by the index (not counting the base it refers to)"},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(DeltaIndex_doc,
"DeltaIndex(base, /)\n--\n\n"
"The block index of one delta base (a contiguous bytes-like object of at most\n"
"MAX_BASE bytes). It keeps an export of base's buffer for its whole life.");

static PyTypeObject DeltaIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "packyard.store.pack._delta.DeltaIndex",
    .tp_basicsize = sizeof(DeltaIndexObject),
    .tp_dealloc = (destructor)DeltaIndex_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = DeltaIndex_doc,
    .tp_methods = DeltaIndex_methods,
    .tp_members = DeltaIndex_members,
    .tp_new = DeltaIndex_new,
};

static struct PyModuleDef delta_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "packyard.store.pack._delta",
    .m_doc = "git-format delta encoder and the delta search's window loop (C); specified in _delta_py.py "
             "and search.py",
    .m_size = -1,
    .m_methods = pd_search_methods,
};

PyMODINIT_FUNC
PyInit__delta(void)
{
    PyObject *m, *max_base;
    int rc;

    if (PyType_Ready(&DeltaIndexType) < 0)
        return NULL;
    m = PyModule_Create(&delta_module);
    if (!m)
        return NULL;
    max_base = PyLong_FromUnsignedLongLong(MAX_BASE);
    rc = (!max_base
          || PyModule_AddObjectRef(m, "MAX_BASE", max_base) < 0
          || PyModule_AddObjectRef(m, "DeltaIndex", (PyObject *)&DeltaIndexType) < 0
          || PyModule_AddIntConstant(m, "BLOCK", BLOCK) < 0
          || PyModule_AddIntConstant(m, "BUCKET_CAP", BUCKET_CAP) < 0
          || PyModule_AddIntConstant(m, "STOP_LEN", STOP_LEN) < 0
          || PyModule_AddIntConstant(m, "MAX_COPY", MAX_COPY) < 0
          || PyModule_AddIntConstant(m, "MAX_INSERT", MAX_INSERT) < 0) ? -1 : 0;
    Py_XDECREF(max_base);
    if (rc < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
