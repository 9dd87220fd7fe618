"""Numba kernels of the hint index: n-gram hashing, the two build stages, checksums (lookup: `hints.lookup`).

Everything here is `nogil` and cached, and works on plain NumPy arrays handed in by
`hints.index`. All hash arithmetic is uint64 and wraps mod 2^64.

Hashing (the contract `hints.reference` reproduces in plain Python). For stream position j
(the index of the next token) and length L, with j >= L:

    R_L(j) = sum_{k=1..L} (s[j-k] + 1) * M^(k-1)            mod 2^64, rolled in O(1) per j
    h_L(j) = fmix64(R_L(j) + SEED[length index])

The shortest length's h gives the partition (top P bits) and its checksum (the next bits);
each longer length's checksum is the low bits of its own h, with 0 reserved for "absent".

Build, stage 1 (`stage1_worker`): workers claim chunks of the stream (64k positions or more), the
next unclaimed one each time (so chunks go round-robin while workers keep pace, and a
worker that finishes early takes the chunks a slow one has not reached), hash 256 positions
at a time with every length in a vectorised pass (`hash_block`), and append each slot to its
partition's chain of staging blocks through a per-partition burst line of 8 slots (64
bytes; 2^14 lines = 1 MiB, the record's L2-resident buffer), or up to 32 with few partitions
(`hints.index.burst_slots`), written out whole with non-temporal stores (no read for
ownership, no cache line taken: at 2^14 partitions stage 1 went from 9.6-10.1 to 7.8
ns/token; the record step's add is unchanged). Stage 2 (`stage2_place`): workers claim
partitions in turn, largest first, take each one's slots in chunk order (= stream order) and
place each in its first bucket while it has room, else its second, else drop it, with a
non-temporal store (no read of its line), prefetching the fill of the partition it takes next.
So the bytes do not depend on the worker count or on which worker took which chunk or partition. A slot
whose two buckets are both full already is not staged at all (stage 1 reads one bit per
bucket, `full_buckets`, which stage 2 keeps current).
"""
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .geometry import SLOTS_PER_LINE

U64 = np.uint64

HASH_MULT = U64(0x9E3779B97F4A7C15)     # odd 64-bit multiplier of the rolling polynomial (golden ratio)
SEED_MULT = U64(0xC2B2AE3D27D4EB4F)     # per-length seed = (k + 1) * SEED_MULT, so lengths hash apart
FMIX_C1 = U64(0xFF51AFD7ED558CCD)       # MurmurHash3 fmix64 constants
FMIX_C2 = U64(0xC4CEB9FE1A85EC53)
BUCKET_MULT = U64(0xD6E8FEB86659FD93)   # odd multiplier of the multiply-shift bucket hash
BURST = SLOTS_PER_LINE                   # slots per burst line: one 64-byte cache line
FILL_LINE = 32                           # uint16 bucket fills per 64-byte line
FILL_PREFETCH_STRIDE = 4                 # stage 2 prefetches a line of the next partition's fill every 4 slots
HASH_BLOCK = 256                        # positions hashed per vectorised block (L1-resident buffers)
# M^i for i = 0..127: a block's prefix sums (HASH_BLOCK + MAX_LENGTH positions) run in four quarters
# of at most 80, joined with these powers
MULT_POWS = np.array([pow(int(HASH_MULT), i, 1 << 64) for i in range(128)], dtype=np.uint64)


def _prefetch_codegen(context, builder, signature, args):
    aryty = signature.args[0]
    ary = context.make_array(aryty)(context, builder, args[0])
    ptr = cgutils.get_item_pointer(context, builder, aryty, ary, args[1:], wraparound=False)
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
    # read (0), keep in all cache levels (3), data cache (1)
    builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
    return context.get_dummy_value()


