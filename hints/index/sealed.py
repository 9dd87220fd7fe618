"""Numba kernels of the sealed hashed index: sealing (sorted buckets, summaries, the side table) and its search.

Sealing (`seal_partitions`) sorts each bucket's slots as uint64 words. A slot is
[checksum(L0) | checksum(L1) | ... | token] from the top bit down, so the order is by the key of
every length at once: the slots of one n-gram of any length form one contiguous run, the run of
a longer n-gram lies inside the run of its shorter suffix, and the slots of the longest n-gram
are sorted by follower token. Each bucket gets a summary row (one cache line for S <= 184): its
fill, per line of 8 slots the top 16 bits of the line's first slot (a fence), and a presence
filter (FILTER_WORDS).

The search (`lookup_sorted`) answers what the scan of a growing index answers
(`hints.index.lookup`). It reads the summary: a clear filter bit says the n-gram is absent, and
no slot line is read; else the fences name the slot lines where the shortest n-gram's run can
lie (usually one or two), and the runs of all lengths are found by binary search (or, in a
short range, by counting), nested. The n-gram count is the run's length. The most frequent
follower comes from the few tokens of a short run (< SIDE_MIN_COUNT slots), and for a long run
from the side table: for every n-gram with at least SIDE_MIN_COUNT slots, sealing stores
(length index << 48 | key) -> (top count << 16 | top token) in a per-partition open-addressing
table (linear probing, at most half full).
"""
import numba
import numpy as np

from ..numba_ops import atomic_add, fmix64, prefetch3, unmanaged
from .geometry import CHECKSUM_BITS, CHECKSUM_TOTAL_BITS, MAX_LENGTHS, SLOTS_PER_LINE
from .hashing import bucket_pair
from .results import purity_kinds
from .lookup import (GROUP_BLOCK, PREFETCH_GROUP, TOKEN_MASK, answer, answer_parts, clear_outputs, count_range,
                     entry_partition, sort_block, top_of_run, top_of_sorted)

U64 = np.uint64
NO_KEY = U64(1 << CHECKSUM_TOTAL_BITS)  # a query key no slot key (< 2^48) can equal
UNUSED_SHIFT = 63                       # shift of lengths a geometry lacks: slot >> 63 is 0 or 1, never NO_KEY

# Sealed index: n-grams with at least this many slots get a side-table entry. At 16 a
# counted run is at most two cache lines of slots; the side table holds at most
# n_lengths / 16 entries per slot, in practice far fewer.
SIDE_MIN_COUNT = 16
SIDE_LEVEL_SHIFT = U64(CHECKSUM_TOTAL_BITS)  # side key = length index << 48 | nested key
SIDE_LOAD = 2                                # side-table capacity >= 2 x entries (linear probing stays short)
# Sealed bucket summary: one uint16 row per bucket, [fill, fence of line 0, line 1, ..., filter],
# where a line's fence is the top 16 bits of its first slot (the top of the shortest length's
# checksum). Rows are padded to whole 64-byte lines: one line for up to 23 slot lines (S <= 184).
FENCE_BITS = 16
FENCE_SHIFT = U64(64 - FENCE_BITS)
assert min(b[0] for b in CHECKSUM_BITS.values()) >= FENCE_BITS  # a fence is part of the shortest length's checksum
SUMMARY_ALIGN = 32  # uint16 words per 64-byte line
# Sealed bucket presence filter: FILTER_WORDS uint16 words (2^FILTER_LOG_BITS bits) after the
# fences, one bit set per distinct shortest checksum in the bucket (a multiply-shift hash of it,
# independent of the bucket's own). A lookup whose bit is clear knows the n-gram is absent
# without reading a slot line. With S = 176 the row still fits one line (1 + 22 + 8 words).
FILTER_WORDS = 8
FILTER_LOG_BITS = 7
FILTER_MULT = U64(0x9E3779B97F4A7C15)  # odd (2^64 / golden ratio), unlike the bucket hash's multiplier
# A sealed lookup's workers claim blocks of positions in turn (search_claimed), blocks that shrink
# as the query is used up (guided scheduling): each a 1/(SEARCH_SHARE x workers) share of the
# positions left, at most one sort block of lookup_sorted (which starts afresh at each) and at
# least SEARCH_MIN_BLOCK. Blocks of one size (a quarter of a worker's share, 8 of 14.5k for the
# prose split's 116k positions on 2 workers) left one worker alone for the last ~2 ms of ~10:
# the cost of a block depends on its text.
SEARCH_BLOCK = GROUP_BLOCK
SEARCH_SHARE = 2
SEARCH_MIN_BLOCK = 4096
LINEAR_BOUNDS = 16  # ranges of up to 16 slots (two lines) are counted, longer ones binary-searched
INSERTION_SORT_MAX = 32  # sealing sorts buckets of up to 32 slots by insertion, longer ones by ndarray.sort


