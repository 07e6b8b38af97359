/*
 * _walk: the reachability walk's hot loops in C.
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
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define OIDLEN 20
#define T_COMMIT 1
#define T_TREE 2
#define T_BLOB 3
#define T_TAG 4
#define T_OFS 6
#define T_REF 7
#define MAX_CHAIN 10000
#define PACK_HEADER 12
#define NO_NAME UINT32_MAX

/* ---- zlib, from the shared library -------------------------------------------------- */

typedef struct {
    const unsigned char *next_in;
    unsigned int avail_in;
    unsigned long total_in;
    unsigned char *next_out;
    unsigned int avail_out;
    unsigned long total_out;
    const char *msg;
    void *state;
    void *zalloc;
    void *zfree;
    void *opaque;
    int data_type;
    unsigned long adler;
    unsigned long reserved;
} zstream;

#define Z_OK 0
#define Z_STREAM_END 1
#define Z_BUF_ERROR (-5)
#define Z_NO_FLUSH 0

static const char *(*z_version)(void);
static int (*z_inflateInit_)(zstream *, const char *, int);
static int (*z_inflate)(zstream *, int);
static int (*z_inflateEnd)(zstream *);
static int (*z_inflateReset)(zstream *);
static unsigned long (*z_crc32)(unsigned long, const unsigned char *, unsigned int);

static int
load_zlib(void)
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

