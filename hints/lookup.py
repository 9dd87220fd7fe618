"""Numba kernels of hint lookup: the scan of a growing index, sealing, and the search of a sealed one.

A lookup answers, for each query position and length, the n-gram's count, its most frequent
follower (ties to the smallest id) and that follower's count. Both kinds of index answer the
same; they differ in how a bucket is read.

Growing index (`lookup_scan`). A bucket holds its slots in insertion order, so a lookup scans
the first bucket (and the second, once the first is full), builds match masks 64 slots at a
time and counts the matching slots' followers in token-indexed counters. Frequent n-grams fill
their buckets and cost a full scan each time, so results of long scans are kept in a
per-worker cache that outlives the call: an entry records the fills of the two buckets it was
counted from, and is used only while they are unchanged (slots are only ever appended, so
equal fills mean equal contents). Once both buckets are full, the entry is valid for good.

Sealed index (`seal_partitions`, `lookup_sorted`). Sealing sorts each bucket's slots as
uint64 words. A slot is [checksum(L0) | checksum(L1) | ... | token] from the top bit down, so
the order is by the key of every length at once: the slots of one n-gram of any length form
one contiguous run, the run of a longer n-gram lies inside the run of its shorter suffix,
and the slots of the longest n-gram are sorted by follower token. Each bucket gets a summary
row (one cache line for S <= 248): its fill and, per line of 8 slots, the top 16 bits of the
line's first slot (a fence). A lookup reads the summary, which names the one or two slot
lines where the shortest n-gram's run can start and end, and finds the runs of all lengths by
branch-free binary search (or, in a short range, by counting), nested. The n-gram count is
the run's length. The most frequent follower comes from the few tokens of a short run (<
SIDE_MIN_COUNT slots), and for a long run from the side table: for every n-gram with at
least SIDE_MIN_COUNT slots, sealing stores (length index << 48 | key) -> (top count << 16 |
top token) in a per-partition open-addressing table (linear probing, at most half full).
"""
import numba
import numpy as np

from .geometry import (CHECKSUM_BITS, CHECKSUM_TOTAL_BITS, FILL_BITS, LEVEL_BITS, MAX_LENGTHS, MAX_PARTITION_BITS, SLOTS_PER_LINE,
                       TOKEN_BITS)
from .kernels import (FMIX_C1, HASH_MULT, bucket_pair, cttz, fmix64, hash_block, init_states, prefetch2, prefetch3,
                      roll, slot_key)

U64 = np.uint64
TOKEN_MASK = U64((1 << TOKEN_BITS) - 1)
LEVEL_MASK = U64((1 << LEVEL_BITS) - 1)
NO_KEY = U64(1 << CHECKSUM_TOTAL_BITS)  # a query key no slot key (< 2^48) can equal
UNUSED_SHIFT = 63                       # shift of lengths a geometry lacks: slot >> 63 is 0 or 1, never NO_KEY
N_TOKENS = 1 << TOKEN_BITS              # follower counters are indexed by token id
PREFETCH_GROUP = 32                     # lookups hashed and prefetched together (misses in flight)

# Scan lookup's result cache: 2^12 entries per length per worker (direct-mapped). A result is
# cached when counting it scanned at least CACHE_MIN_SCAN slots (8 cache lines); below that,
# a scan costs about what a cache probe does.
CACHE_BITS = 12
CACHE_MIN_SCAN = 64
CACHE_VALID = U64(1) << U64(63)
# An entry's tag packs the partition (MAX_PARTITION_BITS) and the two fills (FILL_BITS each)
# it was counted from, below the valid bit.
TAG_FILL1_SHIFT = U64(MAX_PARTITION_BITS)
TAG_FILL2_SHIFT = U64(MAX_PARTITION_BITS + FILL_BITS)
# A cached value packs the top token, the n-gram count and the top's count (COUNT_BITS each:
# a count is at most two buckets' worth of slots).
COUNT_BITS = FILL_BITS + 1
VAL_COUNT_SHIFT = U64(TOKEN_BITS)
VAL_TOP_SHIFT = U64(TOKEN_BITS + COUNT_BITS)
VAL_COUNT_MASK = U64((1 << COUNT_BITS) - 1)
assert MAX_PARTITION_BITS + 2 * FILL_BITS < 63 and TOKEN_BITS + 2 * COUNT_BITS <= 64