def summary_words(slots):
    """uint16 words of one bucket's summary row: the fill, one fence per slot line, the presence
    filter (FILTER_WORDS), padded."""
    lines = -(-slots // SLOTS_PER_LINE)
    return -(-(1 + lines + FILTER_WORDS) // SUMMARY_ALIGN) * SUMMARY_ALIGN


@numba.njit(cache=True, inline="always")
def filter_word_bit(c0, slots):
    """(word of the summary row, bit in it) of shortest checksum c0 in a bucket's presence filter,
    which follows the row's fences (slots // SLOTS_PER_LINE of them)."""
    h = np.int64((c0 * FILTER_MULT) >> U64(64 - FILTER_LOG_BITS))
    return 1 + slots // SLOTS_PER_LINE + (h >> 4), U64(h & 15)


# ---- the query's keys ------------------------------------------------------------------------

@numba.njit(cache=True, inline="always")
def query_keys(key, j, lengths, sh, qk):
    """qk[k] = the nested key of length k at stream position j (NO_KEY where j < L_k, and for
    lanes past the geometry's lengths). Returns the number of lengths present."""
    valid = 0
    for k in range(MAX_LENGTHS):
        qk[k] = NO_KEY
    for k in range(lengths.shape[0]):
        if j >= lengths[k]:
            qk[k] = key >> sh[k]
            valid += 1
    return valid


# ---- sealing ----------------------------------------------------------------------------------

@numba.njit(cache=True, inline="always")
def insertion_sort(a, n):
    """Sort a[:n] in place: for the short runs of sealing and of a lookup, fewer moves than
    a general sort."""
    for i in range(1, n):
        v = a[i]
        j = i - 1
        while j >= 0 and a[j] > v:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = v


@numba.njit(cache=True, inline="always")
def lower_bound(row, base, n, x):
    """First index i in [base, base+n] with row[i] >= x, row[base:base+n] sorted. The iteration
    count depends on n only; each step's select compiles to a conditional jump (LLVM's choice
    for a loop-carried select), which lets the core run ahead on the loads: a branch-free step
    (the compare's borrow, masked) made the sealed lookups 1.09x (prose) and 1.25x (stdlib)
    slower."""
    if n == 0:
        return base
    while n > 1:
        half = n >> 1
        base += half * np.int64(row[base + half - 1] < x)
        n -= half
    return base + np.int64(row[base] < x)


@numba.njit(cache=True, inline="always")
def upper_bound(row, base, n, x):
    """First index i in [base, base+n] with row[i] > x (as lower_bound)."""
    if n == 0:
        return base
    while n > 1:
        half = n >> 1
        base += half * np.int64(row[base + half - 1] <= x)
        n -= half
    return base + np.int64(row[base] <= x)


@numba.njit(cache=True, inline="always")
def side_home(key, mask):
    return np.int64((fmix64(key) & mask))


@numba.njit(cache=True, inline="always")
def side_entries_of_run(run, n, K, shifts, bits, counts, write, side, o, cap):
    """Side-table entries of one shortest-length n-gram's slots run[:n] (sorted): one per
    nested key of each length with >= SIDE_MIN_COUNT slots (and a real checksum). Inserted in
    the partition's table side[2o : 2(o + cap)] when `write`; returns how many there are."""
    found = 0
    for k in range(K):
        sh = U64(shifts[k])
        field_mask = (U64(1) << U64(bits[k])) - U64(1)
        a = 0
        while a < n:
            key = run[a] >> sh
            b = a + 1
            while b < n and (run[b] >> sh) == key:
                b += 1
            # a zero field is "too early for this length": no query asks for it
            if b - a >= SIDE_MIN_COUNT and (k == 0 or (key & field_mask) != U64(0)):
                found += 1
                if write:
                    best_tok, best = top_of_run(run[a:], b - a, counts)
                    skey = (U64(k) << SIDE_LEVEL_SHIFT) | key
                    h = side_home(skey, U64(cap - 1))
                    while side[2 * (o + h) + 1] != U64(0):
                        h = (h + 1) & (cap - 1)
                    side[2 * (o + h)] = skey
                    side[2 * (o + h) + 1] = U64(answer(best_tok, best))
            a = b
    return found


@numba.njit(cache=True, nogil=True)
def seal_partitions(p0, p1, table, fill, bucket_bits, shifts, bits, first_pass, summary, side_off, side, counts, run):
    """Seal partitions p0..p1-1. First pass: sort each bucket's slots, write its summary row, and
    count the partition's side entries into side_off[p + 1]. Second pass (side_off now holds
    each partition's table offset, in entries): insert the entries into side."""
    n_buckets, S = table.shape[1], table.shape[2]
    K = shifts.shape[0]
    sh0 = U64(shifts[0])
    low0 = (U64(1) << sh0) - U64(1)
    table, fill, summary, run = unmanaged(table), unmanaged(fill), unmanaged(summary), unmanaged(run)
    for p in range(p0, p1):
        tp, fp = table[p], fill[p]
        if first_pass:
            for b in range(n_buckets):
                f = np.int64(fp[b])
                if f > INSERTION_SORT_MAX:
                    tp[b, :f].sort()
                else:
                    insertion_sort(tp[b], f)
                sm = summary[p, b]
                sm[:] = 0
                sm[0] = f
                for i in range(0, f, SLOTS_PER_LINE):
                    sm[1 + i // SLOTS_PER_LINE] = np.uint16(tp[b, i] >> FENCE_SHIFT)
                for i in range(f):
                    w, bit = filter_word_bit(tp[b, i] >> sh0, S)
                    sm[w] |= np.uint16(U64(1) << bit)
        o = side_off[p]
        cap = side_off[p + 1] - o
        found = 0
        for b in range(n_buckets):
            f = np.int64(fp[b])
            row = tp[b]
            a = 0
            while a < f:
                c0 = row[a] >> sh0
                e = a + 1
                while e < f and e - a < SIDE_MIN_COUNT and (row[e] >> sh0) == c0:  # most runs are short
                    e += 1
                if e - a == SIDE_MIN_COUNT:
                    e = upper_bound(row, e, f - e, (c0 << sh0) | low0)
                if f < S and e - a < SIDE_MIN_COUNT:  # all of a short run is here: no entry
                    a = e
                    continue
                b1, b2 = bucket_pair(c0, bucket_bits)
                if np.int64(b1) == b:  # an n-gram's slots are read from its first bucket (and its second)
                    n2, lo2 = 0, 0
                    if f >= S:
                        f2 = np.int64(fp[b2])
                        lo2 = lower_bound(tp[b2], 0, f2, c0 << sh0)
                        n2 = upper_bound(tp[b2], lo2, f2 - lo2, (c0 << sh0) | low0) - lo2
                    if e - a + n2 >= SIDE_MIN_COUNT:
                        i, i2, m = a, lo2, 0  # merge the two sorted runs
                        while i < e or i2 < lo2 + n2:
                            if i2 >= lo2 + n2 or (i < e and row[i] <= tp[b2, i2]):
                                run[m] = row[i]
                                i += 1
                            else:
                                run[m] = tp[b2, i2]
                                i2 += 1
                            m += 1
                        found += side_entries_of_run(run, m, K, shifts, bits, counts, not first_pass, side, o, cap)
                a = e
        if first_pass:
            side_off[p + 1] = found


# ---- sealed index: search ---------------------------------------------------------------------

@numba.njit(cache=True, inline="always")
def side_find(side_off, side, part, key):
    """The side-table value of key in partition part (linear probing), or -1."""
    o = side_off[part]
    cap = side_off[part + 1] - o
    if cap == 0:
        return -1
    h = side_home(key, U64(cap - 1))
    while True:
        v = side[2 * (o + h) + 1]
        if v == U64(0):
            return -1
        if side[2 * (o + h)] == key:
            return np.int64(v)
        h = (h + 1) & (cap - 1)


@numba.njit(cache=True, inline="always")
def fence_lines(sm, x):
    """(lines whose fence is below x's top 16 bits, lines whose fence is at most that) among the
    filled lines of a bucket's summary row sm; a vectorised count over the whole row."""
    n_lines = (np.int64(sm[0]) + SLOTS_PER_LINE - 1) // SLOTS_PER_LINE
    top = np.int64(x >> FENCE_SHIFT)
    below = 0
    at_most = 0
    for i in range(1, sm.shape[0]):
        v = np.int64(sm[i]) if i <= n_lines else np.int64(1 << FENCE_BITS)  # past the fill: above any top
        below += np.int64(v < top)
        at_most += np.int64(v <= top)
    return below, at_most


@numba.njit(cache=True, inline="always")
def bounds(row, a, n, x, y):
    """[lo, hi): the slots of row[a:a+n] (sorted) with x <= slot <= y. Short ranges are counted
    (count_range); long ones get two binary searches run in one loop (two independent chains
    of loads; as in lower_bound)."""
    if n <= LINEAR_BOUNDS:
        return count_range(row, a, n, x, y)
    lo = a
    hi = a
    while n > 1:
        half = n >> 1
        lo += half * np.int64(row[lo + half - 1] < x)
        hi += half * np.int64(row[hi + half - 1] <= y)
        n -= half
    return lo + np.int64(row[lo] < x), hi + np.int64(row[hi] <= y)


@numba.njit(cache=True, inline="always")
def fenced_range(f, below, at_most):
    """(start, length) of the slots that can hold a run, from fence_lines: lines below-1 ..
    at_most-1 (lines before hold smaller keys, lines after larger ones)."""
    a = max(below - 1, 0) * SLOTS_PER_LINE
    return a, max(min(at_most * SLOTS_PER_LINE, f) - a, 0)


@numba.njit(cache=True, inline="always")
def bucket_range(table, summary, part, b, key, sh0):
    """(start, length) of the slots of bucket (part, b) of a sealed index that can hold the run
    of `key`'s shortest n-gram, from the bucket's summary row: (0, 0) when the presence filter's
    bit is clear (no slot line is read), else the fenced range, all of whose slot lines are
    prefetched (a binary search over a long range reads lines between its ends, and had
    waited for them: 0.91x on prose with all of them). The fill is clamped to the slots: a
    corrupt summary cannot move a read out of the row."""
    slots = table.shape[2]
    sm = summary[part, b]
    w, bit = filter_word_bit(key >> sh0, slots)
    if not ((U64(sm[w]) >> bit) & U64(1)):
        return 0, 0
    below, at_most = fence_lines(sm, key)
    a, m = fenced_range(min(np.int64(sm[0]), slots), below, at_most)
    for o in range(a, a + m, SLOTS_PER_LINE):  # a starts a line
        prefetch3(table, part, b, o)
    return a, m


@numba.njit(cache=True, inline="always")
def top_follower(toks, n, is_sorted):
    """(most frequent token, its count) of toks[:n] (ties to the smallest id); sorts toks[:n]
    unless is_sorted."""
    if not is_sorted:
        insertion_sort(toks, n)  # n < SIDE_MIN_COUNT
    return top_of_sorted(toks, n)


@numba.njit(cache=True, nogil=True)
def lookup_sorted(t0, t1, q, table, summary, side_off, side, lengths, pows, partition_bits,
                  bucket_bits, bits, shifts, out_token, out_count, out_top, toks, keys, parts, order, spare, hist, prefix,
                  small_i, small_u):
    """lookup_scan's results from a sealed index.

    Positions are hashed and sorted in blocks of GROUP_BLOCK as for lookup_scan (sort_block),
    so buckets are read in address order and a repeated n-gram is searched once (a position
    copies the results of the lengths whose key is the one before's, and searches on inside
    their runs from the first length that differs). In sorted order they go in groups
    of PREFETCH_GROUP through four phases, so that each phase's cache misses overlap across
    the group: (1) hash, prefetch the first bucket's summary line;
    (2) read its filter bit (clear: nothing in this bucket, no slot line read) and its fences,
    prefetch the slot lines where the shortest n-gram's run can lie, and the second
    bucket's summary line when the first is full; (3) the same for the
    second bucket; (4) find the runs of every length (nested: each inside the last): counts
    are run lengths, top followers come from the side table (runs of >= SIDE_MIN_COUNT slots)
    or from the few tokens of a short run. The scratch arrays come from new_scratch.
    """
    K = lengths.shape[0]
    slots = table.shape[2]
    q, table, summary, out_token, out_count, out_top = (unmanaged(q), unmanaged(table), unmanaged(summary),
                                                        unmanaged(out_token), unmanaged(out_count), unmanaged(out_top))
    toks, keys, parts, order, spare, hist, prefix = (unmanaged(toks), unmanaged(keys), unmanaged(parts), unmanaged(order),
                                                     unmanaged(spare), unmanaged(hist), unmanaged(prefix))
    small_i, small_u = unmanaged(small_i), unmanaged(small_u)
    clear_outputs(t0, t1, out_token, out_count, out_top)
    t = max(t0, lengths[0] - 1)
    if t >= t1:
        return
    r, qk, sh, g_key = small_u[0], small_u[1], small_u[2], small_u[3]
    g_idx = small_i[12]  # block index of each position of the group
    sh[:] = UNUSED_SHIFT
    for k in range(K):
        sh[k] = shifts[k]
    lo1, hi1 = small_i[0], small_i[1]  # run of each length in the first bucket ...
    lo2, hi2 = small_i[2], small_i[3]  # ... and in the second
    g_part, g_b1, g_b2 = small_i[4], small_i[5], small_i[6]
    g_f1 = small_i[7]  # fill of the first bucket
    g_a1, g_n1 = small_i[8], small_i[9]  # where the shortest n-gram's run can be, first bucket ...
    g_a2, g_n2 = small_i[10], small_i[11]  # ... and second bucket
    lo1[:] = 0
    hi1[:] = 0
    lo2[:] = 0
    hi2[:] = 0
    g_a2[:] = 0
    g_n2[:] = 0
    sh0 = U64(shifts[0])
    while t < t1:
        n = min(t1 - t, GROUP_BLOCK)
        srt, skeys = sort_block(q, t + 1, n, r, lengths, pows, partition_bits, bucket_bits, bits, shifts, prefix, keys,
                                parts, order, spare, hist)
        prev = -1  # the block index of the last position
        prev_key, prev_part = U64(0), 0
        prev_deepest = K  # its lengths 0..prev_deepest-1 are present (K: none absent)
        for s0 in range(0, n, PREFETCH_GROUP):
            g_n = min(n, s0 + PREFETCH_GROUP) - s0
            for g in range(g_n):  # phase 1: the first bucket's summary; prefetch the next group's
                g_idx[g] = np.int64(srt[s0 + g] & U64(GROUP_BLOCK - 1))
                g_key[g] = skeys[s0 + g]
                part = np.int64(entry_partition(srt[s0 + g], partition_bits))
                b1, b2 = bucket_pair(g_key[g] >> sh0, bucket_bits)
                g_part[g], g_b1[g], g_b2[g] = part, b1, b2
                if s0 == 0:
                    prefetch3(summary, part, b1, 0)
                if s0 + PREFETCH_GROUP + g < n:  # a whole group's time ahead
                    b1, _ = bucket_pair(skeys[s0 + PREFETCH_GROUP + g] >> sh0, bucket_bits)
                    prefetch3(summary, entry_partition(srt[s0 + PREFETCH_GROUP + g], partition_bits), b1, 0)
            for g in range(g_n):  # phase 2: first bucket's filter and fences -> prefetch the run's slot lines
                part, b1 = g_part[g], g_b1[g]
                f1 = min(np.int64(summary[part, b1, 0]), slots)
                g_f1[g] = f1
                g_a1[g], g_n1[g] = bucket_range(table, summary, part, b1, g_key[g], sh0)
                if f1 >= slots:  # the second bucket holds an n-gram's slots only once the first is full
                    prefetch3(summary, part, g_b2[g], 0)
            for g in range(g_n):  # phase 3: the same for the second bucket
                g_a2[g], g_n2[g] = 0, 0
                if g_f1[g] >= slots:
                    g_a2[g], g_n2[g] = bucket_range(table, summary, g_part[g], g_b2[g], g_key[g], sh0)
            for g in range(g_n):  # phase 4: runs of every length, counts, top followers
                i = g_idx[g]
                tp = t + i
                part, b1, b2 = g_part[g], g_b1[g], g_b2[g]
                # lengths whose key is the last position's (sorted: equal keys are adjacent) keep
                # its runs and answers; the search goes on from the first that differs
                first = 0
                if prev >= 0 and part == prev_part:
                    while first < K and (g_key[g] >> sh[first]) == (prev_key >> sh[first]):
                        first += 1
                kept = min(first, prev_deepest)  # a length absent there, with the same key, is absent here
                for k in range(kept):
                    out_token[k, tp] = out_token[k, t + prev]
                    out_count[k, tp] = out_count[k, t + prev]
                    out_top[k, tp] = out_top[k, t + prev]
                prev, prev_key, prev_part = i, g_key[g], part
                if first == K or first > prev_deepest:  # nothing left to search
                    continue
                if first == 0 and g_n1[g] == 0 and g_n2[g] == 0:
                    # no slot line can hold the shortest n-gram (a clear filter bit, most often): every
                    # length is absent, and nothing is searched (64% of the prose split's positions have
                    # no shortest n-gram: the lookup took 0.947-0.960x the time there, 1.007x on Python
                    # source)
                    prev_deepest = 0
                    continue
                j = tp + 1
                valid = query_keys(g_key[g], j, lengths, sh, qk)
                row1 = table[part, b1]
                row2 = table[part, b2]
                a1, n1, a2, n2 = g_a1[g], g_n1[g], g_a2[g], g_n2[g]
                if first > 0:  # inside the shorter length's runs
                    a1, n1 = lo1[first - 1], hi1[first - 1] - lo1[first - 1]
                    a2, n2 = lo2[first - 1], hi2[first - 1] - lo2[first - 1]
                deepest = first  # lengths 0..deepest-1 are present
                for k in range(first, valid):
                    x = qk[k] << sh[k]
                    y = x | ((U64(1) << sh[k]) - U64(1))
                    l1, h1 = bounds(row1, a1, n1, x, y)
                    l2, h2 = bounds(row2, a2, n2, x, y)
                    a1, n1, a2, n2 = l1, h1 - l1, l2, h2 - l2
                    if n1 + n2 == 0:
                        break
                    lo1[k], hi1[k], lo2[k], hi2[k] = a1, a1 + n1, a2, a2 + n2
                    deepest = k + 1
                prev_deepest = deepest
                for k in range(first, deepest):
                    cnt = hi1[k] - lo1[k] + hi2[k] - lo2[k]
                    out_count[k, tp] = cnt
                    if cnt == 1:
                        out_token[k, tp] = np.int64((row1[lo1[k]] if hi1[k] > lo1[k] else row2[lo2[k]]) & TOKEN_MASK)
                        out_top[k, tp] = 1
                        continue
                    v = -1
                    if cnt >= SIDE_MIN_COUNT:
                        v = side_find(side_off, side, part, (U64(k) << SIDE_LEVEL_SHIFT) | qk[k])
                    if v >= 0:
                        out_token[k, tp], out_top[k, tp] = answer_parts(v)
                        continue
                    m1 = row1[lo1[k]:hi1[k]]
                    m2 = row2[lo2[k]:hi2[k]]
                    for i in range(m1.shape[0]):
                        toks[i] = np.int64(m1[i] & TOKEN_MASK)
                    for i in range(m2.shape[0]):
                        toks[m1.shape[0] + i] = np.int64(m2[i] & TOKEN_MASK)
                    m = m1.shape[0] + m2.shape[0]
                    # the longest length's run in one bucket is sorted by token already
                    out_token[k, tp], out_top[k, tp] = top_follower(toks, m, k == deepest - 1 and (
                        hi2[k] == lo2[k] or hi1[k] == lo1[k]) and deepest == K)
        t += n


SEARCH_SCRATCH = ("toks", "keys", "parts", "order", "spare", "hist", "prefix", "small_i", "small_u")


def search_scratch(scratch):
    """The arrays of a worker's lookup scratch (hints.index.lookup.new_scratch) that search_sealed
    takes, as one tuple."""
    return tuple(scratch[name] for name in SEARCH_SCRATCH)


@numba.njit(cache=True, nogil=True)
def search_sealed(t0, t1, q, arrays, scratch, out_token, out_count, out_top):
    """lookup_sorted for positions t0..t1-1 of q, from a sealed index's arrays as one tuple
    (HintIndex.search_arrays) and a worker's scratch (search_scratch): the one place its argument
    list is spelt out, for HintIndex's lookups and for kernels that look up from inside Numba."""
    table, summary, side_off, side, lengths, pows, partition_bits, bucket_bits, bits, shifts = arrays
    toks, keys, parts, order, spare, hist, prefix, small_i, small_u = scratch
    lookup_sorted(t0, t1, q, table, summary, side_off, side, lengths, pows, partition_bits, bucket_bits, bits, shifts,
                  out_token, out_count, out_top, toks, keys, parts, order, spare, hist, prefix, small_i, small_u)


def search_blocks(n, workers):
    """The blocks search_claimed's workers claim in turn, for a lookup of n positions on `workers`
    workers: their starts and n at the end (int64). One worker: one block of all n (lookup_sorted
    takes it in sort blocks)."""
    starts = [0]
    while starts[-1] < n:
        left = n - starts[-1]
        size = left if workers <= 1 else min(SEARCH_BLOCK, max(SEARCH_MIN_BLOCK, -(-left // (SEARCH_SHARE * workers))))
        starts.append(starts[-1] + min(size, left))
    return np.array(starts, dtype=np.int64)


@numba.njit(cache=True, nogil=True)
def search_claimed(q, arrays, scratch, out_token, out_count, out_top, purity, kind, with_kinds, claims, starts):
    """One lookup worker: search_sealed over the blocks of q (starts: search_blocks), each claimed
    from the shared counter claims[0] (the next unclaimed one each time), with purity and kind
    (purity_kinds) of each block right after it when with_kinds. Every block writes only its own
    positions, so the results do not depend on who took which.

    Workers that each took a fixed half of the positions ended far apart: the cost of a position
    depends on the text (an n-gram repeated from the position before costs little, one that is
    absent stops at its filter bit): the busier half took 0.54 of the CPU time on the stdlib
    validation split. Blocks claimed in turn leave at most one block's difference (0.51), and a
    worker that starts late, or that the host runs less, takes fewer blocks."""
    while True:
        b = atomic_add(claims, 0, 1)
        if b >= starts.shape[0] - 1:
            break
        t0, t1 = starts[b], starts[b + 1]
        search_sealed(t0, t1, q, arrays, scratch, out_token, out_count, out_top)
        if with_kinds:
            purity_kinds(t0, t1, out_count, out_top, purity, kind)
