"""Numba kernels of the hint index: n-gram hashing, the two build stages, lookup, checksums.

Everything here is `nogil` and cached, and works on plain NumPy arrays handed in by
`hints.index`. All hash arithmetic is uint64 and wraps mod 2^64.

Hashing (the contract `hints.reference` reproduces in plain Python). For stream position j
(the index of the next token) and length L, with j >= L:

    R_L(j) = sum_{k=1..L} (s[j-k] + 1) * M^(k-1)            mod 2^64, rolled in O(1) per j
    h_L(j) = fmix64(R_L(j) + SEED[length index])

The shortest length's h gives the partition (top P bits) and its checksum (the next bits);
each longer length's checksum is the low bits of its own h, with 0 reserved for "absent".

Build, stage 1 (`stage1_range`): one worker hashes a contiguous range of the stream and
appends each slot to its partition's chain of staging blocks, through a per-partition burst
line of 8 slots (64 bytes; 2^14 lines = 1 MiB, the record's L2-resident buffer) that is
copied out whole. Stage 2 (`stage2_place`): one worker per partition walks the partition's
chains in worker order (= stream order) and places each slot in its first bucket while it
has room, else its second, else drops it.
"""
import numba
import numpy as np
from numba import prange

U64 = np.uint64

HASH_MULT = U64(0x9E3779B97F4A7C15)     # odd 64-bit multiplier of the rolling polynomial (golden ratio)
SEED_MULT = U64(0xC2B2AE3D27D4EB4F)     # per-length seed = (k + 1) * SEED_MULT, so lengths hash apart
FMIX_C1 = U64(0xFF51AFD7ED558CCD)       # MurmurHash3 fmix64 constants
FMIX_C2 = U64(0xC4CEB9FE1A85EC53)
BUCKET_MULT = U64(0xD6E8FEB86659FD93)   # odd multiplier of the multiply-shift bucket hash
TOKEN_MASK = U64(0xFFFF)
NO_KEY = U64(1) << U64(63)              # a query key no slot key (< 2^48) can equal
BURST = 8                               # slots per burst line: one 64-byte cache line
LOOKUP_BLOCK = 2048                     # positions per parallel lookup task


@numba.njit(cache=True, inline="always")
def fmix64(h):
    h ^= h >> U64(33)
    h *= FMIX_C1
    h ^= h >> U64(33)
    h *= FMIX_C2
    h ^= h >> U64(33)
    return h


@numba.njit(cache=True, inline="always")
def bucket_pair(c0, bucket_bits):
    """Both buckets of a shortest-length checksum; the second always differs from the first."""
    x = c0 * BUCKET_MULT
    b1 = x >> U64(64 - bucket_bits)
    mask = (U64(1) << U64(bucket_bits)) - U64(1)
    b2 = b1 ^ (((x >> U64(64 - 2 * bucket_bits)) & mask) | U64(1))
    return b1, b2


@numba.njit(cache=True, inline="always")
def rolling_start(s, j, length):
    """R_L(j) computed directly (Horner, oldest token first)."""
    r = U64(0)
    for k in range(j - length, j):
        r = r * HASH_MULT + U64(s[k]) + U64(1)
    return r


@numba.njit(cache=True, inline="always")
def slot_key(r, j, lengths, pows, partition_bits, bits, shifts):
    """(partition, slot key without the token) of position j, given rolling states r[k]=R_Lk(j).

    Lengths with j < L get checksum 0 ("absent"). Requires j >= lengths[0].
    """
    h0 = fmix64(r[0] + SEED_MULT)
    part = (h0 >> U64(63 - partition_bits)) >> U64(1)
    c0 = (h0 >> U64(64 - partition_bits - bits[0])) & ((U64(1) << U64(bits[0])) - U64(1))
    key = c0 << U64(shifts[0])
    for k in range(1, lengths.shape[0]):
        if j >= lengths[k]:
            c = fmix64(r[k] + U64(k + 1) * SEED_MULT) & ((U64(1) << U64(bits[k])) - U64(1))
            c += U64(c == U64(0))
            key |= c << U64(shifts[k])
    return part, c0, key


@numba.njit(cache=True, inline="always")
def roll(r, s, j, lengths, pows):
    """Advance every rolling state from R_L(j) to R_L(j+1)."""
    for k in range(lengths.shape[0]):
        L = lengths[k]
        r[k] = r[k] * HASH_MULT + U64(s[j]) + U64(1)
        if j >= L:
            r[k] -= (U64(s[j - L]) + U64(1)) * pows[k]


