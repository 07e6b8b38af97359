/*
 * _delta: the git-format delta encoder's hot loop, in C.
 *
 * The algorithm is specified in _delta_py.py (the pure-Python fallback); this file
 * runs the same algorithm and must return the same bytes for the same input
 * (tests/test_delta.py asserts it). In short: aligned 16-byte blocks of the base go
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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
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

typedef struct {
    const uint8_t *base;
    size_t base_len;
    unsigned shift;       /* 64 - bits */
    size_t nbuckets;      /* 0 when the base holds no whole block */
    uint32_t *starts;     /* nbuckets + 1 entries: bucket b is offsets[starts[b] .. starts[b+1]) */
    uint32_t *offsets;    /* kept block offsets, by bucket, ascending within a bucket */
    size_t kept;
} dindex;

static void
dindex_free(dindex *ix)
{
    PyMem_RawFree(ix->starts);
    PyMem_RawFree(ix->offsets);
    ix->starts = NULL;
    ix->offsets = NULL;
    ix->nbuckets = 0;
    ix->kept = 0;
}

/* Build the index of base[0..len); len <= MAX_BASE. Needs no GIL. 0, or -1 when out of memory. */
static int
dindex_build(dindex *ix, const uint8_t *base, size_t len)
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
        dindex_free(ix);
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

static size_t
dindex_memory(const dindex *ix)
{
    return ix->nbuckets ? 4 * (ix->nbuckets + 1) + 4 * ix->kept : 0;
}

/* ---- the output buffer ------------------------------------------------------------ */

enum { OUT_OK = 0, OUT_OVER = 1, OUT_NOMEM = -1 };

typedef struct {
    uint8_t *p;
    size_t len, cap;
    size_t limit;         /* never hold more than this many bytes (SIZE_MAX: no limit) */
} obuf;

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
static int
encode(const dindex *ix, const uint8_t *t, size_t tlen, obuf *o)
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
    dindex_free(&self->ix);
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
    rc = dindex_build(&self->ix, (const uint8_t *)self->view.buf, (size_t)self->view.len);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->base_size = self->view.len;
    self->memory = (Py_ssize_t)dindex_memory(&self->ix);
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
    r = encode(&self->ix, (const uint8_t *)tv.buf, (size_t)tv.len, &o);
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

/* ---- the window search (search.py's _Segment.run, in C) ------------------------------
 *
 * The same loop as store/pack/search.py's pure-Python _Segment.run -- that code is the
 * specification and the fallback; tests assert both give the same result. The window holds
 * the candidates' bytes (a reference to each bytes object read), their depth and, once tried
 * as a base, their block index. Reading an object (``read(i)``) and compressing a delta or a
 * whole object (``compress(data, level)``) call back into Python; building indexes and
 * encoding run with the GIL released.
 */

#define DELTA_OVERHEAD 20
#define DELTA_TYPE_TREE 2
#define DELTA_TYPE_BLOB 3

typedef struct {
    Py_ssize_t i;         /* candidate */
    PyObject *data;       /* its bytes (a reference held by the window) */
    size_t size;
    int depth;
    int has_ix;
    dindex ix;
    size_t mem;           /* data + index bytes */
    int group;
} wslot;

static void
wslot_clear(wslot *w)
{
    Py_CLEAR(w->data);
    if (w->has_ix)
        dindex_free(&w->ix);
    w->has_ix = 0;
}

typedef struct {
    const uint8_t *types;
    const int32_t *max_depth;
    const int32_t *groups;    /* NULL: no source packs (not reusing) */
    const uint8_t *fixed;
    const uint8_t *keep_whole;
    Py_ssize_t n;
} cand_arrays;

static int
append_new(PyObject *list, PyObject *item)
{
    int rc;
    if (!item)
        return -1;
    rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

/* compress(bytes(buf[0..len)), level) */
static PyObject *
compress_buf(PyObject *compress, const uint8_t *buf, size_t len, PyObject *level)
{
    PyObject *b = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len), *z;
    if (!b)
        return NULL;
    z = PyObject_CallFunctionObjArgs(compress, b, level, NULL);
    Py_DECREF(b);
    return z;
}