@intrinsic
def unmanaged(typingctx, arr):
    """arr without its reference count: the same data, shape and strides, no meminfo.

    Numba counts the references of every view a kernel takes (a row, a slice) with an atomic
    increment and decrement of the array's meminfo. An atomic is a full fence on x86, so the core
    cannot run ahead to the next position's loads past it, and when workers take views of one
    array (the stream, the table) the counter's cache line moves between their cores each time.
    In the record step's lookup these counts were 13% of the samples (perf) and their fences
    held back the prefetches. A kernel calls this on the arrays it takes views of, at entry: its
    caller holds the arrays for the whole call, and no view outlives it."""
    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        src = context.make_array(aryty)(context, builder, args[0])
        out = context.make_array(aryty)(context, builder)
        for name in ("data", "shape", "strides", "itemsize", "nitems"):
            setattr(out, name, getattr(src, name))
        out.meminfo = cgutils.get_null_value(out.meminfo.type)  # NRT_incref/decref skip a null meminfo
        out.parent = cgutils.get_null_value(out.parent.type)
        return out._getvalue()
    return arr(arr), codegen


@intrinsic
def stream_store(typingctx, dst, i, j, v):
    """dst[i, j] = v as one non-temporal store (movnti): the word goes to memory through a
    write-combining buffer, and its line is neither read first nor kept in cache. Weakly
    ordered: store_fence() before another core reads it."""
    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = [context.cast(builder, args[k], signature.args[k], types.intp) for k in (1, 2)]
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, idx, wraparound=False)
        store = builder.store(context.cast(builder, args[3], signature.args[3], aryty.dtype), ptr)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()
    return types.void(dst, i, j, v), codegen


@intrinsic
def prefetch1(typingctx, arr, i):
    """Hint the CPU to load arr[i]'s cache line (no fault, no wait)."""
    return types.void(arr, i), _prefetch_codegen


@intrinsic
def prefetch2(typingctx, arr, i, j):
    """Hint the CPU to load arr[i, j]'s cache line (no fault, no wait)."""
    return types.void(arr, i, j), _prefetch_codegen


@intrinsic
def prefetch3(typingctx, arr, i, j, k):
    """Hint the CPU to load arr[i, j, k]'s cache line (no fault, no wait)."""
    return types.void(arr, i, j, k), _prefetch_codegen


@intrinsic
def stream_line(typingctx, dst, di, dj, src, si, sj):
    """dst[di, dj:dj+8] = src[si, sj:sj+8] (uint64) as one 64-byte non-temporal store: the line
    goes to memory without being read first or kept in cache. dst[di, dj] must start a cache line."""
    def codegen(context, builder, signature, args):
        dty, sty = signature.args[0], signature.args[3]
        dst_ary = context.make_array(dty)(context, builder, args[0])
        src_ary = context.make_array(sty)(context, builder, args[3])
        dp = cgutils.get_item_pointer(context, builder, dty, dst_ary, [args[1], args[2]], wraparound=False)
        sp = cgutils.get_item_pointer(context, builder, sty, src_ary, [args[4], args[5]], wraparound=False)
        line = ir.VectorType(ir.IntType(64), BURST)
        v = builder.load(builder.bitcast(sp, line.as_pointer()), align=8)
        store = builder.store(v, builder.bitcast(dp, line.as_pointer()), align=64)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()
    return types.void(dst, di, dj, src, si, sj), codegen


@intrinsic
def store_fence(typingctx):
    """A full memory fence: non-temporal stores before it are visible to every core after it
    (on x86 an mfence; they are weakly ordered otherwise)."""
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen


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

@intrinsic
def atomic_add(typingctx, arr, i, v):
    """arr[i] += v atomically; returns the old arr[i] (a claim counter shared by workers)."""
    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        val = context.cast(builder, args[2], signature.args[2], aryty.dtype)
        return builder.atomic_rmw("add", ptr, val, "monotonic")
    return arr.dtype(arr, i, v), codegen


