/*
 * _bloom.c: the commit-graph's changed-path Bloom filters (bloom.py's TreeDiffer + filter_bytes, in C).
 *
 *   bloom_filters(packs, pairs, read) -> (filters, ends 'I') as bytes
 *       pairs: 40 bytes per commit, its first parent's tree (20 zero bytes: none, a root commit) and its
 *       tree; filters: every commit's filter one after the other, ends[k] where commit k's stops.
 *
 * The specification is store/maintenance/serving/bloom.py (git 2.39's bloom.c): the paths the tree changes against
 * the parent's, recursively (no renames; a file on one side and a directory on the other is the path plus
 * everything below the directory; modes compared as git's canon_mode), more than 512 of them: "too large"
 * (ff); every leading directory added, deduplicated, more than 512: "too large"; none: 00; else
 * ceil(n * 10 / 8) bytes with 7 bits per path from git 2.39's murmur3 (path bytes read as signed chars).
 *
 *   commit_reads(packs, tips, skip, read) -> [(oid, data)]
 *       commitgraph.reachable_commits' reads: a depth-first walk from tips (ids, in the order the Python
 *       stack pops them) along the parent lines, not into ids in any container of skip; the raw commits,
 *       for parse_commit_for_graph.
 *
 * Trees come from the packs (the walk's Reader: CRC32-checked, delta-base cache) or, when not in them, from
 * read(oid) -> (type, data). Parsed trees are kept in a direct-mapped cache bounded in slots and bytes
 * (consecutive commits share most subtrees). The GIL is held throughout (read() may be called).
 */
#include "_walk.h"

#define BLOOM_MAX_CHANGES 512
#define BLOOM_HASHES 7
#define BLOOM_BITS_PER_ENTRY 10
#define BLOOM_SEED0 0x293ae76fU
#define BLOOM_SEED1 0x7e646e2cU
#define TREE_CACHE_SLOTS 16384       /* a power of two */
#define TREE_CACHE_BYTES (48u << 20) /* past this the parsed-tree cache is emptied (trees in use stay alive) */
#define MAX_TREE_DEPTH 2048          /* trees nested deeper are refused (a path of PATH_MAX 4096 has fewer) */

enum { C_TREE = 0, C_LINK, C_GITLINK, C_EXEC, C_FILE };

typedef struct {
    uint32_t start;               /* where the entry starts in the tree's data */
    uint32_t name_off, name_len;  /* in the tree's data; the id follows the name's NUL */
    uint8_t canon;
} TEnt;

typedef struct {
    size_t refs;
    Obj *obj;
    uint32_t n;
    int sorted;                   /* the entries were in git's order (ents[] is in the data's order) */
    TEnt ents[];
} PTree;

static inline size_t
ent_end(const TEnt *e)
{
    return (size_t)e->name_off + e->name_len + 1 + OIDLEN;
}

typedef struct {
    uint8_t oid[OIDLEN];
    PTree *t;
} TSlot;

typedef struct {
    uint32_t off, len;
} Span;

typedef struct {
    Reader rd;
    PyObject *read;
    TSlot *cache;
    size_t cache_bytes;      /* data and entries of the trees in the cache */
    uint64_t seed;
    Buf prefix;              /* the path of the trees being compared, with its "/" */
    Buf arena;               /* the changed paths' bytes (one commit) */
    Buf spans;               /* Span: the changed paths, then their directories */
    size_t changes;          /* paths emitted (one commit) */
    int too_many;
} Bloom;

static void
ptree_decref(PTree *t)
{
    if (t && --t->refs == 0) {
        obj_decref(t->obj);
        PyMem_RawFree(t);
    }
}

static inline int
name_cmp(const uint8_t *a, uint32_t na, const uint8_t *b, uint32_t nb)
{
    int c = memcmp(a, b, na < nb ? na : nb);
    if (c)
        return c;
    return na < nb ? -1 : na > nb;
}