PyDoc_STRVAR(search_segment_doc,
"search_segment(order, types, max_depth, groups, fixed, keep_whole, read, compress, level, window,\n"
"               window_memory, progress, /)\n--\n\n"
"The delta search's window loop over ``order`` (see store/pack/search.py, _Segment.run, which\n"
"this runs in C). Returns (targets, bases, depths, delta_sizes, zdeltas, tried, saved, peak,\n"
"whole, zwholes), lists and ints.");

static PyObject *
search_segment(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *order_seq = NULL, *read, *compress, *level, *progress;
    Py_buffer bt = {0}, bd = {0}, bg = {0}, bf = {0}, bk = {0};
    cand_arrays c = {0};
    Py_ssize_t window, mem_limit, norder, done;
    PyObject *targets = NULL, *bases = NULL, *depths = NULL, *dsizes = NULL, *zdeltas = NULL;
    PyObject *whole = NULL, *zwholes = NULL, *result = NULL;
    wslot *win = NULL;
    Py_ssize_t nwin = 0, cap, keep, k;
    long long tried = 0, saved = 0;
    size_t mem = 0, peak = 0;
    int wtype = -1;
    obuf best_o = {NULL, 0, 0, SIZE_MAX}, o = {NULL, 0, 0, SIZE_MAX};

    if (nargs != 12) {
        PyErr_Format(PyExc_TypeError, "search_segment() takes 12 positional arguments (%zd given)", nargs);
        return NULL;
    }
    read = args[6];
    compress = args[7];
    level = args[8];
    window = PyLong_AsSsize_t(args[9]);
    mem_limit = PyLong_AsSsize_t(args[10]);
    progress = args[11];
    if ((window == -1 || mem_limit == -1) && PyErr_Occurred())
        return NULL;
    if (window < 2 || mem_limit < 0) {
        PyErr_SetString(PyExc_ValueError, "search_segment needs window >= 2 and window_memory >= 0");
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &bt, PyBUF_SIMPLE) < 0)
        goto done;
    if (PyObject_GetBuffer(args[2], &bd, PyBUF_SIMPLE) < 0)
        goto done;
    if (PyObject_GetBuffer(args[5], &bk, PyBUF_SIMPLE) < 0)
        goto done;
    c.n = bt.len;
    if (bd.len != 4 * c.n || bk.len != c.n) {
        PyErr_SetString(PyExc_ValueError, "search_segment: candidate arrays differ in length");
        goto done;
    }
    c.types = bt.buf;
    c.max_depth = bd.buf;
    c.keep_whole = bk.buf;
    if (args[3] != Py_None) {
        if (PyObject_GetBuffer(args[3], &bg, PyBUF_SIMPLE) < 0 || PyObject_GetBuffer(args[4], &bf, PyBUF_SIMPLE) < 0)
            goto done;
        if (bg.len != 4 * c.n || bf.len != c.n) {
            PyErr_SetString(PyExc_ValueError, "search_segment: candidate arrays differ in length");
            goto done;
        }
        c.groups = bg.buf;
        c.fixed = bf.buf;
    }
    order_seq = PySequence_Fast(args[0], "search_segment: order must be a sequence");
    if (!order_seq)
        goto done;
    norder = PySequence_Fast_GET_SIZE(order_seq);
    keep = window - 1;
    cap = keep + 2;
    win = PyMem_Calloc((size_t)cap, sizeof(wslot));
    targets = PyList_New(0); bases = PyList_New(0); depths = PyList_New(0); dsizes = PyList_New(0);
    zdeltas = PyList_New(0); whole = PyList_New(0); zwholes = PyList_New(0);
    if (!win || !targets || !bases || !depths || !dsizes || !zdeltas || !whole || !zwholes) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    for (done = 0; done < norder; done++) {
        PyObject *item = PySequence_Fast_GET_ITEM(order_seq, done), *data;
        Py_ssize_t t = PyLong_AsSsize_t(item);
        const uint8_t *tbuf;
        size_t tsize;
        int ttype, max_depth, tgroup, tdepth = 0, rc;
        Py_ssize_t best = -1;
        size_t best_len = 0;

        if (t == -1 && PyErr_Occurred())
            goto done;
        if (t < 0 || t >= c.n) {
            PyErr_Format(PyExc_IndexError, "search_segment: candidate %zd out of range", t);
            goto done;
        }
        if (progress != Py_None && done && done % 1000 == 0) {
            PyObject *r = PyObject_CallFunction(progress, "n", done);
            if (!r)
                goto done;
            Py_DECREF(r);
        }
        data = PyObject_CallFunction(read, "n", t);
        if (!data)
            goto done;
        if (!PyBytes_Check(data)) {
            PyObject *b = PyBytes_FromObject(data);
            Py_DECREF(data);
            if (!b)
                goto done;
            data = b;
        }
        tbuf = (const uint8_t *)PyBytes_AS_STRING(data);
        tsize = (size_t)PyBytes_GET_SIZE(data);
        ttype = c.types[t];
        if (ttype != wtype) {          /* sorted by type: nothing before this one can be its base */
            for (k = 0; k < nwin; k++)
                wslot_clear(&win[k]);
            nwin = 0;
            mem = 0;
            wtype = ttype;
        }
        while (nwin > keep) {
            mem -= win[0].mem;
            wslot_clear(&win[0]);
            memmove(win, win + 1, (size_t)(--nwin) * sizeof(wslot));
        }
        mem += tsize;
        while (mem_limit && mem > (size_t)mem_limit && nwin > 1) {
            mem -= win[0].mem;
            wslot_clear(&win[0]);
            memmove(win, win + 1, (size_t)(--nwin) * sizeof(wslot));
        }
        if (mem > peak)
            peak = mem;
        max_depth = c.max_depth[t];
        if (max_depth > 0) {
            long long half = (long long)(tsize / 2) - DELTA_OVERHEAD;
            tgroup = (c.groups && c.fixed[t]) ? c.groups[t] : -1;
            for (k = nwin - 1; k >= 0; k--) {
                wslot *s = &win[k];
                long long limit;
                int sdepth = s->depth;
                if (sdepth >= max_depth)
                    continue;
                if (tgroup >= 0 && s->group == tgroup)
                    continue;
                if (best < 0)
                    limit = half * (max_depth - sdepth) / max_depth;
                else
                    limit = (long long)best_len * (max_depth - sdepth) / (max_depth - tdepth + 1);
                if (limit <= 0)
                    continue;
                if (s->size < tsize && (long long)(tsize - s->size) >= limit)
                    continue;
                if (tsize < (s->size >> 5))
                    continue;
                if (!s->has_ix) {
                    Py_BEGIN_ALLOW_THREADS
                    rc = dindex_build(&s->ix, (const uint8_t *)PyBytes_AS_STRING(s->data), s->size);
                    Py_END_ALLOW_THREADS
                    if (rc < 0) {
                        PyErr_NoMemory();
                        Py_DECREF(data);
                        goto done;
                    }
                    s->has_ix = 1;
                    s->mem += dindex_memory(&s->ix);
                    mem += dindex_memory(&s->ix);
                    if (mem > peak)
                        peak = mem;
                }
                tried++;
                o.len = 0;
                o.limit = (size_t)limit;
                Py_BEGIN_ALLOW_THREADS
                rc = encode(&s->ix, tbuf, tsize, &o);
                Py_END_ALLOW_THREADS
                if (rc == OUT_NOMEM) {
                    PyErr_NoMemory();
                    Py_DECREF(data);
                    goto done;
                }
                if (rc == OUT_OVER)
                    continue;
                if (best >= 0 && o.len == best_len && sdepth + 1 >= tdepth)
                    continue;          /* same size: only a shallower base is better */
                {
                    obuf tmp = best_o;     /* keep this delta, reuse the old best's buffer next */
                    best_o = o;
                    o = tmp;
                }
                best = k;
                best_len = best_o.len;
                tdepth = sdepth + 1;
            }
        }
        if (best < 0) {
            if (c.keep_whole[t]) {
                if (append_new(whole, PyLong_FromSsize_t(t)) < 0
                        || append_new(zwholes, PyObject_CallFunctionObjArgs(compress, data, level, NULL)) < 0) {
                    Py_DECREF(data);
                    goto done;
                }
            }
            /* append the target to the window */
            win[nwin].i = t;
            win[nwin].data = data;           /* the window takes the reference */
            win[nwin].size = tsize;
            win[nwin].depth = 0;
            win[nwin].has_ix = 0;
            win[nwin].mem = tsize;
            win[nwin].group = c.groups ? c.groups[t] : -1;
            nwin++;
            continue;
        }
        if (append_new(targets, PyLong_FromSsize_t(t)) < 0
                || append_new(bases, PyLong_FromSsize_t(win[best].i)) < 0
                || append_new(depths, PyLong_FromLong(tdepth)) < 0
                || append_new(dsizes, PyLong_FromSize_t(best_len)) < 0
                || append_new(zdeltas, compress_buf(compress, best_o.p, best_len, level)) < 0) {
            Py_DECREF(data);
            goto done;
        }
        saved += (long long)tsize - (long long)best_len;
        if (tdepth >= max_depth) {         /* at the depth limit: nothing may build on it */
            mem -= tsize;
            Py_DECREF(data);
            continue;
        }
        {
            /* The winning base goes to the front, before its delta (tried first next, kept longest). */
            wslot b = win[best];
            memmove(win + best, win + best + 1, (size_t)(nwin - best - 1) * sizeof(wslot));
            nwin--;
            win[nwin].i = t;
            win[nwin].data = data;
            win[nwin].size = tsize;
            win[nwin].depth = tdepth;
            win[nwin].has_ix = 0;
            win[nwin].mem = tsize;
            win[nwin].group = c.groups ? c.groups[t] : -1;
            nwin++;
            win[nwin++] = b;
        }
    }
    result = Py_BuildValue("(OOOOOLLnOO)", targets, bases, depths, dsizes, zdeltas, tried, saved,
                           (Py_ssize_t)peak, whole, zwholes);
