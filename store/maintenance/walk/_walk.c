/*
 * _walk: the reachability walk's hot loops in C (this file: the Walker type, its methods and the
 * module; _walk.h lists the other files).
 *
 * walk/reach.py specifies the walk (which objects, in which order) and runs it in pure Python
 * when this extension is absent or PACKYARD_PURE_PYTHON=1; the extension produces the same
 * lists (tests/workers/test_walk.py and tests/store/test_repack.py compare both on real repositories):
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
 *
 * The module's _C_API capsule (_walk.h's WalkAPI) gives the Packs type, WalkError, zlib and the Reader to
 * the extensions that read objects the same way: _bitmap, _bloom and _packwrite.
 */
#include "_walk.h"

static PyTypeObject WalkerType;

/* -1 with RuntimeError while another thread walks with w (its sets are not to be touched then), or, when
 * the call needs the seen set (seen), once release_seen freed it. */
static int
walker_usable(WalkerObject *w, int seen)
{
    const char *why = w->busy ? "_walk.Walker is walking in another thread"
                      : seen && w->seen_released ? "_walk.Walker: its seen set was released" : NULL;
    if (why) {
        PyErr_SetString(PyExc_RuntimeError, why);
        return -1;
    }
    return 0;
}

const IdSet *
walker_seen(PyObject *o)
{
    if (!PyObject_TypeCheck(o, &WalkerType) || ((WalkerObject *)o)->busy || ((WalkerObject *)o)->seen_released)
        return NULL;
    return &((WalkerObject *)o)->seen;
}

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
    buf_free(&w->meta);
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
    if (packs_check_open(((PacksObject *)packs)) < 0)
        return NULL;
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
    if (walker_usable(w, 0) < 0)
        return -1;
    if (packs_check_open(w->packs) < 0)
        return -1;
    if (w->released) {
        PyErr_SetString(PyExc_RuntimeError, "_walk.Walker: its reader was released (the walk is over)");
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
    if (walker_usable(w, 1) < 0)
        return NULL;
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
    if (walker_usable(w, 0) < 0)
        return NULL;
    if (out_add(&w->blobs, &w->names, id, (const uint8_t *)name, (size_t)name_len, 1,
                name_hash_fold(0, (const uint8_t *)name, (size_t)name_len)) < 0)
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

/* The claimed roots not walked yet, (next << 32) | stop, in one word: the walking thread takes the next
 * root and another thread (steal_roots) lowers stop with compare-and-swap on that word, so a root is
 * walked by exactly one of them. Without GCC's atomics nothing is ever stolen. */
static void
claim_set(WalkerObject *w, uint64_t next, uint64_t stop)
{
#if defined(__GNUC__)
    __atomic_store_n(&w->claim, (next << 32) | stop, __ATOMIC_SEQ_CST);
#else
    w->claim = (next << 32) | stop;
#endif
}

/* The next root to walk, or -1 when none is left. */
static long long
claim_next(WalkerObject *w)
{
#if defined(__GNUC__)
    uint64_t cur = __atomic_load_n(&w->claim, __ATOMIC_SEQ_CST);
    for (;;) {
        uint64_t next = cur >> 32, stop = cur & 0xFFFFFFFFULL;
        if (next >= stop)
            return -1;
        if (__atomic_compare_exchange_n(&w->claim, &cur, ((next + 1) << 32) | stop, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST))
            return (long long)next;
    }
#else
    uint64_t next = w->claim >> 32, stop = w->claim & 0xFFFFFFFFULL;
    if (next >= stop)
        return -1;
    w->claim = ((next + 1) << 32) | stop;
    return (long long)next;
#endif
}

/* steal_roots(min_left) -> (start, stop) or None: from another thread, take the second half of the claimed
 * roots a walk has not started yet (at least min_left of them must be left); that walk then stops at start. */
static PyObject *
Walker_steal_roots(WalkerObject *w, PyObject *arg)
{
    Py_ssize_t min_left = PyLong_AsSsize_t(arg);
    if (min_left == -1 && PyErr_Occurred())
        return NULL;
    if (min_left < 2)
        min_left = 2;
#if defined(__GNUC__)
    uint64_t cur = __atomic_load_n(&w->claim, __ATOMIC_SEQ_CST);
    for (;;) {
        uint64_t next = cur >> 32, stop = cur & 0xFFFFFFFFULL;
        if (next >= stop || stop - next < (uint64_t)min_left)
            Py_RETURN_NONE;
        uint64_t mid = next + (stop - next) / 2;
        if (__atomic_compare_exchange_n(&w->claim, &cur, (next << 32) | mid, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            return Py_BuildValue("(KK)", (unsigned long long)mid, (unsigned long long)stop);
    }
#else
    Py_RETURN_NONE;
#endif
}

/* claim_roots(start, stop): the roots walk_claimed() walks, roots[start:stop] (steal_roots may then take
 * the tail of them, from another thread). */
static PyObject *
Walker_claim_roots(WalkerObject *w, PyObject *args)
{
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "nn", &start, &stop))
        return NULL;
    Py_ssize_t n = (Py_ssize_t)(w->roots.len / (2 * OIDLEN));
    if (start < 0)
        start = 0;
    if (stop > n)
        stop = n;
    if (stop < start)
        stop = start;
    if ((uint64_t)stop > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "claim_roots: too many roots");
        return NULL;
    }
    if (walker_usable(w, 0) < 0)
        return NULL;
    claim_set(w, (uint64_t)start, (uint64_t)stop);
    Py_RETURN_NONE;
}

