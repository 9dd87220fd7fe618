"""Numba kernels of hint lookup in a growing hashed index, and the pieces the sealed search shares.

A lookup answers, for each query position and length, the n-gram's count, its most frequent
follower (ties to the smallest id) and that follower's count. A growing index and a sealed one
(`hints.index.sealed`) answer the same; they differ in how a bucket is read.

Growing index (`lookup_scan`). A bucket holds its slots in insertion order, so a lookup scans
the first bucket (and the second, once the first is full) for the slots of the query's
shortest n-gram and counts their followers in token-indexed counters. Frequent n-grams have
long runs and recur in a query, so the positions are sorted first (in blocks of
GROUP_BLOCK, by bucket address and key): each distinct n-gram is then gathered and counted
once per block, each longer length from its shorter one's slots, and buckets are read in
address order. An n-gram whose two buckets are both full can gain no slot: its run is kept,
sorted, with its answers, across calls (frozen_run), so an add() between lookups needs no
invalidation.
"""
import numba
import numpy as np

from ..numba_ops import fmix64, prefetch2, prefetch3, unmanaged
from ..parallel import line_aligned
from ..tokens import TOKEN_BITS
from .geometry import MAX_LENGTHS, SLOTS_PER_LINE
from .hashing import HASH_BLOCK, HASH_SCRATCH, bucket_pair, hash_block, init_states, roll, slot_key

U64 = np.uint64
TOKEN_MASK = U64((1 << TOKEN_BITS) - 1)
N_TOKENS = 1 << TOKEN_BITS              # follower counters are indexed by token id
PREFETCH_GROUP = 32                     # positions a sealed lookup takes through each phase together (misses in flight)
SMALL_ROWS = 13                         # rows of a worker's small scratch arrays (per length or per group)

