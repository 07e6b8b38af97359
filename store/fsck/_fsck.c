/* The hot part of store/fsck: the fast path for a clean tree (store/fsck/rules.py check_tree_fast is the
 * specification and the fallback; tests/workers/test_fsck_rules.py checks that both give the same answer).
 *
 * tree_scan(data, allow_664) -> None | (blob ids, tree ids, specials)
 *   None: the tree is not certainly clean (the exact rules must judge it);
 *   otherwise the ids it links to, and (name, id, is a symlink) for each name that looks special (starts
 *   with '.' or a byte >= 0x80, or holds '~' or '\\'), which the caller judges with git's name rules.
 *
 * The link sets' compact form (store/fsck/linkset.py is the specification and the fallback;
 * tests/store/test_fsck_linkset.py checks that both give the same bytes): object ids packed 20 bytes each.
 * sort_unique20(ids) -> bytes              sorted, each id once
 * difference20(a, b) -> bytes              ids of sorted-unique a not in sorted-unique b
 * select20(ids, types, t) -> bytes         the ids whose byte in types is t (ids[20*i:20*i+20], types[i])
 * idx_find(idx, oid, lo, hi) -> int        the position of oid among a v2 .idx's ids lo..hi-1 (its fan-out
 *                                          bucket), or -1: store/pack/idxread.py's IdxV2.find is the Python
 *                                          (tests/store/test_pack_read.py compares them)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static int mode_kind(const unsigned char *m, Py_ssize_t n, int allow_664)
{
    /* 1 blob, 2 tree, 3 gitlink, 0 not a standard mode */
    if (n == 6 && memcmp(m, "100644", 6) == 0) return 1;
    if (n == 6 && memcmp(m, "100755", 6) == 0) return 1;
    if (n == 6 && memcmp(m, "120000", 6) == 0) return 1;
    if (n == 5 && memcmp(m, "40000", 5) == 0) return 2;
    if (n == 6 && memcmp(m, "160000", 6) == 0) return 3;
    if (allow_664 && n == 6 && memcmp(m, "100664", 6) == 0) return 1;
    return 0;
}

/* bytes comparison of name1 (+ '/' if dir1) with name2 (+ '/' if dir2), as Python compares the keys */
static int key_cmp(const unsigned char *a, Py_ssize_t la, int da, const unsigned char *b, Py_ssize_t lb, int db)
{
    Py_ssize_t ka = la + (da ? 1 : 0), kb = lb + (db ? 1 : 0);
    Py_ssize_t n = ka < kb ? ka : kb;
    for (Py_ssize_t i = 0; i < n; i++) {
        int ca = i < la ? a[i] : '/';
        int cb = i < lb ? b[i] : '/';
        if (ca != cb) return ca < cb ? -1 : 1;
    }
    return ka < kb ? -1 : (ka > kb ? 1 : 0);
}

typedef struct { const unsigned char *name; Py_ssize_t len; int kind; } entry_t;