/* walk_claimed(): every commit's tree in the claimed roots not seen yet, in commit order (fewer when
 * steal_roots took the tail). */
static PyObject *
Walker_walk_claimed(WalkerObject *w, PyObject *unused)
{
    if (walker_begin(w) < 0)
        return NULL;
    gil_drop(w);
    int rc = 0;
    for (long long k; rc == 0 && (k = claim_next(w)) >= 0;) {
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

/* walk_roots(start, stop): claim_roots(start, stop), then walk_claimed(). */
static PyObject *
Walker_walk_roots(WalkerObject *w, PyObject *args)
{
    PyObject *r = Walker_claim_roots(w, args);
    if (!r)
        return NULL;
    Py_DECREF(r);
    return Walker_walk_claimed(w, NULL);
}

static PyObject *id_list(const uint8_t *ids, size_t n, size_t stride);

/* read_packed(oid) -> (type, bytes) of an object of the packs, its delta chain resolved through this walker's
 * reader and cache (CRC32 of each entry checked against the idx, as the walk reads), or None when the packs do
 * not hold it. The caller checks the SHA-1 (writeplan.py's search reads). */
static PyObject *
Walker_read_packed(WalkerObject *w, PyObject *arg)
{
    const uint8_t *id;
    if (oid_arg(arg, &id) < 0)
        return NULL;
    long long gid = packs_find(w->packs, id);
    if (gid < 0)
        Py_RETURN_NONE;
    if (walker_begin(w) < 0)
        return NULL;
    uint32_t pk = w->packs->pack_of[gid];
    uint32_t i = (uint32_t)(gid - w->packs->p[pk].base);
    gil_drop(w);
    Obj *o = reader_resolve(&w->rd, pk, i, 0);
    gil_take(w);
    walker_end(w);
    if (!o) {
        raise_err(&w->rd.err);
        return NULL;
    }
    PyObject *out = Py_BuildValue("(iy#)", o->type, (const char *)o->data, (Py_ssize_t)o->size);
    obj_decref(o);
    return out;
}


/* start_young(ids): start points of a walk from objects that are not reached (a cruft plan's young unreachable
 * objects, 20-byte ids end to end). Each id not seen yet and in the packs is marked seen and started from: a
 * commit is queued (walk_commits takes it), a tree walked at once, a blob needs nothing; only entry headers
 * are read to learn a type. Returns the ids it left to the caller, not marked seen: those outside the packs
 * and the tags. With only_trees, only the trees among ids are started from (names.py: the names their entries
 * give), the rest is skipped and nothing is returned. GIL released while it works. */
static PyObject *
Walker_start_young(WalkerObject *w, PyObject *args)
{
    Py_buffer view;
    int only_trees = 0;
    if (!PyArg_ParseTuple(args, "y*|p", &view, &only_trees))
        return NULL;
    if (view.len % OIDLEN) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "start_young(ids): 20-byte ids end to end");
        return NULL;
    }
    if (walker_usable(w, 1) < 0 || walker_begin(w) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint8_t *ids = (const uint8_t *)view.buf;
    size_t n = (size_t)view.len / OIDLEN;
    Buf left = {NULL, 0, 0};
    int rc = 0;
    gil_drop(w);
    for (size_t k = 0; k < n && rc == 0; k++) {
        const uint8_t *id = ids + k * OIDLEN;
        if (idset_has(&w->seen, id))
            continue;
        long long gid = packs_find(w->packs, id);
        int t = 0;
        if (gid >= 0) {
            uint32_t pk = w->packs->pack_of[gid];
            uint32_t i = (uint32_t)(gid - w->packs->p[pk].base);
            if (reader_type(&w->rd, pk, i, &t) < 0) {
                rc = -1;
                break;
            }
            if (only_trees && t != T_TREE)
                continue;
            if (t != T_TAG) {
                if (idset_add(&w->seen, id) < 0) {
                    rc = nomem(&w->rd.err);
                    break;
                }
                if (t == T_COMMIT) {
                    Obj *o = reader_resolve(&w->rd, pk, i, 0);
                    if (!o) {
                        rc = -1;
                        break;
                    }
                    rc = queue_commit(w, id, o->data, o->size, (long)pk, (long long)w->packs->p[pk].offs[i], 0);
                    obj_decref(o);
                } else if (t == T_TREE) {
                    uint8_t root[OIDLEN];
                    memcpy(root, id, OIDLEN);
                    Ref ref = {"tree", root, NULL, NULL};
                    rc = walk_tree(w, root, NULL, 0, 0, &ref);
                }
                continue;
            }
        }
        if (!only_trees && buf_put(&left, id, OIDLEN) < 0)
            rc = nomem(&w->rd.err);
    }
    gil_take(w);
    PyBuffer_Release(&view);
    PyObject *out = rc == 0 ? id_list(left.p, left.len / OIDLEN, OIDLEN) : NULL;
    buf_free(&left);
    walker_end(w);
    if (rc < 0)
        raise_err(&w->rd.err);
    return out;
}

/* A second walker over the same packs with a copy of this one's seen set and roots (for a thread that
 * walks part of the roots, or the cruft walk from young unreachable objects); its own cache, of cache_bytes;
 * this one's fallback reader unless another is given. */
static PyObject *
Walker_copy(WalkerObject *w, PyObject *args)
{
    Py_ssize_t cache_bytes;
    PyObject *fallback = NULL;
    if (!PyArg_ParseTuple(args, "n|O", &cache_bytes, &fallback))
        return NULL;
    if (walker_usable(w, 1) < 0)
        return NULL;
    WalkerObject *c = (WalkerObject *)WalkerType.tp_alloc(&WalkerType, 0);
    if (!c)
        return NULL;
    if (walker_setup(c, w->packs, fallback && fallback != Py_None ? fallback : w->fallback,
                     w->progress ? w->progress : Py_None,
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
    if (walker_usable(w, 1) < 0 || walker_usable(o, 0) < 0)
        return NULL;
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
                        named ? e[j].name_len : 0, named, e[j].path_hash) < 0)
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

/* result() -> (commits, trees, blobs): lists of ids. */
static PyObject *
Walker_result(WalkerObject *w, PyObject *unused)
{
    if (walker_usable(w, 0) < 0)
        return NULL;
    PyObject *commits = id_list(w->commits.p, w->commits.len / OIDLEN, OIDLEN);
    PyObject *trees = id_list(w->trees.p, w->trees.len / sizeof(OutEnt), sizeof(OutEnt));
    PyObject *blobs = id_list(w->blobs.p, w->blobs.len / sizeof(OutEnt), sizeof(OutEnt));
    PyObject *result = NULL;
    if (commits && trees && blobs)
        result = PyTuple_Pack(3, commits, trees, blobs);
    Py_XDECREF(commits);
    Py_XDECREF(trees);
    Py_XDECREF(blobs);
    return result;
}

/* commit_meta() -> (trees, dates, graph_dates, parent counts, graph_ok, parents): what the walk read of each
 * commit, in result()'s order: tree ids (20 bytes each), the walk's committer dates ('q'), the commit-graph's
 * dates ('Q'), parent counts ('I'), one byte each (1: the graph may take the commit as read), and every
 * commit's parent ids one after the other (20 bytes each). walkparse.CommitMeta reads it. */
static PyObject *
Walker_commit_meta(WalkerObject *w, PyObject *unused)
{
    if (walker_usable(w, 0) < 0)
        return NULL;
    size_t n = w->meta.len / sizeof(CommitMetaEnt), np = 0;
    const CommitMetaEnt *m = (const CommitMetaEnt *)w->meta.p;
    for (size_t k = 0; k < n; k++)
        np += m[k].nparents;
    PyObject *trees = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * OIDLEN));
    PyObject *dates = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * sizeof(int64_t)));
    PyObject *gdates = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * sizeof(uint64_t)));
    PyObject *counts = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * sizeof(uint32_t)));
    PyObject *ok = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    PyObject *parents = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(np * OIDLEN));
    PyObject *result = NULL;
    if (trees && dates && gdates && counts && ok && parents) {
        uint8_t *t = (uint8_t *)PyBytes_AS_STRING(trees), *g = (uint8_t *)PyBytes_AS_STRING(ok);
        uint8_t *d = (uint8_t *)PyBytes_AS_STRING(dates), *gd = (uint8_t *)PyBytes_AS_STRING(gdates);
        uint8_t *c = (uint8_t *)PyBytes_AS_STRING(counts), *p = (uint8_t *)PyBytes_AS_STRING(parents);
        for (size_t k = 0; k < n; k++) {
            memcpy(t + k * OIDLEN, m[k].tree, OIDLEN);
            memcpy(d + k * sizeof(int64_t), &m[k].when, sizeof(int64_t));
            memcpy(gd + k * sizeof(uint64_t), &m[k].graph_date, sizeof(uint64_t));
            memcpy(c + k * sizeof(uint32_t), &m[k].nparents, sizeof(uint32_t));
            g[k] = (uint8_t)(m[k].graph_ok != 0);
            memcpy(p, w->parents.p + m[k].parents, (size_t)m[k].nparents * OIDLEN);
            p += (size_t)m[k].nparents * OIDLEN;
        }
        result = PyTuple_Pack(6, trees, dates, gdates, counts, ok, parents);
    }
    Py_XDECREF(trees);
    Py_XDECREF(dates);
    Py_XDECREF(gdates);
    Py_XDECREF(counts);
    Py_XDECREF(ok);
    Py_XDECREF(parents);
    return result;
}

