/*
 * _walk_read.c: one object out of the packs, with no GIL -- the entry's CRC32 checked against its idx,
 * its header decoded within the entry's extent, its zlib data inflated (zlib checks the Adler-32),
 * a delta chain resolved down to a whole or cached object and applied back up, each result kept in
 * a delta-base cache bounded in bytes (least recently used first out). reader_get (with the GIL): an
 * object from the packs, else from the caller's Python read() -- the one such reader of _bitmap and _bloom.
 */
#include "_walk.h"

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
entry_extent(Reader *w, uint32_t pk, uint32_t i, uint64_t *off, uint64_t *stop)
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
entry_header(Reader *w, uint32_t pk, uint32_t i, Link *l, int *type, uint32_t *base_i)
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
        long long base_pos = pack_entry_at(p, base_off);
        if (base_pos < 0)
            return fail(&w->err, E_PACK, oid, (long)pk, (long long)off,
                        "OFS_DELTA base offset %llu is not an entry of the pack", (unsigned long long)base_off);
        *base_i = (uint32_t)base_pos;
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

/* Give back the pages of the packs' maps this process touched (no GIL needed). The maps are read-only maps of
 * files that never change: a later read faults the same bytes in again from the page cache, in any thread,
 * and pointers into the maps stay valid. Without it a walk's RSS counts every commit and tree it read (a full
 * repack of git-v2.0.0 in 50 packs: 67 MiB of file pages at the walk's end, on top of its own tables). */
static void
packs_drop_pages(PacksObject *ps)
{
#ifdef MADV_DONTNEED
    for (uint32_t k = 0; k < ps->npacks; k++) {
        Pack *p = &ps->p[k];
        if (p->droppable && p->buflen)
            (void)madvise((void *)p->buf, p->buflen, MADV_DONTNEED);
    }
#else
    (void)ps;
#endif
}

/* Inflate the entry's zlib data into out[0..size); exactly size bytes must come out. */
static int
inflate_entry(Reader *w, const Link *l, uint8_t *out)
{
    w->n_inflated++;
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
    if (w->packs->drop_every) {
        w->since_drop += (size_t)(l->stop - l->data_off);
        if (w->since_drop >= w->packs->drop_every) {
            w->since_drop = 0;
            packs_drop_pages(w->packs);
        }
    }
    return 0;
}

/* zlib cannot expand data by more than 1032:1; a header declaring more is refused before anything is
 * allocated for it. */
static int
impossible_size(Reader *w, const Link *l)
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
apply_delta(Reader *w, const Obj *base, const uint8_t *d, size_t n, const Link *l)
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

/* The type of entry (pk, i) without inflating anything: its header's, or for a delta the type at the end of its
 * chain of headers (bounded by MAX_CHAIN: a cycle is an error naming the entry). */
int
reader_type(Reader *w, uint32_t pk, uint32_t i, int *type)
{
    uint32_t cur = i;
    for (size_t n = 0; n <= MAX_CHAIN; n++) {
        Link l;
        int t = 0;
        uint32_t next = 0;
        if (entry_header(w, pk, cur, &l, &t, &next) < 0)
            return -1;
        if (t != T_OFS && t != T_REF) {
            *type = t;
            return 0;
        }
        cur = next;
    }
    Pack *p = &w->packs->p[pk];
    return fail(&w->err, E_PACK, p->oids + (size_t)i * OIDLEN, (long)pk, (long long)p->offs[i],
                "delta chain too long (cycle?)");
}

/* Entry i of pack pk, resolved; every object made on the way is cached (a delta's bases serve the next
 * versions), the entry itself too unless it is whole and keep_whole is 0 (a commit: read once, and 83,000 of
 * them filled the cache the tree walk then needed). */
Obj *
reader_resolve(Reader *w, uint32_t pk, uint32_t i, int keep_whole)
{
    Pack *p = &w->packs->p[pk];
    w->n_resolved++;
    Obj *hit = cache_get(&w->cache, pk, p->offs[i]);
    if (hit) {
        w->n_cache_hits++;
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
                w->n_cache_hits++;
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
        if (n > 0 || keep_whole)
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


int
reader_init(Reader *r, PacksObject *packs, size_t cache_bytes)
{
    r->packs = packs;
    r->since_drop = 0;
    if (cache_init(&r->cache, cache_bytes) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    memset(&r->z, 0, sizeof r->z);
    if (z_inflateInit_(&r->z, z_version(), (int)sizeof(zstream)) != Z_OK) {
        PyErr_SetString(PyExc_MemoryError, "_walk: inflateInit failed");
        return -1;
    }
    r->z_ready = 1;
    return 0;
}

void
reader_clear(Reader *r)
{
    cache_free(&r->cache);
    if (r->z_ready) {
        z_inflateEnd(&r->z);
        r->z_ready = 0;
    }
    buf_free(&r->scratch);
}

/* id's object from the packs, or from read(id) -> (type, data) when they do not hold it (see _walk.h). */
Obj *
reader_get(Reader *r, PyObject *read, const uint8_t *id, int keep_whole, long *pack, long long *offset)
{
    long long gid = packs_find(r->packs, id);
    if (gid >= 0) {
        uint32_t pk = r->packs->pack_of[gid];
        const Pack *p = &r->packs->p[pk];
        Obj *o = reader_resolve(r, pk, (uint32_t)(gid - p->base), keep_whole);
        if (!o) {
            raise_err(&r->err);
            return NULL;
        }
        if (pack)
            *pack = (long)pk;
        if (offset)
            *offset = (long long)p->offs[gid - p->base];
        return o;
    }
    if (pack)
        *pack = -1;
    if (offset)
        *offset = -1;
    PyObject *res = PyObject_CallFunction(read, "y#", (const char *)id, (Py_ssize_t)OIDLEN);
    if (!res)
        return NULL;
    Obj *o = NULL;
    int t;
    PyObject *data;
    Py_buffer view;
    if (PyArg_ParseTuple(res, "iO", &t, &data) && PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) == 0) {
        if ((o = obj_new(t, (size_t)view.len)) == NULL)
            PyErr_NoMemory();
        else
            memcpy(o->data, view.buf, (size_t)view.len);
        PyBuffer_Release(&view);
    }
    Py_DECREF(res);
    return o;
}
