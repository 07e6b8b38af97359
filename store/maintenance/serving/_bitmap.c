/*
 * _bitmap.c: the reachability bitmaps' closure loop (bitmap.py's build_bitmaps and its commit reads, in C).
 *
 *   bitmap_commits(packs, ids, read) -> (dates 'q', parent counts 'I') as bytes
 *       each commit's committer date and number of parents (walkparse.parse_commit's rules), for the selection;
 *   bitmap_closures(packs, order, selected, read) -> [bytes] or None
 *       the closure of each selected commit (ids, in the order given: oldest first) as little-endian 64-bit
 *       words over the bit order ``order`` (20-byte ids); a finished selected commit's bitmap is ORed in where
 *       a later walk meets it; None if something reached is not in ``order`` (no closure).
 *
 * Objects come from the packs (Reader, CRC32-checked as the walk reads them) or, when not in them, from
 * read(oid) -> (type, data) (loose objects, SHA-1 checked there). The GIL is held throughout: the loop runs
 * after the pack is written, nothing else of the repack runs beside it.
 */
#include "_walk.h"

typedef struct {
    uint32_t *slots;         /* position + 1, 0 = empty */
    size_t mask;
    const uint8_t *order;
    uint64_t seed;
} PosIndex;

static int
pos_init(PosIndex *x, const uint8_t *order, uint32_t n, uint64_t seed)
{
    size_t cap = 1024;
    while (cap < 2 * (size_t)n + 2)
        cap <<= 1;
    x->slots = PyMem_RawCalloc(cap, sizeof(uint32_t));
    if (!x->slots)
        return -1;
    x->mask = cap - 1;
    x->order = order;
    x->seed = seed;
    for (uint32_t k = 0; k < n; k++) {
        size_t i = (size_t)oid_hash(order + (size_t)k * OIDLEN, seed) & x->mask;
        while (x->slots[i]) {
            if (memcmp(order + (size_t)(x->slots[i] - 1) * OIDLEN, order + (size_t)k * OIDLEN, OIDLEN) == 0)
                break;   /* (a duplicate id keeps its first position) */
            i = (i + 1) & x->mask;
        }
        if (!x->slots[i])
            x->slots[i] = k + 1;
    }
    return 0;
}

static inline long long
pos_find(const PosIndex *x, const uint8_t *id)
{
    size_t i = (size_t)oid_hash(id, x->seed) & x->mask;
    for (;;) {
        uint32_t v = x->slots[i];
        if (!v)
            return -1;
        if (memcmp(x->order + (size_t)(v - 1) * OIDLEN, id, OIDLEN) == 0)
            return (long long)(v - 1);
        i = (i + 1) & x->mask;
    }
}

/* An object of type want from the packs, or from read(); NULL with a Python exception set. */
static Obj *
get_object(Reader *rd, PyObject *read, const uint8_t *id, int want)
{
    long pk;
    long long off;
    Obj *o = reader_get(rd, read, id, want != T_COMMIT, &pk, &off);
    if (!o || o->type == want)
        return o;
    if (pk >= 0) {
        fail(&rd->err, E_CORRUPT, id, pk, off, "object is a %s but the bitmap walk reads it as a %s",
             type_label(o->type), type_label(want));
        raise_err(&rd->err);
    } else {
        PyErr_Format(PyExc_ValueError, "_walk: read() returned a %s for a %s", type_label(o->type), type_label(want));
    }
    obj_decref(o);
    return NULL;
}

#define MAX_DATE INT64_MAX

