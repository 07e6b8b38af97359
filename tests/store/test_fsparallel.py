"""store.fsparallel: independent filesystem calls issued together (over NFS each is a round trip)."""
from __future__ import annotations

import threading
import time

import pytest

from packyard.store import fsparallel


def test_results_come_in_the_items_order_whatever_order_the_calls_end_in() -> None:
    def slow_first(i: int) -> int:
        time.sleep(0.05 if i == 0 else 0)   # (the first call ends last)
        return i * i

    assert fsparallel.each(slow_first, range(20), threads=8) == [i * i for i in range(20)]


def test_every_call_runs_to_its_end_before_the_first_error_is_raised() -> None:
    done: list[int] = []
    lock = threading.Lock()

    def call(i: int) -> int:
        if i in (3, 7):
            raise FileNotFoundError(i, "gone")
        time.sleep(0.01)
        with lock:
            done.append(i)
        return i

    with pytest.raises(FileNotFoundError) as exc:
        fsparallel.each(call, range(12), threads=4)
    assert exc.value.errno == 3                      # the first in the items' order
    assert sorted(done) == [i for i in range(12) if i not in (3, 7)]


def test_at_most_threads_calls_are_in_flight_and_they_do_overlap() -> None:
    lock = threading.Lock()
    now, peak = [0], [0]

    def call(_i: int) -> None:
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.02)        # a round trip: the GIL is free meanwhile
        with lock:
            now[0] -= 1

    fsparallel.each(call, range(40), threads=5)
    assert 2 <= peak[0] <= 5


def test_few_items_or_one_thread_run_in_the_caller_s_thread() -> None:
    me = threading.get_ident()
    assert fsparallel.each(lambda _i: threading.get_ident(), range(fsparallel.MIN_PARALLEL_ITEMS - 1)) == \
        [me] * (fsparallel.MIN_PARALLEL_ITEMS - 1)
    assert set(fsparallel.each(lambda _i: threading.get_ident(), range(50), threads=1)) == {me}


def test_on_a_local_filesystem_the_calls_run_one_after_the_other(tmp_path) -> None:
    """Where a call takes microseconds (ext4, tmpfs, ...), threads would only add their own cost."""
    assert not fsparallel.is_shared(str(tmp_path))
    me = threading.get_ident()
    assert set(fsparallel.each(lambda _i: threading.get_ident(), range(50), where=tmp_path, threads=8)) == {me}
    assert not fsparallel.is_shared(str(tmp_path / "not-there"))   # (unopenable: not remembered, not shared)


def test_steps_together_run_one_after_the_other_on_a_local_filesystem_in_order(tmp_path) -> None:
    me, ran = threading.get_ident(), []

    def step(n: int):
        def run() -> tuple[int, int]:
            ran.append(n)
            return n, threading.get_ident()
        return run

    assert fsparallel.together(step(1), step(2), step(3), where=tmp_path) == [(1, me), (2, me), (3, me)]
    assert ran == [1, 2, 3]
    assert fsparallel.together(where=tmp_path) == []


def test_every_step_together_runs_to_its_end_before_the_first_error_is_raised(tmp_path) -> None:
    ran: list[str] = []

    def fails(name: str):
        def run() -> None:
            ran.append(name)
            raise FileNotFoundError(name)
        return run

    with pytest.raises(FileNotFoundError) as exc:
        fsparallel.together(fails("a"), lambda: ran.append("b"), fails("c"), where=tmp_path)
    assert exc.value.args == ("a",) and ran == ["a", "b", "c"]
