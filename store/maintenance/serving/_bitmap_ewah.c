/*
 * _bitmap_ewah.c: EWAH bitmaps as git builds them (ewah.py, the specification: git's ewah/ewah_bitmap.c,
 * ewah_rlw.c and ewah_io.c ported line for line), and git's XOR search over a .bitmap's commit bitmaps:
 *
 *   ewah_stored(bitmaps, window) -> [(xor offset, serialized EWAH)]
 *       bitmap.py's xor_offsets over ewah.from_words of each bitmap (native 64-bit words, as bitmap_closures
 *       gives them), each chosen EWAH serialized as ewah_serialize_to writes it.
 */
#include "_walk.h"

/* ---- EWAH, as ewah.py (git's ewah/ewah_bitmap.c, ewah_rlw.c, ewah_io.c) ----------------------------------- */

#define RUNNING_BITS 32
#define LARGEST_RUNNING ((uint64_t)0xFFFFFFFFu)
#define LARGEST_LITERAL ((uint64_t)0x7FFFFFFFu)
#define RUN_SHIFTED (LARGEST_RUNNING << 1)
#define RUN_PLUS_BIT ((((uint64_t)1) << (RUNNING_BITS + 1)) - 1)

typedef struct {
    uint64_t *buf;
    size_t size, cap;
    size_t rlw;
    size_t bit_size;
    int oom;
} Ewah;

static inline int rl_bit(uint64_t w) { return (int)(w & 1); }
static inline uint64_t rl_len(uint64_t w) { return (w >> 1) & LARGEST_RUNNING; }
static inline uint64_t rl_lit(uint64_t w) { return w >> (1 + RUNNING_BITS); }
static inline uint64_t with_len(uint64_t w, uint64_t l) { return (w & ~RUN_SHIFTED) | (l << 1); }
static inline uint64_t with_lit(uint64_t w, uint64_t l) { return (w & RUN_PLUS_BIT) | (l << (RUNNING_BITS + 1)); }
static inline uint64_t with_bit(uint64_t w, int b) { return b ? (w | 1) : (w & ~(uint64_t)1); }

static int
ewah_init(Ewah *e)
{
    e->cap = 32;
    e->buf = PyMem_RawMalloc(e->cap * sizeof(uint64_t));
    if (!e->buf)
        return -1;
    e->buf[0] = 0;
    e->size = 1;
    e->rlw = 0;
    e->bit_size = 0;
    e->oom = 0;
    return 0;
}

static void
ewah_free(Ewah *e)
{
    PyMem_RawFree(e->buf);
    e->buf = NULL;
}

static inline void
e_push(Ewah *e, uint64_t v)
{
    if (e->size == e->cap) {
        uint64_t *p = e->oom ? NULL : PyMem_RawRealloc(e->buf, 2 * e->cap * sizeof(uint64_t));
        if (!p) {
            e->oom = 1;
            return;
        }
        e->buf = p;
        e->cap *= 2;
    }
    e->buf[e->size++] = v;
}

static inline void
e_push_rlw(Ewah *e, uint64_t v)
{
    e_push(e, v);
    if (!e->oom)
        e->rlw = e->size - 1;
}

#define RLW (e->buf[e->rlw])

static void
e_add_empty_words_(Ewah *e, int v, uint64_t number)
{
    if (rl_bit(RLW) != v && rl_len(RLW) + rl_lit(RLW) == 0) {
        RLW = with_bit(RLW, v);
    } else if (rl_lit(RLW) != 0 || rl_bit(RLW) != v) {
        e_push_rlw(e, 0);
        if (e->oom)
            return;
        if (v)
            RLW = with_bit(RLW, v);
    }
    uint64_t runlen = rl_len(RLW);
    uint64_t can_add = number < LARGEST_RUNNING - runlen ? number : LARGEST_RUNNING - runlen;
    RLW = with_len(RLW, runlen + can_add);
    number -= can_add;
    while (number >= LARGEST_RUNNING) {
        e_push_rlw(e, 0);
        if (e->oom)
            return;
        RLW = with_len(v ? with_bit(0, v) : 0, LARGEST_RUNNING);
        number -= LARGEST_RUNNING;
    }
    if (number > 0) {
        e_push_rlw(e, 0);
        if (e->oom)
            return;
        RLW = with_len(v ? with_bit(0, v) : 0, number);
    }
}

static void
e_add_empty_words(Ewah *e, int v, uint64_t number)
{
    if (number == 0)
        return;
    e->bit_size += number * 64;
    e_add_empty_words_(e, v, number);
}

static void
e_add_literal(Ewah *e, uint64_t word)
{
    uint64_t current = rl_lit(RLW);
    if (current >= LARGEST_LITERAL) {
        e_push_rlw(e, 0);
        if (e->oom)
            return;
        RLW = with_lit(RLW, 1);
        e_push(e, word);
        return;
    }
    RLW = with_lit(RLW, current + 1);
    e_push(e, word);
}

