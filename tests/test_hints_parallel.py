"""hints.parallel.run_split: ranges in order, run at once, the first on the calling thread, and a
failing range does not leave the others running."""
import threading
import time

import pytest

from hints.parallel import run_split, split


def test_split_covers_the_range_in_order():
    assert split(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert split(0, 1) == [(0, 0)]


def test_ranges_run_concurrently_and_results_keep_range_order():
    caller = threading.current_thread()
    barrier = threading.Barrier(3, timeout=10)  # passes only if all three ranges run at once

    def fn(r, a, b):
        barrier.wait()
        return r, a, b, threading.current_thread() is caller

    out = run_split(fn, 9, 3)
    assert [o[:3] for o in out] == [(0, 0, 3), (1, 3, 6), (2, 6, 9)]
    assert [o[3] for o in out] == [True, False, False]  # the first range on the caller, the rest on the pool


def test_a_failing_first_range_waits_for_the_others():
    done = []

    def fn(r, a, b):
        if r == 0:
            raise ValueError("range 0 failed")
        time.sleep(0.2)
        done.append(r)

    with pytest.raises(ValueError, match="range 0 failed"):
        run_split(fn, 2, 2)
    assert done == [1]  # range 1 finished before the error reached the caller


def test_a_failing_pool_range_raises_in_the_caller():
    def fn(r, a, b):
        if r == 1:
            raise RuntimeError("range 1 failed")
        return r

    with pytest.raises(RuntimeError, match="range 1 failed"):
        run_split(fn, 4, 2)
