/*
 * _walk: the reachability walk's hot loops in C (this file: the Walker and the module; see _walk.h).
 *
 * walk.py specifies the walk (which objects, in which order) and runs it in pure Python
 * when this extension is absent or PACKYARD_PURE_PYTHON=1; this file produces the same
 * lists (tests/test_repack.py compares both on real repositories). What is here:
 *
 *   Packs   the replaceable packs of a repack (their mapped bytes and idx tables, held as
 *           buffer exports) and an id -> entry index over them: the first pack holding an
 *           id wins and ids of .keep packs are left out, exactly SourceIndex.loc's rule.
 *           It answers get()/in like that dict, so SourceIndex uses it in its place.
 *   Walker  one walk: the seen set, the commit queue, the depth-first tree walk, the
 *           objects it reads (delta chains resolved from the packs, with a delta-base
 *           cache bounded in bytes), the lists it produces.
 *
 * Integrity of what is read: every pack entry the walk inflates -- the object itself and
 * every delta base below it -- has its CRC32 checked against its idx before it is used,
 * zlib checks each stream's Adler-32, a delta must apply exactly (sizes, bounds), and
 * the result's type must be the one the referrer names. The idx itself was checked
 * whole (its SHA-1 trailer) when it was read. An object that is not in these packs
 * (loose, .keep packs, arrived later) is read by the Python callback, which checks its
 * SHA-1 as the pure-Python walk does.
 *
 * zlib comes from the shared library the interpreter's own zlib module uses (dlopen at
 * import; no zlib headers are needed to build): the few declarations below follow
 * zlib.h, and inflateInit_ checks the stream struct's size against the library's.
 *
 * Memory safety: every read of a pack is bounded by that entry's extent in the pack
 * (from the idx: the entry's offset to the next entry's), itself checked to lie inside
 * the mapping; every read of an object's bytes by the object's size. Allocation sizes
 * come from entry headers only after the entry's CRC32 matched its idx.
 *
 * The GIL is released while walking: the work touches only memory this module owns and
 * the buffers Packs holds exports of. It is taken again for the Python callbacks (objects
 * outside the packs, progress) and to raise errors. A Walker is used by one thread at a
 * time (a busy flag refuses a second); two Walkers may run in two threads over one Packs.
 */
#include "_walk.h"

/* ---- the Walker -------------------------------------------------------------------------- */

typedef struct {
    int64_t neg_when;
    uint64_t order;          /* queued order: ties go to the first queued */
    uint8_t oid[OIDLEN];
    uint8_t tree[OIDLEN];
    uint32_t nparents;
    size_t parents;          /* offset in the parents arena */
} HeapEnt;

typedef struct {             /* a tree/blob in the output: id, then its name in the names arena */
    uint8_t oid[OIDLEN];
    uint32_t name_len;       /* NO_NAME: reached without a name */
    uint64_t name_off;
} OutEnt;

typedef struct {             /* a fresh entry of a tree on the stack */
    uint64_t hash;           /* of its id, in the seen set */
    uint32_t name_off, name_len, id_off;
    uint8_t is_dir;
} Fresh;

typedef struct {
    Obj *tree;
    uint8_t oid[OIDLEN];
    size_t first, next, stop; /* its fresh entries in the entries array */
} Frame;


typedef struct {
    PyObject_HEAD
    PacksObject *packs;
    PyObject *fallback;      /* fallback(oid, want type, referrer) -> (type, data), SHA-1 checked */
    PyObject *progress;      /* progress(phase, done, None) or None */
    PyThreadState *ts;       /* while the GIL is released */
    int busy;
    IdSet seen;
    Reader rd;               /* objects out of the packs */
    Buf commits;             /* ids */
    Buf trees, blobs;        /* OutEnt */
    Buf names;               /* name bytes */
    Buf roots;               /* (tree id, commit id) per commit, in the order commits were taken */
    Buf heap;                /* HeapEnt, a binary heap */
    Buf parents;             /* ids */
    uint64_t queued;
    Buf frames;              /* Frame */
    Buf fresh;               /* Fresh */
    size_t trees_done;
    int cancelled;           /* set by cancel() from another thread */
} WalkerObject;

static PyTypeObject WalkerType;

static inline void gil_drop(WalkerObject *w) { w->ts = PyEval_SaveThread(); }

static inline int
is_cancelled(WalkerObject *w)
{
#if defined(__GNUC__)
    return __atomic_load_n(&w->cancelled, __ATOMIC_RELAXED);
#else
    return w->cancelled;
#endif
}
static inline void gil_take(WalkerObject *w) { PyEval_RestoreThread(w->ts); w->ts = NULL; }

static void
walker_clear(WalkerObject *w)
{
    idset_free(&w->seen);
    reader_clear(&w->rd);
    buf_free(&w->commits);
    buf_free(&w->trees);
    buf_free(&w->blobs);
    buf_free(&w->names);
    buf_free(&w->roots);
    buf_free(&w->heap);
    buf_free(&w->parents);
    if (w->frames.p) {
        Frame *f = (Frame *)w->frames.p;
        for (size_t k = 0; k < w->frames.len / sizeof(Frame); k++)
            obj_decref(f[k].tree);
    }
    buf_free(&w->frames);
    buf_free(&w->fresh);
}