/* git's tree order (base_name_compare): a tree's name compares as if it ended in "/". A file and a tree of
 * the same name are then two names, as bloom.py's one name with a file on one side and a tree on the other:
 * the file's path and the tree's paths. */
static inline int
tree_cmp(const uint8_t *a, uint32_t na, int a_dir, const uint8_t *b, uint32_t nb, int b_dir)
{
    uint32_t n = na < nb ? na : nb;
    for (uint32_t k = 0; k < n; k++)
        if (a[k] != b[k])
            return (int)a[k] - (int)b[k];
    int ca = na > n ? a[n] : a_dir ? '/' : 0, cb = nb > n ? b[n] : b_dir ? '/' : 0;
    return ca - cb;
}

static inline int
ent_cmp(const uint8_t *da, const TEnt *a, const uint8_t *db, const TEnt *b)
{
    return tree_cmp(da + a->name_off, a->name_len, a->canon == C_TREE, db + b->name_off, b->name_len,
                    b->canon == C_TREE);
}

static const uint8_t *sort_base;

static int
tent_cmp(const void *x, const void *y)
{
    return ent_cmp(sort_base, x, sort_base, y);
}

/* git's canon_mode of an octal mode (the low bits of its value: wrapping arithmetic keeps them exact). */
static inline uint8_t
canon_of(uint32_t v)
{
    uint32_t kind = v & 0170000;
    if (kind == 0040000)
        return C_TREE;
    if (kind == 0120000)
        return C_LINK;
    if (kind == 0160000)
        return C_GITLINK;
    return (v & 0100) ? C_EXEC : C_FILE;
}

/* The entries of tree data (bloom.py's _ENTRY over the whole data), sorted by name; NULL with an exception. */
static PTree *
parse_tree(const uint8_t *id, Obj *o)
{
    const uint8_t *d = o->data;
    size_t n = o->size, count = n / 24 + 1;   /* an entry is at least "0 a\0" and 20 bytes */
    PTree *t = PyMem_RawMalloc(sizeof(PTree) + (count + 1) * sizeof(TEnt));
    if (!t) {
        PyErr_NoMemory();
        return NULL;
    }
    t->refs = 1;
    t->obj = o;
    t->n = 0;
    int sorted = 1;
    const uint8_t *p = d, *end = d + n;
    TreeEnt ent;
    int got;
    for (const uint8_t *at = p; (got = tree_entry_next(&p, end, &ent)) != 0; at = p) {
        if (got < 0 || t->n >= count || (size_t)(ent.id - 1 - d) > UINT32_MAX) {
            PyObject *oid = PyBytes_FromStringAndSize((const char *)id, OIDLEN);
            char msg[96];
            snprintf(msg, sizeof msg, "tree does not parse (malformed entry at byte %llu)",
                     (unsigned long long)(at - d));
            PyObject *args = oid ? Py_BuildValue("(ssOlL)", "corrupt", msg, oid, -1L, -1LL) : NULL;
            if (args)
                PyErr_SetObject(WalkError, args);
            Py_XDECREF(args);
            Py_XDECREF(oid);
            t->obj = NULL;
            PyMem_RawFree(t);
            return NULL;
        }
        uint32_t v = 0;
        for (size_t k = 0; k < ent.mode_len; k++)
            v = v * 8 + (uint32_t)(ent.mode[k] - '0');
        TEnt *e = &t->ents[t->n++];
        e->start = (uint32_t)(at - d);
        e->name_off = (uint32_t)(ent.name - d);
        e->name_len = (uint32_t)ent.name_len;
        e->canon = canon_of(v);
        if (t->n > 1 && ent_cmp(d, e - 1, d, e) > 0)
            sorted = 0;
    }
    t->sorted = sorted;
    if (!sorted) {   /* (not in git's order: a tree git would not write; the merge below needs the order) */
        sort_base = d;
        qsort(t->ents, t->n, sizeof(TEnt), tent_cmp);
    }
    return t;
}

