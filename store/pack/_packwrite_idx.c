/*
 * _packwrite_idx.c: the tables of a pack's .idx v2 and .rev in C (idxwrite.write_index specifies them and builds
 * them in Python without this extension; the files are the same bytes, git's index-pack's).
 *
 * index_tables(oids, offsets 'Q', crcs 'I', off32_limit) -> (fan-out, sorted ids, CRC32s, 31-bit offsets,
 * 64-bit offsets, rev positions, order): every table but the last two as the file holds it (big-endian);
 * positions and order (idx order -> pack order index) in native 'I'. The order is stable: equal ids keep
 * pack order. Sorted by the first two bytes of the id into buckets (counting sort), then each bucket
 * (a handful of ids) by insertion sort.
 */
#include "_walk.h"

static inline void
put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static int
get_items(PyObject *o, Py_buffer *v, Py_ssize_t itemsize, const char *what)
{
    if (PyObject_GetBuffer(o, v, PyBUF_FORMAT) < 0)
        return -1;
    if (v->itemsize != itemsize || v->len % itemsize) {
        PyErr_Format(PyExc_TypeError, "index_tables: %s must hold %zd-byte items", what, itemsize);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

PyObject *
index_tables(PyObject *module, PyObject *args)
{
    PyObject *oo, *offo, *co, *result = NULL;
    unsigned long long limit;
    Py_buffer ov = {0}, offv = {0}, cv = {0};
    uint32_t *count = NULL, *order = NULL;
    PyObject *fan = NULL, *ids = NULL, *crc = NULL, *small = NULL, *large = NULL, *pos = NULL, *ord = NULL;
    if (!PyArg_ParseTuple(args, "OOOK", &oo, &offo, &co, &limit))
        return NULL;
    if (PyObject_GetBuffer(oo, &ov, PyBUF_SIMPLE) < 0)
        return NULL;
    if (get_items(offo, &offv, 8, "offsets") < 0) {
        PyBuffer_Release(&ov);
        return NULL;
    }
    if (get_items(co, &cv, 4, "crcs") < 0) {
        PyBuffer_Release(&offv);
        PyBuffer_Release(&ov);
        return NULL;
    }
    Py_ssize_t n = offv.len / 8;
    if (ov.len != 20 * n || cv.len != 4 * n || n >= (Py_ssize_t)1 << 31) {
        PyErr_SetString(PyExc_ValueError, "index_tables: ids, offsets and crcs disagree");
        goto done;
    }
    const uint8_t *oid = ov.buf;
    const uint64_t *offs = offv.buf;
    const uint32_t *crcs = cv.buf;
    size_t cells = n ? (size_t)n : 1;
    count = PyMem_RawCalloc(65537, sizeof(uint32_t));
    order = PyMem_RawMalloc(cells * sizeof(uint32_t));
    if (!count || !order) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t nlarge = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        count[((oid[20 * i] << 8) | oid[20 * i + 1]) + 1]++;
        if ((offs[i] >> 31) || offs[i] > limit)
            nlarge++;
    }
    for (int b = 0; b < 65536; b++)
        count[b + 1] += count[b];
    fan = PyBytes_FromStringAndSize(NULL, 1024);
    ids = PyBytes_FromStringAndSize(NULL, 20 * n);
    crc = PyBytes_FromStringAndSize(NULL, 4 * n);
    small = PyBytes_FromStringAndSize(NULL, 4 * n);
    large = PyBytes_FromStringAndSize(NULL, 8 * nlarge);
    pos = PyBytes_FromStringAndSize(NULL, 4 * n);
    ord = PyBytes_FromStringAndSize(NULL, 4 * n);
    if (!fan || !ids || !crc || !small || !large || !pos || !ord)
        goto done;
    {
        uint32_t *next = PyMem_RawMalloc(65536 * sizeof(uint32_t));
        if (!next) {
            PyErr_NoMemory();
            goto done;
        }
        memcpy(next, count, 65536 * sizeof(uint32_t));
        for (Py_ssize_t i = 0; i < n; i++)
            order[next[(oid[20 * i] << 8) | oid[20 * i + 1]]++] = (uint32_t)i;
        PyMem_RawFree(next);
    }
    for (int b = 0; b < 65536; b++) {          /* insertion sort in each bucket: stable */
        for (uint32_t a = count[b] + 1; a < count[b + 1]; a++) {
            uint32_t x = order[a], j = a;
            while (j > count[b] && memcmp(oid + 20 * (size_t)order[j - 1], oid + 20 * (size_t)x, 20) > 0) {
                order[j] = order[j - 1];
                j--;
            }
            order[j] = x;
        }
    }
    uint8_t *f = (uint8_t *)PyBytes_AS_STRING(fan), *s = (uint8_t *)PyBytes_AS_STRING(ids);
    uint8_t *c = (uint8_t *)PyBytes_AS_STRING(crc), *sm = (uint8_t *)PyBytes_AS_STRING(small);
    uint8_t *lg = (uint8_t *)PyBytes_AS_STRING(large);
    uint32_t *ps = (uint32_t *)PyBytes_AS_STRING(pos), *od = (uint32_t *)PyBytes_AS_STRING(ord);
    for (int b = 0; b < 256; b++)
        put32(f + 4 * b, count[(b + 1) << 8]);
    uint32_t nl = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        uint32_t i = order[k];
        memcpy(s + 20 * k, oid + 20 * (size_t)i, 20);
        put32(c + 4 * k, crcs[i]);
        uint64_t off = offs[i];
        if ((off >> 31) || off > limit) {
            put32(sm + 4 * k, 0x80000000u | nl);
            put32(lg + 8 * nl, (uint32_t)(off >> 32));
            put32(lg + 8 * nl + 4, (uint32_t)off);
            nl++;
        } else {
            put32(sm + 4 * k, (uint32_t)off);
        }
        ps[i] = (uint32_t)k;
        od[k] = i;
    }
    result = PyTuple_Pack(7, fan, ids, crc, small, large, pos, ord);
done:
    Py_XDECREF(fan);
    Py_XDECREF(ids);
    Py_XDECREF(crc);
    Py_XDECREF(small);
    Py_XDECREF(large);
    Py_XDECREF(pos);
    Py_XDECREF(ord);
    PyMem_RawFree(count);
    PyMem_RawFree(order);
    PyBuffer_Release(&cv);
    PyBuffer_Release(&offv);
    PyBuffer_Release(&ov);
    return result;
}
