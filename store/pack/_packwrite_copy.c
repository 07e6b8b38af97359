/*
 * _packwrite_copy.c: a repack's write plan over the Packs (the _walk extension's), in C (writeplan.py and reuse.py specify each step and run it
 * in Python without this extension; tests/store/test_repack_write.py compares the packs both write, byte for byte):
 *
 *   find_reuse(packs, ids)     step 1: where each id's copy lies -- loose, a whole entry, a delta entry whose
 *                              base is in ids (its position) or one whose base is not; the global entry number
 *   write_order(...)           step 3's order: ids in their order, each delta's base pulled in just before it
 *   copy_entries(packs, ...)   step 3's copies, a run at a time: whole entries verbatim, reused deltas with an
 *                              OFS_DELTA header pointing at the base's new offset, the source CRC32 checked
 *
 * Anything out of the ordinary is left to Python rather than judged here: an entry header the C decoder
 * does not take (find_reuse marks it K_PYTHON), a CRC32 that does not match or a base that does not
 * precede its delta (copy_entries stops there, ``stuck``). Python then runs its own code for that one
 * object, which raises the typed error naming the pack, the object and the offset -- one set of messages.
 */
#include "_walk.h"

#define K_LOOSE 0
#define K_WHOLE 1
#define K_DELTA 2
#define K_BEHIND 3
#define K_PYTHON 255

/* ---- an entry header (format.decode_entry_header's rules; -1: let Python decode it) ---------- */

typedef struct {
    int type;
    uint64_t size;
    uint64_t base_off;           /* OFS_DELTA */
    const uint8_t *base_id;      /* REF_DELTA */
    uint64_t data_off;           /* where the compressed data starts */
} Head;

static int
entry_head(const uint8_t *buf, uint64_t start, uint64_t end, Head *h)
{
    uint64_t pos = start;
    if (pos >= end)
        return -1;
    unsigned c = buf[pos++];
    int shift = 4;
    h->type = (c >> 4) & 7;
    h->size = c & 15;
    h->base_id = NULL;
    h->base_off = 0;
    while (c & 0x80) {
        if (pos >= end || shift > 56)     /* (sizes past 2^56: Python's arbitrary-size ints decide) */
            return -1;
        c = buf[pos++];
        h->size |= (uint64_t)(c & 0x7F) << shift;
        shift += 7;
    }
    if (h->type == T_OFS) {
        if (pos >= end)
            return -1;
        c = buf[pos++];
        uint64_t rel = c & 0x7F;
        int nbytes = 1;
        while (c & 0x80) {
            if (pos >= end || nbytes >= 10 || rel >= (1ULL << 56))
                return -1;
            c = buf[pos++];
            nbytes++;
            rel = ((rel + 1) << 7) | (c & 0x7F);
        }
        if (rel == 0 || rel > start || start - rel < PACK_HEADER)
            return -1;
        h->base_off = start - rel;
    } else if (h->type == T_REF) {
        if (pos + OIDLEN > end)
            return -1;
        h->base_id = buf + pos;
        pos += OIDLEN;
    } else if (h->type < 1 || h->type > 4) {
        return -1;
    }
    h->data_off = pos;
    return 0;
}

/* ---- id -> position in ids (the last position, as a dict built in order) ------------------------ */

typedef struct {
    const uint8_t **ids;
    uint32_t *slots;             /* position + 1, 0: empty */
    size_t mask;
    uint64_t seed;
} PosMap;

static int
posmap_init(PosMap *m, const uint8_t **ids, size_t n, uint64_t seed)
{
    size_t cap = 1024;
    while (cap < 2 * n + 2)
        cap <<= 1;
    m->ids = ids;
    m->seed = seed;
    m->mask = cap - 1;
    m->slots = PyMem_RawCalloc(cap, sizeof(uint32_t));
    if (!m->slots)
        return -1;
    for (size_t k = 0; k < n; k++) {
        size_t i = (size_t)oid_hash(ids[k], seed) & m->mask;
        while (m->slots[i] && memcmp(ids[m->slots[i] - 1], ids[k], OIDLEN) != 0)
            i = (i + 1) & m->mask;
        m->slots[i] = (uint32_t)(k + 1);
    }
    return 0;
}