# Sealed index: n-grams with at least this many slots get a side-table entry. At 16 a
# counted run is at most two cache lines of slots; the side table holds at most
# n_lengths / 16 entries per slot, in practice far fewer.
SIDE_MIN_COUNT = 16
SIDE_LEVEL_SHIFT = U64(CHECKSUM_TOTAL_BITS)  # side key = length index << 48 | nested key
SIDE_TOP_SHIFT = U64(TOKEN_BITS)             # side value = top count << 16 | top token (never 0: top >= 1)
SIDE_LOAD = 2                                # side-table capacity >= 2 x entries (linear probing stays short)
# Sealed bucket summary: one uint16 row per bucket, [fill, fence of line 0, line 1, ...], where
# a line's fence is the top 16 bits of its first slot (the top of the shortest length's
# checksum). Rows are padded to whole 64-byte lines: one line for up to 31 slot lines (S <= 248).
FENCE_BITS = 16
FENCE_SHIFT = U64(64 - FENCE_BITS)
assert min(b[0] for b in CHECKSUM_BITS.values()) >= FENCE_BITS  # a fence is part of the shortest length's checksum
SUMMARY_ALIGN = 32  # uint16 words per 64-byte line
LINEAR_BOUNDS = 16  # ranges of up to 16 slots (two lines) are counted, longer ones binary-searched
INSERTION_SORT_MAX = 32  # sealing sorts buckets of up to 32 slots by insertion, longer ones by ndarray.sort


