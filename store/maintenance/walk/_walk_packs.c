/*
 * _walk_packs.c: zlib from the interpreter's shared library, the walk's errors, Packs (the replaceable
 * packs of a repack held as buffer exports, and the id -> entry index over them), pack_layout.
 */
#include "_walk.h"

const char *(*z_version)(void);
int (*z_inflateInit_)(zstream *, const char *, int);
int (*z_inflate)(zstream *, int);
int (*z_inflateEnd)(zstream *);
int (*z_inflateReset)(zstream *);
unsigned long (*z_crc32)(unsigned long, const unsigned char *, unsigned int);


int
walk_load_zlib(void)
{
    static const char *names[] = {"libz.so.1", "libz.so", "libz.1.dylib", "libz.dylib", NULL};
    void *h = NULL;
    for (int k = 0; names[k] && !h; k++)
        h = dlopen(names[k], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        PyErr_SetString(PyExc_ImportError, "_walk: the zlib shared library (libz.so.1) was not found");
        return -1;
    }
    z_version = (const char *(*)(void))dlsym(h, "zlibVersion");
    z_inflateInit_ = (int (*)(zstream *, const char *, int))dlsym(h, "inflateInit_");
    z_inflate = (int (*)(zstream *, int))dlsym(h, "inflate");
    z_inflateEnd = (int (*)(zstream *))dlsym(h, "inflateEnd");
    z_inflateReset = (int (*)(zstream *))dlsym(h, "inflateReset");
    z_crc32 = (unsigned long (*)(unsigned long, const unsigned char *, unsigned int))dlsym(h, "crc32");
    if (!z_version || !z_inflateInit_ || !z_inflate || !z_inflateEnd || !z_inflateReset || !z_crc32
        || z_version()[0] != '1') {
        PyErr_SetString(PyExc_ImportError, "_walk: the zlib shared library lacks inflate/crc32 or is not zlib 1.x");
        return -1;
    }
    /* The struct layout above must be the library's: inflateInit_ refuses another size. */
    zstream z;
    memset(&z, 0, sizeof z);
    if (z_inflateInit_(&z, z_version(), (int)sizeof(zstream)) != Z_OK) {
        PyErr_SetString(PyExc_ImportError, "_walk: zlib refused this module's z_stream layout");
        return -1;
    }
    z_inflateEnd(&z);
    return 0;
}

/* ---- errors ----------------------------------------------------------------------------- */

PyObject *WalkError;

int
fail(Err *e, int kind, const uint8_t *oid, long pack, long long offset, const char *fmt, ...)
{
    va_list ap;
    if (e->kind != E_NONE)
        return -1;            /* the first error wins */
    e->kind = kind;
    e->has_oid = oid != NULL;
    if (oid)
        memcpy(e->oid, oid, OIDLEN);
    e->pack = pack;
    e->offset = offset;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int
nomem(Err *e)
{
    if (e->kind == E_NONE)
        e->kind = E_NOMEM;
    return -1;
}

void
raise_err(Err *e)
{
    if (e->kind == E_PY) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_SystemError, "_walk: callback failed without an exception");
    } else if (e->kind == E_NOMEM) {
        PyErr_NoMemory();
    } else if (e->kind == E_CANCELLED) {
        PyErr_SetString(PyExc_RuntimeError, "_walk: the walk was cancelled");
    } else {
        const char *kind = e->kind == E_PACK ? "pack" : e->kind == E_MISSING ? "missing" : "corrupt";
        PyObject *oid = e->has_oid ? PyBytes_FromStringAndSize((const char *)e->oid, OIDLEN) : Py_NewRef(Py_None);
        if (oid) {
            PyObject *args = Py_BuildValue("(ssOlL)", kind, e->msg, oid, e->pack, e->offset);
            if (args) {
                PyErr_SetObject(WalkError, args);
                Py_DECREF(args);
            }
            Py_DECREF(oid);
        }
    }
    e->kind = E_NONE;
}

void
hex_of(const uint8_t *oid, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (int k = 0; k < OIDLEN; k++) {
        out[2 * k] = digits[oid[k] >> 4];
        out[2 * k + 1] = digits[oid[k] & 15];
    }
    out[2 * OIDLEN] = 0;
}

