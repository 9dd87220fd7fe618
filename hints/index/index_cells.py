"""Cells from a HintIndex (the background / validation index, growing or sealed).

A HintIndex stores every occurrence of every n-gram (its slots, in the n-gram's two buckets),
with no position, so its cells have no position filter and no cap: the deepest length whose
n-gram the index holds, that n-gram's stored occurrences, and their followers. The per-length
lookup (`HintIndex.lookup_counts`, lengths that would cross a document boundary dropped) finds
the deepest length and its answer, which is all of the cell when that n-gram is pure or one
follower is kept; else `followers_kernel` gathers the n-gram's slots from its buckets (the first,
and the second once the first is full, as every lookup does) and counts their followers. A
sealed index's buckets hold the same slots, sorted, so the same scan serves both.

Where nothing was dropped and no checksum collided, the cells equal
`hints.index.reference.reference_cells(train, query, cap=None)` (a test checks it). N-grams that span a
document boundary are never looked up, so whether the index stored them does not change a cell.
"""
import numba
import numpy as np

from ..cells import (BOS, NO_BOUNDARY, N_TOKEN_IDS, check_boundary, check_max_followers, empty_cells, reach,
                    top_followers, with_kinds)
from ..parallel import run_split
from .hashing import bucket_pair, init_states, slot_key


@numba.njit(cache=True, nogil=True)
def followers_kernel(t0, t1, q, depth, cnt, tok, top, table, fill, lengths, pows, partition_bits, bucket_bits, bits,
                     shifts, count, out_tok, out_cnt):
    """For each position t in [t0, t1) with depth[t] = d >= 0: the followers of its n-gram of length lengths[d].
    The per-length lookup's answer (count cnt[d, t], top follower tok[d, t] with top[d, t] of them)
    is all of it when the n-gram is pure or one follower is kept; else all its slots are gathered
    from its buckets and their followers counted, the F most frequent kept."""
    K = lengths.shape[0]
    slots = table.shape[2]
    F = out_tok.shape[1]
    r = np.zeros(K, np.uint64)
    toks = np.empty(2 * slots, np.int64)
    counter = np.zeros(N_TOKEN_IDS, np.int32)
    for t in range(t0, t1):
        for f in range(F):
            out_tok[t, f] = -1
            out_cnt[t, f] = 0
        d = depth[t]
        if d < 0:
            count[t] = 0
            continue
        if F == 1 or top[d, t] == cnt[d, t]:
            count[t] = cnt[d, t]
            out_tok[t, 0] = tok[d, t]
            out_cnt[t, 0] = top[d, t]
            continue
        j = t + 1  # the slot of the n-gram ending at q[t] sits at stream position t + 1
        init_states(r, q, j, lengths)
        part, c0, key = slot_key(r, j, lengths, pows, partition_bits, bits, shifts)
        b1, b2 = bucket_pair(c0, bucket_bits)
        sh = np.uint64(shifts[d])
        qk = key >> sh
        m = 0
        f1 = np.int64(fill[part, b1])
        for i in range(f1):
            s = table[part, b1, i]
            if (s >> sh) == qk:
                toks[m] = np.int64(s & np.uint64(0xFFFF))
                m += 1
        if f1 >= slots:  # the second bucket holds an n-gram's slots only once the first is full
            for i in range(np.int64(fill[part, b2])):
                s = table[part, b2, i]
                if (s >> sh) == qk:
                    toks[m] = np.int64(s & np.uint64(0xFFFF))
                    m += 1
        count[t] = m
        top_followers(toks, m, F, out_tok, out_cnt, t, counter)


def index_cells(idx, q, max_followers=8, boundary=BOS):
    """Cells of every position of `q` (a 1-D uint16 array, checked by the caller: HintIndex.lookup_cells)
    from HintIndex `idx` (one segment: n-grams restart at its start and at every `boundary` token;
    None: only at its start)."""
    F = check_max_followers(max_followers)
    b = check_boundary(boundary)
    n = q.size
    if n == 0:
        return empty_cells(0, F)
    g = idx.geom
    tok, cnt, top = idx.lookup_counts(q)
    if b != NO_BOUNDARY:  # the boundary rule: a length whose n-gram would cross a boundary is absent
        cnt = np.where(reach(q, b, limit=max(g.lengths))[None, :] < idx._lengths[:, None], 0, cnt)
    present = cnt > 0  # (K, n)
    K = present.shape[0]
    deepest = np.where(present.any(0), K - 1 - np.argmax(present[::-1], axis=0), -1).astype(np.int8)
    count = np.zeros(n, np.int32)
    out_tok = np.empty((n, F), np.int32)
    out_cnt = np.empty((n, F), np.int32)
    run_split(lambda r, t0, t1: followers_kernel(t0, t1, q, deepest, cnt, tok, top, idx.table, idx.fill, idx._lengths,
                                                 idx._pows, g.partition_bits, g.bucket_bits, idx._bits, idx._shifts,
                                                 count, out_tok, out_cnt), n, idx.workers)
    return with_kinds(deepest, count, out_tok, out_cnt)