static void
Walker_dealloc(WalkerObject *w)
{
    walker_clear(w);
    Py_XDECREF(w->packs);
    Py_XDECREF(w->fallback);
    Py_XDECREF(w->progress);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static int
walker_setup(WalkerObject *w, PacksObject *packs, PyObject *fallback, PyObject *progress, size_t cache_bytes)
{
    w->packs = (PacksObject *)Py_NewRef(packs);
    w->fallback = Py_NewRef(fallback);
    w->progress = progress == Py_None ? NULL : Py_XNewRef(progress);
    return reader_init(&w->rd, packs, cache_bytes);
}

static PyObject *
Walker_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"packs", "fallback", "progress", "cache_bytes", "expect", NULL};
    PyObject *packs, *fallback, *progress = Py_None;
    Py_ssize_t cache_bytes = 96 << 20, expect = 0;
    WalkerObject *w;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O|Onn", kwlist, &PacksType, &packs, &fallback, &progress,
                                     &cache_bytes, &expect))
        return NULL;
    if (((PacksObject *)packs)->closed) {
        PyErr_SetString(PyExc_ValueError, "_walk.Packs is closed");
        return NULL;
    }
    w = (WalkerObject *)type->tp_alloc(type, 0);
    if (!w)
        return NULL;
    if (walker_setup(w, (PacksObject *)packs, fallback, progress, cache_bytes < 0 ? 0 : (size_t)cache_bytes) < 0
        || idset_init(&w->seen, expect > 0 ? (size_t)expect : (size_t)((PacksObject *)packs)->total,
                      ((PacksObject *)packs)->seed ^ 0x5bd1e995ULL) < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        Py_DECREF(w);
        return NULL;
    }
    return (PyObject *)w;
}

/* Begin/end a method that walks: one thread at a time, packs kept open. */
static int
walker_begin(WalkerObject *w)
{
    if (w->busy) {
        PyErr_SetString(PyExc_RuntimeError, "_walk.Walker is already walking in another thread");
        return -1;
    }
    if (w->packs->closed) {
        PyErr_SetString(PyExc_ValueError, "_walk.Packs is closed");
        return -1;
    }
    w->busy = 1;
    w->packs->users++;
    return 0;
}

static void
walker_end(WalkerObject *w)
{
    w->busy = 0;
    w->packs->users--;
}

/* Referrers, for messages: a name given by Python, or "<kind> <hex id>". */
typedef struct {
    const char *kind;        /* "commit", "tree" or NULL (then name) */
    const uint8_t *oid;
    PyObject *name;          /* a str */
    const char *text;        /* its UTF-8 form (cached in the str: readable without the GIL) */
} Ref;

static PyObject *
ref_str(const Ref *r)
{
    if (!r->kind)
        return Py_NewRef(r->name);
    char hex[41];
    hex_of(r->oid, hex);
    return PyUnicode_FromFormat("%s %s", r->kind, hex);
}

static int
ref_text(const Ref *r, char *out, size_t n)
{
    if (r->kind) {
        char hex[41];
        hex_of(r->oid, hex);
        snprintf(out, n, "%s %s", r->kind, hex);
        return 0;
    }
    snprintf(out, n, "%s", r->text);
    return 0;
}

/* Object id with the type the referrer wants: from the packs, or (GIL taken) from the fallback. */
static Obj *
read_object(WalkerObject *w, const uint8_t *id, int want, const Ref *ref, long *where_pack, long long *where_off)
{
    long long gid = packs_find(w->packs, id);
    *where_pack = -1;
    *where_off = -1;
    if (gid >= 0) {
        uint32_t pk = w->packs->pack_of[gid];
        *where_pack = (long)pk;
        *where_off = (long long)w->packs->p[pk].offs[gid - w->packs->p[pk].base];
        Obj *o = reader_resolve(&w->rd, pk, (uint32_t)(gid - w->packs->p[pk].base));
        if (o && o->type != want) {
            char rt[200];
            ref_text(ref, rt, sizeof rt);
            fail(&w->rd.err, E_CORRUPT, id, (long)pk, (long long)w->packs->p[pk].offs[gid - w->packs->p[pk].base],
                 "object is a %s but %s refers to it as a %s", type_label(o->type), rt, type_label(want));
            obj_decref(o);
            return NULL;
        }
        return o;
    }
    /* Not in the packs this repack replaces: Python reads it (loose, .keep, arrived later). */
    Obj *o = NULL;
    gil_take(w);
    PyObject *oid = PyBytes_FromStringAndSize((const char *)id, OIDLEN);
    PyObject *rs = oid ? ref_str(ref) : NULL;
    PyObject *res = rs ? PyObject_CallFunction(w->fallback, "OiO", oid, want, rs) : NULL;
    Py_XDECREF(oid);
    Py_XDECREF(rs);
    if (res) {
        int t;
        Py_buffer view;
        PyObject *data;
        if (PyArg_ParseTuple(res, "iO", &t, &data) && PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) == 0) {
            if (t != want)
                PyErr_Format(PyExc_SystemError, "_walk: fallback returned a %s for a %s", type_label(t),
                             type_label(want));
            else if ((o = obj_new(t, (size_t)view.len)) == NULL)
                PyErr_NoMemory();
            else
                memcpy(o->data, view.buf, (size_t)view.len);
            PyBuffer_Release(&view);
        }
        Py_DECREF(res);
    }
    if (!o)
        w->rd.err.kind = E_PY;
    gil_drop(w);
    return o;
}