const char *
type_label(int t)
{
    switch (t) {
    case T_COMMIT: return "commit";
    case T_TREE: return "tree";
    case T_BLOB: return "blob";
    case T_TAG: return "tag";
    default: return "unknown";
    }
}


static void
packs_release(PacksObject *self)
{
    if (self->p) {
        for (uint32_t k = 0; k < self->npacks; k++) {
            Pack *p = &self->p[k];
            release_tables(p->v, p->held);
            p->held = 0;
            PyMem_RawFree(p->checked);
            p->checked = NULL;
        }
        PyMem_RawFree(self->p);
        self->p = NULL;
    }
    PyMem_RawFree(self->pack_of);
    self->pack_of = NULL;
    PyMem_RawFree(self->slots);
    self->slots = NULL;
    self->npacks = 0;
    self->total = 0;
    self->closed = 1;
}

static void
Packs_dealloc(PacksObject *self)
{
    packs_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Packs(packs, kept, seed, drop_every=0): packs is a sequence of (buffer, end, oids, offsets 'Q', crcs 'I',
 * ends 'Q', sorted offsets 'Q', order 'I'), the tables of SourceIndex; kept an iterable of ids. drop_every:
 * after inflating that many bytes a reader gives back the pages of the packs' maps (mmap buffers only; see
 * packs_drop_pages). */
