/*
 * _walk_trees.c: the walk itself, run without the GIL -- an object read from the packs (or, GIL taken,
 * from the Python fallback), commits parsed and queued by date, trees parsed, filtered against the
 * seen set and walked depth first. walk/reach.py specifies the order; _walk.c calls these from the methods.
 */
#include "_walk.h"


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
        Obj *o = reader_resolve(&w->rd, pk, (uint32_t)(gid - w->packs->p[pk].base), want != T_COMMIT);
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

/* Python's repr() of the first 60 bytes of s[0..n) (what walk/reach.py's messages show). */
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

/* The committer date as walkparse.parse_commit reads it: the second field from the end of the line
 * split at single spaces; plain digits here, anything else by Python's int() (GIL taken), 0 if that
 * fails; clamped to 64 bits as walk/reach.py clamps it. */
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

/* The commit-graph's reading of a commit (commitgraph.parse_commit_for_graph and git's parse_commit_date;
 * walkparse.graph_fields is the specification): "tree <hex>\n", then "parent <hex>\n" lines, which must be all
 * of the walk's nparents parent lines; the date from the "committer" line right after the "author" line
 * that follows them, the digits after its '>' (0 when any of that is missing). Not graph_ok: the graph
 * write reads the commit itself (and refuses it if it must). */
static void
graph_fields(const uint8_t *d, size_t n, uint32_t nparents, uint32_t *ok, uint64_t *date)
{
    uint8_t id[OIDLEN];
    *ok = 0;
    *date = 0;
    if (n < 46 || memcmp(d, "tree ", 5) != 0 || d[45] != '\n' || hex_to_oid(d + 5, 40, id) < 0)
        return;
    size_t pos = 46;
    uint32_t k = 0;
    while (n - pos >= 7 && memcmp(d + pos, "parent ", 7) == 0) {   /* (bounded: pos grows by 48 a line) */
        if (n - pos < 48 || d[pos + 47] != '\n' || hex_to_oid(d + pos + 7, 40, id) < 0)
            return;
        pos += 48;
        k++;
    }
    if (k != nparents)
        return;
    *ok = 1;
    if (n - pos < 6 || memcmp(d + pos, "author", 6) != 0)
        return;
    const uint8_t *nl = memchr(d + pos, '\n', n - pos);
    if (!nl)
        return;
    size_t c = (size_t)(nl - d) + 1;
    if (n - c < 9 || memcmp(d + c, "committer", 9) != 0)
        return;
    const uint8_t *gt = memchr(d + c, '>', n - c), *end = memchr(d + c, '\n', n - c);
    if (!gt || !end || gt > end)
        return;
    const uint8_t *q = gt + 1;
    while (q < end && (*q == ' ' || *q == '\t'))
        q++;
    if (q == end || *q < '0' || *q > '9')
        return;
    uint64_t v = 0;
    for (; q < end && *q >= '0' && *q <= '9'; q++) {   /* (saturating, as min(int(digits), 2**64 - 1)) */
        unsigned digit = (unsigned)(*q - '0');
        v = v > (UINT64_MAX - digit) / 10 ? UINT64_MAX : v * 10 + digit;
    }
    *date = v;
}

/* Parse a commit (walkparse.parse_commit's rules) and queue it by date. */
int
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
    if (hex_to_oid(line + 5, (size_t)(line_end - line - 5), e.tree) < 0) {
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
            if (hex_to_oid(line + 7, n - 7, parent) < 0) {
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
    e.neg_when = -when;   /* |when| <= INT64_MAX: commit_date clamps (walk/reach.py clamps the same way) */
    graph_fields(data, size, e.nparents, &e.graph_ok, &e.graph_date);
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

/* Commits newest first (walk/reach.py's queue); each commit's tree is remembered in roots. */
int
walk_commits(WalkerObject *w)
{
    size_t n = 0;
    while (w->heap.len) {
        HeapEnt e;
        heap_pop(w, &e);
        CommitMetaEnt m = {-e.neg_when, e.graph_date, e.parents, e.nparents, e.graph_ok, {0}};
        memcpy(m.tree, e.tree, OIDLEN);
        if (buf_put(&w->commits, e.oid, OIDLEN) < 0 || buf_put(&w->roots, e.tree, OIDLEN) < 0
            || buf_put(&w->roots, e.oid, OIDLEN) < 0 || buf_put(&w->meta, &m, sizeof m) < 0)
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

int
out_add(Buf *list, Buf *names, const uint8_t *oid, const uint8_t *name, size_t name_len, int named,
        uint32_t path_hash)
{
    OutEnt e;
    memcpy(e.oid, oid, OIDLEN);
    e.path_hash = path_hash;
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

/* Parse a whole tree (walkparse.parse_tree_entries' rules: "<octal mode> <name>\0<20-byte id>" entries that
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
    TreeEnt ent;
    int got;
    while ((got = tree_entry_next(&p, end, &ent)) != 0) {
        if (got < 0)
            goto malformed;
        if (ent.gitlink)
            continue;                                    /* another repository's commit */
        Fresh f;
        f.hash = oid_hash(ent.id, seed);
        f.name_off = (uint32_t)(ent.name - d);
        f.name_len = (uint32_t)ent.name_len;
        f.id_off = (uint32_t)(ent.id - d);
        f.is_dir = ent.is_dir;
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
push_frame(WalkerObject *w, Obj *tree, const uint8_t *oid, uint32_t base)
{
    Frame f;
    f.tree = tree;
    f.base = base;
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
int
walk_tree(WalkerObject *w, const uint8_t *root, const uint8_t *name, size_t name_len, int named, const Ref *ref)
{
    /* git names a root tree's entries by their own names; a tree a tip names, "<name>/<entry>" */
    uint32_t root_hash = named ? name_hash_fold(0, name, name_len) : 0;
    if (out_add(&w->trees, &w->names, root, name, name_len, named, root_hash) < 0)
        return nomem(&w->rd.err);
    long pk;
    long long off;
    Obj *t = read_object(w, root, T_TREE, ref, &pk, &off);
    if (!t || push_frame(w, t, root, named && name_len ? name_hash_fold(root_hash, (const uint8_t *)"/", 1) : 0) < 0)
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
                uint32_t ph = name_hash_fold(f->base, d + e->name_off, e->name_len);
                if (out_add(&w->trees, &w->names, eid, d + e->name_off, e->name_len, 1, ph) < 0) {
                    nomem(&w->rd.err);
                    goto error;
                }
                Ref r = {"tree", f->oid, NULL, NULL};
                Obj *sub = read_object(w, eid, T_TREE, &r, &pk, &off);
                if (!sub || push_frame(w, sub, eid, name_hash_fold(ph, (const uint8_t *)"/", 1)) < 0)   /* (f may move: the frames array grows) */
                    goto error;
                descended = 1;
                break;
            }
            if (out_add(&w->blobs, &w->names, id, d + e->name_off, e->name_len, 1,
                        name_hash_fold(f->base, d + e->name_off, e->name_len)) < 0) {
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