static long long
posmap_get(const PosMap *m, const uint8_t *id)
{
    size_t i = (size_t)oid_hash(id, m->seed) & m->mask;
    while (m->slots[i]) {
        if (memcmp(m->ids[m->slots[i] - 1], id, OIDLEN) == 0)
            return (long long)m->slots[i] - 1;
        i = (i + 1) & m->mask;
    }
    return -1;
}

/* The position in ids of the base a delta entry names (-1: not in ids), the last position as a dict built in
 * order would give. pos_of[g]: the last position of global entry g in ids (-1: none); g: the base's entry when
 * the delta names it by offset (-1 when by id). Ids of these packs are found through pos_of (no hashing of
 * the base's id when it is named by offset); only an id outside them (a loose base of a REF_DELTA) needs the
 * map of ids, built on first use. */
static long long
base_position(PacksObject *self, const int32_t *pos_of, long long g, const uint8_t *bid, PosMap *map,
              const uint8_t **idp, size_t n, int *failed)
{
    if (g >= 0 && pos_of[g] >= 0)
        return pos_of[g];
    if (!bid)
        return -1;
    long long gb = packs_find(self, bid);
    if (gb >= 0)
        return pos_of[gb];
    if (!map->slots && posmap_init(map, idp, n, self->seed ^ 0x9E3779B97F4A7C15ULL) < 0) {
        *failed = 1;
        return -1;
    }
    return posmap_get(map, bid);
}

/* find_reuse(ids: list of 20-byte ids) -> (kind bytes, base bytes of 'i', entry bytes of 'q'), or None when
 * ids holds anything but 20-byte bytes (Python then does it all). kind: 0 loose, 1 whole entry, 2 delta
 * whose base is ids[base], 3 delta whose base is not in ids, 255 for Python to decide (an unusual header);
 * entry: the global entry number (-1: not in these packs). */
