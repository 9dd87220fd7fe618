"""Workers: contiguous ranges of work run on threads that call GIL-free (nogil) Numba kernels.

One mechanism serves every parallel step of the index (pre-faulting, stage 1 over stream
ranges, stage 2 over partition ranges, lookup over position ranges, checksums). Ranges are
contiguous and handed out in order, so results never depend on thread timing.
"""
import concurrent.futures
import threading

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


def run_ranges(fn, n, workers):
    """[fn(a, b) for each of `workers` contiguous ranges of [0, n)], run concurrently."""
    ranges = split(n, max(1, min(workers, n)) if n else 1)
    if len(ranges) == 1:
        return [fn(*ranges[0])]
    futures = [_pool(len(ranges)).submit(fn, a, b) for a, b in ranges]
    return [f.result() for f in futures]