/* -- commits -- */

static inline int
hexval(unsigned c)
{
    if (c >= '0' && c <= '9')
        return (int)(c - '0');
    c |= 0x20;
    if (c >= 'a' && c <= 'f')
        return (int)(c - 'a' + 10);
    return -1;
}

/* 40 hex digits (either case, as binascii.unhexlify takes them) -> id; -1 if not exactly that. */
static int
parse_hex(const uint8_t *s, size_t n, uint8_t *out)
{
    if (n != 2 * OIDLEN)
        return -1;
    for (int k = 0; k < OIDLEN; k++) {
        int hi = hexval(s[2 * k]), lo = hexval(s[2 * k + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[k] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

/* Python's repr() of the first 60 bytes of s[0..n) (what walk.py's messages show). */
static void
bytes_repr(const uint8_t *s, size_t n, char *out, size_t cap)
{
    size_t k = 0, m = n < 60 ? n : 60;
    int dq = memchr(s, '\'', m) && !memchr(s, '"', m);
    char quote = dq ? '"' : '\'';
    if (cap < 8) {
        out[0] = 0;
        return;
    }
    out[k++] = 'b';
    out[k++] = quote;
    for (size_t j = 0; j < m && k + 6 < cap; j++) {
        unsigned c = s[j];
        if (c == (unsigned char)quote || c == '\\') {
            out[k++] = '\\';
            out[k++] = (char)c;
        } else if (c == '\t' || c == '\n' || c == '\r') {
            out[k++] = '\\';
            out[k++] = c == '\t' ? 't' : c == '\n' ? 'n' : 'r';
        } else if (c < 0x20 || c >= 0x7f) {
            snprintf(out + k, cap - k, "\\x%02x", c);
            k += 4;
        } else {
            out[k++] = (char)c;
        }
    }
    out[k++] = quote;
    out[k] = 0;
}

/* The committer date as walk.parse_commit reads it: the second field from the end of the line
 * split at single spaces; plain digits here, anything else by Python's int() (GIL taken), 0 if that
 * fails; clamped to 64 bits as walk.py clamps it. */
static int
commit_date(WalkerObject *w, const uint8_t *line, size_t n, int64_t *when, int have_gil)
{
    const uint8_t *s2 = NULL, *s1 = NULL;
    for (size_t k = n; k-- > 0;) {
        if (line[k] == ' ') {
            if (!s2)
                s2 = line + k;
            else {
                s1 = line + k;
                break;
            }
        }
    }
    *when = 0;
    if (!s1)
        return 0;
    const uint8_t *f = s1 + 1;
    size_t len = (size_t)(s2 - f);
    if (len >= 1 && len <= 18) {
        int64_t v = 0;
        size_t k;
        for (k = 0; k < len && f[k] >= '0' && f[k] <= '9'; k++)
            v = v * 10 + (f[k] - '0');
        if (k == len) {
            *when = v;
            return 0;
        }
    }
    if (len == 0)
        return 0;
    /* A sign, spaces, underscores, a huge number: Python decides. */
    if (!have_gil)
        gil_take(w);
    int rc = 0;
    PyObject *b = PyBytes_FromStringAndSize((const char *)f, (Py_ssize_t)len);
    PyObject *num = b ? PyObject_CallOneArg((PyObject *)&PyLong_Type, b) : NULL;
    Py_XDECREF(b);
    if (num) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(num, &overflow);
        *when = overflow > 0 || x > INT64_MAX ? INT64_MAX : overflow < 0 || x < -INT64_MAX ? -INT64_MAX : (int64_t)x;
        Py_DECREF(num);
    } else if (PyErr_ExceptionMatches(PyExc_ValueError)) {
        PyErr_Clear();
    } else {
        w->rd.err.kind = E_PY;
        rc = -1;
    }
    if (!have_gil)
        gil_drop(w);
    return rc;
}

static int
heap_less(const HeapEnt *a, const HeapEnt *b)
{
    return a->neg_when < b->neg_when || (a->neg_when == b->neg_when && a->order < b->order);
}

/* Parse a commit (walk.parse_commit's rules) and queue it by date. */
static int
queue_commit(WalkerObject *w, const uint8_t *oid, const uint8_t *data, size_t size, long pack, long long offset,
             int have_gil)
{
    HeapEnt e;
    const uint8_t *end = data + size, *head_end = end, *q = data;
    while (q < end && (q = memchr(q, '\n', (size_t)(end - q))) != NULL) {
        if (q + 1 < end && q[1] == '\n') {
            head_end = q;
            break;
        }
        q++;
    }
    const uint8_t *line = data;
    const uint8_t *nl = memchr(line, '\n', (size_t)(head_end - line));
    const uint8_t *line_end = nl ? nl : head_end;
    if ((size_t)(line_end - line) < 5 || memcmp(line, "tree ", 5) != 0)
        return fail(&w->rd.err, E_CORRUPT, oid, pack, offset, "commit does not start with a tree header");
    if (parse_hex(line + 5, (size_t)(line_end - line - 5), e.tree) < 0) {
        char r[256];
        bytes_repr(line + 5, (size_t)(line_end - line - 5), r, sizeof r);
        return fail(&w->rd.err, E_CORRUPT, oid, pack, offset, "commit tree is not a hex object id: %s", r);
    }
    memcpy(e.oid, oid, OIDLEN);
    e.neg_when = 0;
    e.nparents = 0;
    e.parents = w->parents.len;
    int64_t when = 0;
    while (nl) {
        line = nl + 1;
        nl = line < head_end ? memchr(line, '\n', (size_t)(head_end - line)) : NULL;
        line_end = nl ? nl : head_end;
        size_t n = (size_t)(line_end - line);
        if (n >= 7 && memcmp(line, "parent ", 7) == 0) {
            uint8_t parent[OIDLEN];
            if (parse_hex(line + 7, n - 7, parent) < 0) {
                char r[256];
                bytes_repr(line + 7, n - 7, r, sizeof r);
                return fail(&w->rd.err, E_CORRUPT, oid, pack, offset, "commit parent is not a hex object id: %s", r);
            }
            if (buf_put(&w->parents, parent, OIDLEN) < 0)
                return nomem(&w->rd.err);
            e.nparents++;
        } else if (n >= 10 && memcmp(line, "committer ", 10) == 0) {
            if (commit_date(w, line, n, &when, have_gil) < 0)
                return -1;
        }
        if (line_end == head_end)
            break;
    }
    e.neg_when = -when;   /* |when| <= INT64_MAX: commit_date clamps (walk.py clamps the same way) */
    e.order = ++w->queued;
    if (buf_reserve(&w->heap, sizeof(HeapEnt)) < 0)
        return nomem(&w->rd.err);
    HeapEnt *h = (HeapEnt *)w->heap.p;
    size_t k = w->heap.len / sizeof(HeapEnt);
    w->heap.len += sizeof(HeapEnt);
    while (k > 0) {
        size_t parent = (k - 1) / 2;
        if (!heap_less(&e, &h[parent]))
            break;
        h[k] = h[parent];
        k = parent;
    }
    h[k] = e;
    return 0;
}

static void
heap_pop(WalkerObject *w, HeapEnt *out)
{
    HeapEnt *h = (HeapEnt *)w->heap.p;
    size_t n = w->heap.len / sizeof(HeapEnt);
    *out = h[0];
    HeapEnt last = h[n - 1];
    n--;
    w->heap.len -= sizeof(HeapEnt);
    size_t k = 0;
    while (n) {
        size_t c = 2 * k + 1;
        if (c >= n)
            break;
        if (c + 1 < n && heap_less(&h[c + 1], &h[c]))
            c++;
        if (!heap_less(&h[c], &last))
            break;
        h[k] = h[c];
        k = c;
    }
    if (n)
        h[k] = last;
}

static int
call_progress(WalkerObject *w, const char *phase, size_t done)
{
    if (!w->progress)
        return 0;
    gil_take(w);
    PyObject *r = PyObject_CallFunction(w->progress, "snO", phase, (Py_ssize_t)done, Py_None);
    int rc = 0;
    if (!r) {
        w->rd.err.kind = E_PY;
        rc = -1;
    }
    Py_XDECREF(r);
    gil_drop(w);
    return rc;
}

/* Commits newest first (walk.py's queue); each commit's tree is remembered in roots. */
static int
walk_commits(WalkerObject *w)
{
    size_t n = 0;
    while (w->heap.len) {
        HeapEnt e;
        heap_pop(w, &e);
        if (buf_put(&w->commits, e.oid, OIDLEN) < 0 || buf_put(&w->roots, e.tree, OIDLEN) < 0
            || buf_put(&w->roots, e.oid, OIDLEN) < 0)
            return nomem(&w->rd.err);
        for (uint32_t k = 0; k < e.nparents; k++) {
            uint8_t parent[OIDLEN];
            memcpy(parent, w->parents.p + e.parents + (size_t)k * OIDLEN, OIDLEN);
            int added = idset_add(&w->seen, parent);
            if (added < 0)
                return nomem(&w->rd.err);
            if (!added)
                continue;
            Ref ref = {"commit", e.oid, NULL, NULL};
            long pk;
            long long off;
            Obj *o = read_object(w, parent, T_COMMIT, &ref, &pk, &off);
            if (!o)
                return -1;
            int rc = queue_commit(w, parent, o->data, o->size, pk, off, 0);
            obj_decref(o);
            if (rc < 0)
                return -1;
        }
        if (++n % 1000 == 0 && call_progress(w, "counting commits", n) < 0)
            return -1;
    }
    return 0;
}

/* -- trees -- */

static int
out_add(Buf *list, Buf *names, const uint8_t *oid, const uint8_t *name, size_t name_len, int named)
{
    OutEnt e;
    memcpy(e.oid, oid, OIDLEN);
    e.name_len = NO_NAME;
    e.name_off = 0;
    if (named) {
        if (name_len >= NO_NAME)
            return -1;
        e.name_off = names->len;
        e.name_len = (uint32_t)name_len;
        if (buf_put(names, name, name_len) < 0)
            return -1;
    }
    return buf_put(list, &e, sizeof e);
}

/* Parse a whole tree (walk.parse_tree_entries' rules: "<octal mode> <name>\0<20-byte id>" entries that
 * cover it exactly) and keep, in tree order, the entries that are neither gitlinks nor seen yet.
 * Two passes: parse (hashing each id), then look each id up in seen with the slots of the entries
 * a few places ahead already being loaded. */
#define PREFETCH_AHEAD 8
static int
tree_fresh(WalkerObject *w, const Obj *t, const uint8_t *oid, size_t *first, size_t *stop)
{
    const uint8_t *d = t->data, *end = t->data + t->size, *p = d;
    const uint64_t seed = w->seen.seed;
    *first = w->fresh.len / sizeof(Fresh);
    if (t->size >= UINT32_MAX)
        return fail(&w->rd.err, E_CORRUPT, oid, -1, -1, "tree is too large (4 GiB or more)");
    while (p < end) {
        const uint8_t *m = p;
        while (p < end && *p >= '0' && *p <= '7')
            p++;
        size_t mode_len = (size_t)(p - m);
        if (!mode_len || p >= end || *p != ' ')
            goto malformed;
        p++;
        const uint8_t *name = p;
        const uint8_t *nul = memchr(p, 0, (size_t)(end - p));
        if (!nul || nul == name || (size_t)(end - nul) < 1 + OIDLEN)
            goto malformed;
        const uint8_t *id = nul + 1;
        p = id + OIDLEN;
        if (mode_len == 6 && memcmp(m, "160000", 6) == 0)
            continue;                                    /* a gitlink: another repository's commit */
        Fresh f;
        f.hash = oid_hash(id, seed);
        f.name_off = (uint32_t)(name - d);
        f.name_len = (uint32_t)(nul - name);
        f.id_off = (uint32_t)(id - d);
        f.is_dir = (mode_len == 5 && memcmp(m, "40000", 5) == 0) || (mode_len == 6 && memcmp(m, "040000", 6) == 0);
        if (buf_put(&w->fresh, &f, sizeof f) < 0)
            return nomem(&w->rd.err);
    }
    Fresh *e = (Fresh *)w->fresh.p;
    size_t n = w->fresh.len / sizeof(Fresh), kept = *first;
    for (size_t k = *first; k < n && k < *first + PREFETCH_AHEAD; k++)
        idset_prefetch(&w->seen, e[k].hash);
    for (size_t k = *first; k < n; k++) {
        if (k + PREFETCH_AHEAD < n)
            idset_prefetch(&w->seen, e[k + PREFETCH_AHEAD].hash);
        if (!idset_has_h(&w->seen, d + e[k].id_off, e[k].hash))
            e[kept++] = e[k];
    }
    w->fresh.len = kept * sizeof(Fresh);
    *stop = kept;
    return 0;
malformed:
    w->fresh.len = *first * sizeof(Fresh);
    return fail(&w->rd.err, E_CORRUPT, oid, -1, -1, "tree does not parse (malformed entry)");
}

static int
push_frame(WalkerObject *w, Obj *tree, const uint8_t *oid)
{
    Frame f;
    f.tree = tree;
    memcpy(f.oid, oid, OIDLEN);
    if (tree_fresh(w, tree, oid, &f.first, &f.stop) < 0) {
        obj_decref(tree);
        return -1;
    }
    f.next = f.first;
    if (buf_put(&w->frames, &f, sizeof f) < 0) {
        obj_decref(tree);
        return nomem(&w->rd.err);
    }
    return 0;
}

static void
pop_frame(WalkerObject *w)
{
    Frame *f = (Frame *)(w->frames.p + w->frames.len) - 1;
    obj_decref(f->tree);
    w->fresh.len = f->first * sizeof(Fresh);
    w->frames.len -= sizeof(Frame);
}

static void
drop_frames(WalkerObject *w)
{
    while (w->frames.len)
        pop_frame(w);
}

/* Depth first from one tree (already marked seen): the tree, then its entries in tree order, a subtree
 * walked completely before the entries after it (walk.Walker._tree). */
static int
walk_tree(WalkerObject *w, const uint8_t *root, const uint8_t *name, size_t name_len, int named, const Ref *ref)
{
    if (out_add(&w->trees, &w->names, root, name, name_len, named) < 0)
        return nomem(&w->rd.err);
    long pk;
    long long off;
    Obj *t = read_object(w, root, T_TREE, ref, &pk, &off);
    if (!t || push_frame(w, t, root) < 0)
        goto error;
    while (w->frames.len) {
        Frame *f = (Frame *)(w->frames.p + w->frames.len) - 1;
        int descended = 0;
        if (is_cancelled(w)) {
            if (w->rd.err.kind == E_NONE)
                w->rd.err.kind = E_CANCELLED;
            goto error;
        }
        while (f->next < f->stop) {
            const Fresh *e = (const Fresh *)w->fresh.p + f->next++;
            const uint8_t *d = f->tree->data;
            const uint8_t *id = d + e->id_off;
            int added = idset_add(&w->seen, id);   /* seen meanwhile (a sibling's subtree, a duplicate)? */
            if (added < 0) {
                nomem(&w->rd.err);
                goto error;
            }
            if (!added)
                continue;
            if (e->is_dir) {
                uint8_t eid[OIDLEN];
                memcpy(eid, id, OIDLEN);
                if (out_add(&w->trees, &w->names, eid, d + e->name_off, e->name_len, 1) < 0) {
                    nomem(&w->rd.err);
                    goto error;
                }
                Ref r = {"tree", f->oid, NULL, NULL};
                Obj *sub = read_object(w, eid, T_TREE, &r, &pk, &off);
                if (!sub || push_frame(w, sub, eid) < 0)   /* (f may move: the frames array grows) */
                    goto error;
                descended = 1;
                break;
            }
            if (out_add(&w->blobs, &w->names, id, d + e->name_off, e->name_len, 1) < 0) {
                nomem(&w->rd.err);
                goto error;
            }
        }
        if (!descended) {
            pop_frame(w);
            if (++w->trees_done % 2000 == 0
                && call_progress(w, "counting objects", w->commits.len / OIDLEN + (w->trees.len + w->blobs.len) / sizeof(OutEnt)) < 0)
                goto error;
        }
    }
    return 0;
error:
    drop_frames(w);
    return -1;
}

/* ---- Walker methods -------------------------------------------------------------------------- */

static int
oid_arg(PyObject *o, const uint8_t **id)
{
    if (!PyBytes_Check(o) || PyBytes_GET_SIZE(o) != OIDLEN) {
        PyErr_SetString(PyExc_TypeError, "an object id is 20 bytes");
        return -1;
    }
    *id = (const uint8_t *)PyBytes_AS_STRING(o);
    return 0;
}

static PyObject *
finish(WalkerObject *w, int rc)
{
    walker_end(w);
    if (rc < 0) {
        raise_err(&w->rd.err);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
Walker_mark_seen(WalkerObject *w, PyObject *arg)
{
    const uint8_t *id;
    if (oid_arg(arg, &id) < 0)
        return NULL;
    if (w->busy) {
        PyErr_SetString(PyExc_RuntimeError, "_walk.Walker is walking in another thread");
        return NULL;
    }
    int r = idset_add(&w->seen, id);
    if (r < 0)
        return PyErr_NoMemory();
    return PyBool_FromLong(r);
}

static PyObject *
Walker_queue_commit(WalkerObject *w, PyObject *const *args, Py_ssize_t nargs)
{
    const uint8_t *id;
    Py_buffer view;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "queue_commit(oid, data)");
        return NULL;
    }
    if (oid_arg(args[0], &id) < 0 || PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (walker_begin(w) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int rc = queue_commit(w, id, view.buf, (size_t)view.len, -1, -1, 1);
    PyBuffer_Release(&view);
    return finish(w, rc);
}

static PyObject *
Walker_walk_commits(WalkerObject *w, PyObject *unused)
{
    if (walker_begin(w) < 0)
        return NULL;
    gil_drop(w);
    int rc = walk_commits(w);
    gil_take(w);
    return finish(w, rc);
}

static PyObject *
Walker_add_blob(WalkerObject *w, PyObject *const *args, Py_ssize_t nargs)
{
    const uint8_t *id;
    char *name;
    Py_ssize_t name_len;
    if (nargs != 2 || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "add_blob(oid, name: bytes)");
        return NULL;
    }
    if (oid_arg(args[0], &id) < 0 || PyBytes_AsStringAndSize(args[1], &name, &name_len) < 0)
        return NULL;
    if (w->busy) {
        PyErr_SetString(PyExc_RuntimeError, "_walk.Walker is walking in another thread");
        return NULL;
    }
    if (out_add(&w->blobs, &w->names, id, (const uint8_t *)name, (size_t)name_len, 1) < 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* walk_tree(oid, name or None, referrer): a tree a tip names (already marked seen) and what it reaches. */
static PyObject *
Walker_walk_tree(WalkerObject *w, PyObject *const *args, Py_ssize_t nargs)
{
    const uint8_t *id;
    char *name = NULL;
    Py_ssize_t name_len = 0;
    if (nargs != 3 || !PyUnicode_Check(args[2]) || (args[1] != Py_None && !PyBytes_Check(args[1]))) {
        PyErr_SetString(PyExc_TypeError, "walk_tree(oid, name: bytes | None, referrer: str)");
        return NULL;
    }
    if (oid_arg(args[0], &id) < 0)
        return NULL;
    if (args[1] != Py_None && PyBytes_AsStringAndSize(args[1], &name, &name_len) < 0)
        return NULL;
    const char *text = PyUnicode_AsUTF8(args[2]);
    if (!text)
        return NULL;
    if (walker_begin(w) < 0)
        return NULL;
    uint8_t root[OIDLEN];
    memcpy(root, id, OIDLEN);
    Ref ref = {NULL, NULL, args[2], text};
    gil_drop(w);
    int rc = walk_tree(w, root, (const uint8_t *)name, (size_t)name_len, args[1] != Py_None, &ref);
    gil_take(w);
    return finish(w, rc);
}

/* walk_roots(start, stop): every commit's tree in roots[start:stop] not seen yet, in commit order. */
static PyObject *
Walker_walk_roots(WalkerObject *w, PyObject *args)
{
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "nn", &start, &stop))
        return NULL;
    Py_ssize_t n = (Py_ssize_t)(w->roots.len / (2 * OIDLEN));
    if (start < 0)
        start = 0;
    if (stop > n)
        stop = n;
    if (walker_begin(w) < 0)
        return NULL;
    gil_drop(w);
    int rc = 0;
    for (Py_ssize_t k = start; k < stop && rc == 0; k++) {
        uint8_t tree[OIDLEN], commit[OIDLEN];
        memcpy(tree, w->roots.p + (size_t)k * 2 * OIDLEN, OIDLEN);
        memcpy(commit, w->roots.p + (size_t)k * 2 * OIDLEN + OIDLEN, OIDLEN);
        int added = idset_add(&w->seen, tree);
        if (added < 0)
            rc = nomem(&w->rd.err);
        else if (added) {
            Ref ref = {"commit", commit, NULL, NULL};
            rc = walk_tree(w, tree, NULL, 0, 0, &ref);
        }
    }
    gil_take(w);
    return finish(w, rc);
}

/* A second walker over the same packs with a copy of this one's seen set and roots (for a thread that
 * walks part of the roots); its own cache, of cache_bytes. */
static PyObject *
Walker_copy(WalkerObject *w, PyObject *args)
{
    Py_ssize_t cache_bytes;
    if (!PyArg_ParseTuple(args, "n", &cache_bytes))
        return NULL;
    if (w->busy) {
        PyErr_SetString(PyExc_RuntimeError, "_walk.Walker is walking in another thread");
        return NULL;
    }
    WalkerObject *c = (WalkerObject *)WalkerType.tp_alloc(&WalkerType, 0);
    if (!c)
        return NULL;
    if (walker_setup(c, w->packs, w->fallback, w->progress ? w->progress : Py_None,
                     cache_bytes < 0 ? 0 : (size_t)cache_bytes) < 0
        || idset_copy(&c->seen, &w->seen) < 0 || buf_put(&c->roots, w->roots.p, w->roots.len) < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        Py_DECREF(c);
        return NULL;
    }
    Py_CLEAR(c->progress);
    return (PyObject *)c;
}

/* merge(other): append the trees and blobs other found that this walk has not seen, in other's order,
 * with their names (walk.Walker._merge). */
static PyObject *
Walker_merge(WalkerObject *w, PyObject *arg)
{
    if (!PyObject_TypeCheck(arg, &WalkerType) || arg == (PyObject *)w) {
        PyErr_SetString(PyExc_TypeError, "merge(another Walker)");
        return NULL;
    }
    WalkerObject *o = (WalkerObject *)arg;
    if (w->busy || o->busy) {
        PyErr_SetString(PyExc_RuntimeError, "_walk.Walker is walking in another thread");
        return NULL;
    }
    Buf *src[2] = {&o->trees, &o->blobs}, *dst[2] = {&w->trees, &w->blobs};
    for (int k = 0; k < 2; k++) {
        const OutEnt *e = (const OutEnt *)src[k]->p;
        size_t n = src[k]->len / sizeof(OutEnt);
        for (size_t j = 0; j < n; j++) {
            int added = idset_add(&w->seen, e[j].oid);
            if (added < 0)
                return PyErr_NoMemory();
            if (!added)
                continue;
            int named = e[j].name_len != NO_NAME && e[j].name_len > 0;
            if (out_add(dst[k], &w->names, e[j].oid, named ? o->names.p + e[j].name_off : NULL,
                        named ? e[j].name_len : 0, named) < 0)
                return PyErr_NoMemory();
        }
    }
    Py_RETURN_NONE;
}

/* cancel(): make a walk running in another thread stop soon (it raises RuntimeError there). */
static PyObject *
Walker_cancel(WalkerObject *w, PyObject *unused)
{
#if defined(__GNUC__)
    __atomic_store_n(&w->cancelled, 1, __ATOMIC_RELAXED);
#else
    w->cancelled = 1;
#endif
    Py_RETURN_NONE;
}

static PyObject *
id_list(const uint8_t *ids, size_t n, size_t stride)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list)
        return NULL;
    for (size_t k = 0; k < n; k++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)ids + k * stride, OIDLEN);
        if (!b) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)k, b);
    }
    return list;
}

