/* nfsim's filesystem in C: the same simulated NFS client as fs.py (its specification and fallback), without
 * the Python interpreter on every FUSE request.
 *
 * fs.py's NfsimOps is the reference: every operation here does what its method there does, in the same order
 * (the round trip first, then the server's call, then the caches), counts the same counters and writes them as
 * the same JSON. tests/service/test_nfsim_impl.py runs one scripted workload through both and compares the
 * counters and what each answered. Why a C twin at all (docs/nfs.md, "nfsim's own cost"): each request through
 * mfusepy costs ~0.2-0.9 ms of a core (ctypes, the interpreter lock among 64 serving threads), which on two
 * cores is more than the 1 ms of simulated latency it models; a kernel NFS client costs microseconds.
 *
 * One mount per process: the state is one static struct, every table behind one mutex (as fs.py's one lock).
 */
#define FUSE_USE_VERSION 312
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <fuse.h>

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
       C_ATTR_HITS = N_METADATA, C_READDIR_HITS, C_ESTALE, C_READS, C_WRITES, C_READ_BYTES, C_WRITTEN_BYTES,
       C_FAILED_RENAMES, C_FAILED_UNLINKS, C_MAX_IN_FLIGHT, N_COUNTERS };
static const char *const COUNTER_NAMES[N_COUNTERS] = {
    "lookup", "getattr", "open", "create", "readdir", "rename", "unlink", "fsync", "setattr", "mkdir", "rmdir",
    "link", "symlink", "readlink", "statfs", "access",
    "attr_hits", "readdir_hits", "estale", "reads", "writes", "read_bytes", "written_bytes", "failed_renames",
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
    if (!path && !(fi && fi->fh)) return -ESTALE;   /* (a node libfuse no longer has a name for) */
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

static int op_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off, struct fuse_file_info *fi,
                      enum fuse_readdir_flags flags) {
    struct dirh *d = (struct dirh *)(uintptr_t)fi->fh;
    if (!d) return 0;
    if (!d->l) {
        int e = fetch_listing(d->path, &d->token, &d->l);
        if (e) return e;
    }
    struct listing *l = d->l;
    for (size_t i = 0; i < l->n; i++) {
        struct stat st;
        memset(&st, 0, sizeof st);
        st.st_mode = l->e[i].kind; st.st_ino = l->e[i].ino;
        if (fill(buf, l->e[i].name, &st, 0, 0)) break;
    }
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

static int op_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
    struct handle *h = HANDLE(fi);
    struct stat st;
    int e = stale(h, &st);
    if (e) return e;
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

/* ---- lifecycle -------------------------------------------------------------------------------------------- */
static void *op_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    /* No GETATTR upcall before every read: the page cache is revalidated at open (auto_cache), as an NFS
     * client's close-to-open does. The kernel keeps positive names for min(ac_attr, ac_dir) s, never negative
     * ones, and no attributes (fs.py serve has the why of each). */
    conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
    cfg->entry_timeout = S.ac_attr < S.ac_dir ? S.ac_attr : S.ac_dir;
    cfg->attr_timeout = 0;
    cfg->negative_timeout = 0;
    cfg->ac_attr_timeout_set = 1;
    cfg->ac_attr_timeout = 0;
    cfg->auto_cache = 1;
    cfg->use_ino = 1;
    cfg->hard_remove = 1;
    if (pthread_create(&S.writer, NULL, writer_main, NULL) == 0) S.writer_started = 1;
    return NULL;
}

static void op_destroy(void *data) {
    pthread_mutex_lock(&S.lock);
    S.stop = 1;
    pthread_cond_signal(&S.stop_cv);
    pthread_mutex_unlock(&S.lock);
    if (S.writer_started) pthread_join(S.writer, NULL);
    write_counters();
}

static const struct fuse_operations OPS = {
    .getattr = op_getattr, .readlink = op_readlink, .mkdir = op_mkdir, .unlink = op_unlink, .rmdir = op_rmdir,
    .symlink = op_symlink, .rename = op_rename, .link = op_link, .chmod = op_chmod, .chown = op_chown,
    .truncate = op_truncate, .open = op_open, .read = op_read, .write = op_write, .statfs = op_statfs,
    .release = op_release, .fsync = op_fsync, .opendir = op_opendir, .readdir = op_readdir,
    .releasedir = op_releasedir, .fsyncdir = op_fsyncdir, .init = op_init, .destroy = op_destroy,
    .access = op_access, .create = op_create, .utimens = op_utimens,
};

static void free_plain(void *v) { free(v); }

/* serve(backing, mountpoint, ac_attr, ac_dir, latency, trust, counters_path, trace_path, fsname): mount and
 * serve until unmounted (foreground, multithreaded; the interpreter lock released meanwhile). */
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
    if (ht_init(&S.attr, free_plain) || ht_init(&S.lists, listing_drop_locked)) return PyErr_NoMemory();
    char opts[PATH_MAX + 200];
    snprintf(opts, sizeof opts, "fsname=%s,subtype=nfsim,max_threads=64,max_idle_threads=64", fsname);
    char *argv[] = {"nfsim", "-f", "-o", opts, (char *)mountpoint, NULL};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fuse_main(5, argv, &OPS, NULL);
    Py_END_ALLOW_THREADS
    if (S.trace) fclose(S.trace);
    if (rc != 0) { PyErr_Format(PyExc_RuntimeError, "nfsim: fuse_main exited %d", rc); return NULL; }
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