static PyObject *
Packs_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"packs", "kept", "seed", "drop_every", NULL};
    PyObject *seq, *kept, *fast = NULL, *it = NULL, *item;
    unsigned long long seed;
    IdSet kept_set = {0};
    PacksObject *self;

    Py_ssize_t drop_every = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOK|n", kwlist, &seq, &kept, &seed, &drop_every))
        return NULL;
    self = (PacksObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->seed = seed;
    self->drop_every = drop_every > 0 ? (size_t)drop_every : 0;
    fast = PySequence_Fast(seq, "_walk.Packs: packs must be a sequence");
    if (!fast)
        goto error;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n >= UINT32_MAX)
        goto error;
    self->p = PyMem_RawCalloc(n ? (size_t)n : 1, sizeof(Pack));
    if (!self->p) {
        PyErr_NoMemory();
        goto error;
    }
    self->npacks = (uint32_t)n;
    uint64_t total = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        Pack *p = &self->p[k];
        PyObject *t = PySequence_Fast_GET_ITEM(fast, k);
        PyObject *buf, *oids, *offs, *crcs, *ends, *soffs, *order;
        unsigned long long end;
        if (!PyArg_ParseTuple(t, "OKOOOOOO", &buf, &end, &oids, &offs, &crcs, &ends, &soffs, &order))
            goto error;
        if (PyObject_GetBuffer(buf, &p->v[0], PyBUF_SIMPLE) < 0)
            goto error;
        p->held = 1;
        if (PyObject_GetBuffer(oids, &p->v[1], PyBUF_SIMPLE) < 0)
            goto error;
        p->held = 2;
        if (p->v[1].len % OIDLEN || p->v[1].len / OIDLEN >= UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "_walk.Packs: oids is not a whole number of ids");
            goto error;
        }
        p->count = (uint32_t)(p->v[1].len / OIDLEN);
        const Table tables[] = {
            {offs, 8, 0, "_walk.Packs: offsets"}, {crcs, 4, 0, "_walk.Packs: crcs"}, {ends, 8, 0, "_walk.Packs: ends"},
            {soffs, 8, 0, "_walk.Packs: sorted offsets"}, {order, 4, 0, "_walk.Packs: order"},
        };
        Py_ssize_t entries = p->count;
        if (get_tables(tables, 5, &p->v[2], &entries) < 0)
            goto error;
        p->held = 7;
        p->buf = p->v[0].buf;
        p->buflen = (size_t)p->v[0].len;
        /* Only a file map may be given back (MADV_DONTNEED on heap memory would zero it). */
        p->droppable = PyObject_HasAttrString(buf, "madvise");
        if (end > p->buflen) {
            PyErr_SetString(PyExc_ValueError, "_walk.Packs: entries end past the pack's bytes");
            goto error;
        }
        p->end = end;
        p->oids = p->v[1].buf;
        p->offs = p->v[2].buf;
        p->crcs = p->v[3].buf;
        p->ends = p->v[4].buf;
        p->soffs = p->v[5].buf;
        p->order = p->v[6].buf;
        for (uint32_t i = 0; i < p->count; i++) {
            if (p->order[i] >= p->count) {
                PyErr_SetString(PyExc_ValueError, "_walk.Packs: order names a position outside the idx");
                goto error;
            }
        }
        p->checked = PyMem_RawCalloc(p->count ? p->count : 1, 1);
        if (!p->checked) {
            PyErr_NoMemory();
            goto error;
        }
        p->base = (uint32_t)total;
        total += p->count;
        if (total >= UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "_walk.Packs: more than 2^32 entries");
            goto error;
        }
    }
    self->total = (uint32_t)total;
    self->pack_of = PyMem_RawMalloc((total ? total : 1) * sizeof(uint32_t));
    if (!self->pack_of) {
        PyErr_NoMemory();
        goto error;
    }
    for (uint32_t k = 0; k < self->npacks; k++)
        for (uint32_t i = 0; i < self->p[k].count; i++)
            self->pack_of[self->p[k].base + i] = k;
    /* Ids of .keep packs: never copied, so never indexed here. */
    if (idset_init(&kept_set, 16, seed) < 0) {
        PyErr_NoMemory();
        goto error;
    }
    it = PyObject_GetIter(kept);
    if (!it)
        goto error;
    while ((item = PyIter_Next(it))) {
        if (!PyBytes_Check(item) || PyBytes_GET_SIZE(item) != OIDLEN) {
            Py_DECREF(item);
            PyErr_SetString(PyExc_ValueError, "_walk.Packs: kept ids must be 20-byte bytes");
            goto error;
        }
        int r = idset_add(&kept_set, (const uint8_t *)PyBytes_AS_STRING(item));
        Py_DECREF(item);
        if (r < 0) {
            PyErr_NoMemory();
            goto error;
        }
    }
    if (PyErr_Occurred())
        goto error;
    size_t cap = 1024;
    while (cap < 2 * (size_t)total + 2)
        cap <<= 1;
    self->slots = PyMem_RawCalloc(cap, sizeof(uint64_t));
    if (!self->slots) {
        PyErr_NoMemory();
        goto error;
    }
    self->mask = cap - 1;
    for (uint32_t k = 0; k < self->npacks; k++) {
        const Pack *p = &self->p[k];
        for (uint32_t i = 0; i < p->count; i++) {
            const uint8_t *id = p->oids + (size_t)i * OIDLEN;
            if (kept_set.count && idset_has(&kept_set, id))
                continue;
            uint64_t h = oid_hash(id, seed), tag = slot_tag(h);
            size_t j = (size_t)h & self->mask;
            int dup = 0;
            while (self->slots[j]) {
                uint64_t v = self->slots[j];
                if ((v & 0xFFFFFFFF00000000ULL) == tag
                    && memcmp(packs_oid(self, (uint32_t)v - 1), id, OIDLEN) == 0) {
                    dup = 1;     /* an earlier pack has it: that copy is the one */
                    break;
                }
                j = (j + 1) & self->mask;
            }
            if (!dup) {
                self->slots[j] = tag | (uint64_t)(p->base + i + 1);
                self->indexed++;
            }
        }
    }
    idset_free(&kept_set);
    Py_DECREF(it);
    Py_DECREF(fast);
    return (PyObject *)self;

error:
    idset_free(&kept_set);
    Py_XDECREF(it);
    Py_XDECREF(fast);
    Py_DECREF(self);
    return NULL;
}

static int
check_oid_arg(PyObject *o, const uint8_t **id)
{
    if (!PyBytes_Check(o) || PyBytes_GET_SIZE(o) != OIDLEN) {
        *id = NULL;
        return 0;     /* not an id: simply absent, as in a dict */
    }
    *id = (const uint8_t *)PyBytes_AS_STRING(o);
    return 1;
}