/* walkparse.parse_commit: tree, parents (up to cap ids into parents; *np counts them all), committer date. */
static int
parse_commit_c(const uint8_t *id, const uint8_t *d, size_t n, uint8_t *tree, uint8_t *parents, size_t cap,
               size_t *np, int64_t *when)
{
    const uint8_t *end = d + n;
    for (size_t k = 0; k + 1 < n; k++)
        if (d[k] == '\n' && d[k + 1] == '\n') {
            end = d + k;
            break;
        }
    const uint8_t *line = d;
    int first = 1;
    *np = 0;
    *when = 0;
    char hex[41];
    while (line < end) {
        const uint8_t *nl = memchr(line, '\n', (size_t)(end - line));
        const uint8_t *le = nl ? nl : end;
        size_t len = (size_t)(le - line);
        if (first) {
            if (len < 5 || memcmp(line, "tree ", 5) != 0 || hex_to_oid(line + 5, len - 5, tree) < 0) {
                hex_of(id, hex);
                PyErr_Format(PyExc_ValueError, "commit %s does not start with a tree header", hex);
                return -1;
            }
            first = 0;
        } else if (len >= 7 && memcmp(line, "parent ", 7) == 0) {
            uint8_t p[OIDLEN];
            if (hex_to_oid(line + 7, len - 7, p) < 0) {
                hex_of(id, hex);
                PyErr_Format(PyExc_ValueError, "commit %s has a parent that is not a hex object id", hex);
                return -1;
            }
            if (*np < cap)
                memcpy(parents + *np * OIDLEN, p, OIDLEN);
            (*np)++;
        } else if (len >= 10 && memcmp(line, "committer ", 10) == 0) {
            /* the second field from the end: "... <email> 1700000000 +0000" */
            const uint8_t *sp2 = NULL, *sp1 = NULL;
            for (const uint8_t *q = le; q > line; q--)
                if (q[-1] == ' ') {
                    if (!sp2)
                        sp2 = q - 1;
                    else {
                        sp1 = q - 1;
                        break;
                    }
                }
            int64_t v = 0;
            if (sp1 && sp2) {
                const uint8_t *q = sp1 + 1;
                int neg = 0, ok = q < sp2;
                if (q < sp2 && (*q == '-' || *q == '+')) {
                    neg = *q == '-';
                    q++;
                    ok = q < sp2;
                }
                for (; q < sp2 && ok; q++) {
                    if (*q < '0' || *q > '9') {
                        ok = 0;
                        break;
                    }
                    if (v > (MAX_DATE - 9) / 10)
                        v = MAX_DATE;    /* (walk/reach.py clamps to 64 bits as well) */
                    else
                        v = v * 10 + (*q - '0');
                }
                *when = ok ? (neg ? -v : v) : 0;
            }
        }
        line = le + 1;
    }
    if (first) {
        hex_of(id, hex);
        PyErr_Format(PyExc_ValueError, "commit %s does not start with a tree header", hex);
        return -1;
    }
    return 0;
}

