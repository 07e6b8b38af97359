/* nfsim's filesystem in C: the same simulated NFS client as fs.py (its specification and fallback), without
 * the Python interpreter on every FUSE request.
 *
 * fs.py's NfsimOps is the reference: every operation here does what its method there does, in the same order
 * (the round trip first, then the server's call, then the caches), counts the same counters and writes them as
 * the same JSON. tests/service/test_nfsim.py runs one scripted workload through both and compares the
 * counters and what each answered. Why a C twin at all (docs/nfs-log.md, "nfsim in C"): each request through
 * mfusepy costs ~0.2-0.9 ms of a core (ctypes, the interpreter lock among 64 serving threads), which on two
 * cores is more than the 1 ms of simulated latency it models; a kernel NFS client costs microseconds.
 *
 * One mount per process: the state is one static struct, every table behind one mutex (as fs.py's one lock).
 *
 * It runs on libfuse's low-level API, with a node layer of its own (below, "nodes") that does what libfuse's
 * high-level one does for fs.py, except that a node is the file a name held, not the name: fs.py's module doc
 * says what that changes.
 */
#define FUSE_USE_VERSION 312
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <fuse_lowlevel.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define SYNC_NAME "/.nfsim-sync"

/* ---- counters: fs.py's METADATA_KINDS, then the rest (names as in its JSON) ------------------------------ */
enum { K_LOOKUP, K_GETATTR, K_OPEN, K_CREATE, K_READDIR, K_RENAME, K_UNLINK, K_FSYNC, K_SETATTR, K_MKDIR,
       K_RMDIR, K_LINK, K_SYMLINK, K_READLINK, K_STATFS, K_ACCESS, N_METADATA,
       C_ATTR_HITS = N_METADATA, C_READDIR_HITS, C_ESTALE, C_KEPT_READS, C_READS, C_WRITES, C_READ_BYTES, C_WRITTEN_BYTES,
       C_FAILED_RENAMES, C_FAILED_UNLINKS, C_MAX_IN_FLIGHT, N_COUNTERS };
static const char *const COUNTER_NAMES[N_COUNTERS] = {
    "lookup", "getattr", "open", "create", "readdir", "rename", "unlink", "fsync", "setattr", "mkdir", "rmdir",
    "link", "symlink", "readlink", "statfs", "access",
    "attr_hits", "readdir_hits", "estale", "kept_reads", "reads", "writes", "read_bytes", "written_bytes", "failed_renames",
    "failed_unlinks", "max_in_flight"};

/* ---- a string-keyed table (chained, doubling); values owned by the caller's free function ---------------- */
struct hent { struct hent *next; uint64_t h; char *key; void *val; };
struct htab { struct hent **b; size_t nb, n; void (*free_val)(void *); };

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ULL;   /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static int ht_init(struct htab *t, void (*free_val)(void *)) {
    t->nb = 1024; t->n = 0; t->free_val = free_val;
    t->b = calloc(t->nb, sizeof *t->b);
    return t->b ? 0 : -1;
}

static struct hent **ht_slot(struct htab *t, const char *key, uint64_t h) {
    struct hent **p = &t->b[h & (t->nb - 1)];
    while (*p && !((*p)->h == h && strcmp((*p)->key, key) == 0)) p = &(*p)->next;
    return p;
}

static void *ht_get(struct htab *t, const char *key) {
    struct hent **p = ht_slot(t, key, hash_str(key));
    return *p ? (*p)->val : NULL;
}

static void ht_grow(struct htab *t) {
    size_t nb = t->nb * 2;
    struct hent **b = calloc(nb, sizeof *b);
    if (!b) return;   /* (keeps working with longer chains) */
    for (size_t i = 0; i < t->nb; i++) {
        struct hent *e = t->b[i];
        while (e) { struct hent *next = e->next; e->next = b[e->h & (nb - 1)]; b[e->h & (nb - 1)] = e; e = next; }
    }
    free(t->b); t->b = b; t->nb = nb;
}

/* Sets key -> val (the old value freed); on no memory the value is freed and nothing is cached (a cache). */
static void ht_put(struct htab *t, const char *key, void *val) {
    uint64_t h = hash_str(key);
    struct hent **p = ht_slot(t, key, h);
    if (*p) { t->free_val((*p)->val); (*p)->val = val; return; }
    struct hent *e = malloc(sizeof *e);
    char *k = strdup(key);
    if (!e || !k) { free(e); free(k); t->free_val(val); return; }
    e->next = NULL; e->h = h; e->key = k; e->val = val; *p = e;
    if (++t->n > t->nb * 2) ht_grow(t);
}

static void ht_pop(struct htab *t, const char *key) {
    struct hent **p = ht_slot(t, key, hash_str(key));
    if (!*p) return;
    struct hent *e = *p; *p = e->next;
    t->free_val(e->val); free(e->key); free(e); t->n--;
}

/* ---- the mount's state ------------------------------------------------------------------------------------- */
struct attr_ent { double at; struct stat st; };
struct dent { char *name; mode_t kind; ino_t ino; };
struct listing { int refs; double fetched; struct stat token; size_t n; struct dent *e; };
struct handle { int fd; char *path; dev_t dev; ino_t ino; struct handle *prev, *next; };
struct devino { dev_t dev; ino_t ino; };

static struct {
    char root[PATH_MAX];
    double ac_attr, ac_dir, latency;
    int trust;                      /* dir_revalidate="trust" */
    char *counters_path;
    FILE *trace;
    pthread_mutex_t lock;
    struct htab attr, lists;
    struct handle *handles;         /* open files (for silly-rename) */
    struct devino *silly; size_t n_silly, cap_silly;
    long long count[N_COUNTERS];
    long in_flight;
    double slept;
    int dirty;
    pthread_t writer; int writer_started, stop;
    pthread_cond_t stop_cv;
} S = {.lock = PTHREAD_MUTEX_INITIALIZER, .stop_cv = PTHREAD_COND_INITIALIZER};

static void listing_unref(struct listing *l) {
    if (!l) return;
    pthread_mutex_lock(&S.lock);
    int last = --l->refs == 0;
    pthread_mutex_unlock(&S.lock);
    if (!last) return;
    for (size_t i = 0; i < l->n; i++) free(l->e[i].name);
    free(l->e); free(l);
}

/* the lists table's free function (called with S.lock held) */
static void listing_drop_locked(void *v) {
    struct listing *l = v;
    if (--l->refs) return;
    for (size_t i = 0; i < l->n; i++) free(l->e[i].name);
    free(l->e); free(l);
}