done:
    if (win) {
        for (k = 0; k < nwin; k++)
            wslot_clear(&win[k]);
        PyMem_Free(win);
    }
    PyMem_RawFree(o.p);
    PyMem_RawFree(best_o.p);
    Py_XDECREF(order_seq);
    Py_XDECREF(targets); Py_XDECREF(bases); Py_XDECREF(depths); Py_XDECREF(dsizes);
    Py_XDECREF(zdeltas); Py_XDECREF(whole); Py_XDECREF(zwholes);
    if (bt.obj) PyBuffer_Release(&bt);
    if (bd.obj) PyBuffer_Release(&bd);
    if (bg.obj) PyBuffer_Release(&bg);
    if (bf.obj) PyBuffer_Release(&bf);
    if (bk.obj) PyBuffer_Release(&bk);
    return result;
}

PyDoc_STRVAR(name_hash_doc,
"name_hash(name, /)\n--\n\n"
"search.py's name_hash in C: a 32-bit key of a path weighing its last characters most.");

static PyObject *
name_hash(PyObject *self, PyObject *arg)
{
    Py_buffer b;
    uint32_t h = 0;
    Py_ssize_t k;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    for (k = 0; k < b.len; k++) {
        uint8_t ch = ((const uint8_t *)b.buf)[k];
        if (ch == ' ' || (ch >= '\t' && ch <= '\r'))
            continue;
        h = (h >> 2) + ((uint32_t)ch << 24);
    }
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(h);
}

static PyMethodDef module_methods[] = {
    {"search_segment", (PyCFunction)(void (*)(void))search_segment, METH_FASTCALL, search_segment_doc},
    {"name_hash", (PyCFunction)name_hash, METH_O, name_hash_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef delta_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "packyard.store.pack._delta",
    .m_doc = "git-format delta encoder and the delta search's window loop (C); specified in _delta_py.py "
             "and search.py",
    .m_size = -1,
    .m_methods = module_methods,
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