static int
open_reader(PyObject *packs_obj, Reader *rd)
{
    if (!PyObject_TypeCheck(packs_obj, &PacksType)) {
        PyErr_SetString(PyExc_TypeError, "bitmap: packs must be a _walk.Packs");
        return -1;
    }
    memset(rd, 0, sizeof *rd);   /* (reader_init sets only its cache and zlib stream) */
    if (reader_init(rd, (PacksObject *)packs_obj, 16 << 20) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

PyObject *
bitmap_commits(PyObject *module, PyObject *args)
{
    PyObject *packs_obj, *read;
    Py_buffer ids;
    if (!PyArg_ParseTuple(args, "Oy*O", &packs_obj, &ids, &read))
        return NULL;
    PyObject *result = NULL;
    Reader rd;
    size_t n = (size_t)ids.len / OIDLEN;
    int64_t *dates = PyMem_RawMalloc((n + 1) * sizeof(int64_t));
    uint32_t *npar = PyMem_RawMalloc((n + 1) * sizeof(uint32_t));
    if (!dates || !npar) {
        PyErr_NoMemory();
        goto done0;
    }
    if (open_reader(packs_obj, &rd) < 0)
        goto done0;
    for (size_t k = 0; k < n; k++) {
        const uint8_t *id = (const uint8_t *)ids.buf + k * OIDLEN;
        Obj *o = get_object(&rd, read, id, T_COMMIT);
        if (!o)
            goto done;
        uint8_t tree[OIDLEN];
        size_t np;
        int rc = parse_commit_c(id, o->data, o->size, tree, NULL, 0, &np, &dates[k]);
        obj_decref(o);
        if (rc < 0)
            goto done;
        npar[k] = (uint32_t)np;
    }
    result = Py_BuildValue("(y#y#)", (const char *)dates, (Py_ssize_t)(n * sizeof(int64_t)), (const char *)npar,
                           (Py_ssize_t)(n * sizeof(uint32_t)));
done:
    reader_clear(&rd);
done0:
    PyMem_RawFree(dates);
    PyMem_RawFree(npar);
    PyBuffer_Release(&ids);
    return result;
}

/* A commit the walks have parsed: its tree's position, its parents' positions (in an arena), its date. */
typedef struct {
    int64_t when;
    uint32_t tree;
    uint32_t nparents;
    size_t parents;          /* index in the arena */
    int parsed;
} CInfo;

typedef struct {
    int64_t neg_when;
    uint64_t seq;
    uint32_t pos;
} QEnt;

static inline int
q_less(const QEnt *a, const QEnt *b)
{
    return a->neg_when < b->neg_when || (a->neg_when == b->neg_when && a->seq < b->seq);
}

static int
q_push(Buf *h, QEnt e)
{
    if (buf_put(h, &e, sizeof e) < 0)
        return -1;
    QEnt *a = (QEnt *)h->p;
    size_t i = h->len / sizeof(QEnt) - 1;
    while (i) {
        size_t up = (i - 1) / 2;
        if (!q_less(&a[i], &a[up]))
            break;
        QEnt t = a[i];
        a[i] = a[up];
        a[up] = t;
        i = up;
    }
    return 0;
}

static QEnt
q_pop(Buf *h)
{
    QEnt *a = (QEnt *)h->p;
    size_t n = h->len / sizeof(QEnt);
    QEnt top = a[0];
    a[0] = a[n - 1];
    h->len -= sizeof(QEnt);
    n--;
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && q_less(&a[l], &a[m]))
            m = l;
        if (r < n && q_less(&a[r], &a[m]))
            m = r;
        if (m == i)
            break;
        QEnt t = a[i];
        a[i] = a[m];
        a[m] = t;
        i = m;
    }
    return top;
}

#define BIT_GET(w, p) (((w)[(p) >> 6] >> ((p) & 63)) & 1)
#define BIT_SET(w, p) ((w)[(p) >> 6] |= (uint64_t)1 << ((p) & 63))

typedef struct {
    Reader rd;
    PyObject *read;
    PosIndex ix;
    const uint8_t *order;
    CInfo *ci;
    Buf arena;               /* uint32 parent positions */
    int closed;              /* 0: something reached has no position */
} Ctx;

/* Parse commit at position pos once; -1 with an exception, 0 ok (ctx->closed cleared if a parent is unknown). */
static int
commit_info(Ctx *c, uint32_t pos)
{
    CInfo *ci = &c->ci[pos];
    if (ci->parsed)
        return 0;
    const uint8_t *id = c->order + (size_t)pos * OIDLEN;
    Obj *o = get_object(&c->rd, c->read, id, T_COMMIT);
    if (!o)
        return -1;
    uint8_t tree[OIDLEN];
    size_t np;
    int64_t when;
    if (parse_commit_c(id, o->data, o->size, tree, NULL, 0, &np, &when) < 0) {
        obj_decref(o);
        return -1;
    }
    uint8_t *pids = PyMem_RawMalloc(np ? np * OIDLEN : 1);
    if (!pids) {
        obj_decref(o);
        PyErr_NoMemory();
        return -1;
    }
    parse_commit_c(id, o->data, o->size, tree, pids, np, &np, &when);
    obj_decref(o);
    long long tp = pos_find(&c->ix, tree);
    if (tp < 0)
        c->closed = 0;
    ci->tree = (uint32_t)(tp < 0 ? 0 : tp);
    ci->when = when;
    ci->nparents = (uint32_t)np;
    ci->parents = c->arena.len / sizeof(uint32_t);
    for (size_t k = 0; k < np; k++) {
        long long pp = pos_find(&c->ix, pids + k * OIDLEN);
        uint32_t v = (uint32_t)(pp < 0 ? 0 : pp);
        if (pp < 0)
            c->closed = 0;
        if (buf_put(&c->arena, &v, sizeof v) < 0) {
            PyMem_RawFree(pids);
            PyErr_NoMemory();
            return -1;
        }
    }
    PyMem_RawFree(pids);
    ci->parsed = 1;
    return 0;
}