static double now_mono(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* How much longer than asked a sleep takes here (the machine's wake-up latency: ~0.3 ms on a 1 ms sleep in a
 * small VM), a moving average; a round trip sleeps that much less, so it costs the latency asked for on
 * average, not 1.3 times it (fs.py _sleep). */
static double oversleep;

static void sleep_s(double s) {
    if (s <= 0) return;
    pthread_mutex_lock(&S.lock);
    double ask = s - oversleep;
    pthread_mutex_unlock(&S.lock);
    if (ask <= 0) return;
    double t0 = now_mono();
    struct timespec ts = {(time_t)ask, (long)((ask - (double)(time_t)ask) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    double over = now_mono() - t0 - ask;
    pthread_mutex_lock(&S.lock);
    oversleep = 0.9 * oversleep + 0.1 * (over < 0 ? 0 : over);
    if (oversleep > s / 2) oversleep = s / 2;
    pthread_mutex_unlock(&S.lock);
}

static int bpath(char *out, const char *path) {
    if (snprintf(out, PATH_MAX, "%s%s", S.root, path) >= PATH_MAX) return -ENAMETOOLONG;
    return 0;
}
#define BPATH(var, path) char var[PATH_MAX]; do { int e_ = bpath(var, path); if (e_) return e_; } while (0)

static void parent_of(const char *path, char *out) {
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (n == 0) { strcpy(out, "/"); return; }
    memcpy(out, path, n); out[n] = 0;
}

static void bump(int kind, long long n) {
    pthread_mutex_lock(&S.lock);
    S.count[kind] += n; S.dirty = 1;
    pthread_mutex_unlock(&S.lock);
}

/* One round trip to the server about path: counted (and traced), costing latency * share now (fs.py _rt). */
static void rt(int kind, const char *path, double share) {
    pthread_mutex_lock(&S.lock);
    if (S.trace) fprintf(S.trace, "%s %s\n", COUNTER_NAMES[kind], path);
    S.count[kind]++;
    S.slept += S.latency;
    S.dirty = 1;
    if (++S.in_flight > S.count[C_MAX_IN_FLIGHT]) S.count[C_MAX_IN_FLIGHT] = S.in_flight;
    pthread_mutex_unlock(&S.lock);
    sleep_s(S.latency * share);
    pthread_mutex_lock(&S.lock);
    S.in_flight--;
    pthread_mutex_unlock(&S.lock);
}

/* ---- counters ---------------------------------------------------------------------------------------------- */
static int name_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static pthread_mutex_t write_lock = PTHREAD_MUTEX_INITIALIZER;   /* one writer of the counters file at a time */

static void write_counters_locked(void);

/* The counters as JSON into the counters file (a temp file renamed over it), one writer at a time: the
 * half-second writer and a stat of the sync name would otherwise write the same temp file together. */
static void write_counters(void) {
    if (!S.counters_path) return;
    pthread_mutex_lock(&write_lock);
    write_counters_locked();
    pthread_mutex_unlock(&write_lock);
}

static void write_counters_locked(void) {
    long long c[N_COUNTERS];
    double slept;
    pthread_mutex_lock(&S.lock);
    memcpy(c, S.count, sizeof c); slept = S.slept; S.dirty = 0;
    pthread_mutex_unlock(&S.lock);
    long long metadata = 0;
    for (int i = 0; i < N_METADATA; i++) metadata += c[i];
    /* json.dumps(sort_keys=True): the keys in sorted order */
    const char *names[N_COUNTERS + 2];
    for (int i = 0; i < N_COUNTERS; i++) names[i] = COUNTER_NAMES[i];
    names[N_COUNTERS] = "latency_s"; names[N_COUNTERS + 1] = "metadata_calls";
    qsort(names, N_COUNTERS + 2, sizeof *names, name_cmp);
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp%ld", S.counters_path, (long)getpid()) >= (int)sizeof tmp) return;
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fputc('{', f);
    for (int i = 0; i < N_COUNTERS + 2; i++) {
        if (i) fputs(", ", f);
        if (strcmp(names[i], "latency_s") == 0) { fprintf(f, "\"latency_s\": %.6f", slept); continue; }
        long long v = metadata;
        for (int k = 0; k < N_COUNTERS; k++) if (strcmp(names[i], COUNTER_NAMES[k]) == 0) v = c[k];
        fprintf(f, "\"%s\": %lld", names[i], v);
    }
    fputc('}', f);
    if (fclose(f) == 0) rename(tmp, S.counters_path); else unlink(tmp);
}

static void *writer_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&S.lock);
    while (!S.stop) {
        struct timespec ts; clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 500000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&S.stop_cv, &S.lock, &ts);
        if (S.stop || !S.dirty) continue;
        pthread_mutex_unlock(&S.lock);
        write_counters();
        pthread_mutex_lock(&S.lock);
    }
    pthread_mutex_unlock(&S.lock);
    return NULL;
}

/* ---- the attribute cache (fs.py _remember, _cached, _forget, _gone) ---------------------------------------- */
static void remember(const char *path, const struct stat *st) {
    struct attr_ent *a = malloc(sizeof *a);
    if (!a) return;
    a->at = now_mono(); a->st = *st;
    pthread_mutex_lock(&S.lock);
    ht_put(&S.attr, path, a);
    pthread_mutex_unlock(&S.lock);
}

static int cached(const char *path, struct stat *out) {
    int hit = 0;
    pthread_mutex_lock(&S.lock);
    struct attr_ent *a = ht_get(&S.attr, path);
    if (a && now_mono() - a->at < (S_ISDIR(a->st.st_mode) ? S.ac_dir : S.ac_attr)) {
        *out = a->st; hit = 1;
        S.count[C_ATTR_HITS]++; S.dirty = 1;
    }
    pthread_mutex_unlock(&S.lock);
    return hit;
}

/* This mount changed path: its own caches for it and its parent are dropped (post-op attributes). */
static void forget(const char *path) {
    char parent[PATH_MAX];
    parent_of(path, parent);
    pthread_mutex_lock(&S.lock);
    ht_pop(&S.attr, path); ht_pop(&S.attr, parent);
    ht_pop(&S.lists, parent); ht_pop(&S.lists, path);
    pthread_mutex_unlock(&S.lock);
}

/* This mount changed path and the server's reply carried its post-op attributes (NFSv3's SETATTR, MKDIR, LINK,
 * SYMLINK replies do; RENAME's and REMOVE's do not): forget, then cache those attributes (fs.py _changed). */
static void changed(const char *path) {
    forget(path);
    char b[PATH_MAX];
    struct stat st;
    if (bpath(b, path) == 0 && lstat(b, &st) == 0) remember(path, &st);
}

/* The server said path (or the inode ino, when ino != 0) is gone: the name's and its directory's cached
 * attributes go (fs.py _gone has the why: a Linux client drops the stale dentry). */
static void gone(const char *path, ino_t ino, int by_ino) {
    char parent[PATH_MAX];
    parent_of(path, parent);
    pthread_mutex_lock(&S.lock);
    struct attr_ent *a = ht_get(&S.attr, path);
    if (a && (!by_ino || a->st.st_ino == ino)) ht_pop(&S.attr, path);
    ht_pop(&S.attr, parent);
    pthread_mutex_unlock(&S.lock);
}

