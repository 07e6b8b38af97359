/*
 * _walk.h: what the C files of packyard's object-reading extensions share.
 *
 * The _walk extension (packyard.store.maintenance.walk._walk: the reachability walk, tree and object reads):
 *   _walk_packs.c  zlib from the shared library, errors, Packs (the replaceable packs and the id index),
 *                  pack_layout
 *   _walk_read.c   reading an object from the packs: CRC32 check, inflate, delta chains, the base cache;
 *                  reader_get (the packs, else the caller's Python read())
 *   _walk_trees.c  the walk itself, without the GIL: reading commits and trees (through the Reader, or the
 *                  Python fallback), the commit queue, the depth-first tree walk
 *   _walk.c        the Walker type, its Python methods, the module and its C API capsule (WalkAPI below)
 *
 * Extensions that read objects through the same Packs and Reader (compiled with WALK_CLIENT defined, with
 * _walk_client.c, which takes _walk's functions from the capsule; see WALK_FN and WalkAPI below):
 *   _bitmap        _bitmap.c (the reachability bitmaps' closures, bitmap.py's build_bitmaps) and
 *                  _bitmap_ewah.c (EWAH bitmaps as git builds them, git's XOR search: ewah.py, xor_offsets)
 *   _bloom         _bloom.c (the commit-graph's changed-path Bloom filters and its commit reads: bloom.py)
 *   _packwrite     store/pack/_packwrite.c (the module), _packwrite_copy.c (a repack's write plan: where each
 *                  object's copy lies, the write order, the copies) and _packwrite_idx.c (a pack's .idx and
 *                  .rev tables)
 */
#ifndef PACKYARD_WALK_H
#define PACKYARD_WALK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

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

/* A function of the _walk extension: declared as itself there, as a pointer taken from _walk's capsule in
 * an extension compiled with WALK_CLIENT (_walk_client.c defines the pointers and fills them at import). */
#ifdef WALK_CLIENT
#define WALK_FN(ret, name, params) extern ret (*name) params
#else
#define WALK_FN(ret, name, params) ret name params
#endif

extern const char *(*z_version)(void);
extern int (*z_inflateInit_)(zstream *, const char *, int);
extern int (*z_inflate)(zstream *, int);
extern int (*z_inflateEnd)(zstream *);
extern int (*z_inflateReset)(zstream *);
extern unsigned long (*z_crc32)(unsigned long, const unsigned char *, unsigned int);

#ifndef WALK_CLIENT
int walk_load_zlib(void);
#endif