@numba.njit(cache=True, inline="always")
def init_states(r, s, j, lengths):
    """Rolling states at j; a length with j < L starts from the tokens it has (its prefix)."""
    for k in range(lengths.shape[0]):
        r[k] = rolling_start(s, j, min(lengths[k], j))


# ---- build, stage 1 -------------------------------------------------------------------------

@numba.njit(cache=True, nogil=True)
def stage1_range(s, j0, j1, lengths, pows, partition_bits, bits, shifts,
                 arena, block_len, block_next, head, tail, first_free, burst, burst_fill):
    """Hash positions j0..j1-1 of s and append one slot each to its partition's block chain.

    arena[b, :] is staging block b; this worker owns blocks first_free.. onwards (its caller
    sized them). head/tail[p] are the first/last block of partition p's chain (-1: none).
    Returns the next free block.
    """
    n_block = arena.shape[1]
    free = first_free
    r = np.empty(lengths.shape[0], dtype=np.uint64)
    start = max(j0, lengths[0])
    if start < j1:
        init_states(r, s, start, lengths)
    for j in range(start, j1):
        part, c0, key = slot_key(r, j, lengths, pows, partition_bits, bits, shifts)
        slot = key | U64(s[j])
        roll(r, s, j, lengths, pows)
        f = burst_fill[part]
        burst[part, f] = slot
        f += 1
        if f == BURST:
            f = 0
            blk = tail[part]
            if blk < 0 or block_len[blk] == n_block:
                nb = free
                free += 1
                block_len[nb] = 0
                block_next[nb] = -1
                if blk < 0:
                    head[part] = nb
                else:
                    block_next[blk] = nb
                tail[part] = nb
                blk = nb
            o = block_len[blk]
            for i in range(BURST):
                arena[blk, o + i] = burst[part, i]
            block_len[blk] = o + BURST
        burst_fill[part] = f
    # flush partial burst lines (block length is a multiple of BURST, so they always fit)
    for part in range(burst.shape[0]):
        f = burst_fill[part]
        if f == 0:
            continue
        blk = tail[part]
        if blk < 0 or block_len[blk] == n_block:
            nb = free
            free += 1
            block_len[nb] = 0
            block_next[nb] = -1
            if blk < 0:
                head[part] = nb
            else:
                block_next[blk] = nb
            tail[part] = nb
            blk = nb
        o = block_len[blk]
        for i in range(f):
            arena[blk, o + i] = burst[part, i]
        block_len[blk] = o + f
        burst_fill[part] = 0
    return free


@numba.njit(cache=True, nogil=True, parallel=True)
def stage1(s, j0, j1, n_ranges, lengths, pows, partition_bits, bits, shifts,
           arena, block_len, block_next, heads, tails, blocks_per_range, bursts, burst_fills):
    """Split j0..j1 into n_ranges contiguous ranges, one worker each (stream order kept by range)."""
    n = j1 - j0
    for w in prange(n_ranges):
        a = j0 + (n * w) // n_ranges
        b = j0 + (n * (w + 1)) // n_ranges
        heads[w, :] = -1
        tails[w, :] = -1
        stage1_range(s, a, b, lengths, pows, partition_bits, bits, shifts,
                     arena, block_len, block_next, heads[w], tails[w], w * blocks_per_range,
                     bursts[w], burst_fills[w])


# ---- build, stage 2 -------------------------------------------------------------------------

@numba.njit(cache=True, nogil=True, parallel=True)
def stage2_place(arena, block_len, block_next, heads, table, fill, bucket_bits, shift0, dropped):
    """Place every staged slot: partition by partition, chains in range order (stream order)."""
    n_ranges, n_part = heads.shape
    slots = table.shape[2]
    for p in prange(n_part):
        drops = 0
        tp = table[p]
        fp = fill[p]
        for w in range(n_ranges):
            blk = heads[w, p]
            while blk >= 0:
                for i in range(block_len[blk]):
                    slot = arena[blk, i]
                    b1, b2 = bucket_pair(slot >> U64(shift0), bucket_bits)
                    b = b2 if fp[b1] >= slots else b1
                    f = fp[b]
                    if f < slots:
                        tp[b, f] = slot
                        fp[b] = f + 1
                    else:
                        drops += 1
                blk = block_next[blk]
        dropped[p] += drops


# ---- lookup ---------------------------------------------------------------------------------

@numba.njit(cache=True, inline="always")
def _insertion_sort(a, m):
    for i in range(1, m):
        v = a[i]
        k = i - 1
        while k >= 0 and a[k] > v:
            a[k + 1] = a[k]
            k -= 1
        a[k + 1] = v