/* What names() and name_hashes() give for one entry: its name (NULL to leave it out) or its path's hash. */
typedef PyObject *(*EntValue)(WalkerObject *w, const OutEnt *e);

static PyObject *
ent_name(WalkerObject *w, const OutEnt *e)
{
    if (e->name_len == NO_NAME)
        return NULL;
    return PyBytes_FromStringAndSize((const char *)w->names.p + e->name_off, e->name_len);
}

static PyObject *
ent_path_hash(WalkerObject *w, const OutEnt *e)
{
    return PyLong_FromUnsignedLong(e->path_hash);
}

/* {id: value(entry)} over the trees and blobs: args are (trees, blobs), the lists result() gave (their id
 * objects become the keys: no second copy of 300,000 ids); value NULL without an exception: left out. */
static PyObject *
ent_dict(WalkerObject *w, PyObject *args, const char *what, EntValue value)
{
    PyObject *lists[2];
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &lists[0], &PyList_Type, &lists[1]))
        return NULL;
    if (walker_usable(w, 0) < 0)
        return NULL;
    Buf *bufs[2] = {&w->trees, &w->blobs};
    for (int k = 0; k < 2; k++)
        if ((size_t)PyList_GET_SIZE(lists[k]) != bufs[k]->len / sizeof(OutEnt)) {
            PyErr_Format(PyExc_ValueError, "%s(trees, blobs): not the lists result() gave", what);
            return NULL;
        }
    PyObject *out = PyDict_New();
    if (!out)
        return NULL;
    for (int k = 0; k < 2; k++) {
        const OutEnt *e = (const OutEnt *)bufs[k]->p;
        size_t n = bufs[k]->len / sizeof(OutEnt);
        for (size_t j = 0; j < n; j++) {
            PyObject *id = PyList_GET_ITEM(lists[k], (Py_ssize_t)j);
            if (!PyBytes_Check(id) || PyBytes_GET_SIZE(id) != OIDLEN || memcmp(PyBytes_AS_STRING(id), e[j].oid, OIDLEN)) {
                PyErr_Format(PyExc_ValueError, "%s(trees, blobs): not the lists result() gave", what);
                Py_DECREF(out);
                return NULL;
            }
            PyObject *v = value(w, &e[j]);
            if (!v && !PyErr_Occurred())
                continue;
            int rc = v ? PyDict_SetItem(out, id, v) : -1;
            Py_XDECREF(v);
            if (rc < 0) {
                Py_DECREF(out);
                return NULL;
            }
        }
    }
    return out;
}