# Both lookups sort their positions in blocks of GROUP_BLOCK by (partition, first bucket, a
# hash of the shortest key, the longer keys) and read each n-gram's buckets once per block, in
# address order. A block is a record step's lookup (32,768 positions); its position ids
# (GROUP_BITS) ride below the SORT_BITS sort key in one uint64, sorted by RADIX_BITS-bit
# digits (RADIX_PASSES = 5 passes).
GROUP_BITS = 15
GROUP_BLOCK = 1 << GROUP_BITS
SORT_BITS = 64 - GROUP_BITS
RADIX_BITS = 10
RADIX_PASSES = -(-SORT_BITS // RADIX_BITS)
RADIX_HIST = RADIX_PASSES << RADIX_BITS  # every pass's counters at once (radix_sort); the frozen runs' 8-bit sorts fit
GROUP_AHEAD = 16  # the fill of the bucket 2 x GROUP_AHEAD sorted positions ahead is prefetched, and
                  # the filled lines of the one GROUP_AHEAD ahead
# Frozen runs (growing index): an n-gram both of whose buckets are full can gain no slot, so a
# worker keeps its shortest-length run across calls, sorted, with the answer of every length's
# run in it. A record step meets ~450 such n-grams (40% of its positions on the stdlib corpus),
# ~90% of them kept from earlier steps, and their runs average ~345 slots (two full buckets of
# 176). A worker keeps up to FROZEN_ENTRIES runs (an open-addressing table twice that size, at
# most half full) in FROZEN_RUN_SLOTS slots (~1,500 of the record's runs), and drops them all
# when either is full.
FROZEN_ENTRIES = 4096
FROZEN_RUN_SLOTS = 1 << 19


# ---- shared pieces --------------------------------------------------------------------------

@numba.njit(cache=True, inline="always")
def answer(tok, top):
    """An n-gram's answer in one int64, as the side table and the frozen runs keep it: top count
    << TOKEN_BITS | top follower (never 0 for a present n-gram: its top count is >= 1)."""
    return (np.int64(top) << TOKEN_BITS) | np.int64(tok)


@numba.njit(cache=True, inline="always")
def answer_parts(v):
    """(top follower, top count) of an answer."""
    return v & np.int64(TOKEN_MASK), v >> TOKEN_BITS


@numba.njit(cache=True, inline="always")
def clear_outputs(t0, t1, out_token, out_count, out_top):
    for k in range(out_token.shape[0]):
        out_token[k, t0:t1] = -1
        out_count[k, t0:t1] = 0
        out_top[k, t0:t1] = 0


@numba.njit(cache=True, inline="always")
def count_range(row, a, n, x, y):
    """[lo, hi): the slots of row[a:a+n] (sorted) with x <= slot <= y, counted: a vectorised
    compare with no dependent loads, faster than a binary search over short ranges and over
    ranges already in cache."""
    lo = a
    hi = a
    part = row[a:a + n]  # indexed from 0: no gathers (gather_run says why)
    for i in range(part.shape[0]):
        lo += np.int64(part[i] < x)
        hi += np.int64(part[i] <= y)
    return lo, hi


# ---- growing index: scan ----------------------------------------------------------------------

def new_scratch(n_lengths, slots):
    """Per-worker lookup state, allocated once per index and reused, every array on cache lines
    of its own (build.stage1_worker says why the kernels allocate nothing themselves):
    follower counters (kept zeroed), each length's matching slots and tokens, a block's hashes
    and sort buffers, and small per-length and per-group arrays (SMALL_ROWS x PREFETCH_GROUP).
    A growing index's lookups add their frozen runs (with_frozen_runs)."""
    return dict(
        counts=line_aligned((N_TOKENS,), np.int32),
        runs=line_aligned((MAX_LENGTHS, 2 * slots), np.uint64),
        toks=line_aligned((2 * slots,), np.int64),
        keys=line_aligned((GROUP_BLOCK,), np.uint64),
        parts=line_aligned((GROUP_BLOCK,), np.uint64),
        order=line_aligned((GROUP_BLOCK,), np.uint64),
        spare=line_aligned((GROUP_BLOCK,), np.uint64),
        hist=line_aligned((RADIX_HIST,), np.int64),
        prefix=line_aligned((HASH_SCRATCH,), np.uint64),
        small_i=line_aligned((SMALL_ROWS, PREFETCH_GROUP), np.int64),
        small_u=line_aligned((SMALL_ROWS, PREFETCH_GROUP), np.uint64),
    )


def with_frozen_runs(scratch, n_lengths, slots):
    """scratch with the frozen runs a growing index's lookups keep across calls (frozen_run),
    allocated and written once so that no lookup takes their page faults (they had cost more
    than the runs saved): 8 bytes a slot, and 8 per slot and longer length for the answers,
    12 MiB with 3 lengths."""
    if "frozen_runs" not in scratch:
        n = max(FROZEN_RUN_SLOTS, 2 * slots)  # room for the longest run, two full buckets
        scratch.update(
            frozen_keys=line_aligned((2 * FROZEN_ENTRIES,), np.uint64),  # 0: empty
            frozen_vals=line_aligned((2 * FROZEN_ENTRIES, 3), np.int64),  # run offset, count, answer
            frozen_runs=line_aligned((n,), np.uint64),
            frozen_tops=line_aligned((max(1, n_lengths - 1), n), np.int64),  # longer lengths' answers
            frozen_used=line_aligned((3,), np.int64),  # entries, run slots, times all were dropped
        )
        for a in (scratch["frozen_runs"], scratch["frozen_tops"]):
            a.fill(1)  # zeroed pages are mapped on first write; write them now
    return scratch


@numba.njit(cache=True, inline="always")
def hash_positions(q, j0, n, r, lengths, pows, partition_bits, bits, shifts, prefix, keys, parts):
    """Slot keys and partitions of stream positions j0..j0+n-1 of q into keys[:n], parts[:n]:
    one at a time while a length is still absent (j < the longest length), then vectorised
    (hashing.hash_block) HASH_BLOCK positions at a time."""
    Lmax = lengths[lengths.shape[0] - 1]
    end = j0 + n
    early = min(end, Lmax)
    if j0 < early:
        init_states(r, q, j0, lengths)
        for j in range(j0, early):
            parts[j - j0], _, keys[j - j0] = slot_key(r, j, lengths, pows, partition_bits, bits, shifts)
            if j < q.shape[0]:
                roll(r, q, j, lengths, pows)
    for b in range(max(j0, Lmax), end, HASH_BLOCK):
        hash_block(q, b, min(end, b + HASH_BLOCK), lengths, pows, partition_bits, bits, shifts, prefix,
                   keys[b - j0:], parts[b - j0:])


@numba.njit(cache=True, inline="always")
def radix_sort(a, n, spare, hist, low, n_bits, digit_bits):
    """Sort a[:n] by bits low..low+n_bits-1 (LSD, digit_bits a pass, stable, through spare[:n]);
    returns the array that holds the result (a or spare). Every pass's counts come from one read
    of a[:n] before the first pass (the counts of a digit do not depend on the order), so the
    data is read passes + 1 times, not 2 x passes. hist holds passes x 2^digit_bits counters
    (RADIX_HIST)."""
    size = 1 << digit_bits
    mask = U64(size - 1)
    passes = (n_bits + digit_bits - 1) // digit_bits
    hist[:passes * size] = 0
    for i in range(n):
        v = a[i] >> U64(low)
        for p in range(passes):
            hist[p * size + np.int64((v >> U64(p * digit_bits)) & mask)] += 1
    for p in range(passes):
        o = 0
        for d in range(p * size, (p + 1) * size):
            c = hist[d]
            hist[d] = o
            o += c
    src, dst = a, spare
    for p in range(passes):
        sh = U64(low + p * digit_bits)
        h = hist[p * size:(p + 1) * size]
        for i in range(n):
            d = np.int64((src[i] >> sh) & mask)
            dst[h[d]] = src[i]
            h[d] += 1
        src, dst = dst, src
    return src


@numba.njit(cache=True, inline="always")
def sort_block(q, j0, n, r, lengths, pows, partition_bits, bucket_bits, bits, shifts, prefix, keys, parts, order,
               spare, hist):
    """Hash stream positions j0..j0+n-1 of q (n <= GROUP_BLOCK) into keys[:n], parts[:n], and
    return them sorted: an array whose first n entries are sort key << GROUP_BITS | index in the
    block. The sort key is partition | first bucket | a hash of the shortest key | the longer
    lengths' fields, cut to SORT_BITS (at most 44 bits of partition and bucket leave 5): equal
    n-grams end up adjacent and buckets are visited in address order. The order only decides
    what is reused and in which order memory is read: any order gives the same results.
    Also returns the keys in sorted order (in the sort buffer the result is not in): a lookup
    then reads its keys in sequence, where keys[i] had missed the cache once or more per
    position (the record step's lookup took 0.94x the time). A sorted entry's partition is
    its top bits (entry_partition)."""
    hash_positions(q, j0, n, r, lengths, pows, partition_bits, bits, shifts, prefix, keys, parts)
    sh0 = U64(shifts[0])
    low_bits = np.int64(shifts[0]) - TOKEN_BITS
    rest = SORT_BITS - partition_bits - bucket_bits
    hash_bits = max(0, rest - low_bits)
    low_kept = rest - hash_bits
    low_mask = (U64(1) << U64(low_bits)) - U64(1)
    for i in range(n):
        b1, _ = bucket_pair(keys[i] >> sh0, bucket_bits)
        sk = (parts[i] << U64(bucket_bits)) | b1
        if hash_bits:
            sk = (sk << U64(hash_bits)) | (fmix64(keys[i] >> sh0) >> U64(64 - hash_bits))
        low = ((keys[i] >> U64(TOKEN_BITS)) & low_mask) >> U64(low_bits - low_kept)
        order[i] = (((sk << U64(low_kept)) | low) << U64(GROUP_BITS)) | U64(i)
    srt = radix_sort(order, n, spare, hist, GROUP_BITS, SORT_BITS, RADIX_BITS)
    sorted_keys = order if RADIX_PASSES % 2 else spare  # the buffer radix_sort did not end in
    for s in range(n):
        sorted_keys[s] = keys[np.int64(srt[s] & U64(GROUP_BLOCK - 1))]
    return srt, sorted_keys


@numba.njit(cache=True, inline="always")
def entry_partition(entry, partition_bits):
    """The partition of a sorted entry of sort_block: the top partition_bits bits (two shifts,
    so that 0 bits gives 0)."""
    return (entry >> U64(63 - partition_bits)) >> U64(1)


@numba.njit(cache=True, inline="always")
def gather_run(row, f, sh, qk, run, m):
    """Append the slots of row[:f] whose key at shift sh is qk to run[m:]; returns the new end.
    Branch-free: every slot is written at the end, and the end moves on when it matches (as
    fast as visiting the set bits of 64-bit match masks, in record-step A/B runs, and simpler).
    row is indexed from 0: indices that might be negative (as far as the compiler knows) turn
    vector loads into gathers."""
    part = row[:f]
    for i in range(part.shape[0]):
        run[m] = part[i]
        m += np.int64((part[i] >> sh) == qk)
    return m


@numba.njit(cache=True, inline="always")
def top_of_run(run, m, counts):
    """(most frequent follower, its count) among the slots run[:m] (ties to the smallest id).
    First a precheck, one vectorised compare: if the first slot's follower is more than half
    of the run it is the answer (most runs are pure or nearly so). Else the followers are
    counted in token-indexed counters that are left zeroed again: one pass counts, a second
    takes the largest (count, -token) without a branch and clears each counter after its
    first read (a token's later copies then read 0). The counting passes wait on a store to
    the same counter whenever a token repeats, so a run the precheck settles costs a fraction."""
    first = run[0] & TOKEN_MASK
    part = run[:m]  # indexed from 0: no gathers (gather_run says why)
    same = 0
    for i in range(part.shape[0]):
        same += np.int64((part[i] & TOKEN_MASK) == first)
    if 2 * same > m:
        return np.int64(first), same
    for i in range(m):
        counts[np.int64(run[i] & TOKEN_MASK)] += 1
    best = 0
    for i in range(m):
        tok = np.int64(run[i] & TOKEN_MASK)
        best = max(best, (np.int64(counts[tok]) << TOKEN_BITS) | (np.int64(TOKEN_MASK) - tok))
        counts[tok] = 0
    return np.int64(TOKEN_MASK) - (best & np.int64(TOKEN_MASK)), best >> TOKEN_BITS


@numba.njit(cache=True, inline="always")
def frozen_run(part, c0, sh, row1, row2, slots, run, spare, hist, counts, fkeys, fvals, fruns, ftops, fused):
    """Row of fvals, [offset in fruns, count, answer (0 when absent)], of the frozen run of
    shortest key c0 in partition `part`, whose buckets row1 and row2 are both full. The run is
    the n-gram's slots sorted, so that the run of each longer length is a range of it, whose
    answer frozen_top keeps in ftops. A run not kept yet is gathered (through `run`) and kept;
    when the table would be more than half full or the runs would not fit, everything kept is
    dropped first. `spare` and `hist` are sort buffers."""
    # key: partition and shortest checksum, whose bits fit in 64 (Geometry checks it), plus 1 so
    # that 0 marks an empty entry (the one pair that wraps to 0 is never found: gathered anew)
    fk = ((part << (U64(64) - sh[0])) | c0) + U64(1)
    mask = fkeys.shape[0] - 1
    h = np.int64(fmix64(fk) & U64(mask))
    while fkeys[h] != 0:
        if fkeys[h] == fk:
            return h
        h = (h + 1) & mask
    m = gather_run(row1, slots, sh[0], c0, run, 0)
    m = gather_run(row2, slots, sh[0], c0, run, m)
    if 2 * (fused[0] + 1) > fkeys.shape[0] or fused[1] + m > fruns.shape[0]:
        fkeys[:] = 0
        fused[0] = 0
        fused[1] = 0
        fused[2] += 1
        h = np.int64(fmix64(fk) & U64(mask))
    o = fused[1]
    kept = fruns[o:o + m]
    kept[:] = radix_sort(run, m, spare, hist, 0, np.int64(sh[0]), 8)[:m]  # they share the bits above
    ftops[:, o:o + m] = -1  # longer lengths' answers: computed when first asked for (frozen_top)
    fkeys[h] = fk
    fvals[h, 0] = o
    fvals[h, 1] = m
    fvals[h, 2] = 0
    if m > 0:
        tok, top = top_of_run(kept, m, counts)
        fvals[h, 2] = answer(tok, top)
    fused[0] += 1
    fused[1] += m
    return h


@numba.njit(cache=True, inline="always")
def frozen_top(k, last, a, m, fruns, ftops, counts):
    """(top follower, its count) of the run fruns[a:a+m] of length k >= 1 (the longest if
    `last`), kept in ftops[k - 1, a] once computed."""
    v = ftops[k - 1, a]
    if v < 0:
        if last:  # the longest length's followers are in order
            tok, top = top_of_sorted(fruns[a:], m)
        else:
            tok, top = top_of_run(fruns[a:], m, counts)
        v = answer(tok, top)
        ftops[k - 1, a] = v
    return answer_parts(v)


@numba.njit(cache=True, inline="always")
def top_of_sorted(toks, m):
    """(most frequent follower, its count) of toks[:m], slots or tokens whose tokens are in
    order (ties to the smallest id): the longest stretch of one token."""
    best, best_tok, stretch = 0, np.int64(-1), 0
    prev = np.int64(-1)
    for i in range(m):
        tok = np.int64(toks[i]) & np.int64(TOKEN_MASK)
        stretch = stretch + 1 if tok == prev else 1
        if stretch > best:
            best, best_tok = stretch, tok
        prev = tok
    return best_tok, best


@numba.njit(cache=True, nogil=True)
def lookup_scan(t0, t1, q, table, fill, lengths, pows, partition_bits, bucket_bits, bits, shifts,
                out_token, out_count, out_top, counts, runs, keys, parts, order, spare, hist, prefix, small_i, small_u,
                frozen_keys, frozen_vals, frozen_runs, frozen_tops, frozen_used):
    """For positions t0..t1-1 of q: top follower, the n-gram's count and the top's count, per length.

    Position t uses the n-gram q[t-L+1..t] (stream position j = t+1). A growing index keeps a
    bucket's slots in insertion order, so an n-gram's slots are found by scanning its first
    bucket (and its second, once the first is full) and its followers are counted. Frequent
    n-grams cost a long scan, and recur: so positions go in blocks of GROUP_BLOCK, sorted by
    (partition, first bucket, a hash of the shortest key, the longer lengths' checksums). Each
    shortest n-gram of the block is then gathered from its buckets once, in address order;
    each longer length's slots are filtered from the next shorter one's, once per distinct key
    (equal keys are adjacent). Buckets ahead are prefetched (GROUP_AHEAD). An n-gram whose two
    buckets are full reads its kept sorted run instead (frozen_run): each length's run is a range
    of it, counted from the shorter length's range, and its answer is kept with it. The scratch
    arrays come from new_scratch.
    """
    K = lengths.shape[0]
    slots = table.shape[2]
    q, table, fill, out_token, out_count, out_top = (unmanaged(q), unmanaged(table), unmanaged(fill),
                                                     unmanaged(out_token), unmanaged(out_count), unmanaged(out_top))
    counts, runs, keys, parts, order, spare, hist, prefix = (unmanaged(counts), unmanaged(runs), unmanaged(keys),
                                                             unmanaged(parts), unmanaged(order), unmanaged(spare),
                                                             unmanaged(hist), unmanaged(prefix))
    small_i, small_u, frozen_runs, frozen_tops = unmanaged(small_i), unmanaged(small_u), unmanaged(frozen_runs), unmanaged(
        frozen_tops)
    clear_outputs(t0, t1, out_token, out_count, out_top)
    t = max(t0, lengths[0] - 1)  # earlier positions have no n-gram of any length
    r, sh = small_u[0], small_u[1]
    for k in range(K):
        sh[k] = shifts[k]
    sh0 = sh[0]
    m, res_tok, res_top = small_i[0], small_i[1], small_i[2]  # slots matching each length's key; what they say
    lo = small_i[3]  # frozen: where each length's run starts in frozen_runs
    frozen = False
    while t < t1:
        n = min(t1 - t, GROUP_BLOCK)
        srt, skeys = sort_block(q, t + 1, n, r, lengths, pows, partition_bits, bucket_bits, bits, shifts, prefix, keys,
                                parts, order, spare, hist)
        prev_part, prev_key = U64(0), U64(0)
        for s in range(n):
            if s + 2 * GROUP_AHEAD < n:  # two steps ahead: the fill, then the lines it says are filled
                b1, _ = bucket_pair(skeys[s + 2 * GROUP_AHEAD] >> sh0, bucket_bits)
                prefetch2(fill, entry_partition(srt[s + 2 * GROUP_AHEAD], partition_bits), b1)
            if s + GROUP_AHEAD < n:
                c0 = skeys[s + GROUP_AHEAD] >> sh0
                pa = entry_partition(srt[s + GROUP_AHEAD], partition_bits)
                if pa != entry_partition(srt[s + GROUP_AHEAD - 1], partition_bits) or c0 != (
                        skeys[s + GROUP_AHEAD - 1] >> sh0):  # a new n-gram
                    b1, b2 = bucket_pair(c0, bucket_bits)
                    fa = np.int64(fill[pa, b1])
                    fb = np.int64(fill[pa, b2]) if fa >= slots else 0  # the second holds slots once the first is full
                    if fa < slots or fb < slots:  # both full: frozen, its kept run is read instead
                        for o in range(0, fa, SLOTS_PER_LINE):
                            prefetch3(table, pa, b1, o)
                        for o in range(0, fb, SLOTS_PER_LINE):
                            prefetch3(table, pa, b2, o)
            i = np.int64(srt[s] & U64(GROUP_BLOCK - 1))
            key, part = skeys[s], entry_partition(srt[s], partition_bits)
            j = t + i + 1
            first = 1  # the first length whose key differs from the last position's
            if s == 0 or part != prev_part or (key >> sh0) != (prev_key >> sh0):
                first = 0
            else:
                while first < K and (key >> sh[first]) == (prev_key >> sh[first]):
                    first += 1
            for k in range(first, K):
                if k == 0:
                    b1, b2 = bucket_pair(key >> sh0, bucket_bits)
                    f1 = np.int64(fill[part, b1])
                    frozen = f1 >= slots and np.int64(fill[part, b2]) >= slots
                    if frozen:
                        e = frozen_run(part, key >> sh0, sh, table[part, b1], table[part, b2], slots, runs[0],
                                       runs[1], hist, counts, frozen_keys, frozen_vals, frozen_runs, frozen_tops,
                                       frozen_used)
                        lo[0], m[0] = frozen_vals[e, 0], frozen_vals[e, 1]
                        res_tok[0], res_top[0] = answer_parts(frozen_vals[e, 2])
                    else:
                        m[0] = gather_run(table[part, b1], f1, sh0, key >> sh0, runs[0], 0)
                        if f1 >= slots:  # the second bucket holds an n-gram's slots only once the first is full
                            m[0] = gather_run(table[part, b2], np.int64(fill[part, b2]), sh0, key >> sh0, runs[0], m[0])
                elif j < lengths[k] or m[k - 1] == 0:  # too early for this length, or absent already
                    m[k] = 0
                elif frozen:  # a range of the shorter length's range
                    x = (key >> sh[k]) << sh[k]
                    a, b = count_range(frozen_runs, lo[k - 1], m[k - 1], x, x | ((U64(1) << sh[k]) - U64(1)))
                    lo[k], m[k] = a, b - a
                else:
                    m[k] = gather_run(runs[k - 1], m[k - 1], sh[k], key >> sh[k], runs[k], 0)
                if m[k] == 0 or (frozen and k == 0):
                    pass
                elif k > 0 and m[k] == m[k - 1]:  # the shorter length's slots, all of them: its answer
                    res_tok[k], res_top[k] = res_tok[k - 1], res_top[k - 1]
                elif frozen:
                    res_tok[k], res_top[k] = frozen_top(k, k == K - 1, lo[k], m[k], frozen_runs, frozen_tops, counts)
                else:
                    res_tok[k], res_top[k] = top_of_run(runs[k], m[k], counts)
            for k in range(K):
                if m[k] > 0:
                    out_token[k, t + i] = res_tok[k]
                    out_count[k, t + i] = m[k]
                    out_top[k, t + i] = res_top[k]
            prev_part, prev_key = part, key
        t += n