static PyObject *
Packs_get(PacksObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const uint8_t *id;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(oid, default=None)");
        return NULL;
    }
    if (packs_check_open(self) < 0)
        return NULL;
    if (check_oid_arg(args[0], &id)) {
        long long gid = packs_find(self, id);
        if (gid >= 0)
            return PyLong_FromLongLong(gid);
    }
    return Py_NewRef(nargs == 2 ? args[1] : Py_None);
}

static int
Packs_contains(PacksObject *self, PyObject *key)
{
    const uint8_t *id;
    if (packs_check_open(self) < 0)
        return -1;
    return check_oid_arg(key, &id) && packs_find(self, id) >= 0;
}

static Py_ssize_t
Packs_len(PacksObject *self)
{
    return (Py_ssize_t)self->indexed;
}

static PyObject *
Packs_subscript(PacksObject *self, PyObject *key)
{
    const uint8_t *id;
    if (packs_check_open(self) < 0)
        return NULL;
    if (check_oid_arg(key, &id)) {
        long long gid = packs_find(self, id);
        if (gid >= 0)
            return PyLong_FromLongLong(gid);
    }
    PyErr_SetObject(PyExc_KeyError, key);
    return NULL;
}

/* oid_at(pack number, offset) -> the id of the entry starting at offset in that pack, or None. */
static PyObject *
Packs_oid_at(PacksObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t k;
    unsigned long long off;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "oid_at(pack number, offset)");
        return NULL;
    }
    if (packs_check_open(self) < 0)
        return NULL;
    k = PyLong_AsSsize_t(args[0]);
    if (k == -1 && PyErr_Occurred())
        return NULL;
    off = PyLong_AsUnsignedLongLong(args[1]);
    if (off == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (k < 0 || (size_t)k >= self->npacks) {
        PyErr_SetString(PyExc_IndexError, "oid_at: no such pack");
        return NULL;
    }
    const Pack *p = &self->p[k];
    long long i = pack_entry_at(p, off);
    if (i < 0)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)p->oids + (size_t)i * OIDLEN, OIDLEN);
}

static PyObject *
Packs_close(PacksObject *self, PyObject *unused)
{
    if (self->users) {
        PyErr_SetString(PyExc_RuntimeError, "_walk.Packs: a walk is still running on these packs");
        return NULL;
    }
    packs_release(self);
    Py_RETURN_NONE;
}

static int
add_all(IdSet *set, PyObject *ids)
{
    PyObject *it = PyObject_GetIter(ids), *item;
    if (!it)
        return -1;
    while ((item = PyIter_Next(it))) {
        int r = 0;
        if (PyBytes_Check(item) && PyBytes_GET_SIZE(item) == OIDLEN)
            r = idset_add(set, (const uint8_t *)PyBytes_AS_STRING(item));
        Py_DECREF(item);
        if (r < 0) {
            Py_DECREF(it);
            PyErr_NoMemory();
            return -1;
        }
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

/* unreached(seen, kept) -> for each pack, the idx positions whose id is in neither (20-byte bytes ids;
 * anything else in them is ignored): the copies a full repack did not reach. The ids are put in a C set
 * once, then every entry is looked up there (a Python loop slicing each id took 0.3 s for 500,000).
 * seen may be the C Walker itself: its own seen set is used as it is. */
static PyObject *
Packs_unreached(PacksObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    IdSet set = {0};
    PyObject *out = NULL;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "unreached(seen, kept)");
        return NULL;
    }
    if (packs_check_open(self) < 0)
        return NULL;
    const IdSet *walked = walker_seen(args[0]);
    Py_ssize_t hint = walked ? PyObject_Length(args[1]) : PyObject_Length(args[0]);
    if (hint < 0) {
        PyErr_Clear();
        hint = 0;
    }
    if (idset_init(&set, (size_t)hint, self->seed ^ 0x2545F4914F6CDD1DULL) < 0) {
        PyErr_NoMemory();
        return NULL;
    }
    if ((!walked && add_all(&set, args[0]) < 0) || add_all(&set, args[1]) < 0)
        goto done;
    out = PyList_New((Py_ssize_t)self->npacks);
    if (!out)
        goto done;
    for (uint32_t k = 0; k < self->npacks; k++) {
        const Pack *p = &self->p[k];
        PyObject *list = PyList_New(0);
        if (!list) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, k, list);
        for (uint32_t i = 0; i < p->count; i++) {
            const uint8_t *id = p->oids + (size_t)i * OIDLEN;
            const IdSet *first = walked ? walked : &set;
            if (i + 8 < p->count)
                idset_prefetch(first, oid_hash(p->oids + (size_t)(i + 8) * OIDLEN, first->seed));
            if (idset_has(first, id) || (walked && set.count && idset_has(&set, id)))
                continue;
            PyObject *n = PyLong_FromUnsignedLong(i);
            if (!n || PyList_Append(list, n) < 0) {
                Py_XDECREF(n);
                Py_CLEAR(out);
                goto done;
            }
            Py_DECREF(n);
        }
    }
