"""EWAH-compressed bitmaps as git writes them (``ewah/ewah_bitmap.c``, ``ewah/ewah_rlw.c``, ``ewah/ewah_io.c``).

The format (git's Documentation/technical/bitmap-format.txt, Appendix A; JavaEWAH's): a stream of 64-bit
words; each chunk is one *run-length word* (bit 0: the repeated bit; bits 1-32: how many words of it;
bits 33-63: how many literal words follow) and its literal words. Serialized as the bit size (be32),
the word count (be32), the words (be64 each), the position of the last run-length word (be32).

One set of bits has many valid encodings; git's readers accept any, but a file byte-identical to git's
needs git's own construction. So the three ways git builds an EWAH are ported here line for line:

* :meth:`Ewah.set` -- ``ewah_set``, bits in increasing order (the four type bitmaps);
* :func:`from_words` -- ``bitmap_to_ewah``, from an uncompressed bitmap (each commit's bitmap);
* :func:`xor` -- ``ewah_xor``, through git's run-length-word iterators (the XOR against an earlier
  bitmap; its encoding keeps literal words that git's discharge copies, so it is not ``from_words`` of
  the XOR).

This is the specification; the bitmap writer (:mod:`.bitmap`) uses it as it is.
"""
from __future__ import annotations

import struct
from array import array
from typing import Sequence

BITS = 64
MASK64 = (1 << 64) - 1
RUNNING_BITS = 32
LITERAL_BITS = 64 - 1 - RUNNING_BITS
LARGEST_RUNNING = (1 << RUNNING_BITS) - 1
LARGEST_LITERAL = (1 << LITERAL_BITS) - 1
_RUN_SHIFTED = LARGEST_RUNNING << 1
_RUN_PLUS_BIT = (1 << (RUNNING_BITS + 1)) - 1


def run_bit(w: int) -> int:
    return w & 1


def running_len(w: int) -> int:
    return (w >> 1) & LARGEST_RUNNING


def literal_words(w: int) -> int:
    return w >> (1 + RUNNING_BITS)


def _with_running_len(w: int, n: int) -> int:
    return (w & ~_RUN_SHIFTED & MASK64) | (n << 1)


def _with_literal_words(w: int, n: int) -> int:
    return (w & _RUN_PLUS_BIT) | (n << (RUNNING_BITS + 1))


def _with_run_bit(w: int, b: int) -> int:
    return (w | 1) if b else (w & ~1 & MASK64)