static int silly_has_locked(dev_t dev, ino_t ino) {
    for (size_t i = 0; i < S.n_silly; i++) if (S.silly[i].dev == dev && S.silly[i].ino == ino) return 1;
    return 0;
}

/* fstat of the handle's file; -ESTALE if its inode was removed through another mount (fs.py _stale). */
static int stale(struct handle *h, struct stat *st) {
    if (fstat(h->fd, st) != 0) return -errno;
    if (st->st_nlink == 0) {
        pthread_mutex_lock(&S.lock);
        int silly = silly_has_locked(h->dev, h->ino);
        pthread_mutex_unlock(&S.lock);
        if (!silly) {
            bump(C_ESTALE, 1);
            if (S.trace) {
                pthread_mutex_lock(&S.lock);
                fprintf(S.trace, "estale %s\n", h->path);
                pthread_mutex_unlock(&S.lock);
            }
            gone(h->path, h->ino, 1);
            return -ESTALE;
        }
    }
    return 0;
}

/* Silly-rename: a file this mount has open stays readable here after this mount removes it. */
static void will_remove(const char *path) {
    char b[PATH_MAX];
    struct stat st;
    if (bpath(b, path) || lstat(b, &st) != 0) return;
    pthread_mutex_lock(&S.lock);
    for (struct handle *h = S.handles; h; h = h->next) {
        if (h->dev != st.st_dev || h->ino != st.st_ino) continue;
        if (!silly_has_locked(st.st_dev, st.st_ino)) {
            if (S.n_silly == S.cap_silly) {
                size_t cap = S.cap_silly ? S.cap_silly * 2 : 64;
                struct devino *n = realloc(S.silly, cap * sizeof *n);
                if (!n) break;
                S.silly = n; S.cap_silly = cap;
            }
            S.silly[S.n_silly++] = (struct devino){st.st_dev, st.st_ino};
        }
        break;
    }
    pthread_mutex_unlock(&S.lock);
}

static int add_handle(int fd, const char *path, struct fuse_file_info *fi) {
    struct stat st;
    if (fstat(fd, &st) != 0) { int e = -errno; close(fd); return e; }
    remember(path, &st);
    struct handle *h = calloc(1, sizeof *h);
    char *p = strdup(path);
    if (!h || !p) { free(h); free(p); close(fd); return -ENOMEM; }
    h->fd = fd; h->path = p; h->dev = st.st_dev; h->ino = st.st_ino;
    pthread_mutex_lock(&S.lock);
    h->next = S.handles; if (S.handles) S.handles->prev = h; S.handles = h;
    pthread_mutex_unlock(&S.lock);
    fi->fh = (uint64_t)(uintptr_t)h;
    return 0;
}

#define HANDLE(fi) ((struct handle *)(uintptr_t)(fi)->fh)

/* ---- attributes ------------------------------------------------------------------------------------------- */
static int op_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    if (!path && !(fi && fi->fh)) return -ESTALE;   /* (a node without a name) */
    if (fi && fi->fh) {
        struct handle *h = HANDLE(fi);
        if (cached(h->path, st) && st->st_ino == h->ino) return 0;
        rt(K_GETATTR, h->path, 1.0);
        int e = stale(h, st);
        if (e) return e;
        remember(h->path, st);
        return 0;
    }
    if (strcmp(path, SYNC_NAME) == 0) { write_counters(); return -ENOENT; }
    if (cached(path, st)) return 0;
    rt(K_LOOKUP, path, 1.0);
    BPATH(b, path);
    if (lstat(b, st) != 0) return -errno;
    remember(path, st);
    return 0;
}

static int op_access(const char *path, int mode) {
    rt(K_ACCESS, path, 1.0);
    BPATH(b, path);
    return access(b, mode) == 0 ? 0 : -EACCES;
}

static int op_chmod(const char *path, mode_t mode, struct fuse_file_info *fi) {
    rt(K_SETATTR, path, 1.0);
    BPATH(b, path);
    if (chmod(b, mode) != 0) return -errno;
    changed(path);
    return 0;
}

static int op_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi) {
    rt(K_SETATTR, path, 1.0);
    BPATH(b, path);
    if (lchown(b, uid, gid) != 0) return -errno;
    changed(path);
    return 0;
}

/* utimensat takes UTIME_NOW (the server's clock: NFS's SET_TO_SERVER_TIME) and UTIME_OMIT as they come. */
static int op_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi) {
    rt(K_SETATTR, path, 1.0);
    BPATH(b, path);
    if (utimensat(AT_FDCWD, b, tv, AT_SYMLINK_NOFOLLOW) != 0) return -errno;
    changed(path);
    return 0;
}

static int op_truncate(const char *path, off_t length, struct fuse_file_info *fi) {
    rt(K_SETATTR, path, 1.0);
    if (fi && fi->fh) {
        struct handle *h = HANDLE(fi);
        struct stat st;
        int e = stale(h, &st);
        if (e) return e;
        if (ftruncate(h->fd, length) != 0) return -errno;
        changed(h->path);
        return 0;
    }
    BPATH(b, path);
    if (truncate(b, length) != 0) return -errno;
    changed(path);
    return 0;
}

static int op_statfs(const char *path, struct statvfs *sv) {
    rt(K_STATFS, path, 1.0);
    BPATH(b, path);
    return statvfs(b, sv) == 0 ? 0 : -errno;
}

/* ---- names ------------------------------------------------------------------------------------------------ */
static int op_mkdir(const char *path, mode_t mode) {
    rt(K_MKDIR, path, 1.0);
    BPATH(b, path);
    if (mkdir(b, mode) != 0) return -errno;
    changed(path);
    return 0;
}

static int op_rmdir(const char *path) {
    rt(K_RMDIR, path, 1.0);
    BPATH(b, path);
    if (rmdir(b) != 0) return -errno;
    forget(path);
    return 0;
}

static int op_unlink(const char *path) {
    rt(K_UNLINK, path, 1.0);
    will_remove(path);
    BPATH(b, path);
    if (unlink(b) != 0) { int e = -errno; bump(C_FAILED_UNLINKS, 1); return e; }
    forget(path);
    return 0;
}

static int op_rename(const char *old, const char *new, unsigned int flags) {
    rt(K_RENAME, old, 1.0);
    if (!(flags & RENAME_NOREPLACE)) will_remove(new);
    BPATH(bo, old);
    BPATH(bn, new);
    if (renameat2(AT_FDCWD, bo, AT_FDCWD, bn, flags) != 0) { int e = -errno; bump(C_FAILED_RENAMES, 1); return e; }
    forget(old); forget(new);
    return 0;
}

static int op_link(const char *from, const char *to) {
    rt(K_LINK, to, 1.0);
    BPATH(bf, from);
    BPATH(bt, to);
    if (link(bf, bt) != 0) return -errno;
    changed(from); changed(to);
    return 0;
}

static int op_symlink(const char *target, const char *path) {
    rt(K_SYMLINK, path, 1.0);
    BPATH(b, path);
    if (symlink(target, b) != 0) return -errno;
    changed(path);
    return 0;
}