/* Every tree and blob below the tree at position root whose bit is clear, into w (git's fill_bitmap_tree). */
static int
fill_tree(Ctx *c, uint64_t *w, uint32_t root, Buf *stack)
{
    stack->len = 0;
    if (buf_put(stack, &root, sizeof root) < 0)
        goto nomem;
    while (stack->len) {   /* (bounded: a tree is pushed only with its bit clear, and its bit set on the way) */
        stack->len -= sizeof(uint32_t);
        uint32_t t;
        memcpy(&t, stack->p + stack->len, sizeof t);
        if (BIT_GET(w, t))
            continue;
        BIT_SET(w, t);
        Obj *o = get_object(&c->rd, c->read, c->order + (size_t)t * OIDLEN, T_TREE);
        if (!o)
            return -1;
        const uint8_t *p = o->data, *e = o->data + o->size;
        TreeEnt ent;
        int got;
        while ((got = tree_entry_next(&p, e, &ent)) != 0) {
            if (got < 0) {
                char hex[41];
                hex_of(c->order + (size_t)t * OIDLEN, hex);
                PyErr_Format(PyExc_ValueError, "tree %s does not parse (malformed entry)", hex);
                obj_decref(o);
                return -1;
            }
            if (ent.gitlink)
                continue;
            const uint8_t *id = ent.id;
            int is_dir = ent.is_dir;
            long long q = pos_find(&c->ix, id);
            if (q < 0) {
                c->closed = 0;
                obj_decref(o);
                return 0;
            }
            if (BIT_GET(w, (uint64_t)q))
                continue;
            if (is_dir) {
                uint32_t v = (uint32_t)q;
                if (buf_put(stack, &v, sizeof v) < 0) {
                    obj_decref(o);
                    goto nomem;
                }
            } else {
                BIT_SET(w, (uint64_t)q);
            }
        }
        obj_decref(o);
    }
    return 0;
nomem:
    PyErr_NoMemory();
    return -1;
}

