"""A fresh index's table is faulted in when it is made (prefault=True, the default for large
tables): every page resident before any add(), all zeros, and what it builds and answers is
what an index faulted at first write builds and answers, and the plain-Python replay's bytes."""
import ctypes
import mmap
import os

import numpy as np
import pytest

from hints import Geometry, HintIndex
from hints.index import memory
from hints.index.hint_index import PREFAULT_MIN_BYTES
from hints.index.reference import reference_slots
from hints.parallel import alloc
from streams import phrase_stream


_libc = ctypes.CDLL(None, use_errno=True)


def resident_bytes(a):
    """Bytes of the pages under array `a` that are in memory (mincore(2), a page at a time)."""
    lo = a.ctypes.data - a.ctypes.data % mmap.PAGESIZE
    n = -(-(a.ctypes.data + a.nbytes - lo) // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * n)()
    if _libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(n * mmap.PAGESIZE), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vec) * mmap.PAGESIZE


GEOM = Geometry(3, 8, 32, (6, 10, 20))  # 512 KiB: small enough for a test, many pages


@pytest.mark.parametrize("workers", [1, 2])
def test_prefaulted_table_is_resident_zeros_and_builds_the_same_bytes(workers):
    stream = phrase_stream(3, 20000, 16, 200, 12)
    fill, table, dropped = reference_slots(GEOM, stream)
    assert dropped > 0  # the drop order is part of what must agree
    idx = HintIndex(GEOM, workers=workers, prefault=True)
    pf = idx.prefault
    assert pf["workers"] == workers and pf["how"] in ("populate", "touch") and pf["bytes"] >= GEOM.table_bytes
    assert resident_bytes(idx.table) >= GEOM.table_bytes  # faulted in now, not by the first add
    assert not idx.table.any() and not idx.fill.any()
    lazy = HintIndex(GEOM, workers=workers, prefault=False)
    assert lazy.prefault is None and resident_bytes(lazy.table) < GEOM.table_bytes
    query = phrase_stream(4, 3000, 16, 200, 12)
    for part in np.array_split(stream, 3):
        idx.add(part)
        lazy.add(part)
    assert idx.table.tobytes() == lazy.table.tobytes() == table.tobytes()
    assert idx.fill.tobytes() == lazy.fill.tobytes() == fill.tobytes()
    assert idx.dropped == lazy.dropped == dropped
    a, b = idx.lookup(query), lazy.lookup(query)
    for field in ("token", "count", "purity", "kind"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field


def test_touch_fallback_faults_in_zeros():
    """Kernels before 5.14 have no MADV_POPULATE_WRITE: each page is touched instead, on every thread."""
    a = alloc((3 * memory.HUGE_PAGE_BYTES // 8 + 5,), np.uint64)
    assert resident_bytes(a) < a.nbytes
    pf = memory.prefault([a], 2, how="touch")
    assert pf["how"] == "touch" and pf["workers"] == 2
    assert resident_bytes(a) >= a.nbytes - mmap.PAGESIZE and not a.any()


def test_large_tables_are_prefaulted_by_default_small_ones_at_first_write():
    big = Geometry(4, 13, 64, (6, 10, 20))
    assert big.table_bytes == PREFAULT_MIN_BYTES  # the smallest table pre-faulted by default
    idx = HintIndex(big, workers=2)
    assert idx.prefault is not None and resident_bytes(idx.table) >= big.table_bytes and not idx.table[::997].any()
    del idx
    assert HintIndex(GEOM).prefault is None


def test_a_file_descriptor_is_always_prefaulted():
    fd = os.memfd_create("test-prefault-false", os.MFD_CLOEXEC)
    try:
        with pytest.raises(ValueError, match="prefault=False with file descriptor"):
            HintIndex(GEOM, path=fd, prefault=False)
    finally:
        os.close(fd)
