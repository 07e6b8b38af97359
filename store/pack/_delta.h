/*
 * _delta.h: what the delta encoder (_delta.c) shares with the delta search's window loop
 * (_search.c), both in the extension module packyard.store.pack._delta.
 */
#ifndef PACKYARD_DELTA_H
#define PACKYARD_DELTA_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

/* The block index of one base (see _delta.c). */
typedef struct {
    const uint8_t *base;
    size_t base_len;
    unsigned shift;       /* 64 - bits */
    size_t nbuckets;      /* 0 when the base holds no whole block */
    uint32_t *starts;     /* nbuckets + 1 entries: bucket b is offsets[starts[b] .. starts[b+1]) */
    uint32_t *offsets;    /* kept block offsets, by bucket, ascending within a bucket */
    size_t kept;
} dindex;

/* A growing output buffer that never holds more than ``limit`` bytes. */
enum { OUT_OK = 0, OUT_OVER = 1, OUT_NOMEM = -1 };

typedef struct {
    uint8_t *p;
    size_t len, cap;
    size_t limit;         /* never hold more than this many bytes (SIZE_MAX: no limit) */
} obuf;

/* Build the index of base[0..len) (len <= MAX_BASE); no GIL needed. 0, or -1 when out of memory. */
int pd_dindex_build(dindex *ix, const uint8_t *base, size_t len);
void pd_dindex_free(dindex *ix);
size_t pd_dindex_memory(const dindex *ix);
/* Append the delta from ix's base to t[0..tlen) to o; no GIL needed. OUT_OK, OUT_OVER or OUT_NOMEM. */
int pd_encode(const dindex *ix, const uint8_t *t, size_t tlen, obuf *o);

/* The window search's functions (_search.c), in the module's method table. */
extern PyMethodDef pd_search_methods[];

#endif