static PyObject *
packs_find_reuse(PacksObject *self, PyObject *ids)
{
    PyObject *kind_b = NULL, *base_b = NULL, *gid_b = NULL, *result = NULL;
    const uint8_t **idp = NULL;
    int32_t *pos_of = NULL;
    PosMap map = {0};
    if (packs_check_open(self) < 0)
        return NULL;
    if (!PyList_Check(ids)) {
        PyErr_SetString(PyExc_TypeError, "find_reuse(ids): ids must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(ids);
    if ((size_t)n >= INT32_MAX - 1)
        Py_RETURN_NONE;
    idp = PyMem_RawMalloc((n ? (size_t)n : 1) * sizeof(*idp));
    pos_of = PyMem_RawMalloc((self->total ? (size_t)self->total : 1) * sizeof(*pos_of));
    if (!idp || !pos_of) {
        PyMem_RawFree(idp);
        PyMem_RawFree(pos_of);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *o = PyList_GET_ITEM(ids, k);
        if (!PyBytes_CheckExact(o) || PyBytes_GET_SIZE(o) != OIDLEN) {
            PyMem_RawFree(idp);
            PyMem_RawFree(pos_of);
            Py_RETURN_NONE;
        }
        idp[k] = (const uint8_t *)PyBytes_AS_STRING(o);
    }
    kind_b = PyBytes_FromStringAndSize(NULL, n);
    base_b = PyBytes_FromStringAndSize(NULL, 4 * n);
    gid_b = PyBytes_FromStringAndSize(NULL, 8 * n);
    if (!kind_b || !base_b || !gid_b)
        goto done;
    uint8_t *kind = (uint8_t *)PyBytes_AS_STRING(kind_b);
    int32_t *base = (int32_t *)PyBytes_AS_STRING(base_b);
    int64_t *gids = (int64_t *)PyBytes_AS_STRING(gid_b);
    memset(pos_of, 0xFF, (size_t)self->total * sizeof(*pos_of));
    for (Py_ssize_t k = 0; k < n; k++) {     /* first: every id's entry, and each entry's last position */
        if (k + 8 < n)
            packs_prefetch(self, idp[k + 8]);
        long long g = packs_find(self, idp[k]);
        gids[k] = g;
        if (g >= 0)
            pos_of[g] = (int32_t)k;
    }
    int failed = 0;
    for (Py_ssize_t k = 0; k < n && !failed; k++) {
        long long g = gids[k];
        base[k] = -1;
#if defined(__GNUC__)
        /* (the idx tables are read in the plan's order, at random: see copy_prefetch) */
        if (k + 16 < n && gids[k + 16] >= 0)
            __builtin_prefetch(&self->pack_of[gids[k + 16]]);
        if (k + 8 < n && gids[k + 8] >= 0) {
            const Pack *q = &self->p[self->pack_of[gids[k + 8]]];
            __builtin_prefetch(&q->offs[(uint32_t)gids[k + 8] - q->base]);
        }
#endif
        if (g < 0) {
            kind[k] = K_LOOSE;
            continue;
        }
        const Pack *p = &self->p[self->pack_of[g]];
        uint32_t i = (uint32_t)g - p->base;
        uint64_t off = p->offs[i];
        Head h;
        if (off >= p->buflen) {
            kind[k] = K_PYTHON;
            continue;
        }
        if (((p->buf[off] >> 4) & 7) < T_OFS) {
            kind[k] = K_WHOLE;
            continue;
        }
        if (entry_head(p->buf, off, p->end, &h) < 0) {
            kind[k] = K_PYTHON;
            continue;
        }
        long long bk;
        if (h.type == T_OFS) {
            long long bi = pack_entry_at(p, h.base_off);
            bk = bi >= 0 ? base_position(self, pos_of, (long long)p->base + bi, p->oids + (size_t)bi * OIDLEN, &map,
                                         idp, (size_t)n, &failed)
                         : -1;
        } else {
            bk = base_position(self, pos_of, -1, h.base_id, &map, idp, (size_t)n, &failed);
        }
        kind[k] = bk < 0 ? K_BEHIND : K_DELTA;
        base[k] = (int32_t)bk;
    }
    if (failed)
        PyErr_NoMemory();
    else
        result = PyTuple_Pack(3, kind_b, base_b, gid_b);
done:
    PyMem_RawFree(map.slots);
    PyMem_RawFree(idp);
    PyMem_RawFree(pos_of);
    Py_XDECREF(kind_b);
    Py_XDECREF(base_b);
    Py_XDECREF(gid_b);
    return result;
}

/* whole_headers(packs, kind, gids 'q') -> (type bytes, size bytes of 'Q'): for each k whose kind is K_WHOLE, the
 * type and size its entry header at gids[k] says (the search's candidates: writeplan._search reads them with
 * header_fields one by one otherwise); type 0 for any other kind, 255 for a header Python must decode (it
 * raises the typed error naming the pack and offset). */
PyObject *
whole_headers(PyObject *module, PyObject *args)
{
    PyObject *packs, *ko, *go, *types_b = NULL, *sizes_b = NULL, *result = NULL;
    Py_buffer v[2];
    if (walk_client_import() < 0 || !PyArg_ParseTuple(args, "O!OO", &PacksType, &packs, &ko, &go))
        return NULL;
    PacksObject *self = (PacksObject *)packs;
    if (packs_check_open(self) < 0)
        return NULL;
    const Table tables[] = {{ko, 1, 0, "whole_headers: kind"}, {go, 8, 0, "whole_headers: gids"}};
    Py_ssize_t n = -1;
    if (get_tables(tables, 2, v, &n) < 0)
        return NULL;
    const uint8_t *kind = v[0].buf;
    const int64_t *gids = v[1].buf;
    types_b = PyBytes_FromStringAndSize(NULL, n);
    sizes_b = PyBytes_FromStringAndSize(NULL, 8 * n);
    if (!types_b || !sizes_b)
        goto done;
    uint8_t *types = (uint8_t *)PyBytes_AS_STRING(types_b);
    uint64_t *sizes = (uint64_t *)PyBytes_AS_STRING(sizes_b);
    for (Py_ssize_t k = 0; k < n; k++) {
        types[k] = 0;
        sizes[k] = 0;
        if (kind[k] != K_WHOLE)
            continue;
        int64_t g = gids[k];
        if (g < 0 || g >= (int64_t)self->total) {
            types[k] = 255;
            continue;
        }
        const Pack *p = &self->p[self->pack_of[g]];
        uint64_t off = p->offs[(uint32_t)g - p->base];
        Head h;
        if (off < PACK_HEADER || off >= p->buflen || entry_head(p->buf, off, p->end, &h) < 0 || h.type < 1
            || h.type > 4) {
            types[k] = 255;
            continue;
        }
        types[k] = (uint8_t)h.type;
        sizes[k] = h.size;
    }
    result = PyTuple_Pack(2, types_b, sizes_b);
done:
    Py_XDECREF(types_b);
    Py_XDECREF(sizes_b);
    PyBuffer_Release(&v[0]);
    PyBuffer_Release(&v[1]);
    return result;
}

/* ---- the write order --------------------------------------------------------------------------------- */

/* find_reuse(packs, ids): packs_find_reuse of these Packs. */
PyObject *
find_reuse(PyObject *module, PyObject *args)
{
    PyObject *packs, *ids;
    if (walk_client_import() < 0 || !PyArg_ParseTuple(args, "O!O", &PacksType, &packs, &ids))
        return NULL;
    return packs_find_reuse((PacksObject *)packs, ids);
}

/* write_order(kind, reused, rbase, cbase) -> (order bytes of 'i', python bytes of 'i', cycle): the positions
 * in writing order (writeplan._write's: ids' order, a delta's base written just before it when it comes
 * later), the indexes into that order of the objects Python writes (all but whole entries and reused deltas
 * with no computed delta), and -1, or the position where a delta base cycle was met (a bug). rbase: a reused
 * delta's base, cbase: a computed delta's base (-1: none). */
PyObject *
write_order(PyObject *module, PyObject *args)
{
    PyObject *ko, *ro, *rbo, *cbo, *order_b = NULL, *result = NULL;
    Py_buffer v[4];
    uint8_t *state = NULL;
    int32_t *stack = NULL;
    Buf py = {0};
    long long cycle = -1;
    if (!PyArg_ParseTuple(args, "OOOO", &ko, &ro, &rbo, &cbo))
        return NULL;
    const Table tables[] = {
        {ko, 1, 0, "write_order: kind"}, {ro, 1, 0, "write_order: reused"}, {rbo, 4, 0, "write_order: rbase"},
        {cbo, 4, 0, "write_order: cbase"},
    };
    Py_ssize_t n = -1;             /* as many as kind has */
    if (get_tables(tables, 4, v, &n) < 0)
        return NULL;
    const uint8_t *kind = v[0].buf, *reused = v[1].buf;
    const int32_t *rbase = v[2].buf, *cbase = v[3].buf;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (rbase[k] >= n || cbase[k] >= n) {
            PyErr_SetString(PyExc_ValueError, "write_order: a base outside the plan");
            goto done;
        }
    }
    order_b = PyBytes_FromStringAndSize(NULL, 4 * n);
    state = PyMem_RawCalloc(n ? (size_t)n : 1, 1);
    stack = PyMem_RawMalloc(((size_t)n + 1) * sizeof(int32_t));
    if (!order_b || !state || !stack) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    int32_t *order = (int32_t *)PyBytes_AS_STRING(order_b);
    Py_ssize_t m = 0;
    for (Py_ssize_t k0 = 0; k0 < n && cycle < 0; k0++) {
        if (state[k0] == 2)
            continue;
        size_t sp = 0;
        stack[sp++] = (int32_t)k0;
        while (sp) {
            int32_t k = stack[sp - 1];
            int32_t bk = cbase[k] >= 0 ? cbase[k] : reused[k] ? rbase[k] : -1;
            if (bk >= 0 && state[bk] == 0) {
                state[k] = 1;
                stack[sp++] = bk;
                continue;
            }
            if (bk >= 0 && state[bk] == 1) {
                cycle = k;
                break;
            }
            if (!(cbase[k] < 0 && (reused[k] || kind[k] == K_WHOLE))) {
                int32_t j = (int32_t)m;
                if (buf_put(&py, &j, sizeof j) < 0) {
                    PyErr_NoMemory();
                    goto done;
                }
            }
            order[m++] = k;
            state[k] = 2;
            sp--;
        }
    }
    {
        PyObject *py_b = PyBytes_FromStringAndSize((const char *)py.p, (Py_ssize_t)py.len);
        if (py_b) {
            result = Py_BuildValue("(OOL)", order_b, py_b, cycle);
            Py_DECREF(py_b);
        }
    }
done:
    buf_free(&py);
    PyMem_RawFree(state);
    PyMem_RawFree(stack);
    Py_XDECREF(order_b);
    release_tables(v, 4);
    return result;
}

/* ---- the copies ------------------------------------------------------------------------------------ */

/* OFS_DELTA's header: type/size varint (format.encode_entry_header), then the distance (write.ofs_encoding). */
static size_t
ofs_header(uint8_t *out, uint64_t size, uint64_t rel)
{
    size_t n = 0;
    unsigned c = (T_OFS << 4) | (unsigned)(size & 15);
    size >>= 4;
    while (size) {
        out[n++] = (uint8_t)(c | 0x80);
        c = size & 0x7F;
        size >>= 7;
    }
    out[n++] = (uint8_t)c;
    uint8_t tmp[10];
    size_t t = 0;
    tmp[t++] = rel & 0x7F;
    rel >>= 7;
    while (rel) {
        rel -= 1;
        tmp[t++] = 0x80 | (rel & 0x7F);
        rel >>= 7;
    }
    while (t)
        out[n++] = tmp[--t];
    return n;
}

static inline void
copy_prefetch(const PacksObject *self, const int64_t *gids, const int32_t *order, Py_ssize_t n, Py_ssize_t j,
              int tables)
{
#if defined(__GNUC__)
    int32_t k = order[j];
    if (k < 0 || k >= n)
        return;
    int64_t g = gids[k];
    if (g < 0 || g >= (int64_t)self->total)
        return;
    if (!tables) {
        __builtin_prefetch(&self->pack_of[g]);
        return;
    }
    const Pack *p = &self->p[self->pack_of[g]];
    uint32_t i = (uint32_t)g - p->base;
    __builtin_prefetch(&p->offs[i]);
    __builtin_prefetch(&p->ends[i]);
    __builtin_prefetch(&p->crcs[i]);
    __builtin_prefetch(p->oids + (size_t)i * OIDLEN);
#else
    (void)self, (void)gids, (void)order, (void)n, (void)j, (void)tables;
#endif
}

/* copy_entries(gids 'q', order 'i', start, stop, reused, rbase 'i', offsets 'Q' (writable), pos, limit)
 *   -> (next, stuck, entries bytes, offsets bytes 'Q', crcs bytes 'I', ids bytes, deltas, bytes copied)
 * Copies the objects order[start:stop] (each a whole entry, or a reused delta whose base is already
 * written: offsets[base]) as PackWriter.copy_raw / copy_delta do, the first at pack offset pos; stops
 * after limit bytes of output (next < stop, stuck False), or before an object it leaves to Python
 * (stuck True: a CRC32 mismatch, an unusual header, a base not before its delta). offsets[k] gets each
 * copied object's new offset. */
PyObject *
copy_entries(PyObject *module, PyObject *args)
{
    PacksObject *self;
    PyObject *go, *oo, *ro, *rbo, *offo, *result = NULL;
    Py_ssize_t start, stop;
    unsigned long long pos0, limit;
    Py_buffer v[5];
    int stuck = 0;
    Buf out = {0}, offs = {0}, crcs = {0}, oids = {0};
    long long deltas = 0, copied = 0;
    if (walk_client_import() < 0
        || !PyArg_ParseTuple(args, "O!OOnnOOOKK", &PacksType, &self, &go, &oo, &start, &stop, &ro, &rbo, &offo,
                             &pos0, &limit))
        return NULL;
    if (packs_check_open(self) < 0)
        return NULL;
    const Table tables[] = {
        {ro, 1, 0, "copy_entries: reused"}, {go, 8, 0, "copy_entries: gids"}, {oo, 4, 0, "copy_entries: order"},
        {rbo, 4, 0, "copy_entries: rbase"}, {offo, 8, 1, "copy_entries: offsets"},
    };
    Py_ssize_t n = -1;             /* as many as reused has */
    if (get_tables(tables, 5, v, &n) < 0)
        return NULL;
    if (start < 0 || stop > n || start > stop) {
        PyErr_SetString(PyExc_IndexError, "copy_entries: start/stop outside the order");
        goto done;
    }
    const uint8_t *reused = v[0].buf;
    const int64_t *gids = v[1].buf;
    const int32_t *order = v[2].buf, *rbase = v[3].buf;
    uint64_t *newoff = v[4].buf;
    uint64_t pos = pos0;
    Py_ssize_t j = start;
    for (; j < stop; j++) {
        int32_t k = order[j];
        if (k < 0 || k >= n) {
            PyErr_SetString(PyExc_IndexError, "copy_entries: order names a position outside the plan");
            goto done;
        }
        /* The idx tables are read in write order, i.e. at random: start loading what the entries a few
         * steps ahead need (their pack number 16 ahead, their offset, end and CRC32 8 ahead). */
        if (j + 16 < stop)
            copy_prefetch(self, gids, order, n, j + 16, 0);
        if (j + 8 < stop)
            copy_prefetch(self, gids, order, n, j + 8, 1);
        int64_t g = gids[k];
        if (g < 0 || g >= (int64_t)self->total) {
            stuck = 1;
            break;
        }
        const Pack *p = &self->p[self->pack_of[g]];
        uint32_t i = (uint32_t)g - p->base;
        uint64_t off = p->offs[i], end = p->ends[i];
        if (off >= end || end > p->buflen) {
            stuck = 1;
            break;
        }
        uint32_t crc = crc32_of(p->buf + off, end - off);
        if (crc != p->crcs[i]) {
            stuck = 1;          /* Python's copy raises the typed error naming the pack and offset */
            break;
        }
        if (reused[k]) {
            Head h;
            int32_t bk = rbase[k];
            uint8_t hdr[32];
            if (bk < 0 || bk >= n || entry_head(p->buf, off, p->end, &h) < 0 || (h.type != T_OFS && h.type != T_REF)
                || h.data_off > end || !(newoff[bk] < pos)) {
                stuck = 1;
                break;
            }
            size_t hn = ofs_header(hdr, h.size, pos - newoff[bk]);
            crc = crc32_more(crc32_more(0, hdr, hn), p->buf + h.data_off, end - h.data_off);
            if (buf_put(&out, hdr, hn) < 0 || buf_put(&out, p->buf + h.data_off, end - h.data_off) < 0)
                goto nomem;
            newoff[k] = pos;
            if (buf_put(&offs, &pos, 8) < 0)
                goto nomem;
            pos += hn + (end - h.data_off);
            deltas++;
        } else {
            if (buf_put(&out, p->buf + off, end - off) < 0)
                goto nomem;
            newoff[k] = pos;
            if (buf_put(&offs, &pos, 8) < 0)
                goto nomem;
            pos += end - off;
        }
        copied += (long long)(end - off);
        if (buf_put(&crcs, &crc, 4) < 0 || buf_put(&oids, p->oids + (size_t)i * OIDLEN, OIDLEN) < 0)
            goto nomem;
        if (out.len >= limit) {
            j++;
            break;
        }
    }
    result = Py_BuildValue("(nOy#y#y#y#LL)", j, stuck ? Py_True : Py_False,
                           (const char *)(out.p ? out.p : (uint8_t *)""), (Py_ssize_t)out.len,
                           (const char *)(offs.p ? offs.p : (uint8_t *)""), (Py_ssize_t)offs.len,
                           (const char *)(crcs.p ? crcs.p : (uint8_t *)""), (Py_ssize_t)crcs.len,
                           (const char *)(oids.p ? oids.p : (uint8_t *)""), (Py_ssize_t)oids.len,
                           deltas, copied);
    goto done;
nomem:
    PyErr_NoMemory();
done:
    buf_free(&out);
    buf_free(&offs);
    buf_free(&crcs);
    buf_free(&oids);
    release_tables(v, 5);
    return result;
}

/* ---- reused chains (writeplan._check_chains) -------------------------------------------------------- */

/* check_chains(reused (writable), base 'i', limit) -> (height bytes of 'i', dropped): drops (reused[k] = 0)
 * the reused delta that closes a cycle or passes limit; each remaining chain's height at its root. */
PyObject *
check_chains(PyObject *module, PyObject *args)
{
    PyObject *ro, *bo, *height_b = NULL, *result = NULL;
    long limit;
    Py_buffer v[2];
    int32_t *depth = NULL, *root = NULL, *path = NULL;
    uint8_t *state = NULL;
    long long dropped = 0;
    if (!PyArg_ParseTuple(args, "OOl", &ro, &bo, &limit))
        return NULL;
    const Table tables[] = {{ro, 1, 1, "check_chains: reused"}, {bo, 4, 0, "check_chains: base"}};
    Py_ssize_t n = -1;             /* as many as reused has */
    if (get_tables(tables, 2, v, &n) < 0)
        return NULL;
    uint8_t *reused = v[0].buf;
    const int32_t *base = v[1].buf;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (reused[k] && (base[k] < 0 || base[k] >= n)) {
            PyErr_SetString(PyExc_ValueError, "check_chains: a reused delta's base outside the plan");
            goto done;
        }
    }
    size_t cells = n ? (size_t)n : 1;
    height_b = PyBytes_FromStringAndSize(NULL, 4 * n);
    depth = PyMem_RawCalloc(cells, sizeof(int32_t));
    root = PyMem_RawMalloc(cells * sizeof(int32_t));
    path = PyMem_RawMalloc(cells * sizeof(int32_t));
    state = PyMem_RawCalloc(cells, 1);
    if (!height_b || !depth || !root || !path || !state) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    int32_t *height = (int32_t *)PyBytes_AS_STRING(height_b);
    for (Py_ssize_t k = 0; k < n; k++) {
        root[k] = -1;
        height[k] = 0;
    }
    for (Py_ssize_t k0 = 0; k0 < n; k0++) {
        if (!reused[k0] || state[k0])
            continue;
        size_t np = 0;
        int32_t k = (int32_t)k0;
        while (reused[k] && !state[k]) {
            state[k] = 1;
            path[np++] = k;
            k = base[k];
        }
        if (reused[k] && state[k] == 1) {
            reused[k] = 0;           /* a cycle: the delta that closes it goes to the search */
            dropped++;
        }
        while (np) {
            int32_t node = path[--np];
            state[node] = 2;
            if (!reused[node])
                continue;
            int32_t b = base[node];
            long d = reused[b] ? depth[b] + 1 : 1;
            if (d > limit) {
                reused[node] = 0;    /* too deep: a new chain starts here */
                dropped++;
                continue;
            }
            depth[node] = (int32_t)d;
            root[node] = reused[b] ? root[b] : b;
        }
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (reused[k]) {
            int32_t rt = root[k] < 0 ? root[k] + (int32_t)n : root[k];   /* (Python's negative index) */
            if (depth[k] > height[rt])
                height[rt] = depth[k];
        }
    }
    result = Py_BuildValue("(OL)", height_b, dropped);
done:
    Py_XDECREF(height_b);
    PyMem_RawFree(depth);
    PyMem_RawFree(root);
    PyMem_RawFree(path);
    PyMem_RawFree(state);
    release_tables(v, 2);
    return result;
}