@numba.njit(cache=True, inline="always")
def prefix_sums(s, base, n, prefix):
    """prefix[a] = P(a) = sum_{k<a} (s[base+k]+1) M^(a-1-k) for a = 0..n. One multiply-add chain
    waits a multiply's latency per token; so four chains run over the four quarters of the
    range at once, and each quarter after the first is then corrected in a vectorised pass:
    P(q+i+1) = P(q) M^(i+1) + the quarter's own sum."""
    prefix[0] = U64(0)
    q = (n + 3) >> 2
    if n < 16 or q + 1 > MULT_POWS.shape[0]:
        acc = U64(0)
        for i in range(n):
            acc = acc * HASH_MULT + U64(s[base + i]) + U64(1)
            prefix[i + 1] = acc
        return
    last = n - 3 * q  # the fourth quarter's length (<= q)
    s0, s1, s2, s3 = s[base:base + q], s[base + q:base + 2 * q], s[base + 2 * q:base + 3 * q], s[base + 3 * q:base + n]
    p0, p1, p2, p3 = prefix[1:q + 1], prefix[q + 1:2 * q + 1], prefix[2 * q + 1:3 * q + 1], prefix[3 * q + 1:n + 1]
    a0, a1, a2, a3 = U64(0), U64(0), U64(0), U64(0)
    for i in range(last):
        a0 = a0 * HASH_MULT + U64(s0[i]) + U64(1)
        a1 = a1 * HASH_MULT + U64(s1[i]) + U64(1)
        a2 = a2 * HASH_MULT + U64(s2[i]) + U64(1)
        a3 = a3 * HASH_MULT + U64(s3[i]) + U64(1)
        p0[i], p1[i], p2[i], p3[i] = a0, a1, a2, a3
    for i in range(last, q):
        a0 = a0 * HASH_MULT + U64(s0[i]) + U64(1)
        a1 = a1 * HASH_MULT + U64(s1[i]) + U64(1)
        a2 = a2 * HASH_MULT + U64(s2[i]) + U64(1)
        p0[i], p1[i], p2[i] = a0, a1, a2
    for c in range(1, 4):
        quarter = prefix[c * q + 1:min(n, (c + 1) * q) + 1]
        p = prefix[c * q]
        for i in range(quarter.shape[0]):
            quarter[i] += p * MULT_POWS[i + 1]


@numba.njit(cache=True, inline="always")
def hash_block(s, j0, j1, lengths, pows, partition_bits, bits, shifts, prefix, keys, parts):
    """Slot keys (without the token) and partitions of positions j0..j1-1, all >= the longest
    length, into keys[:j1-j0] and parts[:j1-j0].

    Vectorised over positions: with the prefix polynomial P(a) = sum_{k<a} (s[k]+1) M^(a-1-k)
    (one multiply-add per token, the only sequential step: prefix_sums), R_L(j) = P(j) -
    P(j-L) M^L for every length at once, and each length's pass over the block is a loop
    without branches."""
    base = j0 - lengths[lengths.shape[0] - 1]
    prefix_sums(s, base, j1 - 1 - base, prefix)  # P(j) for j < j1 reads s[:j1-1] only
    n = j1 - j0
    o = j0 - base
    now = prefix[o:o + n]  # P(j) for the block's positions, and P(j - L) below: slices, because with
    #                        computed indices the loads compiled to gathers (hash_block took 2.1x the time)
    L, pw = lengths[0], pows[0]
    top = U64(63 - partition_bits)
    c0_shift = U64(64 - partition_bits - bits[0])
    c0_mask = (U64(1) << U64(bits[0])) - U64(1)
    sh0 = U64(shifts[0])
    before = prefix[o - L:o - L + n]
    for i in range(n):
        h0 = fmix64(now[i] - before[i] * pw + SEED_MULT)
        parts[i] = (h0 >> top) >> U64(1)
        keys[i] = ((h0 >> c0_shift) & c0_mask) << sh0
    for k in range(1, lengths.shape[0]):
        L, pw = lengths[k], pows[k]
        seed = U64(k + 1) * SEED_MULT
        mask = (U64(1) << U64(bits[k])) - U64(1)
        sh = U64(shifts[k])
        before = prefix[o - L:o - L + n]
        for i in range(n):
            c = fmix64(now[i] - before[i] * pw + seed) & mask
            c += U64(c == U64(0))
            keys[i] |= c << sh


