"""Numba kernels of hint lookup: the scan of a growing index, sealing, and the search of a sealed one.

A lookup answers, for each query position and length, the n-gram's count, its most frequent
follower (ties to the smallest id) and that follower's count. Both kinds of index answer the
same; they differ in how a bucket is read.

Growing index (`lookup_scan`). A bucket holds its slots in insertion order, so a lookup scans
the first bucket (and the second, once the first is full) for the slots of the query's
shortest n-gram and counts their followers in token-indexed counters. Frequent n-grams have
long runs and recur in a query, so the positions are sorted first (in blocks of
GROUP_BLOCK, by bucket address and key): each distinct n-gram is then gathered and counted
once per block, each longer length from its shorter one's slots, and buckets are read in
address order. An n-gram whose two buckets are both full can gain no slot: its run is kept,
sorted, with its answers, across calls (frozen_run), so an add() between lookups needs no
invalidation.

Sealed index (`seal_partitions`, `lookup_sorted`). Sealing sorts each bucket's slots as
uint64 words. A slot is [checksum(L0) | checksum(L1) | ... | token] from the top bit down, so
the order is by the key of every length at once: the slots of one n-gram of any length form
one contiguous run, the run of a longer n-gram lies inside the run of its shorter suffix,
and the slots of the longest n-gram are sorted by follower token. Each bucket gets a summary
row (one cache line for S <= 184): its fill, per line of 8 slots the top 16 bits of the
line's first slot (a fence), and a presence filter (FILTER_WORDS). A lookup reads the summary:
a clear filter bit says the n-gram is absent, and no slot line is read; else the fences name
the slot lines where the shortest n-gram's run can lie (usually one or two), and the runs of
all lengths are found by binary search (or, in a short range, by counting), nested. The n-gram count is
the run's length. The most frequent follower comes from the few tokens of a short run (<
SIDE_MIN_COUNT slots), and for a long run from the side table: for every n-gram with at
least SIDE_MIN_COUNT slots, sealing stores (length index << 48 | key) -> (top count << 16 |
top token) in a per-partition open-addressing table (linear probing, at most half full).
"""
import numba
import numpy as np

from .geometry import CHECKSUM_BITS, CHECKSUM_TOTAL_BITS, MAX_LENGTH, MAX_LENGTHS, SLOTS_PER_LINE, TOKEN_BITS
from .kernels import (HASH_BLOCK, bucket_pair, fmix64, hash_block, init_states, prefetch2, prefetch3,
                      roll, slot_key, unmanaged)
from .parallel import line_aligned

U64 = np.uint64
TOKEN_MASK = U64((1 << TOKEN_BITS) - 1)
NO_KEY = U64(1 << CHECKSUM_TOTAL_BITS)  # a query key no slot key (< 2^48) can equal
UNUSED_SHIFT = 63                       # shift of lengths a geometry lacks: slot >> 63 is 0 or 1, never NO_KEY
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
LINEAR_BOUNDS = 16  # ranges of up to 16 slots (two lines) are counted, longer ones binary-searched
INSERTION_SORT_MAX = 32  # sealing sorts buckets of up to 32 slots by insertion, longer ones by ndarray.sort


def summary_words(slots, filter_words=None):
    """uint16 words of one bucket's summary row: the fill, one fence per slot line, the presence
    filter (FILTER_WORDS; none in files sealed before it, hints.store), padded."""
    lines = -(-slots // SLOTS_PER_LINE)
    filter_words = FILTER_WORDS if filter_words is None else filter_words
    return -(-(1 + lines + filter_words) // SUMMARY_ALIGN) * SUMMARY_ALIGN


@numba.njit(cache=True, inline="always")
def filter_word_bit(c0, slots):
    """(word of the summary row, bit in it) of shortest checksum c0 in a bucket's presence filter,
    which follows the row's fences (slots // SLOTS_PER_LINE of them)."""
    h = np.int64((c0 * FILTER_MULT) >> U64(64 - FILTER_LOG_BITS))
    return 1 + slots // SLOTS_PER_LINE + (h >> 4), U64(h & 15)


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


# ---- growing index: scan ----------------------------------------------------------------------

def new_scratch(n_lengths, slots):
    """Per-worker lookup state, allocated once per index and reused, every array on cache lines
    of its own (kernels.stage1_worker says why the kernels allocate nothing themselves):
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
        hist=line_aligned((1 << RADIX_BITS,), np.int64),
        prefix=line_aligned((HASH_BLOCK + MAX_LENGTH + 1,), np.uint64),
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
    (kernels.hash_block) HASH_BLOCK positions at a time."""
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
    returns the array that holds the result (a or spare). hist holds 2^digit_bits counters."""
    mask = U64((1 << digit_bits) - 1)
    src, dst = a, spare
    for sh in range(low, low + n_bits, digit_bits):
        hist[:1 << digit_bits] = 0
        for i in range(n):
            hist[np.int64((src[i] >> U64(sh)) & mask)] += 1
        o = 0
        for d in range(1 << digit_bits):
            c = hist[d]
            hist[d] = o
            o += c
        for i in range(n):
            d = np.int64((src[i] >> U64(sh)) & mask)
            dst[hist[d]] = src[i]
            hist[d] += 1
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