PyObject *
bitmap_closures(PyObject *module, PyObject *args)
{
    PyObject *packs_obj, *read;
    Py_buffer order, selected;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "Oy*y*OK", &packs_obj, &order, &selected, &read, &seed))
        return NULL;
    PyObject *result = NULL;
    Ctx c;
    memset(&c, 0, sizeof c);
    c.read = read;
    c.order = order.buf;
    c.closed = 1;
    uint32_t n = (uint32_t)((size_t)order.len / OIDLEN);
    size_t nsel = (size_t)selected.len / OIDLEN;
    size_t nwords = ((size_t)n + 63) / 64;
    uint64_t **done = NULL;     /* finished bitmaps, by selected index */
    int32_t *done_at = NULL;    /* position -> selected index with a finished bitmap, or -1 */
    uint64_t *w = NULL;
    Buf heap = {0}, added = {0}, stack = {0};
    int reader_open = 0;

    if ((size_t)order.len % OIDLEN || (size_t)selected.len % OIDLEN || (size_t)order.len / OIDLEN > UINT32_MAX - 1) {
        PyErr_SetString(PyExc_ValueError, "bitmap_closures: ids are 20 bytes each, fewer than 2^32");
        goto out;
    }
    if (open_reader(packs_obj, &c.rd) < 0)
        goto out;
    reader_open = 1;
    if (pos_init(&c.ix, c.order, n, (uint64_t)seed) < 0)
        goto nomem;
    c.ci = PyMem_RawCalloc(n ? n : 1, sizeof(CInfo));
    done = PyMem_RawCalloc(nsel ? nsel : 1, sizeof(uint64_t *));
    done_at = PyMem_RawMalloc((n ? n : 1) * sizeof(int32_t));
    if (!c.ci || !done || !done_at)
        goto nomem;
    for (uint32_t k = 0; k < n; k++)
        done_at[k] = -1;

    for (size_t s = 0; s < nsel && c.closed; s++) {
        long long sp = pos_find(&c.ix, (const uint8_t *)selected.buf + s * OIDLEN);
        if (sp < 0) {
            c.closed = 0;
            break;
        }
        w = PyMem_RawCalloc(nwords ? nwords : 1, sizeof(uint64_t));
        if (!w)
            goto nomem;
        uint64_t seq = 0;
        heap.len = added.len = 0;
        if (commit_info(&c, (uint32_t)sp) < 0)
            goto out;
        if (q_push(&heap, (QEnt){-c.ci[sp].when, seq++, (uint32_t)sp}) < 0)
            goto nomem;
        while (heap.len && c.closed) {   /* (bounded: a commit is added once, its bit set) */
            QEnt e = q_pop(&heap);
            uint32_t p = e.pos;
            if (BIT_GET(w, p))
                continue;
            if (done_at[p] >= 0) {
                const uint64_t *b = done[done_at[p]];
                for (size_t k = 0; k < nwords; k++)
                    w[k] |= b[k];
                continue;
            }
            BIT_SET(w, p);
            if (buf_put(&added, &p, sizeof p) < 0)
                goto nomem;
            if (commit_info(&c, p) < 0)
                goto out;
            const CInfo *ci = &c.ci[p];
            for (uint32_t k = 0; k < ci->nparents; k++) {
                uint32_t q = ((uint32_t *)c.arena.p)[ci->parents + k];
                if (BIT_GET(w, q))
                    continue;
                if (commit_info(&c, q) < 0)
                    goto out;
                if (q_push(&heap, (QEnt){-c.ci[q].when, seq++, q}) < 0)
                    goto nomem;
            }
        }
        for (size_t k = 0; k < added.len / sizeof(uint32_t) && c.closed; k++) {
            uint32_t p = ((uint32_t *)added.p)[k];
            if (fill_tree(&c, w, c.ci[p].tree, &stack) < 0)
                goto out;
        }
        done[s] = w;
        if (done_at[sp] < 0)
            done_at[sp] = (int32_t)s;
        w = NULL;
    }
    if (!c.closed) {
        result = Py_NewRef(Py_None);
        goto out;
    }
    result = PyList_New((Py_ssize_t)nsel);
    if (!result)
        goto out;
    for (size_t s = 0; s < nsel; s++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)done[s], (Py_ssize_t)(nwords * sizeof(uint64_t)));
        if (!b) {
            Py_CLEAR(result);
            goto out;
        }
        PyList_SET_ITEM(result, (Py_ssize_t)s, b);
    }
    goto out;
nomem:
    PyErr_NoMemory();
out:
    if (done)
        for (size_t s = 0; s < nsel; s++)
            PyMem_RawFree(done[s]);
    PyMem_RawFree(done);
    PyMem_RawFree(done_at);
    PyMem_RawFree(w);
    PyMem_RawFree(c.ci);
    PyMem_RawFree(c.ix.slots);
    buf_free(&c.arena);
    buf_free(&heap);
    buf_free(&added);
    buf_free(&stack);
    if (reader_open)
        reader_clear(&c.rd);
    PyBuffer_Release(&order);
    PyBuffer_Release(&selected);
    return result;
}


/* ---- the module ---------------------------------------------------------------------------------- */

static PyMethodDef bitmap_methods[] = {
    {"bitmap_commits", bitmap_commits, METH_VARARGS,
     "bitmap_commits(packs, ids, read) -> (committer dates 'q', parent counts 'I') as bytes"},
    {"bitmap_closures", bitmap_closures, METH_VARARGS,
     "bitmap_closures(packs, order, selected, read, seed) -> [closure bitmap as 64-bit words] or None"},
    {"ewah_stored", ewah_stored, METH_VARARGS,
     "ewah_stored(bitmaps, window) -> [(xor offset, serialized EWAH)]: bitmap.py's xor_offsets, serialized"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef bitmap_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "packyard.store.maintenance.serving._bitmap",
    .m_doc = "reachability bitmaps' closures and EWAH (C); specified in bitmap.py and ewah.py",
    .m_size = -1,
    .m_methods = bitmap_methods,
};

PyMODINIT_FUNC
PyInit__bitmap(void)
{
    if (walk_client_import() < 0)
        return NULL;
    return PyModule_Create(&bitmap_module);
}
