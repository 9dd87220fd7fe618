"""The per-length result of a lookup (Hints: hinted token, count, purity, kind per position and
length), its output arrays, and purity and kind computed from raw counts (as hints.exact needs too).
"""
import dataclasses

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


def lookup_outputs(K, n):
    """A lookup's output arrays, (K, n) each: token, count, top count (int32), purity (float32),
    kind (int16), carved from one allocation. From malloc, not a fresh mapping: once a caller
    has dropped its last result, the allocator hands the same memory back with no page faults
    (a fresh huge-page mapping per call paid them on every lookup)."""
    sizes = [(np.int32, 4), (np.int32, 4), (np.int32, 4), (np.float32, 4), (np.int16, 2)]
    buf = np.empty(sum(b for _, b in sizes) * K * n, dtype=np.uint8)
    out, o = [], 0
    for dtype, b in sizes:
        out.append(buf[o:o + b * K * n].view(dtype).reshape(K, n))
        o += b * K * n
    return out


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
