"""The per-length result of a lookup (Hints: hinted token, count, purity, kind per position and
length), its output arrays, and purity and kind computed from raw counts (as hints.exact needs too).
"""
import dataclasses
import sys
import threading

import numba
import numpy as np

from ..kinds import kind_of


@dataclasses.dataclass
class Hints:
    """Per position and length: hinted token (-1 none), n-gram count, purity, kind (-1 none)."""

    token: np.ndarray   # int32  (n_lengths, n)
    count: np.ndarray   # int32  (n_lengths, n)
    purity: np.ndarray  # float32 (n_lengths, n)
    kind: np.ndarray    # int16  (n_lengths, n)


OUTPUT_TYPES = (np.int32, np.int32, np.int32, np.float32, np.int16)  # token, count, top count, purity, kind
OUTPUT_BYTES = sum(np.dtype(t).itemsize for t in OUTPUT_TYPES)     # per position and length
# An index keeps the memory of its last KEPT_OUTPUTS lookups' outputs: `h = index.lookup(x)` in a
# loop still holds one result while the next is made, and lets go of the one before.
KEPT_OUTPUTS = 2


def lookup_outputs(K, n, buf=None):
    """A lookup's output arrays, (K, n) each: token, count, top count (int32), purity (float32),
    kind (int16), carved from one allocation (`buf`, uint8, at least OUTPUT_BYTES x K x n, or new)."""
    buf = np.empty(OUTPUT_BYTES * K * n, dtype=np.uint8) if buf is None else buf
    out, o = [], 0
    for dtype in OUTPUT_TYPES:
        b = np.dtype(dtype).itemsize * K * n
        out.append(buf[o:o + b].view(dtype).reshape(K, n))
        o += b
    return out


class OutputMemory:
    """The memory of an index's lookup outputs, handed out again once no result refers to it.

    Memory new to the process (a large allocation is a fresh mapping) is faulted in page by page
    by the lookup's workers as they write their results. On the standard-library validation
    split (905k positions, 49 MB of outputs) a sealed lookup on 2 workers ran at 1.80x of one
    into new memory and at 2.07x into memory written before, and 1.25x faster (Intel Xeon,
    2026-12-07, 7 alternated repeats). So the index keeps its last KEPT_OUTPUTS buffers, and a
    lookup takes one that no array views any more (its only references are this pool's: every
    view of it, and every view of a view, holds a reference to it), else a new one. A result a
    caller holds is never written again."""

    def __init__(self):
        self._kept = []  # oldest first
        self._lock = threading.Lock()

    def outputs(self, K, n):
        """lookup_outputs(K, n) in kept memory no result refers to, or in new memory."""
        nbytes = OUTPUT_BYTES * K * n
        with self._lock:
            for i in range(len(self._kept)):
                # references: the list's and getrefcount's own argument; any more are views of it
                if self._kept[i].nbytes >= nbytes and sys.getrefcount(self._kept[i]) == 2:
                    buf = self._kept.pop(i)
                    break
            else:
                buf = np.empty(nbytes, dtype=np.uint8)
            self._kept = (self._kept + [buf])[-KEPT_OUTPUTS:]
            return lookup_outputs(K, n, buf)


def hints_from_counts(tok, cnt, top):
    """Raw counts (hinted token, count, the hinted token's count; (K, n) each) -> the public Hints
    with purity and kind, exactly as lookup makes them (hints.exact uses it)."""
    K, n = tok.shape
    purity = np.empty((K, n), dtype=np.float32)
    kind = np.empty((K, n), dtype=np.int16)
    purity_kinds(0, n, cnt, top, purity, kind)
    return Hints(token=tok, count=cnt, purity=purity, kind=kind)


@numba.njit(cache=True, nogil=True)
def purity_kinds(t0, t1, cnt, top, purity, kind):
    """purity = top / count (float64 division rounded to float32, as NumPy does) and kind, or
    0 and -1 where the n-gram is absent, for positions t0..t1-1. Branch-free (both are computed
    for every entry, absent ones on a count of 1): a branch on presence mispredicts on real
    lookups, where found and absent n-grams alternate."""
    for k in range(cnt.shape[0]):
        c_row, t_row = cnt[k, t0:t1], top[k, t0:t1]  # slices: no gathers (lookup.gather_run says why)
        p_row, k_row = purity[k, t0:t1], kind[k, t0:t1]
        for t in range(c_row.shape[0]):
            found = c_row[t] > 0
            c = max(c_row[t], 1)
            p = np.float32(np.float64(t_row[t]) / np.float64(c))
            kd = kind_of(k, c, t_row[t])
            p_row[t] = p if found else np.float32(0)
            k_row[t] = kd if found else -1
