"""Numba kernels of the positional index: the build (entries, their parallel radix sort, the table
rows, the directory) and the lookup of cells (runs from the directory, the walk back over them).

The layout of a row and why the answers are exact: hints.positional.positional_index.
"""
import numba
import numpy as np

from ..cells import N_TOKEN_IDS, top_followers
from ..fingerprint import multipliers
from ..index import MAX_LENGTH
from ..numba_ops import fmix64, prefetch1, prefetch2

U64 = np.uint64
SORT_BITS = 42           # entries are sorted by the top 42 bits of their key (3 radix passes of 14)
PART_BITS = 8            # the sort's first split: 256 partitions by the top bits, each then sorted on one thread
SORT_DIGIT = 12          # digit of a partition's LSD radix sort: 3 passes over the other 34 sorted bits
CHUNK = 1 << 16          # stream positions per chunk of the build's parallel loops (at least)
LINEAR_STEPS = 16        # entries a lookup scans for its run's ends before it binary-searches
PREFETCH_AHEAD = 16      # positions between a lookup's directory prefetch and its use
WALK_PREFETCH_LINES = 4  # lines prefetched where a lookup's walk back starts (the hardware follows on)
ENTRIES_PER_LINE = 2     # 64-byte lines hold two 32-byte entries (3 lengths: 4 words)
POS_MASK = U64(0xFFFFFFFF)
MULTS = np.array(multipliers(MAX_LENGTH), dtype=np.uint64)  # hints.fingerprint's multipliers A[i]


@numba.njit(cache=True, nogil=True, inline="always")
def fingerprint(s, j, lo, hi, mults):
    """sum over i in [lo, hi) of (s[j - i] + 1) * A[i] mod 2^64: the tokens lo..hi-1 back from j."""
    f = U64(0)
    for i in range(lo, hi):
        f += (U64(s[j - i]) + U64(1)) * mults[i]
    return f