/* result() -> (commits, trees, blobs, names): lists of ids, and {id: name} for what was reached by a name. */
static PyObject *
Walker_result(WalkerObject *w, PyObject *unused)
{
    if (w->busy) {
        PyErr_SetString(PyExc_RuntimeError, "_walk.Walker is walking in another thread");
        return NULL;
    }
    PyObject *commits = id_list(w->commits.p, w->commits.len / OIDLEN, OIDLEN);
    PyObject *trees = id_list(w->trees.p, w->trees.len / sizeof(OutEnt), sizeof(OutEnt));
    PyObject *blobs = id_list(w->blobs.p, w->blobs.len / sizeof(OutEnt), sizeof(OutEnt));
    PyObject *names = PyDict_New();
    PyObject *result = NULL;
    if (!commits || !trees || !blobs || !names)
        goto out;
    PyObject *lists[2] = {trees, blobs};
    Buf *bufs[2] = {&w->trees, &w->blobs};
    for (int k = 0; k < 2; k++) {
        const OutEnt *e = (const OutEnt *)bufs[k]->p;
        size_t n = bufs[k]->len / sizeof(OutEnt);
        for (size_t j = 0; j < n; j++) {
            if (e[j].name_len == NO_NAME)
                continue;
            PyObject *name = PyBytes_FromStringAndSize((const char *)w->names.p + e[j].name_off, e[j].name_len);
            if (!name || PyDict_SetItem(names, PyList_GET_ITEM(lists[k], (Py_ssize_t)j), name) < 0) {
                Py_XDECREF(name);
                goto out;
            }
            Py_DECREF(name);
        }
    }
    result = PyTuple_Pack(4, commits, trees, blobs, names);
out:
    Py_XDECREF(commits);
    Py_XDECREF(trees);
    Py_XDECREF(blobs);
    Py_XDECREF(names);
    return result;
}