class Ewah:
    """git's ``struct ewah_bitmap``: ``buffer`` (the words), ``rlw`` (index of the last run-length word),
    ``bit_size``."""

    __slots__ = ("buffer", "rlw", "bit_size")

    def __init__(self) -> None:
        self.buffer: list[int] = [0]
        self.rlw = 0
        self.bit_size = 0

    # -- ewah_bitmap.c ------------------------------------------------------------------------
    def _push_rlw(self, value: int) -> None:
        self.buffer.append(value)
        self.rlw = len(self.buffer) - 1

    def _add_empty_words(self, v: int, number: int) -> int:
        buf = self.buffer
        added = 0
        w = buf[self.rlw]
        if run_bit(w) != v and running_len(w) + literal_words(w) == 0:
            buf[self.rlw] = _with_run_bit(w, v)
        elif literal_words(w) != 0 or run_bit(w) != v:
            self._push_rlw(0)
            if v:
                buf[self.rlw] = _with_run_bit(buf[self.rlw], v)
            added += 1
        w = buf[self.rlw]
        runlen = running_len(w)
        can_add = min(number, LARGEST_RUNNING - runlen)
        buf[self.rlw] = _with_running_len(w, runlen + can_add)
        number -= can_add
        while number >= LARGEST_RUNNING:
            self._push_rlw(0)
            added += 1
            w = _with_run_bit(0, v) if v else 0
            buf[self.rlw] = _with_running_len(w, LARGEST_RUNNING)
            number -= LARGEST_RUNNING
        if number > 0:
            self._push_rlw(0)
            added += 1
            w = _with_run_bit(0, v) if v else 0
            buf[self.rlw] = _with_running_len(w, number)
        return added

    def add_empty_words(self, v: int, number: int) -> int:
        if number == 0:
            return 0
        self.bit_size += number * BITS
        return self._add_empty_words(v, number)

    def _add_literal(self, word: int) -> int:
        buf = self.buffer
        current = literal_words(buf[self.rlw])
        if current >= LARGEST_LITERAL:
            self._push_rlw(0)
            buf[self.rlw] = _with_literal_words(buf[self.rlw], 1)
            buf.append(word)
            return 2
        buf[self.rlw] = _with_literal_words(buf[self.rlw], current + 1)
        buf.append(word)
        return 1

    def add_dirty_words(self, words: Sequence[int], start: int, number: int, negate: int) -> None:
        buf = self.buffer
        while True:
            lits = literal_words(buf[self.rlw])
            can_add = min(number, LARGEST_LITERAL - lits)
            buf[self.rlw] = _with_literal_words(buf[self.rlw], lits + can_add)
            if negate:
                buf.extend(~words[start + i] & MASK64 for i in range(can_add))
            else:
                buf.extend(words[start:start + can_add])
            self.bit_size += can_add * BITS
            if number - can_add == 0:
                break
            self._push_rlw(0)
            start += can_add
            number -= can_add

    def _add_empty_word(self, v: int) -> int:
        buf = self.buffer
        w = buf[self.rlw]
        no_literal = literal_words(w) == 0
        run_len = running_len(w)
        if no_literal and run_len == 0:
            w = buf[self.rlw] = _with_run_bit(w, v)
        if no_literal and run_bit(w) == v and run_len < LARGEST_RUNNING:
            buf[self.rlw] = _with_running_len(w, run_len + 1)
            return 0
        self._push_rlw(0)
        buf[self.rlw] = _with_running_len(_with_run_bit(0, v), 1)
        return 1

    def add(self, word: int) -> int:
        self.bit_size += BITS
        if word == 0:
            return self._add_empty_word(0)
        if word == MASK64:
            return self._add_empty_word(1)
        return self._add_literal(word)

    def set(self, i: int) -> None:
        """Set bit ``i`` (at or past every bit set so far), as ``ewah_set``."""
        if i < self.bit_size:
            raise ValueError(f"EWAH bits are set in increasing order ({i} < {self.bit_size})")
        dist = (i + BITS) // BITS - (self.bit_size + BITS - 1) // BITS
        self.bit_size = i + 1
        bit = 1 << (i % BITS)
        buf = self.buffer
        if dist > 0:
            if dist > 1:
                self._add_empty_words(0, dist - 1)
            self._add_literal(bit)
            return
        if literal_words(buf[self.rlw]) == 0:
            buf[self.rlw] = _with_running_len(buf[self.rlw], running_len(buf[self.rlw]) - 1)
            self._add_literal(bit)
            return
        buf[-1] |= bit
        if buf[-1] == MASK64:
            buf.pop()
            buf[self.rlw] = _with_literal_words(buf[self.rlw], literal_words(buf[self.rlw]) - 1)
            self._add_empty_word(1)

    # -- ewah_io.c ----------------------------------------------------------------------------
    def serialize(self) -> bytes:
        words = array("Q", self.buffer)
        if words.itemsize != 8:   # pragma: no cover (array 'Q' is 8 bytes on every platform CPython runs on)
            raise RuntimeError("array('Q') is not 64-bit here")
        words.byteswap()   # (big-endian on disk; CPython runs little-endian where packyard runs)
        return (struct.pack(">II", self.bit_size & 0xFFFFFFFF, len(self.buffer)) + words.tobytes()
                + struct.pack(">I", self.rlw))

    @property
    def size(self) -> int:
        """Words in the buffer (git's ``buffer_size``: what the XOR search compares)."""
        return len(self.buffer)

    # -- reading back (tests, the strategy's check) -------------------------------------------
    def words(self) -> list[int]:
        """The uncompressed words (as ``ewah_iterator_next`` yields them)."""
        out: list[int] = []
        buf = self.buffer
        p = 0
        n = len(buf)
        while p < n:
            w = buf[p]
            out.extend([MASK64 if run_bit(w) else 0] * running_len(w))
            lw = literal_words(w)
            out.extend(buf[p + 1:p + 1 + lw])
            p += 1 + lw
        return out

    def to_int(self) -> int:
        """The bits as one Python int (bit i = object i)."""
        return int.from_bytes(array("Q", self.words()).tobytes(), "little")


def from_words(words: Sequence[int]) -> Ewah:
    """``bitmap_to_ewah``: an uncompressed bitmap's words into an EWAH (trailing empty words dropped)."""
    e = Ewah()
    running_empty = 0
    last = 0
    for w in words:
        if w == 0:
            running_empty += 1
            continue
        if last != 0:
            e.add(last)
        if running_empty > 0:
            e.add_empty_words(0, running_empty)
            running_empty = 0
        last = w
    e.add(last)
    return e


def int_words(bits: int, nwords: int | None = None) -> array:
    """A Python int's bits as 64-bit words, low word first (``nwords``: at least enough for every bit)."""
    n = (bits.bit_length() + 63) // 64 if nwords is None else nwords
    out = array("Q")
    out.frombytes(bits.to_bytes(8 * n, "little"))
    return out


def from_int(bits: int) -> Ewah:
    return from_words(int_words(bits))