static void
e_add_dirty_words(Ewah *e, const uint64_t *words, uint64_t number, int negate)
{
    for (;;) {
        uint64_t lits = rl_lit(RLW);
        uint64_t can_add = number < LARGEST_LITERAL - lits ? number : LARGEST_LITERAL - lits;
        RLW = with_lit(RLW, lits + can_add);
        for (uint64_t i = 0; i < can_add; i++)
            e_push(e, negate ? ~words[i] : words[i]);
        if (e->oom)
            return;
        e->bit_size += can_add * 64;
        if (number - can_add == 0)
            break;
        e_push_rlw(e, 0);
        if (e->oom)
            return;
        words += can_add;
        number -= can_add;
    }
}

static void
e_add_empty_word(Ewah *e, int v)
{
    int no_literal = rl_lit(RLW) == 0;
    uint64_t run_len = rl_len(RLW);
    if (no_literal && run_len == 0)
        RLW = with_bit(RLW, v);
    if (no_literal && rl_bit(RLW) == v && run_len < LARGEST_RUNNING) {
        RLW = with_len(RLW, run_len + 1);
        return;
    }
    e_push_rlw(e, 0);
    if (e->oom)
        return;
    RLW = with_len(with_bit(0, v), 1);
}

static void
e_add(Ewah *e, uint64_t word)
{
    e->bit_size += 64;
    if (word == 0)
        e_add_empty_word(e, 0);
    else if (word == ~(uint64_t)0)
        e_add_empty_word(e, 1);
    else
        e_add_literal(e, word);
}

#undef RLW

/* bitmap_to_ewah */
static void
e_from_words(Ewah *e, const uint64_t *w, size_t n)
{
    size_t running_empty = 0;
    uint64_t last = 0;
    for (size_t i = 0; i < n; i++) {
        if (w[i] == 0) {
            running_empty++;
            continue;
        }
        if (last != 0)
            e_add(e, last);
        if (running_empty > 0) {
            e_add_empty_words(e, 0, running_empty);
            running_empty = 0;
        }
        last = w[i];
    }
    e_add(e, last);
}

typedef struct {
    const uint64_t *buf;
    size_t size, pointer, literal_word_start;
    uint64_t literal_words, running_len;
    int running_bit;
} RlwIt;

static int
it_next_word(RlwIt *it)
{
    if (it->pointer >= it->size)
        return 0;
    uint64_t w = it->buf[it->pointer];
    it->literal_words = rl_lit(w);
    it->pointer += it->literal_words + 1;
    it->running_len = rl_len(w);
    it->running_bit = rl_bit(w);
    return 1;
}

static void
it_init(RlwIt *it, const Ewah *e)
{
    it->buf = e->buf;
    it->size = e->size;
    it->pointer = 0;
    it->literal_words = it->running_len = 0;
    it->running_bit = 0;
    it_next_word(it);
    it->literal_word_start = it->pointer - it->literal_words;
}

static inline uint64_t it_size(const RlwIt *it) { return it->running_len + it->literal_words; }

static void
it_discard(RlwIt *it, uint64_t x)
{
    while (x > 0) {
        if (it->running_len > x) {
            it->running_len -= x;
            return;
        }
        x -= it->running_len;
        it->running_len = 0;
        uint64_t discard = x > it->literal_words ? it->literal_words : x;
        it->literal_word_start += discard;
        it->literal_words -= discard;
        x -= discard;
        if (x > 0 || it_size(it) == 0) {
            if (!it_next_word(it))
                break;
            it->literal_word_start = it->pointer - it->literal_words;
        }
    }
}

static uint64_t
it_discharge(RlwIt *it, Ewah *out, uint64_t max, int negate)
{
    uint64_t index = 0;
    while (index < max && it_size(it) > 0 && !out->oom) {
        uint64_t pl = it->running_len;
        if (index + pl > max)
            pl = max - index;
        e_add_empty_words(out, it->running_bit ^ negate, pl);
        index += pl;
        uint64_t pd = it->literal_words;
        if (pd + index > max)
            pd = max - index;
        e_add_dirty_words(out, it->buf + it->literal_word_start, pd, negate);
        it_discard(it, pd + pl);
        index += pd;
    }
    return index;
}