done:
    idset_free(&set);
    return out;
}

/* present(ids, loose, kept) -> the ids of the list ids (same objects, same order) that are in these packs'
 * index, or in loose and not in kept (SourceIndex.present: what a repack may rewrite). */
static PyObject *
Packs_present(PacksObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "present(ids: list, loose, kept)");
        return NULL;
    }
    if (packs_check_open(self) < 0)
        return NULL;
    PyObject *ids = args[0];
    Py_ssize_t n = PyList_GET_SIZE(ids), kept_n = 0;
    PyObject *out = PyList_New(n);
    if (!out)
        return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *o = PyList_GET_ITEM(ids, k);
        const uint8_t *id;
        int in = check_oid_arg(o, &id) && packs_find(self, id) >= 0;
        if (!in) {
            int r = PySequence_Contains(args[1], o);
            if (r > 0) {
                r = PySequence_Contains(args[2], o);
                if (r >= 0)
                    r = !r;
            }
            if (r < 0) {
                Py_SET_SIZE(out, kept_n);
                Py_DECREF(out);
                return NULL;
            }
            in = r;
        }
        if (in)
            PyList_SET_ITEM(out, kept_n++, Py_NewRef(o));
    }
    Py_SET_SIZE(out, kept_n);   /* (the unused tail slots are NULL: a shorter list, freed with it) */
    return out;
}

