"""Workers: contiguous ranges of work run on threads that call GIL-free (nogil) Numba kernels,
and the memory they write: per-worker arrays on cache lines of their own, and tables on fresh
anonymous memory with huge pages asked for.

One mechanism serves every parallel step of the index (pre-faulting, sealing and checksums over
partition or word ranges, lookup over position ranges; the two build stages run one worker
per range, and those workers claim their chunks and partitions from shared counters). Ranges
are contiguous and handed out in order, and the claimed work writes places of its own, so
results never depend on thread timing.
"""
import concurrent.futures
import mmap
import threading

import numpy as np

_pools = {}
_lock = threading.Lock()


def _pool(workers):
    with _lock:
        if workers not in _pools:
            _pools[workers] = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="hints")
        return _pools[workers]


def split(n, parts):
    """Bounds of `parts` contiguous ranges covering [0, n), as equal as possible."""
    return [(n * w // parts, n * (w + 1) // parts) for w in range(parts)]


def run_split(fn, n, workers):
    """[fn(r, a, b) for the r-th of `workers` contiguous ranges (a, b) of [0, n)], run
    concurrently (r lets a range use its own scratch). The calling thread runs the first range
    itself, so only the others wait for a pool thread to wake up."""
    ranges = split(n, max(1, min(workers, n)) if n else 1)
    futures = [_pool(len(ranges) - 1).submit(fn, r, a, b) for r, (a, b) in enumerate(ranges) if r]
    try:
        first = fn(0, *ranges[0])
    finally:
        rest = [f.result() for f in futures]  # wait for them even if the first range failed
    return [first] + rest


def run_ranges(fn, n, workers):
    """[fn(a, b) for each of `workers` contiguous ranges of [0, n)], run concurrently."""
    return run_split(lambda r, a, b: fn(a, b), n, workers)


def line_aligned(shape, dtype):
    """A zeroed array that starts on a 64-byte line and is followed by a line of padding, so
    that no other array shares its cache lines (per-worker state: no false sharing)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(nbytes + 128, dtype=np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + nbytes].view(dtype).reshape(shape)


def alloc(shape, dtype):
    """An uninitialised array on fresh anonymous memory, with transparent huge pages asked for
    (fewer TLB misses on the random bucket accesses of stage 2 and lookup)."""
    nbytes = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(buf, dtype=dtype, count=int(np.prod(shape))).reshape(shape)