def summary_words(slots):
    """uint16 words of one bucket's summary row: the fill and one fence per slot line, padded."""
    lines = -(-slots // SLOTS_PER_LINE)
    return -(-(1 + lines) // SUMMARY_ALIGN) * SUMMARY_ALIGN


# ---- shared pieces --------------------------------------------------------------------------

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


@numba.njit(cache=True, inline="always")
def levels_matched(slot, sh, qk):
    """How many of the query's lengths this slot matches (nested keys: a prefix of the lengths)."""
    lvl = 0
    for k in range(MAX_LENGTHS):
        lvl += np.int64((slot >> sh[k]) == qk[k])
    return lvl


@numba.njit(cache=True, inline="always")
def gather_matches(row, f, sh, qk, lo, buf, m):
    """Append (token << LEVEL_BITS | lengths matched) of the slots row[:f] matching length lo
    to buf[m:]. Match bits are built 64 slots at a time by a vectorised loop; only set bits
    are visited."""
    for c in range(0, f, 64):
        mask = U64(0)
        for i in range(c, min(f, c + 64)):
            mask |= U64((row[i] >> sh[lo]) == qk[lo]) << U64(i - c)
        while mask:
            sl = row[c + np.int64(cttz(mask))]
            mask &= mask - U64(1)
            buf[m] = ((sl & TOKEN_MASK) << U64(LEVEL_BITS)) | U64(levels_matched(sl, sh, qk))
            m += 1
    return m


@numba.njit(cache=True, inline="always")
def count_followers(buf, m, lo, valid, counts, total, best, best_tok):
    """Count the followers in buf[:m] per length lo..valid-1 in token-indexed counters (left
    zeroed again), tracking each length's total and top follower (ties to the smallest id)."""
    for k in range(lo, valid):
        total[k] = 0
        best[k] = 0
        best_tok[k] = -1
    for i in range(m):
        tok = np.int64(buf[i] >> U64(LEVEL_BITS))
        for k in range(lo, np.int64(buf[i] & LEVEL_MASK)):
            c = counts[k, tok] + 1
            counts[k, tok] = c
            total[k] += 1
            if c > best[k] or (c == best[k] and tok < best_tok[k]):
                best[k] = c
                best_tok[k] = tok
    for i in range(m):
        tok = np.int64(buf[i] >> U64(LEVEL_BITS))
        for k in range(lo, np.int64(buf[i] & LEVEL_MASK)):
            counts[k, tok] = 0


@numba.njit(cache=True, inline="always")
def hash_group(q, j0, n, r, lengths, pows, partition_bits, bits, shifts, prefix, keys, parts):
    """Slot keys and partitions of stream positions j0..j0+n-1 of q: vectorised over the group
    (kernels.hash_block), or one at a time where a length is still absent (j < its length)."""
    if j0 >= lengths[lengths.shape[0] - 1]:
        hash_block(q, j0, j0 + n, lengths, pows, partition_bits, bits, shifts, prefix, keys, parts)
        return
    init_states(r, q, j0, lengths)
    for g in range(n):
        j = j0 + g
        parts[g], _, keys[g] = slot_key(r, j, lengths, pows, partition_bits, bits, shifts)
        if j < q.shape[0]:
            roll(r, q, j, lengths, pows)


@numba.njit(cache=True, inline="always")
def clear_outputs(t0, t1, out_token, out_count, out_top):
    for k in range(out_token.shape[0]):
        for t in range(t0, t1):
            out_token[k, t] = -1
            out_count[k, t] = 0
            out_top[k, t] = 0


# ---- growing index: scan ----------------------------------------------------------------------

@numba.njit(cache=True, inline="always")
def cache_slot(part, key):
    return np.int64(((key ^ (U64(part) * HASH_MULT)) * FMIX_C1) >> U64(64 - CACHE_BITS))


def new_scratch(n_lengths, slots):
    """Per-worker lookup state, allocated once per index: follower counters (kept zeroed),
    the match buffer, and the scan lookup's result cache (tag 0 = empty)."""
    return dict(
        counts=np.zeros((n_lengths, N_TOKENS), dtype=np.int32),
        buf=np.empty(2 * slots + 1, dtype=np.uint64),
        cache_tag=np.zeros((n_lengths, 1 << CACHE_BITS), dtype=np.uint64),
        cache_key=np.zeros((n_lengths, 1 << CACHE_BITS), dtype=np.uint64),
        cache_val=np.zeros((n_lengths, 1 << CACHE_BITS), dtype=np.uint64),
    )


@numba.njit(cache=True, nogil=True)
def lookup_scan(t0, t1, q, table, fill, lengths, pows, partition_bits, bucket_bits, bits, shifts,
                out_token, out_count, out_top, counts, buf, cache_tag, cache_key, cache_val):
    """For positions t0..t1-1 of q: top follower, the n-gram's count and the top's count, per length.

    Position t uses the n-gram q[t-L+1..t] (stream position j = t+1). Positions go in groups
    of PREFETCH_GROUP: first hash the group and prefetch each first bucket, then scan them, so
    the group's cache misses overlap. The second bucket is scanned only when the first is full.
    counts, buf and the cache_* arrays are this worker's scratch (new_scratch).
    """
    K = lengths.shape[0]
    slots = table.shape[2]
    clear_outputs(t0, t1, out_token, out_count, out_top)
    t = max(t0, lengths[0] - 1)  # earlier positions have no n-gram of any length
    if t >= t1:
        return
    r = np.empty(K, dtype=np.uint64)
    qk = np.empty(MAX_LENGTHS, dtype=np.uint64)
    best = np.zeros(MAX_LENGTHS, dtype=np.int64)
    best_tok = np.zeros(MAX_LENGTHS, dtype=np.int64)
    total = np.zeros(MAX_LENGTHS, dtype=np.int64)
    sh = np.full(MAX_LENGTHS, UNUSED_SHIFT, dtype=np.uint64)
    for k in range(K):
        sh[k] = shifts[k]
    g_part = np.empty(PREFETCH_GROUP, dtype=np.uint64)
    g_b1 = np.empty(PREFETCH_GROUP, dtype=np.uint64)
    g_b2 = np.empty(PREFETCH_GROUP, dtype=np.uint64)
    g_key = np.empty(PREFETCH_GROUP, dtype=np.uint64)
    sh0 = U64(shifts[0])
    prefix = np.empty(PREFETCH_GROUP + lengths[K - 1] + 1, dtype=np.uint64)
    g_hpart = np.empty(PREFETCH_GROUP, dtype=np.uint64)
    while t < t1:
        g_end = min(t1, t + PREFETCH_GROUP)
        hash_group(q, t + 1, g_end - t, r, lengths, pows, partition_bits, bits, shifts, prefix, g_key, g_hpart)
        for g in range(g_end - t):  # phase 1: prefetch the group's first buckets
            part = g_hpart[g]
            b1, b2 = bucket_pair(g_key[g] >> sh0, bucket_bits)
            g_part[g], g_b1[g], g_b2[g] = part, b1, b2
            prefetch2(fill, part, b1)
            prefetch3(table, part, b1, 0)
            prefetch3(table, part, b1, 8)
        for g in range(g_end - t):  # phase 2: cached results, else scan and count
            j = t + g + 1
            part, b1, b2 = g_part[g], g_b1[g], g_b2[g]
            valid = query_keys(g_key[g], j, lengths, sh, qk)
            f1 = np.int64(fill[part, b1])
            f2 = np.int64(fill[part, b2]) if f1 >= slots else 0  # the second bucket only once the first is full
            if f1 == 0:
                continue
            tag = CACHE_VALID | part | (U64(f1) << TAG_FILL1_SHIFT) | (U64(f2) << TAG_FILL2_SHIFT)
            lo = valid
            for k in range(valid - 1, -1, -1):
                ci = cache_slot(part, qk[k])
                if cache_tag[k, ci] == tag and cache_key[k, ci] == qk[k]:
                    v = cache_val[k, ci]
                    cnt = np.int64((v >> VAL_COUNT_SHIFT) & VAL_COUNT_MASK)
                    if cnt > 0:
                        out_token[k, t + g] = np.int64(v & TOKEN_MASK)
                        out_count[k, t + g] = cnt
                        out_top[k, t + g] = np.int64(v >> VAL_TOP_SHIFT)
                else:
                    lo = k
            if lo == valid:
                continue
            m = gather_matches(table[part, b1], f1, sh, qk, lo, buf, 0)
            if f2 > 0:
                m = gather_matches(table[part, b2], f2, sh, qk, lo, buf, m)
            count_followers(buf, m, lo, valid, counts, total, best, best_tok)
            cacheable = f1 + f2 >= CACHE_MIN_SCAN
            for k in range(lo, valid):
                if total[k] > 0:
                    out_token[k, t + g] = best_tok[k]
                    out_count[k, t + g] = total[k]
                    out_top[k, t + g] = best[k]
                # absent shortest n-grams are one-offs: not worth a cache entry
                if cacheable and (total[k] > 0 or k > 0):
                    ci = cache_slot(part, qk[k])
                    cache_tag[k, ci] = tag
                    cache_key[k, ci] = qk[k]
                    cache_val[k, ci] = (U64(best_tok[k] if total[k] > 0 else 0) | (U64(total[k]) << VAL_COUNT_SHIFT)
                                        | (U64(best[k]) << VAL_TOP_SHIFT))
        t = g_end


# ---- sealing ----------------------------------------------------------------------------------

@numba.njit(cache=True, inline="always")
def lower_bound(row, base, n, x):
    """First index i in [base, base+n] with row[i] >= x, row[base:base+n] sorted. Branch-free:
    the iteration count depends on n only, never on the values read."""
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
                    best, best_tok = 0, 0
                    for i in range(a, b):
                        tok = np.int64(run[i] & TOKEN_MASK)
                        c = counts[tok] + 1
                        counts[tok] = c
                        if c > best or (c == best and tok < best_tok):
                            best, best_tok = c, tok
                    for i in range(a, b):
                        counts[np.int64(run[i] & TOKEN_MASK)] = 0
                    skey = (U64(k) << SIDE_LEVEL_SHIFT) | key
                    h = side_home(skey, U64(cap - 1))
                    while side[2 * (o + h) + 1] != U64(0):
                        h = (h + 1) & (cap - 1)
                    side[2 * (o + h)] = skey
                    side[2 * (o + h) + 1] = (U64(best) << SIDE_TOP_SHIFT) | U64(best_tok)
            a = b
    return found


@numba.njit(cache=True, nogil=True)
def seal_partitions(p0, p1, table, fill, bucket_bits, shifts, bits, first_pass, summary, side_off, side):
    """Seal partitions p0..p1-1. First pass: sort each bucket's slots, write its summary row, and
    count the partition's side entries into side_off[p + 1]. Second pass (side_off now holds
    each partition's table offset, in entries): insert the entries into side."""
    n_buckets, S = table.shape[1], table.shape[2]
    K = shifts.shape[0]
    sh0 = U64(shifts[0])
    low0 = (U64(1) << sh0) - U64(1)
    counts = np.zeros(1 << TOKEN_BITS, dtype=np.int32)
    run = np.empty(2 * S, dtype=np.uint64)
    for p in range(p0, p1):
        tp, fp = table[p], fill[p]
        if first_pass:
            for b in range(n_buckets):
                f = np.int64(fp[b])
                if f > INSERTION_SORT_MAX:
                    tp[b, :f].sort()
                else:
                    row = tp[b]
                    for i in range(1, f):
                        v = row[i]
                        j = i - 1
                        while j >= 0 and row[j] > v:
                            row[j + 1] = row[j]
                            j -= 1
                        row[j + 1] = v
                sm = summary[p, b]
                sm[:] = 0
                sm[0] = f
                for i in range(0, f, SLOTS_PER_LINE):
                    sm[1 + i // SLOTS_PER_LINE] = np.uint16(tp[b, i] >> FENCE_SHIFT)
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
    (a vectorised compare, no dependent loads); long ones get two branch-free binary searches
    run in one loop (two independent chains of loads; the iteration count depends on n only)."""
    if n <= LINEAR_BOUNDS:
        lo = a
        hi = a
        for i in range(a, a + n):
            lo += np.int64(row[i] < x)
            hi += np.int64(row[i] <= y)
        return lo, hi
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
def top_follower(toks, n, is_sorted):
    """(most frequent token, its count) of toks[:n] (ties to the smallest id); sorts toks[:n]
    unless is_sorted."""
    if not is_sorted:
        for i in range(1, n):  # insertion sort: n < SIDE_MIN_COUNT
            v = toks[i]
            j = i - 1
            while j >= 0 and toks[j] > v:
                toks[j + 1] = toks[j]
                j -= 1
            toks[j + 1] = v
    best, best_tok, run = 0, -1, 0
    for i in range(n):
        run = run + 1 if i > 0 and toks[i] == toks[i - 1] else 1
        if run > best:
            best, best_tok = run, toks[i]
    return best_tok, best


@numba.njit(cache=True, nogil=True)
def lookup_sorted(t0, t1, q, table, summary, side_off, side, lengths, pows, partition_bits,
                  bucket_bits, bits, shifts, out_token, out_count, out_top):
    """lookup_scan's results from a sealed index.

    Positions go in groups of PREFETCH_GROUP through four phases, so that each phase's cache
    misses overlap across the group: (1) hash, prefetch the first bucket's summary line;
    (2) read its fences, prefetch the slot lines where the shortest n-gram's run can start and
    end, and the second bucket's summary line when the first is full; (3) the same for the
    second bucket; (4) find the runs of every length (nested: each inside the last): counts
    are run lengths, top followers come from the side table (runs of >= SIDE_MIN_COUNT slots)
    or from the few tokens of a short run.
    """
    K = lengths.shape[0]
    slots = table.shape[2]
    clear_outputs(t0, t1, out_token, out_count, out_top)
    t = max(t0, lengths[0] - 1)
    if t >= t1:
        return
    r = np.empty(K, dtype=np.uint64)
    qk = np.empty(MAX_LENGTHS, dtype=np.uint64)
    sh = np.full(MAX_LENGTHS, UNUSED_SHIFT, dtype=np.uint64)
    for k in range(K):
        sh[k] = shifts[k]
    lo1 = np.zeros(MAX_LENGTHS, dtype=np.int64)  # run of each length in the first bucket ...
    hi1 = np.zeros(MAX_LENGTHS, dtype=np.int64)
    lo2 = np.zeros(MAX_LENGTHS, dtype=np.int64)  # ... and in the second
    hi2 = np.zeros(MAX_LENGTHS, dtype=np.int64)
    toks = np.empty(2 * slots, dtype=np.int64)
    g_part = np.empty(PREFETCH_GROUP, dtype=np.int64)
    g_b1 = np.empty(PREFETCH_GROUP, dtype=np.int64)
    g_b2 = np.empty(PREFETCH_GROUP, dtype=np.int64)
    g_key = np.empty(PREFETCH_GROUP, dtype=np.uint64)
    g_f1 = np.empty(PREFETCH_GROUP, dtype=np.int64)  # fill of the first bucket
    g_a1 = np.empty(PREFETCH_GROUP, dtype=np.int64)  # where the shortest n-gram's run can be, first bucket
    g_n1 = np.empty(PREFETCH_GROUP, dtype=np.int64)
    g_a2 = np.zeros(PREFETCH_GROUP, dtype=np.int64)  # ... and second bucket
    g_n2 = np.zeros(PREFETCH_GROUP, dtype=np.int64)
    sh0 = U64(shifts[0])
    low0 = (U64(1) << sh0) - U64(1)
    prefix = np.empty(PREFETCH_GROUP + lengths[K - 1] + 1, dtype=np.uint64)
    g_hpart = np.empty(PREFETCH_GROUP, dtype=np.uint64)
    while t < t1:
        g_n = min(t1, t + PREFETCH_GROUP) - t
        hash_group(q, t + 1, g_n, r, lengths, pows, partition_bits, bits, shifts, prefix, g_key, g_hpart)
        for g in range(g_n):  # phase 1: prefetch the first bucket's summary
            part = np.int64(g_hpart[g])
            b1, b2 = bucket_pair(g_key[g] >> sh0, bucket_bits)
            g_part[g], g_b1[g], g_b2[g] = part, b1, b2
            prefetch3(summary, part, b1, 0)
        for g in range(g_n):  # phase 2: first bucket's fences -> prefetch the run's slot lines
            part, b1 = g_part[g], g_b1[g]
            sm = summary[part, b1]
            f1 = min(np.int64(sm[0]), slots)  # clamped: a corrupt summary cannot move a read out of the row
            below, at_most = fence_lines(sm, g_key[g])
            a, m = fenced_range(f1, below, at_most)
            g_f1[g], g_a1[g], g_n1[g] = f1, a, m
            prefetch3(table, part, b1, a)
            if m > SLOTS_PER_LINE:
                prefetch3(table, part, b1, a + m - 1)
            if f1 >= slots:  # the second bucket holds an n-gram's slots only once the first is full
                prefetch3(summary, part, g_b2[g], 0)
        for g in range(g_n):  # phase 3: the same for the second bucket
            if g_f1[g] >= slots:
                part, b2 = g_part[g], g_b2[g]
                sm = summary[part, b2]
                below, at_most = fence_lines(sm, g_key[g])
                a, m = fenced_range(min(np.int64(sm[0]), slots), below, at_most)
                g_a2[g], g_n2[g] = a, m
                prefetch3(table, part, b2, a)
                if m > SLOTS_PER_LINE:
                    prefetch3(table, part, b2, a + m - 1)
            else:
                g_a2[g], g_n2[g] = 0, 0
        for g in range(g_n):  # phase 4: runs of every length, counts, top followers
            j = t + g + 1
            part, b1, b2 = g_part[g], g_b1[g], g_b2[g]
            valid = query_keys(g_key[g], j, lengths, sh, qk)
            row1 = table[part, b1]
            row2 = table[part, b2]
            a1, n1, a2, n2 = g_a1[g], g_n1[g], g_a2[g], g_n2[g]
            deepest = 0  # lengths 0..deepest-1 are present
            for k in range(valid):
                x = qk[k] << sh[k]
                y = x | ((U64(1) << sh[k]) - U64(1))
                l1, h1 = bounds(row1, a1, n1, x, y)
                l2, h2 = bounds(row2, a2, n2, x, y)
                a1, n1, a2, n2 = l1, h1 - l1, l2, h2 - l2
                if n1 + n2 == 0:
                    break
                lo1[k], hi1[k], lo2[k], hi2[k] = a1, a1 + n1, a2, a2 + n2
                deepest = k + 1
            for k in range(deepest):
                cnt = hi1[k] - lo1[k] + hi2[k] - lo2[k]
                out_count[k, t + g] = cnt
                if cnt == 1:
                    out_token[k, t + g] = np.int64((row1[lo1[k]] if hi1[k] > lo1[k] else row2[lo2[k]]) & TOKEN_MASK)
                    out_top[k, t + g] = 1
                    continue
                v = -1
                if cnt >= SIDE_MIN_COUNT:
                    v = side_find(side_off, side, part, (U64(k) << SIDE_LEVEL_SHIFT) | qk[k])
                if v >= 0:
                    out_token[k, t + g] = v & np.int64(TOKEN_MASK)
                    out_top[k, t + g] = v >> np.int64(SIDE_TOP_SHIFT)
                    continue
                m = 0
                for i in range(lo1[k], hi1[k]):
                    toks[m] = np.int64(row1[i] & TOKEN_MASK)
                    m += 1
                for i in range(lo2[k], hi2[k]):
                    toks[m] = np.int64(row2[i] & TOKEN_MASK)
                    m += 1
                # the longest length's run in one bucket is sorted by token already
                out_token[k, t + g], out_top[k, t + g] = top_follower(toks, m, k == deepest - 1 and (
                    hi2[k] == lo2[k] or hi1[k] == lo1[k]) and deepest == K)
        t += g_n