/* names(trees, blobs) -> {id: name} for the trees and blobs reached by a name. */
static PyObject *
Walker_names(WalkerObject *w, PyObject *args)
{
    return ent_dict(w, args, "names", ent_name);
}

/* name_hashes(trees, blobs): {id: pack_name_hash of its whole path} for every tree and blob (0 for those
 * reached without a path). */
static PyObject *
Walker_name_hashes(WalkerObject *w, PyObject *args)
{
    return ent_dict(w, args, "name_hashes", ent_path_hash);
}

/* release_reader(): free the reader (its delta-base cache, zlib stream) once the walk is over; the lists,
 * names and the seen set stay (``in`` answers from it). */
static PyObject *
Walker_release_reader(WalkerObject *w, PyObject *unused)
{
    if (walker_usable(w, 0) < 0)
        return NULL;
    w->released = 1;
    reader_clear(&w->rd);
    Py_RETURN_NONE;
}

/* release_seen(): free the seen set (after release_reader(); the lists and names stay, 'in' is refused). */
static PyObject *
Walker_release_seen(WalkerObject *w, PyObject *unused)
{
    if (walker_usable(w, 0) < 0)
        return NULL;
    if (!w->released) {
        PyErr_SetString(PyExc_RuntimeError, "_walk.Walker.release_seen: release_reader() first");
        return NULL;
    }
    w->seen_released = 1;
    idset_free(&w->seen);
    w->seen.count = 0;
    w->seen.mask = 0;
    Py_RETURN_NONE;
}