/* A WalkError "corrupt" for id, the object found a type other than the one wanted (pack -1: from read()). */
static void
wrong_type(const uint8_t *id, const char *msg, long pack, long long offset)
{
    PyObject *oid = PyBytes_FromStringAndSize((const char *)id, OIDLEN);
    PyObject *args = oid ? Py_BuildValue("(ssOlL)", "corrupt", msg, oid, pack, offset) : NULL;
    if (args)
        PyErr_SetObject(WalkError, args);
    Py_XDECREF(args);
    Py_XDECREF(oid);
}

/* An object of type want from the packs, or from read(); NULL with a Python exception set. */
static Obj *
bloom_object(Reader *rd, PyObject *read, const uint8_t *id, int want)
{
    long pk;
    long long off;
    Obj *o = reader_get(rd, read, id, 1, &pk, &off);
    if (!o || o->type == want)
        return o;
    char msg[80];
    snprintf(msg, sizeof msg, "expected a %s, found a %s", type_label(want), type_label(o->type));
    obj_decref(o);
    wrong_type(id, msg, pk, off);
    return NULL;
}

/* The parsed tree id (a new reference), from the cache or read and parsed; NULL with an exception. */
static PTree *
get_tree(Bloom *b, const uint8_t *id)
{
    TSlot *s = &b->cache[(size_t)oid_hash(id, b->seed) & (TREE_CACHE_SLOTS - 1)];
    if (s->t && memcmp(s->oid, id, OIDLEN) == 0) {
        s->t->refs++;
        return s->t;
    }
    Obj *o = bloom_object(&b->rd, b->read, id, T_TREE);
    if (!o)
        return NULL;
    PTree *t = parse_tree(id, o);
    if (!t) {
        obj_decref(o);
        return NULL;
    }
    size_t size = o->size + t->n * sizeof(TEnt);
    if (b->cache_bytes + size > TREE_CACHE_BYTES) {
        for (size_t k = 0; k < TREE_CACHE_SLOTS; k++) {
            ptree_decref(b->cache[k].t);
            b->cache[k].t = NULL;
        }
        b->cache_bytes = 0;
    }
    if (s->t)
        b->cache_bytes -= s->t->obj->size + s->t->n * sizeof(TEnt);
    ptree_decref(s->t);
    b->cache_bytes += size;
    memcpy(s->oid, id, OIDLEN);
    s->t = t;
    t->refs++;
    return t;
}