@numba.njit(cache=True, nogil=True)
def stage1_worker(s, start, end, chunk_len, n_chunks, claims, owner, counts, w, lengths, pows, partition_bits,
                  bucket_bits, bits, shifts, full, arena, block_len, block_next, free, head, tail, tail_len, full_blocks,
                  staged, burst, burst_fill, skipped, r, prefix, keys, parts):
    """One stage-1 worker: claim chunks of chunk_len positions of s[start:end] (the next
    unclaimed one each time, from the shared counter claims[0], so chunk ids rise for every
    worker), hash them, and append each slot to this worker's chain for its partition.

    A partition's slots go through a burst line of 8 (64 bytes; the record's 2^14 lines are
    1 MiB, L2-resident), or of 16 or 32 with few partitions (burst.shape[1], whole lines),
    copied out whole to the chain's tail block; blocks come from the
    shared counter free[0]. With several workers, at the end of chunk c, counts[c, p] is the
    number of slots chunk c gave partition p and owner[c] = w: stage 2 takes them in chunk
    order. Every array but the shared ones (s, arena, block_next, block_len, free, claims,
    owner, counts) is this worker's own, so workers share no cache line on the per-token path;
    that includes the hash buffers r, prefix, keys and parts, which the caller allocates on
    lines of their own (allocated in here, even padded to whole lines, two workers ran stage 1
    at 1.5x the time per token of one; passed in, at the same speed). The block append is
    written out twice (per line, and for the partial lines at the end) on purpose: as an
    inlined helper taking the arrays, stage 1 ran 6x slower.

    A slot whose two buckets were both full when the add began (bits of `full`, one per
    bucket) would be dropped by stage 2, so it is not staged: it is counted in skipped[0].
    Without a branch: the slot is written to the burst line either way, and the line's fill
    moves on only for a slot that is kept. A record-step add drops ~37% of its slots.
    """
    s, prefix, keys, parts = unmanaged(s), unmanaged(prefix), unmanaged(keys), unmanaged(parts)  # hash_block slices them
    sh0 = U64(shifts[0])
    any_full = full.any()  # else the bits are not read (a build from empty: ~1 ns a token saved)
    n_skipped = 0
    n_part, burst_len = burst.shape
    n_block = arena.shape[1]
    Lmax = lengths[lengths.shape[0] - 1]
    while True:
        c = atomic_add(claims, 0, 1)
        if c >= n_chunks:
            break
        if owner.shape[0]:
            owner[c] = w
        j = max(start + c * chunk_len, lengths[0])
        j1 = min(end, start + (c + 1) * chunk_len)
        while j < j1:
            b1 = min(j1, j + HASH_BLOCK)
            if j >= Lmax:
                hash_block(s, j, b1, lengths, pows, partition_bits, bits, shifts, prefix, keys, parts)
            else:  # the stream's first positions, where some lengths are absent: one at a time
                b1 = min(b1, Lmax)
                init_states(r, s, j, lengths)
                for i in range(b1 - j):
                    parts[i], _, keys[i] = slot_key(r, j + i, lengths, pows, partition_bits, bits, shifts)
                    roll(r, s, j + i, lengths, pows)
            for i in range(b1 - j):
                part = np.int64(parts[i])
                drop = 0
                if any_full:
                    x1, x2 = bucket_pair(keys[i] >> sh0, bucket_bits)
                    drop = np.int64((full[part, x1 >> U64(6)] >> (x1 & U64(63))) & (full[part, x2 >> U64(6)] >> (
                        x2 & U64(63))) & U64(1))
                f = np.int64(burst_fill[part])
                burst[part, f] = keys[i] | U64(s[j + i])
                f += 1 - drop
                n_skipped += drop
                if f == burst_len:
                    f = 0
                    blk = tail[part]
                    if blk < 0 or tail_len[part] == n_block:
                        nb = atomic_add(free, 0, 1)
                        block_next[nb] = -1
                        if blk < 0:
                            head[part] = nb
                        else:
                            block_next[blk] = nb
                            block_len[blk] = n_block
                            full_blocks[part] += 1
                        tail[part] = nb
                        tail_len[part] = 0
                        blk = nb
                    o = tail_len[part]
                    for x in range(0, burst_len, BURST):
                        stream_line(arena, blk, o + x, burst, part, x)
                    tail_len[part] = o + burst_len
                burst_fill[part] = f
            j = b1
        if counts.shape[0]:  # slots staged so far per partition: a difference gives this chunk's
            for p in range(n_part):
                total = full_blocks[p] * n_block + tail_len[p] + burst_fill[p]
                counts[c, p] = total - staged[p]
                staged[p] = total
    # flush partial burst lines (a block's length is a multiple of burst_len, so they always fit)
    for part in range(n_part):
        f = np.int64(burst_fill[part])
        if f:
            blk = tail[part]
            if blk < 0 or tail_len[part] == n_block:
                nb = atomic_add(free, 0, 1)
                block_next[nb] = -1
                if blk < 0:
                    head[part] = nb
                else:
                    block_next[blk] = nb
                    block_len[blk] = n_block
                    full_blocks[part] += 1
                tail[part] = nb
                tail_len[part] = 0
                blk = nb
            o = tail_len[part]
            for q in range(f):
                arena[blk, o + q] = burst[part, q]
            tail_len[part] = o + f
            burst_fill[part] = 0
        if tail[part] >= 0:
            block_len[tail[part]] = tail_len[part]
    skipped[0] += n_skipped
    store_fence()  # stage 2 may run on another core