@numba.njit(cache=True, nogil=True, parallel=True)
def make_entries(s, rs, upto, L0, mults, keys, pos, threads):
    """Entries of every j < upto - 1 whose shortest n-gram exists (rs[j] >= L0), in stream order:
    key = fmix64(F_L0(j)) (a bijection: equal keys <=> equal fingerprints). Chunks of the stream
    are counted, then filled, on Numba's threads. Returns the number of entries."""
    first, end = L0 - 1, max(L0 - 1, upto - 1)
    C = max(1, min(threads * 4, (end - first) // CHUNK + 1))
    cnt = np.zeros(C + 1, np.int64)
    for c in numba.prange(C):
        a, b = first + (end - first) * c // C, first + (end - first) * (c + 1) // C
        k = 0
        for j in range(a, b):
            k += rs[j] >= L0
        cnt[c + 1] = k
    for c in range(C):
        cnt[c + 1] += cnt[c]
    for c in numba.prange(C):
        a, b = first + (end - first) * c // C, first + (end - first) * (c + 1) // C
        o = cnt[c]
        for j in range(a, b):
            if rs[j] >= L0:
                keys[o] = fmix64(fingerprint(s, j, 0, L0, mults))
                pos[o] = j
                o += 1
    return cnt[C]


@numba.njit(cache=True, nogil=True, parallel=True)
def sort_entries(keys, pos, n, tk, tp, starts, threads):
    """Stable sort of (keys, pos)[:n] by the top SORT_BITS bits of keys, on Numba's threads: a
    stable scatter into 2^PART_BITS partitions by the top bits (chunks of the input counted, then
    placed, in order), then each partition's LSD radix sort on the rest of the sorted bits (digits
    of SORT_DIGIT bits). Ends in keys, pos; starts[p] = partition p's first entry."""
    P = 1 << PART_BITS
    C = max(1, min(threads * 4, n // CHUNK + 1))
    psh = U64(64 - PART_BITS)
    counts = np.zeros((C, P), np.int64)
    for c in numba.prange(C):
        for i in range(n * c // C, n * (c + 1) // C):
            counts[c, np.int64(keys[i] >> psh)] += 1
    total = 0
    for p in range(P):
        starts[p] = total
        for c in range(C):
            x = counts[c, p]
            counts[c, p] = total
            total += x
    starts[P] = total
    for c in numba.prange(C):
        o = counts[c].copy()
        for i in range(n * c // C, n * (c + 1) // C):
            p = np.int64(keys[i] >> psh)
            tk[o[p]] = keys[i]
            tp[o[p]] = pos[i]
            o[p] += 1
    digits = 1 << SORT_DIGIT
    mask = U64(digits - 1)
    passes = (SORT_BITS - PART_BITS + SORT_DIGIT - 1) // SORT_DIGIT
    for p in numba.prange(P):
        lo, hi = starts[p], starts[p + 1]
        hist = np.zeros(digits, np.int64)
        src_k, src_p, dst_k, dst_p = tk, tp, keys, pos
        for d in range(passes):
            sh = U64(64 - SORT_BITS + d * SORT_DIGIT)
            hist[:] = 0
            for i in range(lo, hi):
                hist[(src_k[i] >> sh) & mask] += 1
            acc = lo
            for b in range(digits):
                x = hist[b]
                hist[b] = acc
                acc += x
            for i in range(lo, hi):
                b = (src_k[i] >> sh) & mask
                dst_k[hist[b]] = src_k[i]
                dst_p[hist[b]] = src_p[i]
                hist[b] += 1
            src_k, src_p, dst_k, dst_p = dst_k, dst_p, src_k, src_p
        if passes % 2 == 0:  # the result is in tk, tp
            keys[lo:hi] = tk[lo:hi]
            pos[lo:hi] = tp[lo:hi]


@numba.njit(cache=True, nogil=True, parallel=True)
def make_table(s, rs, keys, pos, lengths, mults, table):
    """The sorted entries as table rows: [key, position | follower << 32 | reach << 48, then the
    fingerprint of each extension (the tokens L_{k-1} .. L_k - 1 back; 0 where the reach falls
    short, never compared there)]."""
    K = lengths.shape[0]
    for i in numba.prange(pos.shape[0]):  # rows are independent: the build's one parallel loop
        j = np.int64(pos[i])
        r = rs[j]
        table[i, 0] = keys[i]
        table[i, 1] = U64(j) | (U64(s[j + 1]) << U64(32)) | (U64(r) << U64(48))
        for k in range(1, K):
            table[i, 1 + k] = fingerprint(s, j, lengths[k - 1], lengths[k], mults) if r >= lengths[k] else U64(0)


@numba.njit(cache=True, nogil=True, parallel=True)
def make_directory(table, n, dir_bits, directory, starts):
    """directory[b] = first entry whose key's top dir_bits bits are >= b (b = 0 .. 2^dir_bits),
    each sort partition's buckets on a thread of their own when the directory is at least as fine
    as the partitions (else in one pass)."""
    sh = U64(64 - dir_bits)
    if dir_bits < PART_BITS:
        i = 0
        for b in range(directory.shape[0]):
            while i < n and np.int64(table[i, 0] >> sh) < b:
                i += 1
            directory[b] = i
        return
    per = 1 << (dir_bits - PART_BITS)
    for p in numba.prange(1 << PART_BITS):
        i, hi = starts[p], starts[p + 1]
        for b in range(p * per, (p + 1) * per):
            while i < hi and np.int64(table[i, 0] >> sh) < b:
                i += 1
            directory[b] = i
    directory[directory.shape[0] - 1] = n


@numba.njit(cache=True, nogil=True, inline="always")
def run_of(e, directory, b, skey, sort_mask):
    """[lo, hi): the entries of directory bucket b whose sorted bits equal skey. A bucket holds
    about one key, so both ends are found by short linear scans (at most LINEAR_STEPS entries, then
    a binary search: a rare key may share its bucket with a frequent one)."""
    lo, end = directory[b], directory[b + 1]
    z = min(end, lo + LINEAR_STEPS)
    while lo < z and (e[lo, 0] & sort_mask) < skey:
        lo += 1
    if lo == z and z < end:
        z = end
        while lo < z:
            mid = (lo + z) >> 1
            if (e[mid, 0] & sort_mask) < skey:
                lo = mid + 1
            else:
                z = mid
    hi = end
    z = max(lo, end - LINEAR_STEPS)
    while hi > z and (e[hi - 1, 0] & sort_mask) > skey:
        hi -= 1
    if hi == z and z > lo:
        a = lo
        while a < hi:
            mid = (a + hi) >> 1
            if (e[mid, 0] & sort_mask) <= skey:
                a = mid + 1
            else:
                hi = mid
    return lo, hi


@numba.njit(cache=True, nogil=True, inline="always")
def position(e, i):
    return np.int64(e[i, 1] & POS_MASK)


@numba.njit(cache=True, nogil=True, inline="always")
def first_after(e, lo, hi, last):
    """The first index in [lo, hi) whose position is > last (positions ascend in a run): checks
    both ends, then interpolates (a frequent n-gram's positions spread evenly over the stream) and
    gallops from the guess to a bracket it binary-searches."""
    if hi <= lo or position(e, hi - 1) <= last:
        return hi
    if position(e, lo) > last:
        return lo
    p0, p1 = position(e, lo), position(e, hi - 1)
    g = lo + (hi - 1 - lo) * (last - p0) // max(1, p1 - p0)
    g = min(max(g, lo), hi - 1)
    # bracket [a, z): pos[a - 1] <= last < pos[z] ... by galloping from g
    if position(e, g) <= last:
        a, step = g + 1, 1
        z = min(hi, a + step)
        while z < hi and position(e, z) <= last:
            a = z + 1
            step *= 2
            z = min(hi, a + step)
    else:
        z, step = g, 1
        a = max(lo, z - step)
        while a > lo and position(e, a) > last:
            z = a
            step *= 2
            a = max(lo, z - step)
    while a < z:
        mid = (a + z) >> 1
        if position(e, mid) <= last:
            a = mid + 1
        else:
            z = mid
    return a


@numba.njit(cache=True, nogil=True)
def lookup_kernel(q, rq, e, directory, dir_bits, lengths, mults, last, cap, depth, count, out_tok, out_cnt):
    """Cells of every query position (hints.cells; module docstring). last = the largest stream
    position whose follower is before `before` (entries j <= last count); cap <= 0: no cap.
    First every position's key and directory bucket; then a pipeline: AHEAD positions ahead the
    bucket's directory entry is prefetched, AHEAD / 2 ahead it is read and the lines at its run's
    ends are prefetched, AHEAD / 4 ahead the run and the walk's start are found and the walk's first
    lines prefetched, and the position itself walks back over at most `cap` occurrences."""
    n = q.shape[0]
    L0 = lengths[0]
    K = lengths.shape[0]
    F = out_tok.shape[1]
    sort_mask = ~((U64(1) << U64(64 - SORT_BITS)) - U64(1))
    dsh = U64(64 - dir_bits)
    ncap = cap if cap > 0 else e.shape[0]
    size = max(1, min(ncap, e.shape[0]))
    cand_m = np.empty(size, np.int64)
    cand_t = np.empty(size, np.int64)
    toks = np.empty(size, np.int64)
    counter = np.zeros(N_TOKEN_IDS, np.int32)
    qkey = np.zeros(n, np.uint64)
    qb = np.full(n, -1, np.int64)
    qlo = np.zeros(n, np.int64)
    qa = np.zeros(n, np.int64)
    qext = np.zeros((n, max(1, K - 1)), np.uint64)
    for t in range(n):
        r = np.int64(rq[t])
        if r >= L0 and last >= 0:
            qkey[t] = fmix64(fingerprint(q, t, 0, L0, mults))
            qb[t] = np.int64(qkey[t] >> dsh)
            for k in range(1, K):
                qext[t, k - 1] = fingerprint(q, t, lengths[k - 1], lengths[k], mults) if r >= lengths[k] else U64(0)
    A1, A2, A3 = PREFETCH_AHEAD, PREFETCH_AHEAD // 2, PREFETCH_AHEAD // 4
    for t in range(-A1, n):
        u = t + A1
        if u < n and qb[u] >= 0:
            prefetch1(directory, qb[u])
        u = t + A2
        if 0 <= u < n and qb[u] >= 0:
            lo, hi = directory[qb[u]], directory[qb[u] + 1]
            if hi > lo:
                prefetch2(e, lo, 0)
                prefetch2(e, hi - 1, 0)
        u = t + A3
        if 0 <= u < n and qb[u] >= 0:
            lo, hi = run_of(e, directory, qb[u], qkey[u] & sort_mask, sort_mask)
            a = first_after(e, lo, hi, last)
            qlo[u], qa[u] = lo, a
            for x in range(1, 1 + WALK_PREFETCH_LINES * ENTRIES_PER_LINE, ENTRIES_PER_LINE):
                if a - x >= lo:
                    prefetch2(e, a - x, 0)
        if t < 0:
            continue
        depth[t] = -1
        count[t] = 0
        for f in range(F):
            out_tok[t, f] = -1
            out_cnt[t, f] = 0
        if qb[t] < 0:
            continue
        key = qkey[t]
        r = np.int64(rq[t])
        lo = qlo[t]
        i = qa[t] - 1
        m = 0
        deepest = 0
        while i >= lo and m < ncap:
            if e[i, 0] == key:
                w = e[i, 1]
                er = np.int64(w >> U64(48))
                d = 0
                for k in range(1, K):
                    if r >= lengths[k] and er >= lengths[k] and e[i, 1 + k] == qext[t, k - 1]:
                        d = k
                    else:
                        break
                cand_m[m] = d
                cand_t[m] = np.int64((w >> U64(32)) & U64(0xFFFF))
                m += 1
                deepest = max(deepest, d)
            i -= 1
        if m == 0:
            continue
        c = 0
        for x in range(m):
            if cand_m[x] == deepest:
                toks[c] = cand_t[x]
                c += 1
        depth[t] = deepest
        count[t] = c
        top_followers(toks, c, F, out_tok, out_cnt, t, counter)