static PyMethodDef Packs_methods[] = {
    {"present", (PyCFunction)(void (*)(void))Packs_present, METH_FASTCALL,
     "present(ids, loose, kept): the ids in these packs, or in loose and not in kept, in their order"},
    {"unreached", (PyCFunction)(void (*)(void))Packs_unreached, METH_FASTCALL,
     "unreached(seen, kept): for each pack, the idx positions whose id is in neither"},
    {"get", (PyCFunction)(void (*)(void))Packs_get, METH_FASTCALL,
     "get(oid, default=None): the global entry number of oid, as SourceIndex.loc.get"},
    {"oid_at", (PyCFunction)(void (*)(void))Packs_oid_at, METH_FASTCALL,
     "oid_at(pack number, offset): the id of the entry starting there, or None"},
    {"close", (PyCFunction)Packs_close, METH_NOARGS, "release the exported buffers (the packs can be closed)"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods Packs_as_sequence = {
    .sq_length = (lenfunc)Packs_len,
    .sq_contains = (objobjproc)Packs_contains,
};

static PyMappingMethods Packs_as_mapping = {
    .mp_length = (lenfunc)Packs_len,
    .mp_subscript = (binaryfunc)Packs_subscript,
};

PyTypeObject PacksType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "packyard.store.maintenance.walk._walk.Packs",
    .tp_basicsize = sizeof(PacksObject),
    .tp_dealloc = (destructor)Packs_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Packs(packs, kept, seed): the replaceable packs of a repack and an id -> entry index",
    .tp_methods = Packs_methods,
    .tp_as_sequence = &Packs_as_sequence,
    .tp_as_mapping = &Packs_as_mapping,
    .tp_new = Packs_new,
};


/* ---- pack layout --------------------------------------------------------------------------- */

typedef struct {
    uint64_t off;
    uint32_t i;
} OffIdx;

static int
cmp_offidx(const void *a, const void *b)
{
    const OffIdx *x = a, *y = b;
    if (x->off != y->off)
        return x->off < y->off ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Sort by offset, ties by idx position (as cmp_offidx): a least-significant-digit radix sort, 11 bits a pass
 * (stable, and the items start in idx order), as many passes as the largest offset has bits -- 3 for a
 * pack under 8 GiB; qsort took 80 ms of a repack for 500,000 entries. qsort when the scratch copy cannot
 * be allocated. */
static void
sort_offidx(OffIdx *a, size_t n)
{
    OffIdx *b = n > 1 ? PyMem_RawMalloc(n * sizeof(OffIdx)) : NULL;
    if (!b) {
        if (n > 1)
            qsort(a, n, sizeof(OffIdx), cmp_offidx);
        return;
    }
    uint64_t bits = 0;
    for (size_t k = 0; k < n; k++)
        bits |= a[k].off;
    OffIdx *src = a, *dst = b;
    for (unsigned shift = 0; shift < 64 && (bits >> shift); shift += 11) {
        size_t count[2049] = {0};
        for (size_t k = 0; k < n; k++)
            count[((src[k].off >> shift) & 2047) + 1]++;
        for (size_t d = 1; d < 2049; d++)
            count[d] += count[d - 1];
        for (size_t k = 0; k < n; k++)
            dst[count[(src[k].off >> shift) & 2047]++] = src[k];
        OffIdx *t = src;
        src = dst;
        dst = t;
    }
    if (src != a)
        memcpy(a, src, n * sizeof(OffIdx));
    PyMem_RawFree(b);
}

/* pack_layout(offsets, trailer) -> (order, sorted offsets, ends) as bytes of 'I', 'Q', 'Q' items:
 * the idx positions in pack order, their offsets, and where each entry ends (idx order: the next
 * entry's offset, or the trailer's). */
PyObject *
walk_pack_layout(PyObject *module, PyObject *args)
{
    PyObject *offsets;
    unsigned long long trailer;
    Py_buffer v;
    if (!PyArg_ParseTuple(args, "OK", &offsets, &trailer))
        return NULL;
    if (PyObject_GetBuffer(offsets, &v, PyBUF_SIMPLE) < 0)
        return NULL;
    if (v.len % 8 || v.len / 8 >= UINT32_MAX) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_ValueError, "pack_layout: offsets must be 8-byte items");
        return NULL;
    }
    size_t n = (size_t)v.len / 8;
    const uint64_t *offs = v.buf;
    PyObject *order = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(4 * n));
    PyObject *sorted = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(8 * n));
    PyObject *ends = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(8 * n));
    OffIdx *tmp = PyMem_RawMalloc((n ? n : 1) * sizeof(OffIdx));
    PyObject *result = NULL;
    if (!order || !sorted || !ends || !tmp) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto out;
    }
    uint32_t *o = (uint32_t *)PyBytes_AS_STRING(order);
    uint64_t *s = (uint64_t *)PyBytes_AS_STRING(sorted), *e = (uint64_t *)PyBytes_AS_STRING(ends);
    Py_BEGIN_ALLOW_THREADS
    for (size_t k = 0; k < n; k++) {
        tmp[k].off = offs[k];
        tmp[k].i = (uint32_t)k;
    }
    sort_offidx(tmp, n);
    for (size_t k = 0; k < n; k++) {
        o[k] = tmp[k].i;
        s[k] = tmp[k].off;
        e[tmp[k].i] = k + 1 < n ? tmp[k + 1].off : trailer;
    }
    Py_END_ALLOW_THREADS
    result = PyTuple_Pack(3, order, sorted, ends);
out:
    PyMem_RawFree(tmp);
    Py_XDECREF(order);
    Py_XDECREF(sorted);
    Py_XDECREF(ends);
    PyBuffer_Release(&v);
    return result;
}