/* oid in walker: was it seen (reached, or marked seen)? */
static int
Walker_contains(WalkerObject *w, PyObject *key)
{
    if (walker_usable(w, 1) < 0)
        return -1;
    if (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) != OIDLEN)
        return 0;
    return idset_has(&w->seen, (const uint8_t *)PyBytes_AS_STRING(key));
}

static Py_ssize_t
Walker_len(WalkerObject *w)
{
    return (Py_ssize_t)w->seen.count;
}

static PySequenceMethods Walker_as_sequence = {
    .sq_length = (lenfunc)Walker_len,
    .sq_contains = (objobjproc)Walker_contains,
};

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
    {"commit_meta", (PyCFunction)Walker_commit_meta, METH_NOARGS,
     "commit_meta() -> (trees, dates, graph_dates, parent counts, graph_ok, parents) of the commits taken"},
    {"walk_commits", (PyCFunction)Walker_walk_commits, METH_NOARGS,
     "take the queued commits newest first, reading and queueing their parents"},
    {"add_blob", (PyCFunction)(void (*)(void))Walker_add_blob, METH_FASTCALL, "add_blob(oid, name)"},
    {"walk_tree", (PyCFunction)(void (*)(void))Walker_walk_tree, METH_FASTCALL,
     "walk_tree(oid, name | None, referrer): a tree and everything below it not seen yet"},
    {"walk_roots", (PyCFunction)Walker_walk_roots, METH_VARARGS,
     "walk_roots(start, stop): the trees of the commits taken, roots[start:stop]"},
    {"claim_roots", (PyCFunction)Walker_claim_roots, METH_VARARGS,
     "claim_roots(start, stop): the roots walk_claimed() walks (steal_roots may take their tail)"},
    {"walk_claimed", (PyCFunction)Walker_walk_claimed, METH_NOARGS, "walk the claimed roots' trees"},
    {"steal_roots", (PyCFunction)Walker_steal_roots, METH_O,
     "steal_roots(min_left): (start, stop) of the second half of the roots a running walk_roots has left, or None"},
    {"read_packed", (PyCFunction)Walker_read_packed, METH_O,
     "read_packed(oid): (type, bytes) of an object of the packs, resolved here (no SHA-1 check), or None"},
    {"start_young", (PyCFunction)Walker_start_young, METH_VARARGS,
     "start_young(ids, only_trees=False): start a walk from unreached objects (commits queued, trees walked); the ids left to Python"},
    {"copy", (PyCFunction)Walker_copy, METH_VARARGS, "copy(cache_bytes, fallback=None): a walker with this one's seen set and roots (and its fallback, unless given)"},
    {"merge", (PyCFunction)Walker_merge, METH_O, "merge(other): append what other found and this walk did not"},
    {"cancel", (PyCFunction)Walker_cancel, METH_NOARGS, "make a walk running in another thread stop soon"},
    {"result", (PyCFunction)Walker_result, METH_NOARGS, "(commits, trees, blobs)"},
    {"names", (PyCFunction)Walker_names, METH_VARARGS,
     "names(trees, blobs): {id: name} of the trees and blobs reached by a name (the lists result() gave)"},
    {"name_hashes", (PyCFunction)Walker_name_hashes, METH_VARARGS,
     "name_hashes(trees, blobs): {id: git's pack_name_hash of the whole path it was reached by}"},
    {"release_seen", (PyCFunction)Walker_release_seen, METH_NOARGS,
     "free the seen set once nothing asks 'in' any more (after release_reader)"},
    {"release_reader", (PyCFunction)Walker_release_reader, METH_NOARGS,
     "free the delta-base cache once the walk is over (the lists, names and seen set stay)"},
    {"counts", (PyCFunction)Walker_counts, METH_NOARGS, "(commits, trees, blobs, roots, seen)"},
    {"stats", (PyCFunction)Walker_stats, METH_NOARGS,
     "objects resolved, entries inflated, cache hits, bytes and entries in the delta-base cache"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WalkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "packyard.store.maintenance.walk._walk.Walker",
    .tp_basicsize = sizeof(WalkerObject),
    .tp_dealloc = (destructor)Walker_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Walker(packs, fallback, progress=None, cache_bytes=96 MiB, expect=0): one reachability walk",
    .tp_methods = Walker_methods,
    .tp_as_sequence = &Walker_as_sequence,
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
    .m_name = "packyard.store.maintenance.walk._walk",
    .m_doc = "the reachability walk's hot loops (C); the walk is specified in walk/reach.py",
    .m_size = -1,
    .m_methods = module_methods,
};

/* The C API of the extensions that read objects through these Packs and Reader (_walk.h's WalkAPI). */
static WalkAPI walk_api;

static int
add_capsule(PyObject *m)
{
    walk_api.version = WALK_API_VERSION;
    walk_api.packs_type = &PacksType;
    walk_api.walk_error = WalkError;
#define GIVE(ret, name, params) walk_api.name = name;
    WALK_API_FUNCTIONS(GIVE)
#undef GIVE
    PyObject *capsule = PyCapsule_New(&walk_api, WALK_API_CAPSULE, NULL);
    if (!capsule)
        return -1;
    int rc = PyModule_AddObjectRef(m, "_C_API", capsule);
    Py_DECREF(capsule);
    return rc;
}

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
    WalkError = PyErr_NewException("packyard.store.maintenance.walk._walk.WalkError", NULL, NULL);
    if (!WalkError || PyModule_AddObjectRef(m, "WalkError", WalkError) < 0
        || PyModule_AddObjectRef(m, "Packs", (PyObject *)&PacksType) < 0
        || PyModule_AddObjectRef(m, "Walker", (PyObject *)&WalkerType) < 0
        || PyModule_AddIntConstant(m, "MAX_CHAIN", MAX_CHAIN) < 0 || add_capsule(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}