def from_int_as_set(bits: int) -> Ewah:
    """The EWAH that :meth:`Ewah.set` of each bit of ``bits`` in increasing order builds (git's ``ewah_set``
    loop: a word filled to all ones becomes a run of ones, ``bit_size`` ends at the last bit set), a word at a
    time: the type rows of a 164k-object bitmap took 164k ``set`` calls (0.11 s of the bitmap's encoding)."""
    e = Ewah()
    words = int_words(bits)
    filled = 0        # words the bitmap spans so far (ceil(bit_size / 64))
    for k, w in enumerate(words):
        if not w:
            continue
        if k > filled:
            e._add_empty_words(0, k - filled)   # (set's dist - 1 empty words before a bit in a new word)
        e._add_literal(w & -w)                  # set's first bit in the word ...
        buf = e.buffer
        buf[-1] = w                             # ... the later ones ORed in
        if w == MASK64:                         # (set's conversion, at the word's last bit)
            buf.pop()
            buf[e.rlw] = _with_literal_words(buf[e.rlw], literal_words(buf[e.rlw]) - 1)
            e._add_empty_word(1)
        filled = k + 1
    e.bit_size = bits.bit_length()
    return e


# -- ewah_rlw.c: the run-length-word iterator ewah_xor walks two bitmaps with ------------------------

class _RlwIter:
    __slots__ = ("buffer", "size", "pointer", "literal_word_start", "literal_words", "running_len",
                 "running_bit")

    def __init__(self, e: Ewah) -> None:
        self.buffer = e.buffer
        self.size = len(e.buffer)
        self.pointer = 0
        self.literal_words = self.running_len = self.running_bit = 0
        self._next_word()
        self.literal_word_start = self.pointer - self.literal_words

    def _next_word(self) -> bool:
        if self.pointer >= self.size:
            return False
        w = self.buffer[self.pointer]
        self.literal_words = literal_words(w)
        self.pointer += self.literal_words + 1
        self.running_len = running_len(w)
        self.running_bit = run_bit(w)
        return True

    def word_size(self) -> int:
        return self.running_len + self.literal_words

    def discard_first_words(self, x: int) -> None:
        while x > 0:
            if self.running_len > x:
                self.running_len -= x
                return
            x -= self.running_len
            self.running_len = 0
            discard = self.literal_words if x > self.literal_words else x
            self.literal_word_start += discard
            self.literal_words -= discard
            x -= discard
            if x > 0 or self.word_size() == 0:
                if not self._next_word():
                    break
                self.literal_word_start = self.pointer - self.literal_words

    def discharge(self, out: Ewah, limit: int, negate: int) -> int:
        index = 0
        while index < limit and self.word_size() > 0:
            pl = self.running_len
            if index + pl > limit:
                pl = limit - index
            out.add_empty_words(self.running_bit ^ negate, pl)
            index += pl
            pd = self.literal_words
            if pd + index > limit:
                pd = limit - index
            out.add_dirty_words(self.buffer, self.literal_word_start, pd, negate)
            self.discard_first_words(pd + pl)
            index += pd
        return index


_NO_LIMIT = (1 << 64) - 1


def xor(a: Ewah, b: Ewah) -> Ewah:
    """``ewah_xor(a, b, out)``: git's encoding of a XOR b."""
    out = Ewah()
    i = _RlwIter(a)
    j = _RlwIter(b)
    while i.word_size() > 0 and j.word_size() > 0:
        while i.running_len > 0 or j.running_len > 0:
            if i.running_len < j.running_len:
                prey, predator = i, j
            else:
                prey, predator = j, i
            negate = 1 if predator.running_bit else 0
            index = prey.discharge(out, predator.running_len, negate)
            out.add_empty_words(negate, predator.running_len - index)
            predator.discard_first_words(predator.running_len)
        literals = min(i.literal_words, j.literal_words)
        if literals:
            ib, jb, si, sj = i.buffer, j.buffer, i.literal_word_start, j.literal_word_start
            for k in range(literals):
                out.add(ib[si + k] ^ jb[sj + k])
            i.discard_first_words(literals)
            j.discard_first_words(literals)
    if i.word_size() > 0:
        i.discharge(out, _NO_LIMIT, 0)
    else:
        j.discharge(out, _NO_LIMIT, 0)
    out.bit_size = max(a.bit_size, b.bit_size)
    return out


def parse(data: bytes, offset: int = 0) -> tuple[Ewah, int]:
    """Read one serialized EWAH at ``offset``; returns it and the offset past it. ValueError if it is cut off
    or its run-length-word position is out of range (the caller names the file)."""
    if offset + 8 > len(data):
        raise ValueError(f"EWAH header cut off at offset {offset}")
    bit_size, count = struct.unpack_from(">II", data, offset)
    end = offset + 8 + 8 * count + 4
    if end > len(data):
        raise ValueError(f"EWAH of {count} words at offset {offset} runs past the end ({len(data)} bytes)")
    words = array("Q")
    words.frombytes(data[offset + 8:offset + 8 + 8 * count])
    words.byteswap()
    (rlw,) = struct.unpack_from(">I", data, end - 4)
    if count and rlw >= count:
        raise ValueError(f"EWAH at offset {offset}: run-length word position {rlw} past its {count} words")
    e = Ewah()
    e.buffer = list(words) if count else [0]
    e.rlw = rlw
    e.bit_size = bit_size
    return e, end


__all__ = ["Ewah", "from_words", "from_int", "from_int_as_set", "int_words", "xor", "parse"]