/* ewah_xor(a, b, out); out initialized by the caller. */
static void
e_xor(const Ewah *a, const Ewah *b, Ewah *out)
{
    RlwIt i, j;
    it_init(&i, a);
    it_init(&j, b);
    while (it_size(&i) > 0 && it_size(&j) > 0 && !out->oom) {
        while ((i.running_len > 0 || j.running_len > 0) && !out->oom) {
            RlwIt *prey, *predator;
            if (i.running_len < j.running_len) {
                prey = &i;
                predator = &j;
            } else {
                prey = &j;
                predator = &i;
            }
            int negate = predator->running_bit ? 1 : 0;
            uint64_t index = it_discharge(prey, out, predator->running_len, negate);
            e_add_empty_words(out, negate, predator->running_len - index);
            it_discard(predator, predator->running_len);
        }
        uint64_t literals = i.literal_words < j.literal_words ? i.literal_words : j.literal_words;
        if (literals) {
            for (uint64_t k = 0; k < literals; k++)
                e_add(out, i.buf[i.literal_word_start + k] ^ j.buf[j.literal_word_start + k]);
            it_discard(&i, literals);
            it_discard(&j, literals);
        }
    }
    if (it_size(&i) > 0)
        it_discharge(&i, out, UINT64_MAX, 0);
    else
        it_discharge(&j, out, UINT64_MAX, 0);
    out->bit_size = a->bit_size > b->bit_size ? a->bit_size : b->bit_size;
}

static PyObject *
e_serialize(const Ewah *e)
{
    size_t n = 8 + 8 * e->size + 4;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (!out)
        return NULL;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
    uint32_t v[2] = {(uint32_t)e->bit_size, (uint32_t)e->size};
    for (int k = 0; k < 2; k++)
        for (int b = 0; b < 4; b++)
            *p++ = (uint8_t)(v[k] >> (24 - 8 * b));
    for (size_t i = 0; i < e->size; i++)
        for (int b = 0; b < 8; b++)
            *p++ = (uint8_t)(e->buf[i] >> (56 - 8 * b));
    uint32_t r = (uint32_t)e->rlw;
    for (int b = 0; b < 4; b++)
        *p++ = (uint8_t)(r >> (24 - 8 * b));
    return out;
}

/* ewah_stored(bitmaps: [bytes of little-endian 64-bit words], window) -> [(xor offset, serialized EWAH)]:
 * bitmap.py's xor_offsets over from_words of each, each chosen EWAH serialized (git's compute_xor_offsets). */
PyObject *
ewah_stored(PyObject *module, PyObject *args)
{
    PyObject *seq;
    int window;
    if (!PyArg_ParseTuple(args, "Oi", &seq, &window))
        return NULL;
    PyObject *fast = PySequence_Fast(seq, "ewah_stored: a list of bytes");
    if (!fast)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    Ewah *es = PyMem_RawCalloc(n ? (size_t)n : 1, sizeof(Ewah));
    PyObject *result = NULL;
    Py_ssize_t made = 0;
    if (!es) {
        PyErr_NoMemory();
        goto out;
    }
    for (; made < n; made++) {
        PyObject *b = PySequence_Fast_GET_ITEM(fast, made);
        char *p;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(b, &p, &len) < 0)
            goto out;
        if (len % 8) {
            PyErr_SetString(PyExc_ValueError, "ewah_stored: bitmaps are whole 64-bit words");
            goto out;
        }
        if (ewah_init(&es[made]) < 0) {
            PyErr_NoMemory();
            goto out;
        }
        size_t nw = (size_t)len / 8;
        const uint64_t *w = (const uint64_t *)p;
        while (nw && w[nw - 1] == 0)
            nw--;      /* (an int's bytes: no trailing zero words, as ewah.int_words gives) */
        e_from_words(&es[made], w, nw);
        if (es[made].oom) {
            made++;
            PyErr_NoMemory();
            goto out;
        }
    }
    result = PyList_New(n);
    if (!result)
        goto out;
    for (Py_ssize_t k = 0; k < n; k++) {
        Ewah best = es[k];
        int best_offset = 0, owned = 0;
        for (int i = 1; i <= window && k - i >= 0; i++) {
            Ewah t;
            if (ewah_init(&t) < 0) {
                PyErr_NoMemory();
                goto fail;
            }
            e_xor(&es[k - i], &es[k], &t);
            if (t.oom) {
                ewah_free(&t);
                PyErr_NoMemory();
                goto fail;
            }
            if (t.size < best.size) {
                if (owned)
                    ewah_free(&best);
                best = t;
                best_offset = i;
                owned = 1;
            } else {
                ewah_free(&t);
            }
        }
        PyObject *ser = e_serialize(&best);
        if (owned)
            ewah_free(&best);
        PyObject *item = ser ? Py_BuildValue("(iN)", best_offset, ser) : NULL;
        if (!item)
            goto fail;
        PyList_SET_ITEM(result, k, item);
    }
    goto out;
fail:
    Py_CLEAR(result);
out:
    if (es)
        for (Py_ssize_t k = 0; k < made; k++)
            ewah_free(&es[k]);
    PyMem_RawFree(es);
    Py_DECREF(fast);
    return result;
}