# ---- build, stage 2 -------------------------------------------------------------------------

@numba.njit(cache=True, nogil=True)
def full_buckets(fill, slots):
    """One bit per bucket, set where the bucket is full: (partitions, ceil(buckets / 64)) uint64,
    bit b & 63 of word b >> 6 (1/16 of the fill's size, and no larger temporary). Stage 2
    keeps it current as buckets fill up; stage 1 reads it."""
    P, B = fill.shape
    full = np.zeros((P, (B + 63) // 64), dtype=np.uint64)
    for p in range(P):
        for b in range(B):
            if fill[p, b] >= slots:
                full[p, b >> 6] |= U64(1) << U64(b & 63)
    return full


@numba.njit(cache=True, nogil=True)
def staged_sizes(heads, block_len, block_next):
    """Slots staged per partition (walks the block chains, not the slots)."""
    n_workers, n_part = heads.shape
    sizes = np.zeros(n_part, dtype=np.int64)
    for w in range(n_workers):
        for p in range(n_part):
            blk = heads[w, p]
            while blk >= 0:
                sizes[p] += block_len[blk]
                blk = block_next[blk]
    return sizes


@numba.njit(cache=True, inline="always")
def place_run(row, a, e, tp, fp, fullp, slots, bucket_bits, shift0, fnext, pf):
    """Place row[a:e] in partition tp/fp: first bucket while it has room, else the second, else
    drop; a bucket that fills up gets its bit in fullp (full_buckets). Meanwhile the fill row of
    the partition to come, fnext, is prefetched: one line every FILL_PREFETCH_STRIDE slots, from
    line pf on. Returns (drops, the next line to prefetch).

    A partition's fill lines are cold when it starts (an add touched them one step ago), and a
    slot's store waits for its fill; stores leave the store buffer in order, so one fill miss
    held back every store behind it (perf: the samples sat on the table store). Prefetched
    this way, the record step's stage 2 took 0.77x the time (in-process A/B, two runs).

    Each slot is written with a non-temporal store (stream_store): its line is not read from
    memory first, so the store leaves the store buffer without waiting for it, and with
    slots landing on random lines of a partition far larger than the cache, nothing is lost
    by not keeping it. Stage 2 against plain stores (in-process A/B): the record step's
    0.88-0.93x, a build at 16 partitions 0.74x (2 workers 0.88x), at 2^14 0.90x (0.91x).
    Prefetching the slots' table lines instead made stage 2 slower at every geometry we
    measured (1.3-1.38x on the record's add)."""
    drops = 0
    for i in range(a, e):
        if i % FILL_PREFETCH_STRIDE == 0 and pf < fnext.shape[0]:
            prefetch1(fnext, pf)
            pf += FILL_LINE
        slot = row[i]
        b1, b2 = bucket_pair(slot >> shift0, bucket_bits)
        b = b2 if fp[b1] >= slots else b1
        f = fp[b]
        if f < slots:
            stream_store(tp, b, f, slot)
            fp[b] = f + 1
            if f + 1 == slots:
                fullp[b >> U64(6)] |= U64(1) << (b & U64(63))
        else:
            drops += 1
    return drops, pf


@numba.njit(cache=True, nogil=True)
def stage2_place(order, claims, arena, block_len, block_next, heads, owner, counts_t, table, fill, full, bucket_bits,
                 shift0, dropped, cursor):
    """One stage-2 worker: claim partitions from `order` (the next unclaimed one each time, from
    the shared counter claims[0]; a worker that finishes early takes the rest, and a late one
    holds up only the partition it is on) and place each one's staged slots in stream order:
    chunk by chunk (counts_t[p, c] slots of partition p from the chain of owner[c], who claimed
    chunk c; stage 1's counts transposed, so a partition's are contiguous), or, with one stage-1
    worker (no chunks recorded), along its chain. Partitions share nothing, so the bytes do not
    depend on who placed which. cursor (2, workers) is this worker's own, allocated by the
    caller as stage 1's buffers are."""
    n_workers = heads.shape[0]
    slots = table.shape[2]
    sh0 = U64(shift0)
    arena, table, fill, full, cursor = unmanaged(arena), unmanaged(table), unmanaged(fill), unmanaged(full), unmanaged(cursor)
    blk, off = cursor[0], cursor[1]  # each worker chain's block and offset
    while True:
        c = atomic_add(claims, 0, 1)
        if c >= order.shape[0]:
            break
        p = order[c]
        drops = 0
        tp = table[p]
        fp = fill[p]
        fullp = full[p]
        # the partition this worker takes next, if the workers keep claiming in turn: its fill
        # is prefetched while this one is placed (place_run)
        nxt = c + n_workers
        fnext = fill[order[nxt]] if nxt < order.shape[0] else fill[p, :0]
        pf = 0
        if owner.shape[0] == 0:
            b = heads[0, p]
            while b >= 0:
                d, pf = place_run(arena[b], 0, block_len[b], tp, fp, fullp, slots, bucket_bits, sh0, fnext, pf)
                drops += d
                b = block_next[b]
        else:
            for w in range(n_workers):
                blk[w] = heads[w, p]
                off[w] = 0
            for c in range(owner.shape[0]):
                w = owner[c]
                need = np.int64(counts_t[p, c])
                while need > 0:
                    b = blk[w]
                    o = off[w]
                    take = min(need, block_len[b] - o)
                    d, pf = place_run(arena[b], o, o + take, tp, fp, fullp, slots, bucket_bits, sh0, fnext, pf)
                    drops += d
                    need -= take
                    o += take
                    if o == block_len[b]:
                        blk[w] = block_next[b]
                        o = 0
                    off[w] = o
        dropped[p] += drops
    store_fence()  # the slots' non-temporal stores are visible to every core from here on


# ---- whole-table helpers --------------------------------------------------------------------

@numba.njit(cache=True, nogil=True)
def zero_fill(a0, a1, a):
    """Write zeros over a[a0:a1]: pre-faults fresh pages from the worker that runs it."""
    a[a0:a1] = 0


@numba.njit(cache=True, nogil=True)
def checksum64(a0, a1, words):
    """Checksum of words[a0:a1], position-sensitive: sum of fmix64(word ^ index mix). Sums of
    ranges add up to the checksum of the whole (mod 2^64)."""
    acc = U64(0)
    for i in range(a0, a1):
        acc += fmix64(words[i] ^ (U64(i) * HASH_MULT))
    return acc
