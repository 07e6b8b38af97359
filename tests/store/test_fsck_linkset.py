"""The fsck link sets as packed ids: the same answers as a Python set, the C folding the same bytes
as its Python specification."""
from __future__ import annotations

import os
import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packyard.store.fsck import linkset
from packyard.store.fsck.linkset import LinkSet, difference20_py, select20_py, sort_unique20_py

ids = st.lists(st.binary(min_size=20, max_size=20), max_size=300)
# few distinct values, so repeats and overlaps are common
small_ids = st.lists(st.sampled_from([bytes([i]) * 20 for i in range(12)]), max_size=60)
# long shared prefixes, so the C radix sort recurses byte after byte down to the last one
prefixed_ids = st.lists(st.builds(lambda k, tail: b"\xab" * k + tail[k:], st.integers(0, 20),
                                  st.binary(min_size=20, max_size=20)), max_size=300)


@settings(max_examples=200, deadline=None)
@given(a=st.one_of(ids, small_ids), b=st.one_of(ids, small_ids), fold_at=st.sampled_from([20, 60, 1 << 20]))
def test_linkset_answers_as_a_set(a, b, fold_at):
    old = linkset.FOLD_AT
    linkset.FOLD_AT = fold_at
    try:
        s = LinkSet()
        for x in a:
            s.add(x)
        t = LinkSet(b)
        assert list(s) == sorted(set(a))
        assert len(s) == len(set(a))
        assert s == set(a)
        for x in a + b:
            assert (x in s) == (x in set(a))
        s.merge(t)
        assert list(s) == sorted(set(a) | set(b))
        s.discard_packed(b"".join(sorted(set(b))))
        assert list(s) == sorted(set(a) - set(b))
        back = pickle.loads(pickle.dumps(s))
        assert isinstance(back, LinkSet) and list(back) == list(s)
        back.update_packed(b"".join(b))
        assert list(back) == sorted((set(a) - set(b)) | set(b))
    finally:
        linkset.FOLD_AT = old


@pytest.mark.skipif(linkset._C is None, reason="the _fsck extension is not built (or PACKYARD_PURE_PYTHON=1)")
@settings(max_examples=200, deadline=None)
@given(a=st.one_of(ids, small_ids, prefixed_ids), b=st.one_of(ids, small_ids, prefixed_ids),
       types=st.binary(max_size=300))
def test_c_folding_gives_the_specifications_bytes(a, b, types):
    c = linkset._C
    pa, pb = b"".join(a), b"".join(b)
    assert c.sort_unique20(pa) == sort_unique20_py(pa)
    ua, ub = sort_unique20_py(pa), sort_unique20_py(pb)
    assert c.difference20(ua, ub) == difference20_py(ua, ub)
    for t in (1, 2, 3, 4):
        assert c.select20(pa, types, t) == select20_py(pa, types, t)


@pytest.mark.skipif(linkset._C is None, reason="the _fsck extension is not built (or PACKYARD_PURE_PYTHON=1)")
def test_c_sort_of_a_large_run_with_repeats_gives_the_specifications_bytes():
    rng = random.Random(7)
    pool = [rng.randbytes(20) for _ in range(50_000)] + [b"\x00" * 19 + bytes([i]) for i in range(256)]
    packed = b"".join(rng.choice(pool) for _ in range(300_000))
    assert linkset._C.sort_unique20(packed) == sort_unique20_py(packed)


def test_bad_lengths_are_refused():
    for fn in (sort_unique20_py, linkset.sort_unique20):
        with pytest.raises(ValueError):
            fn(b"x" * 21)
    for fn in (difference20_py, linkset.difference20):
        with pytest.raises(ValueError):
            fn(b"x" * 20, b"y" * 19)
    with pytest.raises(ValueError):
        LinkSet().update_packed(b"z" * 39)


def test_a_large_set_folds_and_stays_compact():
    rng = random.Random(int(os.environ.get("PACKYARD_TEST_SEED", "7")))
    pool = [rng.randbytes(20) for _ in range(60_000)]
    s = LinkSet()
    for i in range(0, 200_000, 50):
        s.update(pool[(i * 7919 + k) % len(pool)] for k in range(50))   # repeats across batches
        # folded as it goes: pending never outgrows the sorted part (or the fold threshold) by more than a batch
        assert len(s._pending) < max(linkset.FOLD_AT, len(s._sorted)) + 50 * 20
    want = sorted(set(pool))
    assert len(s) == len(want)
    assert s.packed() == b"".join(want)
    assert len(pickle.dumps(s)) < 20 * len(want) + 100     # 20 bytes an id, not a set of objects
