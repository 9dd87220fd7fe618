"""Kinds of hint: length x count bucket x purity bucket, the unit the model learns trust for.

kind = length_index * KINDS_PER_LENGTH + count_bucket * N_PURITY_BUCKETS + purity_bucket

With the default three lengths that is 3 x 7 x 6 = 126 kinds (the article's 126 trust
amounts and trust embeddings). Buckets are computed from integer counts only, so the
Numba lookup and the plain-Python reference agree exactly.
"""
import numba
import numpy as np

# Count buckets: a bucket starts at each edge (inclusive). 1, 2, 3-4, 5-8, 9-16, 17-32, 33+.
# Doubling widths because trust grows roughly with log(count); 33+ lumps the n-grams whose
# two buckets (2 x 176 slots at record geometry) are mostly theirs.
COUNT_BUCKET_EDGES = (1, 2, 3, 5, 9, 17, 33)
N_COUNT_BUCKETS = len(COUNT_BUCKET_EDGES)  # 7

# Purity buckets, as fractions top/count: [0, .3), [.3, .5), [.5, .7), [.7, .9), [.9, 1), exactly 1.
# Written as integer ratios (num, den) so bucketing is exact: purity >= num/den  <=>  top*den >= num*count.
PURITY_BUCKET_EDGES = ((3, 10), (5, 10), (7, 10), (9, 10))
N_PURITY_BUCKETS = len(PURITY_BUCKET_EDGES) + 2  # 6: the four edges, below the first, and "pure"

KINDS_PER_LENGTH = N_COUNT_BUCKETS * N_PURITY_BUCKETS  # 42


def n_kinds(n_lengths):
    return n_lengths * KINDS_PER_LENGTH


_COUNT_EDGES = np.array(COUNT_BUCKET_EDGES, dtype=np.int64)
_PURITY_NUM = np.array([e[0] for e in PURITY_BUCKET_EDGES], dtype=np.int64)
_PURITY_DEN = np.array([e[1] for e in PURITY_BUCKET_EDGES], dtype=np.int64)


@numba.njit(cache=True, inline="always")
def kind_of(length_index, count, top):
    """Kind id of a hint of one length whose n-gram was seen `count` times, `top` of them
    followed by the hinted token (count >= top >= 1)."""
    cb = 0
    for e in range(1, _COUNT_EDGES.shape[0]):
        cb += count >= _COUNT_EDGES[e]
    pb = np.int64(top == count)  # "pure" is one bucket past the last edge, which a pure hint passes too
    for e in range(_PURITY_NUM.shape[0]):
        pb += top * _PURITY_DEN[e] >= _PURITY_NUM[e] * count
    return length_index * KINDS_PER_LENGTH + cb * N_PURITY_BUCKETS + pb


def kind_parts(kind):
    """(length_index, count_bucket, purity_bucket) of a kind id (arrays work too)."""
    kind = np.asarray(kind)
    return kind // KINDS_PER_LENGTH, (kind % KINDS_PER_LENGTH) // N_PURITY_BUCKETS, kind % N_PURITY_BUCKETS


def count_bucket_label(cb):
    lo = COUNT_BUCKET_EDGES[cb]
    if cb + 1 == N_COUNT_BUCKETS:
        return f"{lo}+"
    hi = COUNT_BUCKET_EDGES[cb + 1] - 1
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def purity_bucket_label(pb):
    if pb == N_PURITY_BUCKETS - 1:
        return "1.0"
    edges = [0.0] + [n / d for n, d in PURITY_BUCKET_EDGES] + [1.0]
    return f"[{edges[pb]:.1f},{edges[pb + 1]:.1f})"