static int
emit(Bloom *b, const uint8_t *name, uint32_t len)
{
    if (++b->changes > BLOOM_MAX_CHANGES) {
        b->too_many = 1;
        return 0;
    }
    Span sp = {(uint32_t)b->arena.len, (uint32_t)(b->prefix.len + len)};
    if (b->arena.len + b->prefix.len + len > UINT32_MAX || buf_put(&b->arena, b->prefix.p, b->prefix.len) < 0
        || buf_put(&b->arena, name, len) < 0 || buf_put(&b->spans, &sp, sizeof sp) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static int diff_trees(Bloom *b, const uint8_t *old, const uint8_t *new, int depth);

/* One name of the two trees: ea/eb NULL when absent on that side (bloom.py's TreeDiffer._diff loop body). */
static int
diff_entry(Bloom *b, const PTree *ta, const TEnt *ea, const PTree *tb, const TEnt *eb, int depth)
{
    const uint8_t *ida = ea ? ta->obj->data + ea->name_off + ea->name_len + 1 : NULL;
    const uint8_t *idb = eb ? tb->obj->data + eb->name_off + eb->name_len + 1 : NULL;
    if (ea && eb && ea->canon == eb->canon && memcmp(ida, idb, OIDLEN) == 0)
        return 0;
    const uint8_t *name = ea ? ta->obj->data + ea->name_off : tb->obj->data + eb->name_off;
    uint32_t len = ea ? ea->name_len : eb->name_len;
    int a_tree = ea && ea->canon == C_TREE, b_tree = eb && eb->canon == C_TREE;
    if (!a_tree && !b_tree)
        return emit(b, name, len);
    if ((ea && !a_tree) || (eb && !b_tree))
        if (emit(b, name, len) < 0 || b->too_many)
            return b->too_many ? 0 : -1;
    size_t keep = b->prefix.len;
    if (buf_put(&b->prefix, name, len) < 0 || buf_put(&b->prefix, "/", 1) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = diff_trees(b, a_tree ? ida : NULL, b_tree ? idb : NULL, depth + 1);
    b->prefix.len = keep;
    return rc;
}

/* Two versions of a tree differ in a few entries: the entries in the bytes both start with, and in the bytes
 * both end with, are the same entries (same boundaries, same bytes) and no change; only the ones between
 * are merged. (Both in the data's order: the boundaries are the parse's.) */
static void
trim_common(const PTree *ta, const PTree *tb, uint32_t *i, uint32_t *j, uint32_t *na, uint32_t *nb)
{
    const uint8_t *a = ta->obj->data, *b = tb->obj->data;
    size_t la = ta->obj->size, lb = tb->obj->size, m = la < lb ? la : lb, pre = 0, suf = 0;
    while (pre + 256 <= m && memcmp(a + pre, b + pre, 256) == 0)
        pre += 256;
    while (pre + 8 <= m && load64(a + pre) == load64(b + pre))
        pre += 8;
    while (pre < m && a[pre] == b[pre])
        pre++;
    while (suf + 256 <= m && memcmp(a + la - suf - 256, b + lb - suf - 256, 256) == 0)
        suf += 256;
    while (suf + 8 <= m && load64(a + la - suf - 8) == load64(b + lb - suf - 8))
        suf += 8;
    while (suf < m && a[la - suf - 1] == b[lb - suf - 1])
        suf++;
    uint32_t k = 0;
    while (k < *na && k < *nb && ent_end(&ta->ents[k]) <= pre)
        k++;
    *i = *j = k;
    while (*na > k && *nb > k && ta->ents[*na - 1].start >= la - suf
           && la - ta->ents[*na - 1].start == lb - tb->ents[*nb - 1].start) {
        (*na)--;
        (*nb)--;
    }
}

static int
diff_trees(Bloom *b, const uint8_t *old, const uint8_t *new, int depth)
{
    if (depth > MAX_TREE_DEPTH) {
        PyObject *oid = PyBytes_FromStringAndSize((const char *)(new ? new : old), OIDLEN);
        PyObject *args = oid ? Py_BuildValue("(ssOlL)", "corrupt", "trees nested too deep for a Bloom filter",
                                             oid, -1L, -1LL) : NULL;
        if (args)
            PyErr_SetObject(WalkError, args);
        Py_XDECREF(args);
        Py_XDECREF(oid);
        return -1;
    }
    PTree *ta = NULL, *tb = NULL;
    int rc = -1;
    if (old && !(ta = get_tree(b, old)))
        goto done;
    if (new && !(tb = get_tree(b, new)))
        goto done;
    uint32_t na = ta ? ta->n : 0, nb = tb ? tb->n : 0, i = 0, j = 0;
    if (ta && tb && ta->sorted && tb->sorted)
        trim_common(ta, tb, &i, &j, &na, &nb);
    while ((i < na || j < nb) && !b->too_many) {
        const TEnt *ea = i < na ? &ta->ents[i] : NULL, *eb = j < nb ? &tb->ents[j] : NULL;
        if (ea && eb) {
            int c = ent_cmp(ta->obj->data, ea, tb->obj->data, eb);
            if (c < 0)
                eb = NULL;
            else if (c > 0)
                ea = NULL;
        }
        if (ea)
            i++;
        if (eb)
            j++;
        if (diff_entry(b, ta, ea, tb, eb, depth) < 0)
            goto done;
    }
    rc = 0;
done:
    ptree_decref(ta);
    ptree_decref(tb);
    return rc;
}

static const uint8_t *span_base;

static int
span_cmp(const void *x, const void *y)
{
    const Span *a = x, *b = y;
    return name_cmp(span_base + a->off, a->len, span_base + b->off, b->len);
}

static inline uint32_t
rotl32(uint32_t v, int n)
{
    return (v << n) | (v >> (32 - n));
}

/* A byte read through git 2.39's `const char *`: sign-extended. */
static inline uint32_t
sx(uint8_t c)
{
    return (uint32_t)(int32_t)(int8_t)c;
}

/* git 2.39's murmur3_seeded (bloom.c), signed-char reading included (bloom.py's murmur3_seeded). */
static uint32_t
murmur3_seeded(uint32_t seed, const uint8_t *data, size_t len)
{
    const uint32_t c1 = 0xcc9e2d51U, c2 = 0x1b873593U;
    uint32_t h = seed;
    size_t n4 = len / 4;
    for (size_t i = 0; i < n4; i++) {
        const uint8_t *p = data + 4 * i;
        uint32_t k = sx(p[0]) | (sx(p[1]) << 8) | (sx(p[2]) << 16) | (sx(p[3]) << 24);
        k *= c1;
        k = rotl32(k, 15);
        k *= c2;
        h ^= k;
        h = rotl32(h, 13) * 5 + 0xe6546b64U;
    }
    const uint8_t *tail = data + 4 * n4;
    uint32_t k1 = 0;
    switch (len & 3) {
    case 3:
        k1 ^= sx(tail[2]) << 16;
        /* fall through */
    case 2:
        k1 ^= sx(tail[1]) << 8;
        /* fall through */
    case 1:
        k1 ^= sx(tail[0]);
        k1 *= c1;
        k1 = rotl32(k1, 15);
        k1 *= c2;
        h ^= k1;
    }
    h ^= (uint32_t)len;
    h ^= h >> 16;
    h *= 0x85ebca6bU;
    h ^= h >> 13;
    h *= 0xc2b2ae35U;
    h ^= h >> 16;
    return h;
}

/* One commit's filter appended to out (the changed paths are in b->spans). */
static int
put_filter(Bloom *b, Buf *out)
{
    static const uint8_t too_large = 0xff, empty = 0x00;
    if (b->too_many)
        return buf_put(out, &too_large, 1);
    size_t emitted = b->spans.len / sizeof(Span);
    for (size_t k = 0; k < emitted; k++) {   /* every leading directory of each path */
        Span sp = ((Span *)b->spans.p)[k];
        const uint8_t *p = b->arena.p + sp.off;
        for (uint32_t cut = sp.len; cut-- > 0;)
            if (p[cut] == '/') {
                Span dir = {sp.off, cut};
                if (buf_put(&b->spans, &dir, sizeof dir) < 0)
                    return -1;
            }
    }
    Span *all = (Span *)b->spans.p;
    size_t n = b->spans.len / sizeof(Span), uniq = 0;
    if (n) {
        span_base = b->arena.p;
        qsort(all, n, sizeof(Span), span_cmp);
        for (size_t k = 0; k < n; k++)
            if (!uniq || span_cmp(&all[uniq - 1], &all[k]) != 0)
                all[uniq++] = all[k];
    }
    if (uniq > BLOOM_MAX_CHANGES)
        return buf_put(out, &too_large, 1);
    size_t length = (uniq * BLOOM_BITS_PER_ENTRY + 7) / 8;
    if (!length)
        return buf_put(out, &empty, 1);
    if (buf_reserve(out, length) < 0)
        return -1;
    uint8_t *data = out->p + out->len;
    memset(data, 0, length);
    uint64_t bits = (uint64_t)length * 8;
    for (size_t k = 0; k < uniq; k++) {
        const uint8_t *p = b->arena.p + all[k].off;
        uint32_t h0 = murmur3_seeded(BLOOM_SEED0, p, all[k].len), h1 = murmur3_seeded(BLOOM_SEED1, p, all[k].len);
        for (uint32_t i = 0; i < BLOOM_HASHES; i++) {
            uint64_t pos = (uint32_t)(h0 + i * h1) % bits;
            data[pos >> 3] |= (uint8_t)(1u << (pos & 7));
        }
    }
    out->len += length;
    return 0;
}

PyObject *
bloom_filters(PyObject *module, PyObject *args)
{
    PyObject *packs_obj, *read, *result = NULL;
    Py_buffer pairs;
    if (!PyArg_ParseTuple(args, "Oy*O", &packs_obj, &pairs, &read))
        return NULL;
    Bloom b;
    memset(&b, 0, sizeof b);
    Buf out = {0}, ends = {0};
    size_t n = (size_t)pairs.len / (2 * OIDLEN);
    if (!PyObject_TypeCheck(packs_obj, &PacksType)) {
        PyErr_SetString(PyExc_TypeError, "bloom_filters: packs must be a _walk.Packs");
        goto done0;
    }
    if ((size_t)pairs.len != n * 2 * OIDLEN) {
        PyErr_SetString(PyExc_ValueError, "bloom_filters: pairs must be 40 bytes per commit");
        goto done0;
    }
    b.read = read;
    b.seed = ((PacksObject *)packs_obj)->seed ^ 0x5bd1e995U;
    b.cache = PyMem_RawCalloc(TREE_CACHE_SLOTS, sizeof(TSlot));
    if (!b.cache || reader_init(&b.rd, (PacksObject *)packs_obj, 96 << 20) < 0) {
        PyErr_NoMemory();
        goto done0;
    }
    for (size_t k = 0; k < n; k++) {
        const uint8_t *old = (const uint8_t *)pairs.buf + k * 2 * OIDLEN, *new = old + OIDLEN;
        b.prefix.len = b.arena.len = b.spans.len = 0;
        b.changes = 0;
        b.too_many = 0;
        if (diff_trees(&b, memcmp(old, ZERO_ID, OIDLEN) ? old : NULL, new, 0) < 0)
            goto done;
        if (put_filter(&b, &out) < 0 || out.len > UINT32_MAX) {
            PyErr_NoMemory();
            goto done;
        }
        uint32_t end = (uint32_t)out.len;
        if (buf_put(&ends, &end, sizeof end) < 0) {
            PyErr_NoMemory();
            goto done;
        }
    }
    result = Py_BuildValue("(y#y#)", out.p ? (const char *)out.p : "", (Py_ssize_t)out.len,
                           ends.p ? (const char *)ends.p : "", (Py_ssize_t)ends.len);
done:
    reader_clear(&b.rd);
done0:
    if (b.cache) {
        for (size_t s = 0; s < TREE_CACHE_SLOTS; s++)
            ptree_decref(b.cache[s].t);
        PyMem_RawFree(b.cache);
    }
    buf_free(&b.prefix);
    buf_free(&b.arena);
    buf_free(&b.spans);
    buf_free(&out);
    buf_free(&ends);
    PyBuffer_Release(&pairs);
    return result;
}

static int
skipped(PyObject *skip, const uint8_t *id)
{
    Py_ssize_t n = PyTuple_GET_SIZE(skip);
    if (!n)
        return 0;
    PyObject *key = PyBytes_FromStringAndSize((const char *)id, OIDLEN);
    if (!key)
        return -1;
    int rc = 0;
    for (Py_ssize_t k = 0; k < n && !rc; k++)
        rc = PySequence_Contains(PyTuple_GET_ITEM(skip, k), key);
    Py_DECREF(key);
    return rc;
}

PyObject *
commit_reads(PyObject *module, PyObject *args)
{
    PyObject *packs_obj, *read, *skip;
    Py_buffer tips;
    if (!PyArg_ParseTuple(args, "Oy*O!O", &packs_obj, &tips, &PyTuple_Type, &skip, &read))
        return NULL;
    PyObject *out = NULL;
    Reader rd;
    IdSet seen;
    Buf stack = {0};
    memset(&rd, 0, sizeof rd);
    memset(&seen, 0, sizeof seen);
    if (!PyObject_TypeCheck(packs_obj, &PacksType)) {
        PyErr_SetString(PyExc_TypeError, "commit_reads: packs must be a _walk.Packs");
        goto done0;
    }
    if (tips.len % OIDLEN) {
        PyErr_SetString(PyExc_ValueError, "commit_reads: tips must be 20 bytes each");
        goto done0;
    }
    if (idset_init(&seen, 1024, ((PacksObject *)packs_obj)->seed) < 0
        || reader_init(&rd, (PacksObject *)packs_obj, 16 << 20) < 0 || buf_put(&stack, tips.buf, (size_t)tips.len) < 0
        || !(out = PyList_New(0))) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    while (stack.len) {
        uint8_t id[OIDLEN];
        stack.len -= OIDLEN;
        memcpy(id, stack.p + stack.len, OIDLEN);
        if (idset_has(&seen, id))
            continue;
        int sk = skipped(skip, id);
        if (sk < 0)
            goto fail;
        if (sk)
            continue;
        Obj *o = reader_get(&rd, read, id, 0, NULL, NULL);   /* (a non-commit is named below) */
        if (!o)
            goto fail;
        if (o->type != T_COMMIT) {
            char msg[80];
            snprintf(msg, sizeof msg, "a commit's parent is a %s", type_label(o->type));
            obj_decref(o);
            wrong_type(id, msg, -1, -1);
            goto fail;
        }
        PyObject *item = Py_BuildValue("(y#y#)", (const char *)id, (Py_ssize_t)OIDLEN, (const char *)o->data,
                                       (Py_ssize_t)o->size);
        int bad = !item || PyList_Append(out, item) < 0 || idset_add(&seen, id) < 0;
        Py_XDECREF(item);
        if (bad) {
            obj_decref(o);
            if (!PyErr_Occurred())
                PyErr_NoMemory();
            goto fail;
        }
        /* the parents (as parse_commit_for_graph reads them; a malformed line ends them: the parse names it) */
        const uint8_t *d = o->data;
        size_t n = o->size, pos = 46;
        if (n >= 46 && memcmp(d, "tree ", 5) == 0 && d[45] == '\n') {
            while (pos + 48 <= n && memcmp(d + pos, "parent ", 7) == 0 && d[pos + 47] == '\n') {
                uint8_t pid[OIDLEN];
                if (hex_to_oid(d + pos + 7, 2 * OIDLEN, pid) < 0)
                    break;
                if (!idset_has(&seen, pid) && buf_put(&stack, pid, OIDLEN) < 0) {
                    obj_decref(o);
                    PyErr_NoMemory();
                    goto fail;
                }
                pos += 48;
            }
        }
        obj_decref(o);
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    reader_clear(&rd);
done0:
    idset_free(&seen);
    buf_free(&stack);
    PyBuffer_Release(&tips);
    return out;
}

/* ---- the module ---------------------------------------------------------------------------------- */

static PyMethodDef bloom_methods[] = {
    {"bloom_filters", bloom_filters, METH_VARARGS,
     "bloom_filters(packs, pairs, read) -> (filters, ends 'I'): bloom.py's filters of (parent tree, tree) pairs"},
    {"commit_reads", commit_reads, METH_VARARGS,
     "commit_reads(packs, tips, skip, read) -> [(oid, data)]: commitgraph.reachable_commits' reads"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef bloom_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "packyard.store.maintenance.serving._bloom",
    .m_doc = "the commit-graph's changed-path Bloom filters and commit reads (C); specified in bloom.py",
    .m_size = -1,
    .m_methods = bloom_methods,
};

PyMODINIT_FUNC
PyInit__bloom(void)
{
    if (walk_client_import() < 0)
        return NULL;
    return PyModule_Create(&bloom_module);
}
