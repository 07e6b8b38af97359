/*
 * _search.c: the delta search's window loop (search.py's _Segment.run_python, in C) and the name hash.
 *
 * The same loop as store/pack/search.py's pure-Python _Segment.run_python -- that code is the
 * specification and the fallback; tests assert both give the same result. The window holds
 * the candidates' bytes (a reference to each bytes object read), their depth and, once tried
 * as a base, their block index. Reading an object (``read(i)``) and compressing a delta or a
 * whole object (``compress(data, level)``) call back into Python; building indexes and
 * encoding run with the GIL released.
 */
#include "_delta.h"

#include <string.h>

#define DELTA_OVERHEAD 20   /* search.py's DELTA_OVERHEAD */

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
        pd_dindex_free(&w->ix);
    w->has_ix = 0;
}

typedef struct {
    const uint8_t *types;
    const int32_t *max_depth;
    const int32_t *groups;    /* NULL: no source packs (not reusing) */
    const uint8_t *fixed;
    const uint8_t *keep_whole;
    const int32_t *islands;   /* NULL: no delta islands; else each candidate's island class */
    const uint8_t *island_ok; /* island_ok[trg_class * nclasses + base_class]: may trg rest on base? */
    Py_ssize_t nclasses;
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
"               window_memory, progress[, islands, island_ok], /)\n--\n\n"
"The delta search's window loop over ``order`` (see store/pack/search.py, _Segment.run_python, which\n"
"this runs in C). Returns (targets, bases, depths, delta_sizes, zdeltas, tried, saved, peak,\n"
"whole, zwholes), lists and ints.");

static PyObject *
search_segment(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *order_seq = NULL, *read, *compress, *level, *progress;
    Py_buffer bt = {0}, bd = {0}, bg = {0}, bf = {0}, bk = {0}, bi = {0}, bo = {0};
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

    if (nargs != 12 && nargs != 14) {
        PyErr_Format(PyExc_TypeError, "search_segment() takes 12 or 14 positional arguments (%zd given)", nargs);
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
    if (nargs == 14 && args[12] != Py_None) {   /* delta islands (search.py: Candidates.islands) */
        Py_ssize_t nc = 0;
        if (PyObject_GetBuffer(args[12], &bi, PyBUF_SIMPLE) < 0 || PyObject_GetBuffer(args[13], &bo, PyBUF_SIMPLE) < 0)
            goto done;
        while (nc * nc < bo.len)
            nc++;
        if (bi.len != 4 * c.n || nc * nc != bo.len || nc == 0) {
            PyErr_SetString(PyExc_ValueError, "search_segment: island arrays do not fit the candidates");
            goto done;
        }
        for (k = 0; k < c.n; k++) {
            int32_t cls = ((const int32_t *)bi.buf)[k];
            if (cls < 0 || cls >= nc) {
                PyErr_SetString(PyExc_ValueError, "search_segment: island class out of range");
                goto done;
            }
        }
        c.islands = bi.buf;
        c.island_ok = bo.buf;
        c.nclasses = nc;
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
                if (c.islands && !c.island_ok[(Py_ssize_t)c.islands[t] * c.nclasses + c.islands[s->i]])
                    continue;       /* another island lacks this base (git's in_same_island) */
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
                    rc = pd_dindex_build(&s->ix, (const uint8_t *)PyBytes_AS_STRING(s->data), s->size);
                    Py_END_ALLOW_THREADS
                    if (rc < 0) {
                        PyErr_NoMemory();
                        Py_DECREF(data);
                        goto done;
                    }
                    s->has_ix = 1;
                    s->mem += pd_dindex_memory(&s->ix);
                    mem += pd_dindex_memory(&s->ix);
                    if (mem > peak)
                        peak = mem;
                }
                tried++;
                o.len = 0;
                o.limit = (size_t)limit;
                Py_BEGIN_ALLOW_THREADS
                rc = pd_encode(&s->ix, tbuf, tsize, &o);
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
    if (bi.obj) PyBuffer_Release(&bi);
    if (bo.obj) PyBuffer_Release(&bo);
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

PyMethodDef pd_search_methods[] = {
    {"search_segment", (PyCFunction)(void (*)(void))search_segment, METH_FASTCALL, search_segment_doc},
    {"name_hash", (PyCFunction)name_hash, METH_O, name_hash_doc},
    {NULL, NULL, 0, NULL},
};