@numba.njit(cache=True, nogil=True, parallel=True)
def lookup(q, table, fill, lengths, pows, partition_bits, bucket_bits, bits, shifts,
           out_token, out_count, out_top):
    """For every position t of q: top follower, its count and the n-gram's count, per length.

    Position t uses the n-gram q[t-L+1..t] (stream position j = t+1). Scans the first bucket,
    and the second only when the first is full (a hint goes to its second bucket only then).
    """
    n = q.shape[0]
    K = lengths.shape[0]
    slots = table.shape[2]
    n_tasks = (n + LOOKUP_BLOCK - 1) // LOOKUP_BLOCK
    for task in prange(n_tasks):
        t0 = task * LOOKUP_BLOCK
        t1 = min(n, t0 + LOOKUP_BLOCK)
        r = np.empty(K, dtype=np.uint64)
        buf = np.empty(2 * slots + 1, dtype=np.uint64)
        qk = np.empty(4, dtype=np.uint64)
        total = np.zeros(K, dtype=np.int64)
        best = np.zeros(K, dtype=np.int64)
        best_tok = np.zeros(K, dtype=np.int64)
        run = np.zeros(K, dtype=np.int64)
        init_states(r, q, t0 + 1, lengths)
        for t in range(t0, t1):
            j = t + 1
            for k in range(K):
                out_token[k, t] = -1
                out_count[k, t] = 0
                out_top[k, t] = 0
            if j >= lengths[0]:
                part, c0, key = slot_key(r, j, lengths, pows, partition_bits, bits, shifts)
                valid = 0
                for k in range(4):
                    qk[k] = NO_KEY
                for k in range(K):
                    if j >= lengths[k]:
                        qk[k] = key >> U64(shifts[k])
                        valid += 1
                b1, b2 = bucket_pair(c0, bucket_bits)
                m = 0
                for pass_ in range(2):
                    b = b1 if pass_ == 0 else b2
                    f = fill[part, b]
                    row = table[part, b]
                    for i in range(f):
                        sl = row[i]
                        lvl = np.int64((sl >> U64(shifts[0])) == qk[0])
                        if K > 1:
                            lvl += np.int64((sl >> U64(shifts[1])) == qk[1])
                        if K > 2:
                            lvl += np.int64((sl >> U64(shifts[2])) == qk[2])
                        if K > 3:
                            lvl += np.int64((sl >> U64(shifts[3])) == qk[3])
                        buf[m] = ((sl & TOKEN_MASK) << U64(3)) | U64(lvl)
                        m += lvl > 0
                    if pass_ == 0 and fill[part, b1] < slots:
                        break
                if m > 0:
                    if m <= 32:
                        _insertion_sort(buf, m)
                    else:
                        buf[:m].sort()
                    for k in range(K):
                        total[k] = 0
                        best[k] = 0
                        best_tok[k] = -1
                        run[k] = 0
                    i = 0
                    while i < m:
                        tok = buf[i] >> U64(3)
                        for k in range(K):
                            run[k] = 0
                        while i < m and (buf[i] >> U64(3)) == tok:
                            lvl = np.int64(buf[i] & U64(7))
                            for k in range(lvl):
                                run[k] += 1
                            i += 1
                        for k in range(K):
                            total[k] += run[k]
                            if run[k] > best[k]:  # ascending tokens: strict > keeps the smallest id on ties
                                best[k] = run[k]
                                best_tok[k] = np.int64(tok)
                    for k in range(valid):
                        if total[k] > 0:
                            out_token[k, t] = best_tok[k]
                            out_count[k, t] = total[k]
                            out_top[k, t] = best[k]
            if j < n:
                roll(r, q, j, lengths, pows)


# ---- whole-table helpers --------------------------------------------------------------------

@numba.njit(cache=True, nogil=True, parallel=True)
def zero_fill(a):
    """Write zeros over a flat array in parallel: pre-faults fresh pages on all workers."""
    n = a.shape[0]
    step = 1 << 20
    for c in prange((n + step - 1) // step):
        a[c * step:min(n, (c + 1) * step)] = 0


@numba.njit(cache=True, nogil=True, parallel=True)
def checksum64(words):
    """Order-sensitive 64-bit checksum of a flat uint64 array: sum of fmix64(word ^ index-mix)."""
    n = words.shape[0]
    step = 1 << 20
    n_chunks = (n + step - 1) // step
    partial = np.zeros(n_chunks, dtype=np.uint64)
    for c in prange(n_chunks):
        acc = U64(0)
        for i in range(c * step, min(n, (c + 1) * step)):
            acc += fmix64(words[i] ^ (U64(i) * HASH_MULT))
        partial[c] = acc
    total = U64(n)
    for c in range(n_chunks):
        total += partial[c]
    return total