static int op_readlink(const char *path, char *buf, size_t size) {
    rt(K_READLINK, path, 1.0);
    BPATH(b, path);
    if (size == 0) return -EINVAL;
    ssize_t n = readlink(b, buf, size - 1);
    if (n < 0) return -errno;
    buf[n] = 0;
    return 0;
}

/* ---- directories ------------------------------------------------------------------------------------------ */
static int same_token(const struct stat *a, const struct stat *b) {
    /* what an NFSv3 client compares to decide a directory changed (fs.py _token) */
    return a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec &&
           a->st_size == b->st_size && a->st_nlink == b->st_nlink && a->st_ino == b->st_ino;
}

static int add_dent(struct listing *l, size_t *cap, const char *name, mode_t kind, ino_t ino) {
    if (l->n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        struct dent *e = realloc(l->e, c * sizeof *e);
        if (!e) return -ENOMEM;
        l->e = e; *cap = c;
    }
    char *n = strdup(name);
    if (!n) return -ENOMEM;
    l->e[l->n++] = (struct dent){n, kind, ino};
    return 0;
}

struct attr_pending { char *path; struct stat st; };

/* One READDIRPLUS round trip: the names, and each entry's attributes into the attribute cache (fs.py
 * _fetch_listing). On success *out holds a listing with one reference for the caller. */
static int fetch_listing(const char *path, const struct stat *token, struct listing **out) {
    rt(K_READDIR, path, 1.0);
    BPATH(b, path);
    char pb[PATH_MAX], parent[PATH_MAX];
    if (strcmp(path, "/") == 0) strcpy(parent, "/"); else parent_of(path, parent);
    struct stat here, up;
    if (stat(b, &here) != 0) return -errno;
    { int e = bpath(pb, parent); if (e) return e; }
    if (stat(pb, &up) != 0) return -errno;
    struct listing *l = calloc(1, sizeof *l);
    if (!l) return -ENOMEM;
    size_t cap = 0, n_att = 0, cap_att = 0;
    struct attr_pending *att = NULL;
    int err = add_dent(l, &cap, ".", S_IFDIR, here.st_ino);
    if (!err) err = add_dent(l, &cap, "..", S_IFDIR, up.st_ino);
    DIR *d = err ? NULL : opendir(b);
    if (!err && !d) err = -errno;
    size_t plen = strlen(path);
    while (!err) {
        errno = 0;
        struct dirent *de = readdir(d);
        if (!de) { if (errno) err = -errno; break; }
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT) continue;   /* (gone since the server listed it) */
            err = -errno; break;
        }
        if ((err = add_dent(l, &cap, de->d_name, st.st_mode & S_IFMT, st.st_ino))) break;
        if (n_att == cap_att) {
            size_t c = cap_att ? cap_att * 2 : 64;
            struct attr_pending *a = realloc(att, c * sizeof *a);
            if (!a) { err = -ENOMEM; break; }
            att = a; cap_att = c;
        }
        size_t len = plen + 1 + strlen(de->d_name) + 1;
        char *full = malloc(len);
        if (!full) { err = -ENOMEM; break; }
        snprintf(full, len, "%s/%s", strcmp(path, "/") == 0 ? "" : path, de->d_name);
        att[n_att].path = full; att[n_att].st = st; n_att++;
    }
    if (d) closedir(d);
    if (!err) {
        double now = now_mono();
        l->refs = 2; l->fetched = now; l->token = *token;
        pthread_mutex_lock(&S.lock);
        ht_put(&S.lists, path, l);
        for (size_t i = 0; i < n_att; i++) {
            struct attr_ent *a = malloc(sizeof *a);
            if (!a) continue;
            a->at = now; a->st = att[i].st;
            ht_put(&S.attr, att[i].path, a);
        }
        pthread_mutex_unlock(&S.lock);
        *out = l;
    } else {
        for (size_t i = 0; i < l->n; i++) free(l->e[i].name);
        free(l->e); free(l);
    }
    for (size_t i = 0; i < n_att; i++) free(att[i].path);
    free(att);
    return err;
}

/* An open directory: its path and change token, and its listing (NULL until the first readdir fetches it). */
struct dirh { char *path; struct stat token; struct listing *l; };

/* Close-to-open for a directory: its attributes, fresh (one round trip), decide whether the cached listing still
 * holds; a changed one is fetched by the first readdir, as an NFS client reads a directory's entries only when
 * asked for them (an open for fsync or fstatfs reads none). (fs.py opendir) */
static int op_opendir(const char *path, struct fuse_file_info *fi) {
    struct dirh *d = calloc(1, sizeof *d);
    if (!d || !(d->path = strdup(path))) { free(d); return -ENOMEM; }
    pthread_mutex_lock(&S.lock);
    struct listing *c = ht_get(&S.lists, path);
    if (c) c->refs++;
    pthread_mutex_unlock(&S.lock);
    if (S.trust && c && now_mono() - c->fetched < S.ac_dir) {
        bump(C_READDIR_HITS, 1);
        d->token = c->token; d->l = c;
    } else {
        rt(K_GETATTR, path, 1.0);    /* close-to-open: the directory's attributes, fresh */
        char b[PATH_MAX];
        int e = bpath(b, path);
        struct stat st;
        if (!e && stat(b, &st) != 0) e = -errno;
        if (e) { listing_unref(c); free(d->path); free(d); return e; }
        remember(path, &st);
        d->token = st;
        if (c && same_token(&c->token, &st)) {
            bump(C_READDIR_HITS, 1);
            d->l = c;
        } else {
            listing_unref(c);
        }
    }
    fi->fh = (uint64_t)(uintptr_t)d;
    return 0;
}

static int op_releasedir(const char *path, struct fuse_file_info *fi) {
    struct dirh *d = (struct dirh *)(uintptr_t)fi->fh;
    if (!d) return 0;
    listing_unref(d->l);
    free(d->path); free(d);
    return 0;
}