static PyObject *tree_scan(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    int allow_664 = 0;
    if (!PyArg_ParseTuple(args, "y*|p", &buf, &allow_664))
        return NULL;
    const unsigned char *d = buf.buf;
    Py_ssize_t size = buf.len, pos = 0, nent = 0, cap = 64, zeros = 0;
    PyObject *blobs = NULL, *trees = NULL, *specials = NULL, *result = NULL;
    entry_t *ents = PyMem_Malloc(cap * sizeof(entry_t));
    if (!ents) { PyBuffer_Release(&buf); return PyErr_NoMemory(); }
    for (Py_ssize_t i = 0; i < size; i++) {     /* 21 NUL bytes in a row: a null id (or inside ids: not fast) */
        zeros = d[i] ? 0 : zeros + 1;
        if (zeros >= 21) goto not_fast;
    }
    blobs = PyList_New(0); trees = PyList_New(0); specials = PyList_New(0);
    if (!blobs || !trees || !specials) goto error;
    while (pos < size) {
        Py_ssize_t sp = pos;
        while (sp < size && sp - pos < 7 && d[sp] != ' ') sp++;
        if (sp >= size || d[sp] != ' ') goto not_fast;
        int kind = mode_kind(d + pos, sp - pos, allow_664);
        if (!kind) goto not_fast;
        Py_ssize_t ns = sp + 1, ne = ns;
        while (ne < size && d[ne] != 0) {
            if (d[ne] == '/') goto not_fast;
            ne++;
        }
        if (ne == ns || ne >= size || ne + 21 > size) goto not_fast;
        const unsigned char *name = d + ns;
        Py_ssize_t len = ne - ns;
        if (nent == cap) {
            cap *= 2;
            entry_t *grown = PyMem_Realloc(ents, cap * sizeof(entry_t));
            if (!grown) { PyErr_NoMemory(); goto error; }
            ents = grown;
        }
        if (nent > 0) {
            entry_t *p = &ents[nent - 1];
            if (key_cmp(p->name, p->len, p->kind == 2, name, len, kind == 2) >= 0) goto not_fast;
        }
        if (kind == 2) {       /* a file of the same name sorts before, past names that extend it with < '/' */
            for (Py_ssize_t k = nent - 1; k >= 0; k--) {
                entry_t *p = &ents[k];
                if (p->len < len || memcmp(p->name, name, len) != 0) break;
                if (p->len == len) goto not_fast;
            }
        }
        ents[nent].name = name; ents[nent].len = len; ents[nent].kind = kind;
        nent++;
        int special = name[0] == '.' || name[0] >= 0x80 || memchr(name, '~', len) || memchr(name, '\\', len);
        if (special) {
            int is_link = sp - pos == 6 && memcmp(d + pos, "120000", 6) == 0;
            PyObject *s = Py_BuildValue("(y#y#O)", (const char *)name, len, (const char *)d + ne + 1,
                                        (Py_ssize_t)20, is_link ? Py_True : Py_False);
            if (!s || PyList_Append(specials, s) < 0) { Py_XDECREF(s); goto error; }
            Py_DECREF(s);
        }
        if (kind != 3) {
            PyObject *oid = PyBytes_FromStringAndSize((const char *)d + ne + 1, 20);
            if (!oid || PyList_Append(kind == 2 ? trees : blobs, oid) < 0) { Py_XDECREF(oid); goto error; }
            Py_DECREF(oid);
        }
        pos = ne + 21;
    }
    result = PyTuple_Pack(3, blobs, trees, specials);
    goto done;
not_fast:
    result = Py_None;
    Py_INCREF(result);
    goto done;
error:
    result = NULL;
done:
    Py_XDECREF(blobs); Py_XDECREF(trees); Py_XDECREF(specials);
    PyMem_Free(ents);
    PyBuffer_Release(&buf);
    return result;
}

static void swap20(unsigned char *a, unsigned char *b)
{
    unsigned char t[20];
    memcpy(t, a, 20); memcpy(a, b, 20); memcpy(b, t, 20);
}

/* Records a[0..n) of 20 bytes, equal in their first `depth` bytes: sorted in place. An in-place MSD radix
 * sort (American flag sort) on one byte a level, insertion sort for small runs: object ids are uniform, so
 * each level splits a run 256 ways and 320k ids take about three passes; qsort with a memcmp callback
 * took ~18 comparisons an id (2.5 s of index-pack --strict's 13 s on git-v2.0.0, profiled). */
static void flag_sort20(unsigned char *a, Py_ssize_t n, int depth)
{
    if (n < 24 || depth >= 20) {
        unsigned char t[20];
        for (Py_ssize_t i = 1; i < n; i++) {
            Py_ssize_t j = i;
            memcpy(t, a + 20 * i, 20);
            while (j > 0 && memcmp(a + 20 * (j - 1) + depth, t + depth, 20 - depth) > 0) {
                memcpy(a + 20 * j, a + 20 * (j - 1), 20);
                j--;
            }
            memcpy(a + 20 * j, t, 20);
        }
        return;
    }
    Py_ssize_t count[256] = {0}, start[256], next[256];
    for (Py_ssize_t i = 0; i < n; i++)
        count[a[20 * i + depth]]++;
    if (count[a[depth]] == n) {     /* one bucket: the same id many times (a link repeated by every tree)? */
        Py_ssize_t i = 1;
        while (i < n && memcmp(a + 20 * i + depth, a + depth, 20 - depth) == 0)
            i++;
        if (i == n)
            return;                 /* all equal: sorted; without this it recursed down all 20 bytes */
        flag_sort20(a, n, depth + 1);
        return;
    }
    Py_ssize_t at = 0;
    for (int b = 0; b < 256; b++) {
        start[b] = next[b] = at;
        at += count[b];
    }
    for (int b = 0; b < 256; b++) {
        Py_ssize_t end = start[b] + count[b];
        while (next[b] < end) {                 /* each swap puts one record in its bucket for good */
            int v = a[20 * next[b] + depth];
            if (v == b)
                next[b]++;
            else
                swap20(a + 20 * next[b], a + 20 * next[v]++);
        }
    }
    for (int b = 0; b < 256; b++)
        if (count[b] > 1)
            flag_sort20(a + 20 * start[b], count[b], depth + 1);
}