/* crc extended over p[0..n) (zlib's CRC32, in pieces its 32-bit length takes). */
static inline uint32_t
crc32_more(uint32_t crc, const uint8_t *p, size_t n)
{
    unsigned long c = crc;
    while (n) {
        unsigned int chunk = n > (1u << 30) ? (1u << 30) : (unsigned int)n;
        c = z_crc32(c, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return (uint32_t)c;
}

/* CRC32 of p[0..n) (zlib's crc32(0, NULL, 0) is 0). */
static inline uint32_t
crc32_of(const uint8_t *p, size_t n)
{
    return crc32_more(0, p, n);
}

/* ---- errors ----------------------------------------------------------------------------- */

extern PyObject *WalkError;   /* (kind, message, oid or None, pack number or -1, offset or -1) */

enum { E_NONE = 0, E_PY, E_NOMEM, E_CANCELLED, E_CORRUPT, E_PACK, E_MISSING };

typedef struct {
    int kind;
    char msg[300];
    uint8_t oid[OIDLEN];
    int has_oid;
    long pack;
    long long offset;
} Err;

/* Record the first error of a walk (no GIL needed); returns -1. */
WALK_FN(int, fail, (Err *e, int kind, const uint8_t *oid, long pack, long long offset, const char *fmt, ...));
WALK_FN(int, nomem, (Err *e));
/* With the GIL: turn a recorded error into a Python exception (E_PY: one is already set). */
WALK_FN(void, raise_err, (Err *e));
WALK_FN(void, hex_of, (const uint8_t *oid, char *out));
WALK_FN(const char *, type_label, (int t));

/* ---- hex ids --------------------------------------------------------------------------------- */

static inline int
hex_digit(unsigned c)
{
    if (c >= '0' && c <= '9')
        return (int)(c - '0');
    c |= 0x20;
    if (c >= 'a' && c <= 'f')
        return (int)(c - 'a' + 10);
    return -1;
}

/* 40 hex digits (either case, as binascii.unhexlify takes them) -> id; -1 if s[0..n) is not exactly that. */
static inline int
hex_to_oid(const uint8_t *s, size_t n, uint8_t *out)
{
    if (n != 2 * OIDLEN)
        return -1;
    for (int k = 0; k < OIDLEN; k++) {
        int hi = hex_digit(s[2 * k]), lo = hex_digit(s[2 * k + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[k] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
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

static inline int
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

static inline void
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
    return idset_has_h(s, id, oid_hash(id, s->seed));
}

static inline int
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
static inline int
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

static inline int
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

static inline int
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

static inline void
buf_free(Buf *b)
{
    PyMem_RawFree(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}


/* ---- tables passed as buffers ------------------------------------------------------------- */

/* Exports o's whole buffer into v (writable when asked): count items of itemsize bytes, else ValueError
 * naming what, and nothing held. */
static inline int
get_table(PyObject *o, Py_buffer *v, Py_ssize_t itemsize, Py_ssize_t count, int writable, const char *what)
{
    if (PyObject_GetBuffer(o, v, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
        return -1;
    if (v->len != count * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s has %zd bytes, %zd entries need %zd", what, v->len, count,
                     count * itemsize);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

typedef struct {
    PyObject *o;
    Py_ssize_t itemsize;
    int writable;
    const char *what;
} Table;

static inline void
release_tables(Py_buffer *v, int count)
{
    while (count > 0)
        PyBuffer_Release(&v[--count]);
}

/* get_table for each of t[0..count) into v[0..count), *entries entries each; with *entries < 0 the first
 * table's own length decides them (*entries is set). All held, or none (-1). */
static inline int
get_tables(const Table *t, int count, Py_buffer *v, Py_ssize_t *entries)
{
    for (int k = 0; k < count; k++) {
        int rc;
        if (k == 0 && *entries < 0) {
            rc = PyObject_GetBuffer(t[0].o, &v[0], t[0].writable ? PyBUF_WRITABLE : PyBUF_SIMPLE);
            if (rc == 0 && v[0].len % t[0].itemsize) {
                PyErr_Format(PyExc_ValueError, "%s has %zd bytes, not whole entries of %zd", t[0].what, v[0].len,
                             t[0].itemsize);
                PyBuffer_Release(&v[0]);
                rc = -1;
            }
            if (rc == 0)
                *entries = v[0].len / t[0].itemsize;
        } else {
            rc = get_table(t[k].o, &v[k], t[k].itemsize, *entries, t[k].writable, t[k].what);
        }
        if (rc < 0) {
            release_tables(v, k);
            return -1;
        }
    }
    return 0;
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
    int droppable;           /* buf is a read-only file map (an mmap): its pages may be given back */
} Pack;

/* The idx position of the entry starting at off in p, or -1 (a binary search of the sorted offsets). */
static inline long long
pack_entry_at(const Pack *p, uint64_t off)
{
    uint32_t lo = 0, hi = p->count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (p->soffs[mid] < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo >= p->count || p->soffs[lo] != off)
        return -1;
    return (long long)p->order[lo];
}

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
    size_t drop_every;       /* a reader gives the maps' pages back after inflating this many bytes (0: never) */
} PacksObject;

/* -1 with ValueError once close() released the packs' buffers. */
static inline int
packs_check_open(const PacksObject *ps)
{
    if (ps->closed) {
        PyErr_SetString(PyExc_ValueError, "_walk.Packs is closed");
        return -1;
    }
    return 0;
}

#ifdef WALK_CLIENT
extern PyTypeObject *walk_packs_type;
#define PacksType (*walk_packs_type)
#else
extern PyTypeObject PacksType;
#endif

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

/* Start loading the index slot packs_find(id) reads first (see idset_prefetch). */
static inline void
packs_prefetch(const PacksObject *ps, const uint8_t *id)
{
#if defined(__GNUC__)
    __builtin_prefetch(&ps->slots[(size_t)oid_hash(id, ps->seed) & ps->mask]);
#else
    (void)ps;
    (void)id;
#endif
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

static inline Obj *
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

/* What reads objects out of the packs for one walker (one thread): its zlib stream, its base cache. */
typedef struct {
    PacksObject *packs;      /* (the walker holds the reference) */
    Cache cache;
    zstream z;
    int z_ready;
    Buf scratch;             /* an inflated delta */
    Err err;
    size_t n_resolved;       /* objects asked of the packs */
    size_t n_inflated;       /* entries inflated (whole objects and deltas) */
    size_t n_cache_hits;     /* chains that stopped at a cached object */
    size_t since_drop;       /* compressed bytes inflated since the maps' pages were last given back */
} Reader;

WALK_FN(int, reader_init, (Reader *r, PacksObject *packs, size_t cache_bytes));
WALK_FN(void, reader_clear, (Reader *r));
/* The object at entry (pack pk, idx position i), its delta chain resolved (a new reference), or NULL with
 * r->err set. No GIL needed. */
WALK_FN(Obj *, reader_resolve, (Reader *r, uint32_t pk, uint32_t i, int keep_whole));

/* The type of entry (pk, i) from its headers alone (a delta: its chain's base's), or -1 with r->err set. */
int reader_type(Reader *r, uint32_t pk, uint32_t i, int *type);   /* (_walk only) */

/* id's object from the packs (reader_resolve: CRC32-checked, the delta-base cache; keep_whole as there) or,
 * when it is not in them, from read(id) -> (type, data) (loose objects; the caller's Python fallback). Any
 * type: the caller checks it. *pack, *offset (either may be NULL): where the packs hold it, -1 when read()
 * gave it. NULL with a Python exception set (a pack's error raised as WalkError, r->err cleared). With the
 * GIL. */
WALK_FN(Obj *, reader_get, (Reader *r, PyObject *read, const uint8_t *id, int keep_whole, long *pack,
                            long long *offset));

#ifndef WALK_CLIENT
PyObject *walk_pack_layout(PyObject *module, PyObject *args);
#endif

/* ---- one tree entry (walk/reach.py's _TREE_ENTRY: an octal mode, a space, a name, a NUL, a 20-byte id) ------ */

typedef struct {
    const uint8_t *mode, *name, *id;
    size_t mode_len, name_len;
    int is_dir;                  /* mode 40000 or 040000 */
    int gitlink;                 /* mode 160000: another repository's commit */
} TreeEnt;

/* The entry of a tree's data at *p (before end): 1 with *p past it, 0 at the end, -1 malformed. */
static inline int
tree_entry_next(const uint8_t **pp, const uint8_t *end, TreeEnt *e)
{
    const uint8_t *p = *pp;
    if (p >= end)
        return 0;
    e->mode = p;
    while (p < end && *p >= '0' && *p <= '7')
        p++;
    e->mode_len = (size_t)(p - e->mode);
    if (!e->mode_len || p >= end || *p != ' ')
        return -1;
    e->name = ++p;
    const uint8_t *nul = memchr(p, 0, (size_t)(end - p));
    if (!nul || nul == e->name || (size_t)(end - nul) < 1 + OIDLEN)
        return -1;
    e->name_len = (size_t)(nul - e->name);
    e->id = nul + 1;
    *pp = e->id + OIDLEN;
    e->gitlink = e->mode_len == 6 && memcmp(e->mode, "160000", 6) == 0;
    e->is_dir = (e->mode_len == 5 && memcmp(e->mode, "40000", 5) == 0)
                || (e->mode_len == 6 && memcmp(e->mode, "040000", 6) == 0);
    return 1;
}

/* ---- the Walker (_walk.c: the type and its methods; _walk_trees.c: the walk, without the GIL) ---- */

typedef struct {
    int64_t neg_when;
    uint64_t order;          /* queued order: ties go to the first queued */
    uint8_t oid[OIDLEN];
    uint8_t tree[OIDLEN];
    uint32_t nparents;
    uint32_t graph_ok;       /* the header as the commit-graph reads it: tree, then every parent line */
    size_t parents;          /* offset in the parents arena */
    uint64_t graph_date;     /* git's parse_commit_date (commitgraph.py), valid with graph_ok */
} HeapEnt;

/* What walk_commits records of each commit it takes, in the commits' order (commit_meta()). */
typedef struct {
    int64_t when;            /* the walk's committer date */
    uint64_t graph_date;
    size_t parents;          /* offset in the parents arena */
    uint32_t nparents;
    uint32_t graph_ok;
    uint8_t tree[OIDLEN];
} CommitMetaEnt;

typedef struct {             /* a tree/blob in the output: id, then its name in the names arena */
    uint8_t oid[OIDLEN];
    uint32_t name_len;       /* NO_NAME: reached without a name */
    uint64_t name_off;
    uint32_t path_hash;      /* git's pack_name_hash of the whole path it was reached by (the bitmaps' cache) */
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
    uint32_t base;           /* pack_name_hash state after its path and "/" (0 for a root tree: no path) */
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
    Buf meta;                /* CommitMetaEnt per commit taken, in the order of commits */
    uint64_t queued;
    Buf frames;              /* Frame */
    Buf fresh;               /* Fresh */
    size_t trees_done;
    int cancelled;           /* set by cancel() from another thread */
    uint64_t claim;          /* roots to walk: (next << 32) | stop, shared with steal_roots() in another thread */
    int released;            /* release_reader() was called: no more walking */
    int seen_released;       /* release_seen() was called: no more walking, no more 'in' */
} WalkerObject;

/* The seen set of o if it is a Walker not walking right now, else NULL (_walk.c). */
const IdSet *walker_seen(PyObject *o);   /* (_walk only) */

/* Let go of the GIL / take it back (between them: no Python object may be touched). */
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


/* Referrers, for messages: a name given by Python, or "<kind> <hex id>". */
typedef struct {
    const char *kind;        /* "commit", "tree" or NULL (then name) */
    const uint8_t *oid;
    PyObject *name;          /* a str */
    const char *text;        /* its UTF-8 form (cached in the str: readable without the GIL) */
} Ref;

/* Parse a commit (walk.parse_commit's rules) and queue it by date; pack/offset name it in errors. */
int queue_commit(WalkerObject *w, const uint8_t *oid, const uint8_t *data, size_t size, long pack, long long offset,
                 int have_gil);
/* Commits newest first (walk/reach.py's queue); each commit's tree is remembered in roots. GIL released. */
int walk_commits(WalkerObject *w);
/* Depth first from one tree (already marked seen), walk.Walker._tree's order. GIL released. */
int walk_tree(WalkerObject *w, const uint8_t *root, const uint8_t *name, size_t name_len, int named, const Ref *ref);
/* Append an id (and its name, if named; path_hash: of its whole path) to an output list. */
int out_add(Buf *list, Buf *names, const uint8_t *oid, const uint8_t *name, size_t name_len, int named,
            uint32_t path_hash);

/* git's pack_name_hash, continued from state h over s[0..n) (whitespace skipped, the last bytes weigh most). */
static inline uint32_t
name_hash_fold(uint32_t h, const uint8_t *s, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        uint32_t c = s[k];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
            continue;
        h = (h >> 2) + (c << 24);
    }
    return h;
}


/* ---- the C API capsule: what _walk gives the extensions compiled with WALK_CLIENT ---------------- */

#define WALK_API_CAPSULE "packyard.store.maintenance.walk._walk._C_API"
#define WALK_API_VERSION 1

/* The functions _walk gives, as X(return type, name, parameters): the struct's members, the clients'
 * pointers (_walk_client.c) and their filling, and _walk's filling of the struct (_walk.c) are made from it. */
#define WALK_API_FUNCTIONS(X)                                                                                \
    X(const char *, z_version, (void))                                                                     \
    X(int, z_inflateInit_, (zstream *, const char *, int))                                                 \
    X(int, z_inflate, (zstream *, int))                                                                    \
    X(int, z_inflateEnd, (zstream *))                                                                      \
    X(int, z_inflateReset, (zstream *))                                                                    \
    X(unsigned long, z_crc32, (unsigned long, const unsigned char *, unsigned int))                        \
    X(int, fail, (Err *e, int kind, const uint8_t *oid, long pack, long long offset, const char *fmt, ...)) \
    X(int, nomem, (Err *e))                                                                                \
    X(void, raise_err, (Err *e))                                                                           \
    X(void, hex_of, (const uint8_t *oid, char *out))                                                       \
    X(const char *, type_label, (int t))                                                                   \
    X(int, reader_init, (Reader *r, PacksObject *packs, size_t cache_bytes))                               \
    X(void, reader_clear, (Reader *r))                                                                     \
    X(Obj *, reader_resolve, (Reader *r, uint32_t pk, uint32_t i, int keep_whole))                         \
    X(Obj *, reader_get, (Reader *r, PyObject *read, const uint8_t *id, int keep_whole, long *pack,        \
                          long long *offset))

#define WALK_API_MEMBER(ret, name, params) ret (*name) params;

typedef struct {
    int version;                          /* WALK_API_VERSION */
    PyTypeObject *packs_type;
    PyObject *walk_error;
    WALK_API_FUNCTIONS(WALK_API_MEMBER)
} WalkAPI;

#ifdef WALK_CLIENT
/* _walk_client.c: import _walk and take its functions from the capsule (once); 0, or -1 with an exception
 * set. */
int walk_client_import(void);
#endif

/* ---- the client extensions' module functions (each in its own module's method table) --------------- */

/* _bitmap: _bitmap.c, _bitmap_ewah.c */
PyObject *bitmap_commits(PyObject *module, PyObject *args);
PyObject *bitmap_closures(PyObject *module, PyObject *args);
PyObject *ewah_stored(PyObject *module, PyObject *args);
/* _bloom: _bloom.c */
PyObject *bloom_filters(PyObject *module, PyObject *args);
PyObject *commit_reads(PyObject *module, PyObject *args);
/* _packwrite: store/pack/_packwrite_copy.c, store/pack/_packwrite_idx.c */
PyObject *find_reuse(PyObject *module, PyObject *args);
PyObject *whole_headers(PyObject *module, PyObject *args);
PyObject *copy_entries(PyObject *module, PyObject *args);
PyObject *write_order(PyObject *module, PyObject *args);
PyObject *check_chains(PyObject *module, PyObject *args);
PyObject *index_tables(PyObject *module, PyObject *args);

#endif