static int op_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi) {
    rt(K_FSYNC, path, 1.0);
    BPATH(b, path);
    int fd = open(b, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int e = fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return e;
}

/* ---- files ------------------------------------------------------------------------------------------------ */
static int op_open(const char *path, struct fuse_file_info *fi) {
    rt(K_OPEN, path, 0.5);      /* close-to-open: always asks the server; half the trip there... */
    BPATH(b, path);
    int fd = open(b, (fi->flags & ~(O_CREAT | O_EXCL | O_NOCTTY)) | O_CLOEXEC);
    if (fd < 0) {
        int e = -errno;
        if (e == -ENOENT) gone(path, 0, 0);   /* deleted through another host: the cached "it exists" goes */
        return e;
    }
    if (fi->flags & O_TRUNC) forget(path);
    int e = add_handle(fd, path, fi);
    if (e) return e;
    sleep_s(S.latency / 2);     /* ...and half back: another host can delete the file meanwhile */
    return 0;
}

static int op_create(const char *path, mode_t mode, struct fuse_file_info *fi) {
    rt(K_CREATE, path, 1.0);
    BPATH(b, path);
    int fd = open(b, fi->flags | O_CREAT | O_CLOEXEC, mode);
    if (fd < 0) return -errno;
    forget(path);
    return add_handle(fd, path, fi);
}

/* One data call of an open file (no round trip: it is counted, never slept on). */
static void count_data(int calls, int bytes, ssize_t n) {
    pthread_mutex_lock(&S.lock);
    S.count[calls]++; S.count[bytes] += n; S.dirty = 1;
    pthread_mutex_unlock(&S.lock);
}

/* A read of a file that has a link but no longer the name it was opened by (removed or replaced, through any
 * mount): an NFS server serves it through the file handle, and without that other link it would be ESTALE
 * (fs.py _kept_read). */
static void kept_read(struct handle *h, const struct stat *st) {
    char b[PATH_MAX];
    struct stat now;
    if (st->st_nlink == 0 || bpath(b, h->path) != 0) return;
    if (lstat(b, &now) == 0 && now.st_dev == st->st_dev && now.st_ino == st->st_ino) return;
    bump(C_KEPT_READS, 1);
}

static int op_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
    struct handle *h = HANDLE(fi);
    struct stat st;
    int e = stale(h, &st);
    if (e) return e;
    kept_read(h, &st);
    ssize_t n = pread(h->fd, buf, size, off);
    if (n < 0) return -errno;
    count_data(C_READS, C_READ_BYTES, n);
    return (int)n;
}

static int op_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
    struct handle *h = HANDLE(fi);
    struct stat st;
    int e = stale(h, &st);
    if (e) return e;
    ssize_t n = pwrite(h->fd, buf, size, off);
    if (n < 0) return -errno;
    if (fstat(h->fd, &st) == 0) remember(h->path, &st);   /* the reply's post-op attributes */
    count_data(C_WRITES, C_WRITTEN_BYTES, n);
    return (int)n;
}

static int op_fsync(const char *path, int datasync, struct fuse_file_info *fi) {
    struct handle *h = HANDLE(fi);
    rt(K_FSYNC, path ? path : h->path, 1.0);
    struct stat st;
    int e = stale(h, &st);
    if (e) return e;
    return (datasync ? fdatasync(h->fd) : fsync(h->fd)) == 0 ? 0 : -errno;
}

static int op_release(const char *path, struct fuse_file_info *fi) {
    struct handle *h = HANDLE(fi);
    if (!h) return 0;
    pthread_mutex_lock(&S.lock);
    if (h->prev) h->prev->next = h->next; else S.handles = h->next;
    if (h->next) h->next->prev = h->prev;
    pthread_mutex_unlock(&S.lock);
    close(h->fd);
    free(h->path); free(h);
    return 0;
}

/* ---- nodes: the kernel's inodes, one per name *and* the file it held (an NFS client's file handles) --------
 *
 * libfuse's high-level API (what fs.py runs on, through mfusepy) keys the kernel's inodes by name: a file
 * another host renamed over a name takes over the old file's inode here, so a reader that had the old file
 * mapped sees its size shrink under it (SIGBUS) and shares its page cache with readers of the new file. An NFS
 * client's inode is the server's file handle: the new file is a new inode, and the old one keeps answering
 * for the old file while it lives (ESTALE once it is gone). So this layer does what libfuse's does (a node per
 * name, paths rebuilt from the parents, the same path-based operations above and so the same round trips and
 * caches) and one thing more: a node remembers the file (device, inode) its name held, and a lookup that finds
 * another file there gives a new node; the old node is unhashed and answers for the old file only (through a
 * handle this mount has open on it, else ESTALE, on which the kernel looks the name up again). */
struct node {
    struct node *parent;            /* (holds a reference: refs) */
    char *name;                     /* the name it was last known by */
    dev_t dev; ino_t ino;           /* the file its name held */
    uint64_t nlookup;               /* the kernel's references */
    long refs;                      /* children naming it as their parent */
    int hashed;                     /* its name still resolves to it here */
    int cache_valid; struct timespec mtime; off_t size;   /* libfuse's auto_cache state */
};

static struct node ROOT = {.name = "", .nlookup = 1, .hashed = 1};
static struct htab names;           /* "<parent pointer>/<name>" -> node (values not owned) */

static struct node *NODE(fuse_ino_t ino) {
    return ino == FUSE_ROOT_ID ? &ROOT : (struct node *)(uintptr_t)ino;
}

static int name_key(char *out, size_t n, struct node *parent, const char *name) {
    return snprintf(out, n, "%p/%s", (void *)parent, name) >= (int)n ? -ENAMETOOLONG : 0;
}

/* The node's path, rebuilt from its parents' names; ESTALE if it or a parent lost its name (libfuse's
 * try_get_path: removed or replaced through this mount, or found replaced through another). */
static int node_path(struct node *n, char *out) {
    char buf[PATH_MAX];
    size_t pos = PATH_MAX - 1;
    buf[pos] = 0;
    pthread_mutex_lock(&S.lock);
    for (struct node *m = n; m != &ROOT; m = m->parent) {
        size_t len = strlen(m->name);
        if (!m->parent || !m->hashed) { pthread_mutex_unlock(&S.lock); return -ESTALE; }
        if (len + 1 > pos) { pthread_mutex_unlock(&S.lock); return -ENAMETOOLONG; }
        pos -= len; memcpy(buf + pos, m->name, len); buf[--pos] = '/';
    }
    pthread_mutex_unlock(&S.lock);
    strcpy(out, pos == PATH_MAX - 1 ? "/" : buf + pos);
    return 0;
}

static int child_path(struct node *parent, const char *name, char *out) {
    char p[PATH_MAX];
    int e = node_path(parent, p);
    if (e) return e;
    if (snprintf(out, PATH_MAX, "%s/%s", strcmp(p, "/") == 0 ? "" : p, name) >= PATH_MAX) return -ENAMETOOLONG;
    return 0;
}

static void unhash_locked(struct node *n) {
    if (!n->hashed || n == &ROOT) return;
    char key[PATH_MAX + 32];
    if (name_key(key, sizeof key, n->parent, n->name) == 0 && ht_get(&names, key) == n) ht_pop(&names, key);
    n->hashed = 0;
}

static void hash_locked(struct node *n) {
    char key[PATH_MAX + 32];
    if (name_key(key, sizeof key, n->parent, n->name) != 0) return;
    struct node *old = ht_get(&names, key);
    if (old && old != n) old->hashed = 0;
    ht_put(&names, key, n);
    n->hashed = 1;
}

/* Frees n and then any parent left without references (libfuse's unref_node). */
static void maybe_free_locked(struct node *n) {
    while (n && n != &ROOT && n->nlookup == 0 && n->refs == 0) {
        unhash_locked(n);
        struct node *p = n->parent;
        free(n->name); free(n);
        if (p) p->refs--;
        n = p;
    }
}