static PyObject *sort_unique20(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf))
        return NULL;
    if (buf.len % 20) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "sort_unique20: length is not a multiple of 20");
        return NULL;
    }
    Py_ssize_t n = buf.len / 20, k = 0;
    PyObject *out = PyBytes_FromStringAndSize(NULL, buf.len);
    if (!out) { PyBuffer_Release(&buf); return NULL; }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    memcpy(o, buf.buf, buf.len);
    PyBuffer_Release(&buf);
    Py_BEGIN_ALLOW_THREADS
    flag_sort20(o, n, 0);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (k > 0 && memcmp(o + 20 * (k - 1), o + 20 * i, 20) == 0)
            continue;
        if (k != i)
            memcpy(o + 20 * k, o + 20 * i, 20);
        k++;
    }
    Py_END_ALLOW_THREADS
    if (_PyBytes_Resize(&out, 20 * k) < 0)
        return NULL;
    return out;
}

static PyObject *difference20(PyObject *self, PyObject *args)
{
    Py_buffer a, b;
    if (!PyArg_ParseTuple(args, "y*y*", &a, &b))
        return NULL;
    if (a.len % 20 || b.len % 20) {
        PyBuffer_Release(&a); PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "difference20: length is not a multiple of 20");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, a.len);
    if (!out) { PyBuffer_Release(&a); PyBuffer_Release(&b); return NULL; }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    const unsigned char *pa = a.buf, *pb = b.buf;
    Py_ssize_t na = a.len / 20, nb = b.len / 20, i = 0, j = 0, k = 0;
    while (i < na) {
        int c = j < nb ? memcmp(pa + 20 * i, pb + 20 * j, 20) : -1;
        if (c < 0) { memcpy(o + 20 * k++, pa + 20 * i++, 20); }
        else if (c == 0) { i++; j++; }
        else j++;
    }
    PyBuffer_Release(&a); PyBuffer_Release(&b);
    if (_PyBytes_Resize(&out, 20 * k) < 0)
        return NULL;
    return out;
}

static PyObject *select20(PyObject *self, PyObject *args)
{
    Py_buffer ids, types;
    int t;
    if (!PyArg_ParseTuple(args, "y*y*i", &ids, &types, &t))
        return NULL;
    Py_ssize_t n = ids.len / 20;
    if (types.len < n) n = types.len;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 20 * n);
    if (!out) { PyBuffer_Release(&ids); PyBuffer_Release(&types); return NULL; }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    const unsigned char *pi = ids.buf, *pt = types.buf;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (pt[i] == t)
            memcpy(o + 20 * k++, pi + 20 * i, 20);
    PyBuffer_Release(&ids); PyBuffer_Release(&types);
    if (_PyBytes_Resize(&out, 20 * k) < 0)
        return NULL;
    return out;
}

/* The ids of a v2 .idx start after its 8-byte header and 256-entry fan-out table. */
#define IDX_NAMES_AT (8 + 4 * 256)

static PyObject *idx_find(PyObject *self, PyObject *args)
{
    Py_buffer idx, oid;
    Py_ssize_t lo, hi;
    if (!PyArg_ParseTuple(args, "y*y*nn", &idx, &oid, &lo, &hi))
        return NULL;
    if (lo < 0 || (hi > lo && IDX_NAMES_AT + 20 * hi > idx.len)) {
        PyBuffer_Release(&idx); PyBuffer_Release(&oid);
        PyErr_SetString(PyExc_ValueError, "idx_find: the range of ids is not inside the index");
        return NULL;
    }
    if (oid.len != 20)   /* (no id of another length is in an index) */
        lo = hi;
    const unsigned char *names = (const unsigned char *)idx.buf + IDX_NAMES_AT, *want = oid.buf;
    Py_ssize_t found = -1;
    while (lo < hi) {
        Py_ssize_t mid = lo + ((hi - lo) >> 1);
        int c = memcmp(names + 20 * mid, want, 20);
        if (c < 0)
            lo = mid + 1;
        else if (c == 0) {
            found = mid;
            break;
        } else
            hi = mid;
    }
    PyBuffer_Release(&idx); PyBuffer_Release(&oid);
    return PyLong_FromSsize_t(found);
}

static PyMethodDef methods[] = {
    {"tree_scan", tree_scan, METH_VARARGS, "Fast path of fsck_tree for a clean tree: None or (blobs, trees, [(name, id, is_link)] of special names)."},
    {"sort_unique20", sort_unique20, METH_VARARGS, "Packed 20-byte ids sorted, each once."},
    {"difference20", difference20, METH_VARARGS, "Ids of sorted-unique a that are not in sorted-unique b."},
    {"select20", select20, METH_VARARGS, "The ids whose type byte is t."},
    {"idx_find", idx_find, METH_VARARGS, "The position of a 20-byte id among a v2 .idx's ids lo..hi-1, or -1."},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fsck", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fsck(void) { return PyModule_Create(&module); }