static uint32_t
crc32_of(const uint8_t *p, size_t n)
{
    unsigned long crc = z_crc32(0L, NULL, 0);
    while (n) {
        unsigned int chunk = n > (1u << 30) ? (1u << 30) : (unsigned int)n;
        crc = z_crc32(crc, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return (uint32_t)crc;
}

/* ---- errors ----------------------------------------------------------------------------- */

static PyObject *WalkError;   /* (kind, message, oid or None, pack number or -1, offset or -1) */

enum { E_NONE = 0, E_PY, E_NOMEM, E_CANCELLED, E_CORRUPT, E_PACK, E_MISSING };

typedef struct {
    int kind;
    char msg[300];
    uint8_t oid[OIDLEN];
    int has_oid;
    long pack;
    long long offset;
} Err;

static int
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

static int
nomem(Err *e)
{
    if (e->kind == E_NONE)
        e->kind = E_NOMEM;
    return -1;
}

/* With the GIL: turn a recorded error into a Python exception (E_PY: one is already set). */
static void
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

static void
hex_of(const uint8_t *oid, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (int k = 0; k < OIDLEN; k++) {
        out[2 * k] = digits[oid[k] >> 4];
        out[2 * k + 1] = digits[oid[k] & 15];
    }
    out[2 * OIDLEN] = 0;
}

static const char *
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

/* ---- ids: hashing, a set of ids ----------------------------------------------------------- */

static inline uint64_t
load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Ids are SHA-1 digests; the per-process seed keeps crafted ids from piling into one run of slots. */
static inline uint64_t
oid_hash(const uint8_t *id, uint64_t seed)
{
    uint64_t h = (load64(id) ^ seed) * 0x9E3779B97F4A7C15ULL;
    h ^= load64(id + 8);
    h *= 0xC2B2AE3D27D4EB4FULL;
    return h ^ (h >> 31);
}

static const uint8_t ZERO_ID[OIDLEN];

/* Open addressing, linear probing, keys stored inline (one cache line per probe); the all-zero
 * id marks an empty slot, so the zero id itself is kept aside in has_zero. */
typedef struct {
    uint8_t *slots;
    size_t mask;
    size_t count;
    int has_zero;
    uint64_t seed;
} IdSet;

static int
idset_init(IdSet *s, size_t expect, uint64_t seed)
{
    size_t cap = 1024;
    while (cap < 2 * expect + 2)
        cap <<= 1;
    s->slots = PyMem_RawCalloc(cap, OIDLEN);
    if (!s->slots)
        return -1;
    s->mask = cap - 1;
    s->count = 0;
    s->has_zero = 0;
    s->seed = seed;
    return 0;
}

static void
idset_free(IdSet *s)
{
    PyMem_RawFree(s->slots);
    s->slots = NULL;
}

/* With the id's hash computed beforehand (oid_hash(id, s->seed)): see idset_prefetch. */
static inline int
idset_has_h(const IdSet *s, const uint8_t *id, uint64_t h)
{
    if (memcmp(id, ZERO_ID, OIDLEN) == 0)
        return s->has_zero;
    size_t i = (size_t)h & s->mask;
    for (;;) {
        const uint8_t *slot = s->slots + i * OIDLEN;
        if (memcmp(slot, id, OIDLEN) == 0)
            return 1;
        if (memcmp(slot, ZERO_ID, OIDLEN) == 0)
            return 0;
        i = (i + 1) & s->mask;
    }
}

/* Start loading the slot an id with hash h lands in (a lookup a few entries later then finds it in
 * the cache: the table is tens of MiB and most lookups of a tree's entries hit, each a cache miss). */
static inline void
idset_prefetch(const IdSet *s, uint64_t h)
{
#if defined(__GNUC__)
    const uint8_t *slot = s->slots + ((size_t)h & s->mask) * OIDLEN;
    __builtin_prefetch(slot);
    __builtin_prefetch(slot + OIDLEN - 1);
#else
    (void)s;
    (void)h;
#endif
}

static inline int
idset_has(const IdSet *s, const uint8_t *id)
{
    if (memcmp(id, ZERO_ID, OIDLEN) == 0)
        return s->has_zero;
    size_t i = (size_t)oid_hash(id, s->seed) & s->mask;
    for (;;) {
        const uint8_t *slot = s->slots + i * OIDLEN;
        if (memcmp(slot, id, OIDLEN) == 0)
            return 1;
        if (memcmp(slot, ZERO_ID, OIDLEN) == 0)
            return 0;
        i = (i + 1) & s->mask;
    }
}

static int
idset_grow(IdSet *s)
{
    size_t cap = (s->mask + 1) * 2;
    uint8_t *slots = PyMem_RawCalloc(cap, OIDLEN);
    if (!slots)
        return -1;
    for (size_t k = 0; k <= s->mask; k++) {
        const uint8_t *old = s->slots + k * OIDLEN;
        if (memcmp(old, ZERO_ID, OIDLEN) == 0)
            continue;
        size_t i = (size_t)oid_hash(old, s->seed) & (cap - 1);
        while (memcmp(slots + i * OIDLEN, ZERO_ID, OIDLEN) != 0)
            i = (i + 1) & (cap - 1);
        memcpy(slots + i * OIDLEN, old, OIDLEN);
    }
    PyMem_RawFree(s->slots);
    s->slots = slots;
    s->mask = cap - 1;
    return 0;
}

/* 1: added, 0: was there, -1: out of memory. */
static int
idset_add(IdSet *s, const uint8_t *id)
{
    if (memcmp(id, ZERO_ID, OIDLEN) == 0) {
        if (s->has_zero)
            return 0;
        s->has_zero = 1;
        s->count++;
        return 1;
    }
    size_t i = (size_t)oid_hash(id, s->seed) & s->mask;
    for (;;) {
        uint8_t *slot = s->slots + i * OIDLEN;
        if (memcmp(slot, id, OIDLEN) == 0)
            return 0;
        if (memcmp(slot, ZERO_ID, OIDLEN) == 0)
            break;
        i = (i + 1) & s->mask;
    }
    if (2 * (s->count + 1) > s->mask + 1) {
        if (idset_grow(s) < 0)
            return -1;
        i = (size_t)oid_hash(id, s->seed) & s->mask;
        while (memcmp(s->slots + i * OIDLEN, ZERO_ID, OIDLEN) != 0)
            i = (i + 1) & s->mask;
    }
    memcpy(s->slots + i * OIDLEN, id, OIDLEN);
    s->count++;
    return 1;
}

static int
idset_copy(IdSet *dst, const IdSet *src)
{
    dst->slots = PyMem_RawMalloc((src->mask + 1) * OIDLEN);
    if (!dst->slots)
        return -1;
    memcpy(dst->slots, src->slots, (src->mask + 1) * OIDLEN);
    dst->mask = src->mask;
    dst->count = src->count;
    dst->has_zero = src->has_zero;
    dst->seed = src->seed;
    return 0;
}

/* A growable byte array. */
typedef struct {
    uint8_t *p;
    size_t len, cap;
} Buf;

static int
buf_reserve(Buf *b, size_t more)
{
    if (more > SIZE_MAX / 2 - b->len)
        return -1;
    if (b->len + more <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more)
        cap *= 2;
    uint8_t *p = PyMem_RawRealloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int
buf_put(Buf *b, const void *data, size_t n)
{
    if (!n)
        return 0;
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->p + b->len, data, n);
    b->len += n;
    return 0;
}

static void
buf_free(Buf *b)
{
    PyMem_RawFree(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* ---- Packs ------------------------------------------------------------------------------- */

typedef struct {
    Py_buffer v[7];          /* pack bytes, oids, offsets, crcs, ends, sorted offsets, order */
    int held;                /* how many of v are exported */
    const uint8_t *buf;
    size_t buflen;
    uint64_t end;            /* where the entries stop (the trailer) */
    uint32_t count, base;
    const uint8_t *oids;     /* idx order (sorted) */
    const uint64_t *offs;    /* idx order */
    const uint32_t *crcs;    /* idx order */
    const uint64_t *ends;    /* idx order: where each entry ends */
    const uint64_t *soffs;   /* pack order */
    const uint32_t *order;   /* idx positions in pack order */
    uint8_t *checked;        /* idx order: CRC32 verified (written by any walker thread) */
} Pack;

typedef struct {
    PyObject_HEAD
    Pack *p;
    uint32_t npacks;
    uint32_t total;          /* entries in all packs */
    uint32_t *pack_of;       /* global entry number -> pack number */
    uint64_t *slots;         /* index: (tag << 32) | (global entry number + 1), 0 = empty */
    size_t mask;
    size_t indexed;
    uint64_t seed;
    int closed;
    Py_ssize_t users;        /* walks running on these packs (close() refuses meanwhile) */
} PacksObject;

static PyTypeObject PacksType;

static inline const uint8_t *
packs_oid(const PacksObject *ps, uint32_t gid)
{
    const Pack *p = &ps->p[ps->pack_of[gid]];
    return p->oids + (size_t)(gid - p->base) * OIDLEN;
}

/* A slot's tag: hash bits the slot's position does not use, so most probes that miss need not read the id. */
static inline uint64_t
slot_tag(uint64_t h)
{
    return h & 0xFFFFFFFF00000000ULL;
}

/* The global entry number of id, or -1. */
static inline long long
packs_find(const PacksObject *ps, const uint8_t *id)
{
    uint64_t h = oid_hash(id, ps->seed), tag = slot_tag(h);
    size_t i = (size_t)h & ps->mask;
    for (;;) {
        uint64_t v = ps->slots[i];
        if (!v)
            return -1;
        if ((v & 0xFFFFFFFF00000000ULL) == tag) {
            uint32_t gid = (uint32_t)v - 1;
            if (memcmp(packs_oid(ps, gid), id, OIDLEN) == 0)
                return (long long)gid;
        }
        i = (i + 1) & ps->mask;
    }
}

static void
packs_release(PacksObject *self)
{
    if (self->p) {
        for (uint32_t k = 0; k < self->npacks; k++) {
            Pack *p = &self->p[k];
            for (int j = 0; j < p->held; j++)
                PyBuffer_Release(&p->v[j]);
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

static int
get_table(PyObject *obj, Py_buffer *v, Py_ssize_t itemsize, uint32_t count, const char *what)
{
    if (PyObject_GetBuffer(obj, v, PyBUF_SIMPLE) < 0)
        return -1;
    if (v->len != (Py_ssize_t)count * itemsize) {
        PyErr_Format(PyExc_ValueError, "_walk.Packs: %s has %zd bytes, %u entries need %zd", what, v->len,
                     count, (Py_ssize_t)count * itemsize);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

/* Packs(packs, kept, seed): packs is a sequence of (buffer, end, oids, offsets 'Q', crcs 'I',
 * ends 'Q', sorted offsets 'Q', order 'I'), the tables of SourceIndex; kept an iterable of ids. */
static PyObject *
Packs_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"packs", "kept", "seed", NULL};
    PyObject *seq, *kept, *fast = NULL, *it = NULL, *item;
    unsigned long long seed;
    IdSet kept_set = {0};
    PacksObject *self;

    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOK", kwlist, &seq, &kept, &seed))
        return NULL;
    self = (PacksObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->seed = seed;
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
        if (get_table(offs, &p->v[2], 8, p->count, "offsets") < 0)
            goto error;
        p->held = 3;
        if (get_table(crcs, &p->v[3], 4, p->count, "crcs") < 0)
            goto error;
        p->held = 4;
        if (get_table(ends, &p->v[4], 8, p->count, "ends") < 0)
            goto error;
        p->held = 5;
        if (get_table(soffs, &p->v[5], 8, p->count, "sorted offsets") < 0)
            goto error;
        p->held = 6;
        if (get_table(order, &p->v[6], 4, p->count, "order") < 0)
            goto error;
        p->held = 7;
        p->buf = p->v[0].buf;
        p->buflen = (size_t)p->v[0].len;
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
    if (self->closed) {
        PyErr_SetString(PyExc_ValueError, "_walk.Packs is closed");
        return NULL;
    }
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
    if (self->closed) {
        PyErr_SetString(PyExc_ValueError, "_walk.Packs is closed");
        return -1;
    }
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
    if (self->closed) {
        PyErr_SetString(PyExc_ValueError, "_walk.Packs is closed");
        return NULL;
    }
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
    if (self->closed) {
        PyErr_SetString(PyExc_ValueError, "_walk.Packs is closed");
        return NULL;
    }
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
    uint32_t lo = 0, hi = p->count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (p->soffs[mid] < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo >= p->count || p->soffs[lo] != off)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)p->oids + (size_t)p->order[lo] * OIDLEN, OIDLEN);
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

static PyMethodDef Packs_methods[] = {
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

static PyTypeObject PacksType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "packyard.store.maintenance._walk.Packs",
    .tp_basicsize = sizeof(PacksObject),
    .tp_dealloc = (destructor)Packs_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Packs(packs, kept, seed): the replaceable packs of a repack and an id -> entry index",
    .tp_methods = Packs_methods,
    .tp_as_sequence = &Packs_as_sequence,
    .tp_as_mapping = &Packs_as_mapping,
    .tp_new = Packs_new,
};

/* ---- objects and the delta-base cache ------------------------------------------------------- */

typedef struct Lru {
    struct Lru *prev, *next;
} Lru;

/* An object's bytes, reference counted (the cache and the walk's stack share them). An object read
 * from a pack entry may sit in the cache under (pack, offset): its cache links live here too. */
typedef struct Obj {
    Lru lru;                      /* first: a Lru* of a cached object is the Obj* */
    struct Obj *hnext;            /* bucket chain */
    uint64_t off;
    uint32_t pack;
    int cached;
    size_t refs;
    size_t size;
    int type;
    uint8_t data[];
} Obj;

static Obj *
obj_new(int type, size_t size)
{
    if (size > SIZE_MAX - sizeof(Obj) - 1)
        return NULL;
    Obj *o = PyMem_RawMalloc(sizeof(Obj) + size + 1);
    if (!o)
        return NULL;
    o->cached = 0;
    o->refs = 1;
    o->size = size;
    o->type = type;
    return o;
}

static inline void
obj_decref(Obj *o)
{
    if (o && --o->refs == 0)
        PyMem_RawFree(o);
}

typedef struct {
    Obj **buckets;
    size_t nbuckets;               /* a power of two */
    size_t count;
    Lru head;                      /* most recently used at head.next */
    size_t used, limit;
} Cache;

static int
cache_init(Cache *c, size_t limit)
{
    c->nbuckets = 4096;
    c->buckets = PyMem_RawCalloc(c->nbuckets, sizeof(Obj *));
    if (!c->buckets)
        return -1;
    c->count = 0;
    c->head.prev = c->head.next = &c->head;
    c->used = 0;
    c->limit = limit;
    return 0;
}

static inline size_t
cache_slot(const Cache *c, uint32_t pack, uint64_t off)
{
    uint64_t h = (off ^ ((uint64_t)pack << 40)) * 0x9E3779B97F4A7C15ULL;
    return (size_t)(h >> 20) & (c->nbuckets - 1);
}

static inline void
lru_unlink(Lru *e)
{
    e->prev->next = e->next;
    e->next->prev = e->prev;
}

static inline void
lru_front(Cache *c, Lru *e)
{
    e->next = c->head.next;
    e->prev = &c->head;
    c->head.next->prev = e;
    c->head.next = e;
}

static Obj *
cache_get(Cache *c, uint32_t pack, uint64_t off)
{
    for (Obj *o = c->buckets[cache_slot(c, pack, off)]; o; o = o->hnext) {
        if (o->off == off && o->pack == pack) {
            lru_unlink(&o->lru);
            lru_front(c, &o->lru);
            return o;
        }
    }
    return NULL;
}

static void
cache_drop(Cache *c, Obj *o)
{
    Obj **pp = &c->buckets[cache_slot(c, o->pack, o->off)];
    while (*pp != o)
        pp = &(*pp)->hnext;
    *pp = o->hnext;
    lru_unlink(&o->lru);
    c->used -= o->size + sizeof(Obj);
    c->count--;
    o->cached = 0;
    obj_decref(o);
}

static void
cache_grow(Cache *c)
{
    size_t n = c->nbuckets * 2;
    Obj **b = PyMem_RawCalloc(n, sizeof(Obj *));
    if (!b)
        return;        /* longer chains, still correct */
    Obj **old = c->buckets;
    size_t oldn = c->nbuckets;
    c->buckets = b;
    c->nbuckets = n;
    for (size_t k = 0; k < oldn; k++) {
        Obj *o = old[k];
        while (o) {
            Obj *next = o->hnext;
            size_t s = cache_slot(c, o->pack, o->off);
            o->hnext = b[s];
            b[s] = o;
            o = next;
        }
    }
    PyMem_RawFree(old);
}

/* Keep obj (read from entry (pack, off)) in the cache, most recently used first. */
static void
cache_put(Cache *c, uint32_t pack, uint64_t off, Obj *obj)
{
    if (obj->cached || obj->size > c->limit / 4)
        return;
    size_t s = cache_slot(c, pack, off);
    for (Obj *o = c->buckets[s]; o; o = o->hnext)
        if (o->off == off && o->pack == pack)
            return;
    obj->pack = pack;
    obj->off = off;
    obj->cached = 1;
    obj->refs++;
    obj->hnext = c->buckets[s];
    c->buckets[s] = obj;
    lru_front(c, &obj->lru);
    c->used += obj->size + sizeof(Obj);
    c->count++;
    while (c->used > c->limit && c->head.prev != &c->head)
        cache_drop(c, (Obj *)c->head.prev);
    if (c->count > 2 * c->nbuckets)
        cache_grow(c);
}

static void
cache_free(Cache *c)
{
    if (!c->buckets)
        return;
    while (c->head.next != &c->head)
        cache_drop(c, (Obj *)c->head.next);
    PyMem_RawFree(c->buckets);
    c->buckets = NULL;
}

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
    Cache cache;
    zstream z;
    int z_ready;
    Buf commits;             /* ids */
    Buf trees, blobs;        /* OutEnt */
    Buf names;               /* name bytes */
    Buf roots;               /* (tree id, commit id) per commit, in the order commits were taken */
    Buf heap;                /* HeapEnt, a binary heap */
    Buf parents;             /* ids */
    uint64_t queued;
    Buf frames;              /* Frame */
    Buf fresh;               /* Fresh */
    Buf scratch;             /* an inflated delta */
    Err err;
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
    cache_free(&w->cache);
    if (w->z_ready) {
        z_inflateEnd(&w->z);
        w->z_ready = 0;
    }
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
    buf_free(&w->scratch);
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
    if (cache_init(&w->cache, cache_bytes) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    memset(&w->z, 0, sizeof w->z);
    if (z_inflateInit_(&w->z, z_version(), (int)sizeof(zstream)) != Z_OK) {
        PyErr_SetString(PyExc_MemoryError, "_walk: inflateInit failed");
        return -1;
    }
    w->z_ready = 1;
    return 0;
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

/* -- reading objects -- */

static int
checked_get(const Pack *p, uint32_t i)
{
#if defined(__GNUC__)
    return __atomic_load_n(&p->checked[i], __ATOMIC_RELAXED);
#else
    return p->checked[i];
#endif
}

static void
checked_set(Pack *p, uint32_t i)
{
#if defined(__GNUC__)
    __atomic_store_n(&p->checked[i], 1, __ATOMIC_RELAXED);
#else
    p->checked[i] = 1;
#endif
}

typedef struct {
    uint32_t pack, i;        /* the entry */
    uint64_t off, data_off, stop;
    uint64_t size;
} Link;

/* The entry's extent, checked against the mapping, and its CRC32 against the idx. */
static int
entry_extent(WalkerObject *w, uint32_t pk, uint32_t i, uint64_t *off, uint64_t *stop)
{
    Pack *p = &w->packs->p[pk];
    const uint8_t *oid = p->oids + (size_t)i * OIDLEN;
    uint64_t o = p->offs[i], e = p->ends[i];
    if (o < PACK_HEADER || o >= e || e > p->end)
        return fail(&w->err, E_PACK, oid, (long)pk, (long long)o, "entry offset outside the pack");
    if (!checked_get(p, i)) {
        uint32_t crc = crc32_of(p->buf + o, (size_t)(e - o));
        if (crc != p->crcs[i])
            return fail(&w->err, E_PACK, oid, (long)pk, (long long)o,
                        "entry's CRC32 %08x differs from its idx's %08x (corrupt pack entry)", (unsigned)crc,
                        (unsigned)p->crcs[i]);
        checked_set(p, i);
    }
    *off = o;
    *stop = e;
    return 0;
}

/* Decode the header of entry (pk, i): type, size, where the data starts, and the base entry of a delta. */
static int
entry_header(WalkerObject *w, uint32_t pk, uint32_t i, Link *l, int *type, uint32_t *base_i)
{
    Pack *p = &w->packs->p[pk];
    const uint8_t *oid = p->oids + (size_t)i * OIDLEN;
    uint64_t off = 0, stop = 0;
    if (entry_extent(w, pk, i, &off, &stop) < 0)
        return -1;
    const uint8_t *b = p->buf;
    uint64_t pos = off;
    unsigned c = b[pos++];
    int t = (c >> 4) & 7;
    uint64_t size = c & 15;
    unsigned shift = 4;
    while (c & 0x80) {
        if (pos >= stop)
            return fail(&w->err, E_PACK, oid, (long)pk, (long long)off, "pack truncated inside an entry header");
        if (shift > 57)
            return fail(&w->err, E_PACK, oid, (long)pk, (long long)off, "entry size overflows 64 bits");
        c = b[pos++];
        size |= (uint64_t)(c & 0x7F) << shift;
        shift += 7;
    }
    l->pack = pk;
    l->i = i;
    l->off = off;
    l->stop = stop;
    l->size = size;
    if (t == T_OFS) {
        uint64_t rel;
        int nbytes = 1;
        if (pos >= stop)
            return fail(&w->err, E_PACK, oid, (long)pk, (long long)off, "pack truncated inside an OFS_DELTA header");
        c = b[pos++];
        rel = c & 0x7F;
        while (c & 0x80) {
            if (pos >= stop || nbytes >= 9)
                return fail(&w->err, E_PACK, oid, (long)pk, (long long)off, "OFS_DELTA offset overflows or is truncated");
            c = b[pos++];
            nbytes++;
            rel = ((rel + 1) << 7) | (c & 0x7F);
        }
        if (rel == 0)
            return fail(&w->err, E_PACK, oid, (long)pk, (long long)off, "delta cycle: OFS_DELTA names itself as its base");
        if (rel > off || off - rel < PACK_HEADER)
            return fail(&w->err, E_PACK, oid, (long)pk, (long long)off, "OFS_DELTA base offset is out of bounds");
        uint64_t base_off = off - rel;
        /* The base must be an entry: find it among the sorted offsets. */
        uint32_t lo = 0, hi = p->count;
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (p->soffs[mid] < base_off)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo >= p->count || p->soffs[lo] != base_off)
            return fail(&w->err, E_PACK, oid, (long)pk, (long long)off,
                        "OFS_DELTA base offset %llu is not an entry of the pack", (unsigned long long)base_off);
        *base_i = p->order[lo];
    } else if (t == T_REF) {
        if (stop - pos < OIDLEN)
            return fail(&w->err, E_PACK, oid, (long)pk, (long long)off, "pack truncated inside a REF_DELTA header");
        const uint8_t *want = b + pos;
        pos += OIDLEN;
        uint32_t lo = 0, hi = p->count;
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (memcmp(p->oids + (size_t)mid * OIDLEN, want, OIDLEN) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo >= p->count || memcmp(p->oids + (size_t)lo * OIDLEN, want, OIDLEN) != 0) {
            char hex[41];
            hex_of(want, hex);
            return fail(&w->err, E_PACK, oid, (long)pk, (long long)off, "REF_DELTA base %s is not in the pack", hex);
        }
        *base_i = lo;
    } else if (t < T_COMMIT || t > T_TAG) {
        return fail(&w->err, E_PACK, oid, (long)pk, (long long)off, "invalid object type %d in pack entry", t);
    }
    l->data_off = pos;
    *type = t;
    return 0;
}

/* Inflate the entry's zlib data into out[0..size); exactly size bytes must come out. */
static int
inflate_entry(WalkerObject *w, const Link *l, uint8_t *out)
{
    const Pack *p = &w->packs->p[l->pack];
    const uint8_t *oid = p->oids + (size_t)l->i * OIDLEN;
    zstream *z = &w->z;
    uint64_t in_left = l->stop - l->data_off, out_left = l->size + 1;   /* one spare byte: too long is caught */
    if (z_inflateReset(z) != Z_OK)
        return fail(&w->err, E_PACK, oid, (long)l->pack, (long long)l->off, "inflateReset failed");
    z->next_in = p->buf + l->data_off;
    z->avail_in = 0;
    z->next_out = out;
    z->avail_out = 0;
    for (;;) {
        if (z->avail_in == 0 && in_left) {
            unsigned chunk = in_left > (1u << 30) ? (1u << 30) : (unsigned)in_left;
            z->avail_in = chunk;
            in_left -= chunk;
        }
        if (z->avail_out == 0) {
            if (!out_left)
                return fail(&w->err, E_PACK, oid, (long)l->pack, (long long)l->off,
                            "entry inflates to more than the %llu bytes its header says", (unsigned long long)l->size);
            unsigned chunk = out_left > (1u << 30) ? (1u << 30) : (unsigned)out_left;
            z->avail_out = chunk;
            out_left -= chunk;
        }
        int rc = z_inflate(z, Z_NO_FLUSH);
        if (rc == Z_STREAM_END)
            break;
        if (rc == Z_BUF_ERROR && z->avail_in == 0 && !in_left)
            return fail(&w->err, E_PACK, oid, (long)l->pack, (long long)l->off,
                        "entry's zlib stream runs past the end of the entry");
        if (rc != Z_OK && rc != Z_BUF_ERROR)
            return fail(&w->err, E_PACK, oid, (long)l->pack, (long long)l->off, "entry does not inflate: %s",
                        z->msg ? z->msg : "zlib error");
    }
    uint64_t produced = (uint64_t)(z->next_out - out);
    if (produced != l->size)
        return fail(&w->err, E_PACK, oid, (long)l->pack, (long long)l->off,
                    "entry inflates to %llu bytes, header says %llu", (unsigned long long)produced,
                    (unsigned long long)l->size);
    return 0;
}

/* zlib cannot expand data by more than 1032:1; a header declaring more is refused before anything is
 * allocated for it. */
static int
impossible_size(WalkerObject *w, const Link *l)
{
    uint64_t in = l->stop - l->data_off;
    if (l->size / 1040 > in + 1) {
        const Pack *p = &w->packs->p[l->pack];
        return fail(&w->err, E_PACK, p->oids + (size_t)l->i * OIDLEN, (long)l->pack, (long long)l->off,
                    "entry declares %llu bytes; its %llu bytes of zlib data cannot hold that many",
                    (unsigned long long)l->size, (unsigned long long)in);
    }
    return 0;
}

static int
delta_varint(const uint8_t *d, size_t n, size_t *pos, uint64_t *out)
{
    uint64_t v = 0;
    unsigned shift = 0;
    for (;;) {
        if (*pos >= n || shift > 63)
            return -1;
        unsigned c = d[(*pos)++];
        v |= (uint64_t)(c & 0x7F) << shift;
        shift += 7;
        if (!(c & 0x80))
            break;
    }
    *out = v;
    return 0;
}

/* base + delta -> a new object; the checks of resolve.apply_delta_checked. */
static Obj *
apply_delta(WalkerObject *w, const Obj *base, const uint8_t *d, size_t n, const Link *l)
{
    const Pack *p = &w->packs->p[l->pack];
    const uint8_t *oid = p->oids + (size_t)l->i * OIDLEN;
    size_t pos = 0;
    uint64_t src, dst;
    if (delta_varint(d, n, &pos, &src) < 0 || delta_varint(d, n, &pos, &dst) < 0) {
        fail(&w->err, E_PACK, oid, (long)l->pack, (long long)l->off,
             "delta header unreadable: delta header truncated or overflowing");
        return NULL;
    }
    if (src != base->size) {
        fail(&w->err, E_PACK, oid, (long)l->pack, (long long)l->off, "delta expects a %llu-byte base, base has %zu bytes",
             (unsigned long long)src, base->size);
        return NULL;
    }
    /* Each opcode byte yields at most max(127, base size) bytes: refuse impossible sizes before allocating. */
    uint64_t per = base->size > 127 ? base->size : 127;
    if (dst / per > n) {
        fail(&w->err, E_PACK, oid, (long)l->pack, (long long)l->off, "delta result size %llu is impossible for this delta",
             (unsigned long long)dst);
        return NULL;
    }
    Obj *o = obj_new(base->type, (size_t)dst);
    if (!o) {
        nomem(&w->err);
        return NULL;
    }
    uint8_t *out = o->data;
    size_t left = (size_t)dst;
    while (pos < n) {
        unsigned c = d[pos++];
        if (c & 0x80) {
            uint64_t cp_off = 0, cp_size = 0;
            for (int k = 0; k < 4; k++) {
                if (c & (1u << k)) {
                    if (pos >= n)
                        goto bad;
                    cp_off |= (uint64_t)d[pos++] << (8 * k);
                }
            }
            for (int k = 0; k < 3; k++) {
                if (c & (0x10u << k)) {
                    if (pos >= n)
                        goto bad;
                    cp_size |= (uint64_t)d[pos++] << (8 * k);
                }
            }
            if (cp_size == 0)
                cp_size = 0x10000;
            if (cp_size > base->size || cp_off > base->size - cp_size || cp_size > left)
                goto bad;
            memcpy(out, base->data + cp_off, (size_t)cp_size);
            out += cp_size;
            left -= (size_t)cp_size;
        } else if (c) {
            if (c > n - pos || c > left)
                goto bad;
            memcpy(out, d + pos, c);
            out += c;
            pos += c;
            left -= c;
        } else {
            goto bad;
        }
    }
    if (left)
        goto bad;
    return o;
bad:
    obj_decref(o);
    fail(&w->err, E_PACK, oid, (long)l->pack, (long long)l->off,
         "delta does not apply (result size mismatch or bad opcode)");
    return NULL;
}

/* The object at entry (pk, i), its delta chain resolved (a new reference), or NULL with w->err set. */
static Obj *
resolve(WalkerObject *w, uint32_t pk, uint32_t i)
{
    Pack *p = &w->packs->p[pk];
    Obj *hit = cache_get(&w->cache, pk, p->offs[i]);
    if (hit) {
        hit->refs++;
        return hit;
    }
    Link chain_local[16];
    Link *chain = chain_local;
    size_t n = 0, cap = 16;
    Obj *base = NULL;
    uint32_t cur = i;
    for (;;) {
        if (n > MAX_CHAIN) {
            fail(&w->err, E_PACK, p->oids + (size_t)i * OIDLEN, (long)pk, (long long)p->offs[i],
                 "delta chain too long (cycle?)");
            goto out;
        }
        if (n > 0) {
            hit = cache_get(&w->cache, pk, p->offs[cur]);
            if (hit) {
                hit->refs++;
                base = hit;
                break;
            }
        }
        Link l;
        int t = 0;
        uint32_t next = 0;
        if (entry_header(w, pk, cur, &l, &t, &next) < 0)
            goto out;
        if (t == T_OFS || t == T_REF) {
            if (n == cap) {
                size_t ncap = cap * 2;
                Link *nc = PyMem_RawMalloc(ncap * sizeof(Link));
                if (!nc) {
                    nomem(&w->err);
                    goto out;
                }
                memcpy(nc, chain, n * sizeof(Link));
                if (chain != chain_local)
                    PyMem_RawFree(chain);
                chain = nc;
                cap = ncap;
            }
            chain[n++] = l;
            cur = next;
            continue;
        }
        if (impossible_size(w, &l) < 0)
            goto out;
        base = obj_new(t, (size_t)l.size);
        if (!base) {
            nomem(&w->err);
            goto out;
        }
        if (inflate_entry(w, &l, base->data) < 0) {
            obj_decref(base);
            base = NULL;
            goto out;
        }
        cache_put(&w->cache, pk, l.off, base);
        break;
    }
    while (n) {
        Link *l = &chain[--n];
        if (impossible_size(w, l) < 0) {
            obj_decref(base);
            base = NULL;
            goto out;
        }
        if (l->size > SIZE_MAX - 1 || buf_reserve(&w->scratch, (size_t)l->size + 1) < 0) {
            nomem(&w->err);
            obj_decref(base);
            base = NULL;
            goto out;
        }
        if (inflate_entry(w, l, w->scratch.p) < 0) {
            obj_decref(base);
            base = NULL;
            goto out;
        }
        Obj *o = apply_delta(w, base, w->scratch.p, (size_t)l->size, l);
        obj_decref(base);
        base = o;
        if (!o)
            goto out;
        cache_put(&w->cache, pk, l->off, o);
    }
out:
    if (chain != chain_local)
        PyMem_RawFree(chain);
    return base;
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
        Obj *o = resolve(w, pk, (uint32_t)(gid - w->packs->p[pk].base));
        if (o && o->type != want) {
            char rt[200];
            ref_text(ref, rt, sizeof rt);
            fail(&w->err, E_CORRUPT, id, (long)pk, (long long)w->packs->p[pk].offs[gid - w->packs->p[pk].base],
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
        w->err.kind = E_PY;
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
        w->err.kind = E_PY;
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
        return fail(&w->err, E_CORRUPT, oid, pack, offset, "commit does not start with a tree header");
    if (parse_hex(line + 5, (size_t)(line_end - line - 5), e.tree) < 0) {
        char r[256];
        bytes_repr(line + 5, (size_t)(line_end - line - 5), r, sizeof r);
        return fail(&w->err, E_CORRUPT, oid, pack, offset, "commit tree is not a hex object id: %s", r);
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
                return fail(&w->err, E_CORRUPT, oid, pack, offset, "commit parent is not a hex object id: %s", r);
            }
            if (buf_put(&w->parents, parent, OIDLEN) < 0)
                return nomem(&w->err);
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
        return nomem(&w->err);
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
        w->err.kind = E_PY;
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
            return nomem(&w->err);
        for (uint32_t k = 0; k < e.nparents; k++) {
            uint8_t parent[OIDLEN];
            memcpy(parent, w->parents.p + e.parents + (size_t)k * OIDLEN, OIDLEN);
            int added = idset_add(&w->seen, parent);
            if (added < 0)
                return nomem(&w->err);
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
        return fail(&w->err, E_CORRUPT, oid, -1, -1, "tree is too large (4 GiB or more)");
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
            return nomem(&w->err);
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
    return fail(&w->err, E_CORRUPT, oid, -1, -1, "tree does not parse (malformed entry)");
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
        return nomem(&w->err);
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
        return nomem(&w->err);
    long pk;
    long long off;
    Obj *t = read_object(w, root, T_TREE, ref, &pk, &off);
    if (!t || push_frame(w, t, root) < 0)
        goto error;
    while (w->frames.len) {
        Frame *f = (Frame *)(w->frames.p + w->frames.len) - 1;
        int descended = 0;
        if (is_cancelled(w)) {
            if (w->err.kind == E_NONE)
                w->err.kind = E_CANCELLED;
            goto error;
        }
        while (f->next < f->stop) {
            const Fresh *e = (const Fresh *)w->fresh.p + f->next++;
            const uint8_t *d = f->tree->data;
            const uint8_t *id = d + e->id_off;
            int added = idset_add(&w->seen, id);   /* seen meanwhile (a sibling's subtree, a duplicate)? */
            if (added < 0) {
                nomem(&w->err);
                goto error;
            }
            if (!added)
                continue;
            if (e->is_dir) {
                uint8_t eid[OIDLEN];
                memcpy(eid, id, OIDLEN);
                if (out_add(&w->trees, &w->names, eid, d + e->name_off, e->name_len, 1) < 0) {
                    nomem(&w->err);
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
                nomem(&w->err);
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
        raise_err(&w->err);
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
            rc = nomem(&w->err);
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
Walker_cache_used(WalkerObject *w, PyObject *unused)
{
    return Py_BuildValue("(nn)", (Py_ssize_t)w->cache.used, (Py_ssize_t)w->cache.count);
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
    {"cache_used", (PyCFunction)Walker_cache_used, METH_NOARGS, "(bytes, entries) in the delta-base cache"},
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

/* pack_layout(offsets, trailer) -> (order, sorted offsets, ends) as bytes of 'I', 'Q', 'Q' items:
 * the idx positions in pack order, their offsets, and where each entry ends (idx order: the next
 * entry's offset, or the trailer's). */
static PyObject *
pack_layout(PyObject *module, PyObject *args)
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
    qsort(tmp, n, sizeof(OffIdx), cmp_offidx);
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

static PyMethodDef module_methods[] = {
    {"pack_layout", pack_layout, METH_VARARGS,
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
    if (load_zlib() < 0)
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