/* libfuse's update_stat: the page cache holds while mtime and size stay as last seen. */
static void update_stat_locked(struct node *n, const struct stat *st) {
    if (n->cache_valid && (n->mtime.tv_sec != st->st_mtim.tv_sec || n->mtime.tv_nsec != st->st_mtim.tv_nsec ||
                           n->size != st->st_size))
        n->cache_valid = 0;
    n->mtime = st->st_mtim; n->size = st->st_size;
}

/* The node for parent/name holding the file st describes (a new node if the name held another file), one
 * more kernel reference to it, and the entry to reply with (libfuse's lookup_path + do_lookup). */
static int bind_entry(struct node *parent, const char *name, const struct stat *st, struct fuse_entry_param *e) {
    char key[PATH_MAX + 32];
    int err = name_key(key, sizeof key, parent, name);
    if (err) return err;
    pthread_mutex_lock(&S.lock);
    struct node *n = ht_get(&names, key);
    if (!n || n->dev != st->st_dev || n->ino != st->st_ino) {
        struct node *m = calloc(1, sizeof *m);
        char *nm = strdup(name);
        if (!m || !nm) { pthread_mutex_unlock(&S.lock); free(m); free(nm); return -ENOMEM; }
        m->parent = parent; parent->refs++;
        m->name = nm; m->dev = st->st_dev; m->ino = st->st_ino;
        if (n) n->hashed = 0;
        hash_locked(m);
        n = m;
    }
    n->nlookup++;
    update_stat_locked(n, st);
    pthread_mutex_unlock(&S.lock);
    memset(e, 0, sizeof *e);
    e->ino = (fuse_ino_t)(uintptr_t)n;
    e->attr = *st;
    e->attr_timeout = 0;    /* no attributes kept in the kernel: every stat asks (the cache is ours) */
    e->entry_timeout = S.ac_attr < S.ac_dir ? S.ac_attr : S.ac_dir;   /* positive names, as a client's dcache */
    return 0;
}

/* The answer for a node whose name now holds another file (seen through another host): ESTALE, as the server
 * answers a file handle whose file is gone; the kernel then looks the name up again (a new node). */
static int stale_node(struct node *n, const char *path) {
    pthread_mutex_lock(&S.lock);
    unhash_locked(n);
    if (S.trace) fprintf(S.trace, "estale %s\n", path);
    S.count[C_ESTALE]++; S.dirty = 1;
    pthread_mutex_unlock(&S.lock);
    return -ESTALE;
}

/* getattr of a node: by the handle when the kernel passes one, else by path; a path that now holds another file
 * makes the node stale (above). */
static int node_getattr(struct node *n, struct stat *st, struct fuse_file_info *fi) {
    char path[PATH_MAX];
    if (fi && fi->fh) return op_getattr(NULL, st, fi);
    int e = node_path(n, path);
    if (e) return e;
    e = op_getattr(path, st, NULL);
    if (e || n == &ROOT || (st->st_dev == n->dev && st->st_ino == n->ino)) return e;
    return stale_node(n, path);
}

#define PATH_OR_REPLY(var, node) char var[PATH_MAX]; \
    do { int e_ = node_path(node, var); if (e_) { fuse_reply_err(req, -e_); return; } } while (0)

static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    struct node *p = NODE(parent);
    char path[PATH_MAX];
    struct stat st;
    struct fuse_entry_param e;
    int err = child_path(p, name, path);
    if (!err) err = op_getattr(path, &st, NULL);
    if (!err) err = bind_entry(p, name, &st, &e);
    if (err) fuse_reply_err(req, -err); else fuse_reply_entry(req, &e);
}

static void forget_one(fuse_ino_t ino, uint64_t nlookup) {
    struct node *n = NODE(ino);
    pthread_mutex_lock(&S.lock);
    if (n != &ROOT) {
        n->nlookup = n->nlookup > nlookup ? n->nlookup - nlookup : 0;
        maybe_free_locked(n);
    }
    pthread_mutex_unlock(&S.lock);
}

static void ll_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
    forget_one(ino, nlookup);
    fuse_reply_none(req);
}

static void ll_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets) {
    for (size_t i = 0; i < count; i++) forget_one(forgets[i].ino, forgets[i].nlookup);
    fuse_reply_none(req);
}

static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    struct node *n = NODE(ino);
    struct stat st;
    int e = node_getattr(n, &st, fi);
    if (e) { fuse_reply_err(req, -e); return; }
    pthread_mutex_lock(&S.lock);
    update_stat_locked(n, &st);
    pthread_mutex_unlock(&S.lock);
    fuse_reply_attr(req, &st, 0);
}

static int bpath_copy(char *out, const char *path) {
    return snprintf(out, PATH_MAX, "%s", path) >= PATH_MAX ? -ENAMETOOLONG : 0;
}

/* libfuse's setattr: chmod, chown, truncate, utimens, each its own call, then the attributes. */
static void ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int valid, struct fuse_file_info *fi) {
    struct node *n = NODE(ino);
    char path[PATH_MAX];
    int e = node_path(n, path);
    if (e && fi && fi->fh) e = bpath_copy(path, HANDLE(fi)->path);   /* (an open file without a name) */
    if (e) { fuse_reply_err(req, -e); return; }
    if (!e && (valid & FUSE_SET_ATTR_MODE)) e = op_chmod(path, attr->st_mode, fi);
    if (!e && (valid & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)))
        e = op_chown(path, (valid & FUSE_SET_ATTR_UID) ? attr->st_uid : (uid_t)-1,
                     (valid & FUSE_SET_ATTR_GID) ? attr->st_gid : (gid_t)-1, fi);
    if (!e && (valid & FUSE_SET_ATTR_SIZE)) e = op_truncate(path, attr->st_size, fi);
    if (!e && (valid & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME))) {
        struct timespec tv[2] = {{0, UTIME_OMIT}, {0, UTIME_OMIT}};
        if (valid & FUSE_SET_ATTR_ATIME_NOW) tv[0].tv_nsec = UTIME_NOW;
        else if (valid & FUSE_SET_ATTR_ATIME) tv[0] = attr->st_atim;
        if (valid & FUSE_SET_ATTR_MTIME_NOW) tv[1].tv_nsec = UTIME_NOW;
        else if (valid & FUSE_SET_ATTR_MTIME) tv[1] = attr->st_mtim;
        e = op_utimens(path, tv, fi);
    }
    struct stat st;
    if (!e) e = op_getattr(path, &st, fi);
    if (e) { fuse_reply_err(req, -e); return; }
    pthread_mutex_lock(&S.lock);
    update_stat_locked(n, &st);
    pthread_mutex_unlock(&S.lock);
    fuse_reply_attr(req, &st, 0);
}

static void ll_readlink(fuse_req_t req, fuse_ino_t ino) {
    PATH_OR_REPLY(path, NODE(ino));
    char buf[PATH_MAX];
    int e = op_readlink(path, buf, sizeof buf);
    if (e) fuse_reply_err(req, -e); else fuse_reply_readlink(req, buf);
}