static PyObject *
Walker_counts(WalkerObject *w, PyObject *unused)
{
    return Py_BuildValue("(nnnnn)", (Py_ssize_t)(w->commits.len / OIDLEN),
                         (Py_ssize_t)(w->trees.len / sizeof(OutEnt)), (Py_ssize_t)(w->blobs.len / sizeof(OutEnt)),
                         (Py_ssize_t)(w->roots.len / (2 * OIDLEN)), (Py_ssize_t)w->seen.count);
}

static PyObject *
Walker_stats(WalkerObject *w, PyObject *unused)
{
    return Py_BuildValue("{snsnsnsnsn}", "resolved", (Py_ssize_t)w->rd.n_resolved, "inflated", (Py_ssize_t)w->rd.n_inflated,
                         "cache_hits", (Py_ssize_t)w->rd.n_cache_hits, "cache_bytes", (Py_ssize_t)w->rd.cache.used,
                         "cache_entries", (Py_ssize_t)w->rd.cache.count);
}

static PyMethodDef Walker_methods[] = {
    {"mark_seen", (PyCFunction)Walker_mark_seen, METH_O, "mark_seen(oid) -> True if it was not seen yet"},
    {"queue_commit", (PyCFunction)(void (*)(void))Walker_queue_commit, METH_FASTCALL,
     "queue_commit(oid, data): parse a commit (read by the caller) and queue it by date"},
    {"walk_commits", (PyCFunction)Walker_walk_commits, METH_NOARGS,
     "take the queued commits newest first, reading and queueing their parents"},
    {"add_blob", (PyCFunction)(void (*)(void))Walker_add_blob, METH_FASTCALL, "add_blob(oid, name)"},
    {"walk_tree", (PyCFunction)(void (*)(void))Walker_walk_tree, METH_FASTCALL,
     "walk_tree(oid, name | None, referrer): a tree and everything below it not seen yet"},
    {"walk_roots", (PyCFunction)Walker_walk_roots, METH_VARARGS,
     "walk_roots(start, stop): the trees of the commits taken, roots[start:stop]"},
    {"copy", (PyCFunction)Walker_copy, METH_VARARGS, "copy(cache_bytes): a walker with this one's seen set and roots"},
    {"merge", (PyCFunction)Walker_merge, METH_O, "merge(other): append what other found and this walk did not"},
    {"cancel", (PyCFunction)Walker_cancel, METH_NOARGS, "make a walk running in another thread stop soon"},
    {"result", (PyCFunction)Walker_result, METH_NOARGS, "(commits, trees, blobs, names)"},
    {"counts", (PyCFunction)Walker_counts, METH_NOARGS, "(commits, trees, blobs, roots, seen)"},
    {"stats", (PyCFunction)Walker_stats, METH_NOARGS,
     "objects resolved, entries inflated, cache hits, bytes and entries in the delta-base cache"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WalkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "packyard.store.maintenance._walk.Walker",
    .tp_basicsize = sizeof(WalkerObject),
    .tp_dealloc = (destructor)Walker_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Walker(packs, fallback, progress=None, cache_bytes=96 MiB, expect=0): one reachability walk",
    .tp_methods = Walker_methods,
    .tp_new = Walker_new,
};

static PyMethodDef module_methods[] = {
    {"pack_layout", walk_pack_layout, METH_VARARGS,
     "pack_layout(offsets 'Q', trailer) -> (order 'I', sorted offsets 'Q', ends 'Q') as bytes"},
    {NULL, NULL, 0, NULL},
};

/* ---- module ------------------------------------------------------------------------------ */

static struct PyModuleDef walk_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "packyard.store.maintenance._walk",
    .m_doc = "the reachability walk's hot loops (C); the walk is specified in walk.py",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__walk(void)
{
    PyObject *m;
    if (walk_load_zlib() < 0)
        return NULL;
    if (PyType_Ready(&PacksType) < 0 || PyType_Ready(&WalkerType) < 0)
        return NULL;
    m = PyModule_Create(&walk_module);
    if (!m)
        return NULL;
    WalkError = PyErr_NewException("packyard.store.maintenance._walk.WalkError", NULL, NULL);
    if (!WalkError || PyModule_AddObjectRef(m, "WalkError", WalkError) < 0
        || PyModule_AddObjectRef(m, "Packs", (PyObject *)&PacksType) < 0
        || PyModule_AddObjectRef(m, "Walker", (PyObject *)&WalkerType) < 0
        || PyModule_AddIntConstant(m, "MAX_CHAIN", MAX_CHAIN) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

