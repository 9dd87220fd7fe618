"""Kinds of hint (length x count bucket x purity bucket, the unit the model learns trust for), and
the record's cells (deepest length x count bin x purity bin): the one owner of both numberings.

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


# ---- cells: the record's representation (one hint per position, at its deepest match) ----------
# cell = depth * CELLS_PER_DEPTH + count bin * N_CELL_PURITY_BINS + purity bin, where depth indexes
# the lengths (6, 10, 20 -> 0, 1, 2): 3 x 7 x 6 = 126 cells, -1 for "no hint". docs/design.md,
# "Cells", says what depth, count and purity are.
# Count bins start at 1 and at each edge (inclusive): 1 | 2 | 3-4 | 5-8 | 9-16 | 17-32 | 33+, the
# same doubling widths as the per-length kinds above (the record's edges are the same numbers).
CELL_COUNT_EDGES = (2, 3, 5, 9, 17, 33)
N_CELL_COUNT_BINS = len(CELL_COUNT_EDGES) + 1  # 7
# Purity bins (top follower's share of the count): <.3 | .3-.5 | .5-.7 | .7-.85 | .85-.95 | >=.95,
# each edge inclusive: the record's edges, finer near 1 than the per-length kinds' (0.9 and "pure").
CELL_PURITY_EDGES = (0.3, 0.5, 0.7, 0.85, 0.95)
# The same edges as exact integer ratios (num, den): share >= num/den <=> top * den >= num * count,
# so the Numba code and the plain-Python reference bin alike (a float share can round across an edge).
CELL_PURITY_RATIOS = ((3, 10), (1, 2), (7, 10), (17, 20), (19, 20))
N_CELL_PURITY_BINS = len(CELL_PURITY_EDGES) + 1  # 6
CELLS_PER_DEPTH = N_CELL_COUNT_BINS * N_CELL_PURITY_BINS  # 42
assert all(abs(n / d - e) < 1e-12 for (n, d), e in zip(CELL_PURITY_RATIOS, CELL_PURITY_EDGES))

_CELL_COUNT_EDGES = np.array(CELL_COUNT_EDGES, dtype=np.int64)
_CELL_PURITY_NUM = np.array([r[0] for r in CELL_PURITY_RATIOS], dtype=np.int64)
_CELL_PURITY_DEN = np.array([r[1] for r in CELL_PURITY_RATIOS], dtype=np.int64)


def n_cells(n_lengths):
    """Cells of a representation over `n_lengths` lengths (126 for three)."""
    return n_lengths * CELLS_PER_DEPTH


@numba.njit(cache=True, inline="always")
def cell_one(depth, count, top):
    """Cell of one position: deepest matching length index `depth` (-1: none), `count` candidates,
    `top` of them followed by the most frequent follower (count >= top >= 1)."""
    if depth < 0:
        return -1
    cb = 0
    for e in range(_CELL_COUNT_EDGES.shape[0]):
        cb += count >= _CELL_COUNT_EDGES[e]
    pb = 0
    for e in range(_CELL_PURITY_NUM.shape[0]):
        pb += top * _CELL_PURITY_DEN[e] >= _CELL_PURITY_NUM[e] * count
    return depth * CELLS_PER_DEPTH + cb * N_CELL_PURITY_BINS + pb


def cell_of(depth, count, top_count):
    """int16 cells of arrays (depth, count, top follower's count); -1 where depth < 0."""
    depth, count, top = (np.asarray(a, dtype=np.int64) for a in (depth, count, top_count))
    cb = (count[..., None] >= _CELL_COUNT_EDGES).sum(-1)
    pb = (top[..., None] * _CELL_PURITY_DEN >= _CELL_PURITY_NUM * count[..., None]).sum(-1)
    out = depth * CELLS_PER_DEPTH + cb * N_CELL_PURITY_BINS + pb
    return np.where(depth < 0, -1, out).astype(np.int16)


def cell_parts(cell):
    """(depth, count bin, purity bin) of a cell id (arrays work too)."""
    cell = np.asarray(cell)
    return cell // CELLS_PER_DEPTH, (cell % CELLS_PER_DEPTH) // N_CELL_PURITY_BINS, cell % N_CELL_PURITY_BINS


def cell_count_label(cb):
    lo = 1 if cb == 0 else CELL_COUNT_EDGES[cb - 1]
    if cb + 1 == N_CELL_COUNT_BINS:
        return f"{lo}+"
    hi = CELL_COUNT_EDGES[cb] - 1
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def cell_purity_label(pb):
    edges = (0.0,) + CELL_PURITY_EDGES + (1.0,)
    return f"[{edges[pb]:.2f},{edges[pb + 1]:.2f}{']' if pb + 1 == N_CELL_PURITY_BINS else ')'}"