/* A name this mount just made: its post-op attributes (cached by the op: no round trip), a node, the entry. */
static void reply_made(fuse_req_t req, struct node *parent, const char *name, const char *path, int err) {
    struct stat st;
    struct fuse_entry_param e;
    if (!err) err = op_getattr(path, &st, NULL);
    if (!err) err = bind_entry(parent, name, &st, &e);
    if (err) fuse_reply_err(req, -err); else fuse_reply_entry(req, &e);
}

static void ll_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode) {
    char path[PATH_MAX];
    int e = child_path(NODE(parent), name, path);
    if (!e) e = op_mkdir(path, mode);
    reply_made(req, NODE(parent), name, path, e);
}

static void ll_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name) {
    char path[PATH_MAX];
    int e = child_path(NODE(parent), name, path);
    if (!e) e = op_symlink(link, path);
    reply_made(req, NODE(parent), name, path, e);
}

static void ll_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname) {
    PATH_OR_REPLY(from, NODE(ino));
    char to[PATH_MAX];
    int e = child_path(NODE(newparent), newname, to);
    if (!e) e = op_link(from, to);
    reply_made(req, NODE(newparent), newname, to, e);
}

/* The node at parent/name (if this mount has one) stops resolving: this mount removed or replaced the name. */
static void unhash_name(struct node *parent, const char *name) {
    char key[PATH_MAX + 32];
    if (name_key(key, sizeof key, parent, name)) return;
    pthread_mutex_lock(&S.lock);
    struct node *n = ht_get(&names, key);
    if (n) unhash_locked(n);
    pthread_mutex_unlock(&S.lock);
}

/* unlink or rmdir of parent/name through this mount (op), then its node stops resolving */
static void remove_name(fuse_req_t req, fuse_ino_t parent, const char *name, int (*op)(const char *)) {
    char path[PATH_MAX];
    int e = child_path(NODE(parent), name, path);
    if (!e) e = op(path);
    if (!e) unhash_name(NODE(parent), name);
    fuse_reply_err(req, -e);
}

static void ll_unlink(fuse_req_t req, fuse_ino_t parent, const char *name) {
    remove_name(req, parent, name, op_unlink);
}

static void ll_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name) {
    remove_name(req, parent, name, op_rmdir);
}

static void ll_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                      const char *newname, unsigned int flags) {
    struct node *p = NODE(parent), *np = NODE(newparent);
    char old[PATH_MAX], new[PATH_MAX];
    int e = child_path(p, name, old);
    if (!e) e = child_path(np, newname, new);
    if (!e) e = op_rename(old, new, flags);
    if (e) { fuse_reply_err(req, -e); return; }
    /* libfuse's rename_node: the target's node stops resolving, the source's takes the new name */
    char key[PATH_MAX + 32];
    pthread_mutex_lock(&S.lock);
    struct node *src = name_key(key, sizeof key, p, name) ? NULL : ht_get(&names, key);
    struct node *dst = name_key(key, sizeof key, np, newname) ? NULL : ht_get(&names, key);
    if (dst) unhash_locked(dst);
    if (src) {
        unhash_locked(src);
        char *nm = strdup(newname);
        if (nm && !(flags & RENAME_EXCHANGE)) {
            free(src->name); src->name = nm;
            np->refs++; src->parent = np;
            hash_locked(src);
            p->refs--;
            maybe_free_locked(p);
        } else {
            free(nm);
        }
    }
    pthread_mutex_unlock(&S.lock);
    fuse_reply_err(req, 0);
}

/* libfuse's open_auto_cache: keep the kernel's pages if the file's mtime and size are as last seen. */
static void auto_cache(struct node *n, const char *path, struct fuse_file_info *fi) {
    pthread_mutex_lock(&S.lock);
    if (n->cache_valid) {
        pthread_mutex_unlock(&S.lock);
        struct stat st;
        int e = op_getattr(path, &st, fi);
        pthread_mutex_lock(&S.lock);
        if (!e) update_stat_locked(n, &st); else n->cache_valid = 0;
    }
    if (n->cache_valid) fi->keep_cache = 1;
    n->cache_valid = 1;
    pthread_mutex_unlock(&S.lock);
}

static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    struct node *n = NODE(ino);
    PATH_OR_REPLY(path, n);
    int e = op_open(path, fi);
    if (e) { fuse_reply_err(req, -e); return; }
    struct handle *h = HANDLE(fi);
    if (h->dev != n->dev || h->ino != n->ino) {
        /* the name holds another file now: this node's file handle is stale (the kernel looks the name up
         * again and opens the new file through a new node) */
        op_release(path, fi);
        fuse_reply_err(req, -stale_node(n, path));
        return;
    }
    auto_cache(n, path, fi);
    if (fuse_reply_open(req, fi) == -ENOENT) op_release(path, fi);   /* (the open was interrupted) */
}

static void ll_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi) {
    struct node *p = NODE(parent);
    char path[PATH_MAX];
    struct stat st;
    struct fuse_entry_param e;
    int err = child_path(p, name, path);
    if (!err) err = op_create(path, mode, fi);
    if (err) { fuse_reply_err(req, -err); return; }
    err = op_getattr(path, &st, fi);
    if (!err) err = bind_entry(p, name, &st, &e);
    if (err) { op_release(path, fi); fuse_reply_err(req, -err); return; }
    if (fuse_reply_create(req, &e, fi) == -ENOENT) { op_release(path, fi); forget_one(e.ino, 1); }
}

static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    char *buf = malloc(size ? size : 1);
    if (!buf) { fuse_reply_err(req, ENOMEM); return; }
    int n = op_read(NULL, buf, size, off, fi);
    if (n < 0) fuse_reply_err(req, -n); else fuse_reply_buf(req, buf, (size_t)n);
    free(buf);
}

static void ll_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi) {
    int n = op_write(NULL, buf, size, off, fi);
    if (n < 0) fuse_reply_err(req, -n); else fuse_reply_write(req, (size_t)n);
}

static void ll_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi) {
    fuse_reply_err(req, -op_fsync(NULL, datasync, fi));
}

static void ll_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    op_release(NULL, fi);
    fuse_reply_err(req, 0);
}

static void ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    PATH_OR_REPLY(path, NODE(ino));
    int e = op_opendir(path, fi);
    if (e) { fuse_reply_err(req, -e); return; }
    if (fuse_reply_open(req, fi) == -ENOENT) op_releasedir(path, fi);
}

/* The listing, fetched by the first readdir (fs.py readdir), handed out from the kernel's offset on. */
static void ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    struct dirh *d = (struct dirh *)(uintptr_t)fi->fh;
    if (!d) { fuse_reply_buf(req, NULL, 0); return; }
    if (!d->l) {
        int e = fetch_listing(d->path, &d->token, &d->l);
        if (e) { fuse_reply_err(req, -e); return; }
    }
    char *buf = malloc(size ? size : 1);
    if (!buf) { fuse_reply_err(req, ENOMEM); return; }
    size_t pos = 0;
    struct listing *l = d->l;
    for (size_t i = off < 0 ? 0 : (size_t)off; i < l->n; i++) {
        struct stat st;
        memset(&st, 0, sizeof st);
        st.st_mode = l->e[i].kind; st.st_ino = l->e[i].ino;
        size_t need = fuse_add_direntry(req, buf + pos, size - pos, l->e[i].name, &st, (off_t)(i + 1));
        if (need > size - pos) break;
        pos += need;
    }
    fuse_reply_buf(req, buf, pos);
    free(buf);
}

static void ll_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    op_releasedir(NULL, fi);
    fuse_reply_err(req, 0);
}

static void ll_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi) {
    PATH_OR_REPLY(path, NODE(ino));
    fuse_reply_err(req, -op_fsyncdir(path, datasync, fi));
}

static void ll_statfs(fuse_req_t req, fuse_ino_t ino) {
    PATH_OR_REPLY(path, NODE(ino));
    struct statvfs sv;
    int e = op_statfs(path, &sv);
    if (e) fuse_reply_err(req, -e); else fuse_reply_statfs(req, &sv);
}

static void ll_access(fuse_req_t req, fuse_ino_t ino, int mask) {
    PATH_OR_REPLY(path, NODE(ino));
    fuse_reply_err(req, -op_access(path, mask));
}

/* ---- lifecycle -------------------------------------------------------------------------------------------- */
static void ll_init(void *userdata, struct fuse_conn_info *conn) {
    /* No GETATTR upcall before every read: the page cache is revalidated at open (auto_cache above), as an NFS
     * client's close-to-open does; names come by LOOKUP, not READDIRPLUS (as libfuse's high-level API answers
     * it: entries without attributes). fs.py serve has the why of each. */
    conn->want &= ~(FUSE_CAP_AUTO_INVAL_DATA | FUSE_CAP_READDIRPLUS);
    if (conn->capable & FUSE_CAP_EXPORT_SUPPORT) conn->want |= FUSE_CAP_EXPORT_SUPPORT;
    if (pthread_create(&S.writer, NULL, writer_main, NULL) == 0) S.writer_started = 1;
}

static void ll_destroy(void *userdata) {
    pthread_mutex_lock(&S.lock);
    S.stop = 1;
    pthread_cond_signal(&S.stop_cv);
    pthread_mutex_unlock(&S.lock);
    if (S.writer_started) pthread_join(S.writer, NULL);
    write_counters();
}

static const struct fuse_lowlevel_ops OPS = {
    .init = ll_init, .destroy = ll_destroy, .lookup = ll_lookup, .forget = ll_forget,
    .forget_multi = ll_forget_multi, .getattr = ll_getattr, .setattr = ll_setattr, .readlink = ll_readlink,
    .mkdir = ll_mkdir, .unlink = ll_unlink, .rmdir = ll_rmdir, .symlink = ll_symlink, .rename = ll_rename,
    .link = ll_link, .open = ll_open, .read = ll_read, .write = ll_write, .release = ll_release,
    .fsync = ll_fsync, .opendir = ll_opendir, .readdir = ll_readdir, .releasedir = ll_releasedir,
    .fsyncdir = ll_fsyncdir, .statfs = ll_statfs, .access = ll_access, .create = ll_create,
};

static void free_plain(void *v) { free(v); }
static void free_none(void *v) { (void)v; }

/* serve(backing, mountpoint, ac_attr, ac_dir, latency, trust, counters_path, trace_path, fsname): mount and
 * serve until unmounted (foreground, up to 64 threads; the interpreter lock released meanwhile). */
static PyObject *serve(PyObject *self, PyObject *args) {
    const char *backing, *mountpoint, *counters = NULL, *trace = NULL, *fsname;
    double ac_attr, ac_dir, latency;
    int trust;
    if (!PyArg_ParseTuple(args, "ssdddpzzs", &backing, &mountpoint, &ac_attr, &ac_dir, &latency, &trust,
                          &counters, &trace, &fsname))
        return NULL;
    if (S.attr.b) { PyErr_SetString(PyExc_RuntimeError, "nfsim: one mount per process"); return NULL; }
    if (!realpath(backing, S.root)) return PyErr_SetFromErrnoWithFilename(PyExc_OSError, backing);
    if (strcmp(S.root, "/") == 0) S.root[0] = 0;
    S.ac_attr = ac_attr; S.ac_dir = ac_dir; S.latency = latency; S.trust = trust;
    S.counters_path = counters ? strdup(counters) : NULL;
    if (trace) {
        S.trace = fopen(trace, "a");
        if (!S.trace) return PyErr_SetFromErrnoWithFilename(PyExc_OSError, trace);
        setvbuf(S.trace, NULL, _IOLBF, 0);
    }
    if (ht_init(&S.attr, free_plain) || ht_init(&S.lists, listing_drop_locked) || ht_init(&names, free_none))
        return PyErr_NoMemory();
    char opts[PATH_MAX + 200];
    snprintf(opts, sizeof opts, "fsname=%s,subtype=nfsim", fsname);
    char *argv[] = {"nfsim", "-o", opts, NULL};
    struct fuse_args fargs = FUSE_ARGS_INIT(3, argv);
    int rc = -1;
    Py_BEGIN_ALLOW_THREADS
    struct fuse_session *se = fuse_session_new(&fargs, &OPS, sizeof OPS, NULL);
    if (se) {
        if (fuse_set_signal_handlers(se) == 0) {
            if (fuse_session_mount(se, mountpoint) == 0) {
                struct fuse_loop_config *cfg = fuse_loop_cfg_create();
                if (cfg) {
                    fuse_loop_cfg_set_max_threads(cfg, 64);
                    fuse_loop_cfg_set_idle_threads(cfg, 64);
                    rc = fuse_session_loop_mt(se, cfg);
                    fuse_loop_cfg_destroy(cfg);
                }
                fuse_session_unmount(se);
            }
            fuse_remove_signal_handlers(se);
        }
        fuse_session_destroy(se);
    }
    Py_END_ALLOW_THREADS
    fuse_opt_free_args(&fargs);
    if (S.trace) fclose(S.trace);
    if (rc != 0) { PyErr_Format(PyExc_RuntimeError, "nfsim: the FUSE session ended with %d", rc); return NULL; }
    Py_RETURN_NONE;
}

static PyMethodDef METHODS[] = {
    {"serve", serve, METH_VARARGS, "serve(backing, mountpoint, ac_attr, ac_dir, latency, trust, counters_path, "
                                   "trace_path, fsname): mount and serve until unmounted"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_nfsimd", "nfsim's filesystem in C (see fs.py)", -1,
                                    METHODS};

PyMODINIT_FUNC PyInit__nfsimd(void) { return PyModule_Create(&MODULE); }
