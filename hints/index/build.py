"""Numba kernels of the hashed index's build: stage 1 (hash and stage), stage 2 (place), checksums.

Everything here is `nogil` and cached, and works on plain NumPy arrays handed in by
`hints.index.hint_index`; the hashing is `hints.index.hashing`'s.

Build, stage 1 (`stage1_worker`): workers claim chunks of the stream (64k positions or more), the
next unclaimed one each time (so chunks go round-robin while workers keep pace, and a
worker that finishes early takes the chunks a slow one has not reached), hash 256 positions
at a time with every length in a vectorised pass (`hash_block`), and append each slot to its
partition's chain of staging blocks through a per-partition burst line of 8 slots (64
bytes; 2^14 lines = 1 MiB, the record's L2-resident buffer), or up to 32 with few partitions
(`hints.index.sizing.burst_slots`), written out whole with non-temporal stores (no read for
ownership, no cache line taken: at 2^14 partitions stage 1 went from 9.6-10.1 to 7.8
ns/token; the record step's add is unchanged). Stage 2 (`stage2_place`): workers claim
partitions in turn, largest first, take each one's slots in chunk order (= stream order) and
place each in its first bucket while it has room, else its second, else drop it: through a
line of 8 per bucket that goes to the table whole, in one non-temporal 64-byte store, once full
(`place_run`; a partition with few slots a bucket stores each alone, with a plain store),
prefetching the fill of the partition it takes next.
So the bytes do not depend on the worker count or on which worker took which chunk or partition. A slot
whose two buckets are both full already is not staged at all (stage 1 reads one bit per
bucket, `full_buckets`, which stage 2 keeps current).
"""
import numba
import numpy as np

from ..numba_ops import atomic_add, fmix64, prefetch1, store_fence, stream_line, unmanaged
from .geometry import SLOTS_PER_LINE
from .hashing import HASH_BLOCK, HASH_MULT, bucket_pair, hash_block, init_states, roll, slot_key

U64 = np.uint64

BURST = SLOTS_PER_LINE                   # slots per burst line: one 64-byte cache line
FILL_LINE = 32                           # uint16 bucket fills per 64-byte line
FILL_PREFETCH_STRIDE = 4                 # stage 2 prefetches a line of the next partition's fill every 4 slots
# Stage 2 places a partition's slots through bucket lines (place_run) when it brings at least a line's
# worth a bucket: a build's partitions bring ~55 (stage 2 took 0.40x the time at 16 partitions, 0.65x
# at 2^14, in-process A/B on a Xeon), a record-step add's ~0.16, where nearly every line stays partial
# (with lines its add took 1.3x the time); below it, each slot is stored alone.
LINE_MIN_SLOTS_PER_BUCKET = 8


@numba.njit(cache=True, nogil=True)
def chain_block(part, blk, n_block, head, tail, tail_len, full_blocks, block_len, block_next, free):
    """A new staging block at the end of partition part's chain, whose tail blk (-1: none yet) is
    full: taken from the shared counter free[0], linked after blk (whose length is then
    n_block) or made the chain's head. Returns it; its tail length is 0."""
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
    return nb


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
    at 1.5x the time per token of one; passed in, at the same speed). A new block comes from
    `chain_block`, called on the rare path only (once a block, 512 slots); the test that
    leads to it stays inline, as the copies of whole lines do: as an inlined helper taking
    the arrays, the whole append had made stage 1 6x slower.

    A slot whose two buckets were both full when the add began (bits of `full`, one per
    bucket) would be dropped by stage 2, so it is not staged: it is counted in skipped[0].
    Without a branch: the slot is written to the burst line either way, and the line's fill
    moves on only for a slot that is kept. A record-step add drops ~37% of its slots.
    """
    s, prefix, keys, parts = unmanaged(s), unmanaged(prefix), unmanaged(keys), unmanaged(parts)  # hash_block slices them
    sh0 = U64(shifts[0])
    any_full = full.any()  # else the bits are not read (a build from empty: ~1 ns a token saved)
    n_skipped = U64(0)
    n_part = burst.shape[0]
    burst_len = U64(burst.shape[1])
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
            for i in range(b1 - j):  # unsigned indices: no negative-index wraparound code to run
                part = parts[i]
                drop = U64(0)
                if any_full:
                    x1, x2 = bucket_pair(keys[i] >> sh0, bucket_bits)
                    drop = (full[part, x1 >> U64(6)] >> (x1 & U64(63))) & (full[part, x2 >> U64(6)] >> (
                        x2 & U64(63))) & U64(1)
                f = U64(burst_fill[part])
                burst[part, f] = keys[i] | U64(s[U64(j + i)])
                f += U64(1) - drop
                n_skipped += drop
                if f == burst_len:
                    f = U64(0)
                    blk = tail[part]
                    if blk < 0 or tail_len[part] == n_block:
                        blk = chain_block(part, blk, n_block, head, tail, tail_len, full_blocks, block_len, block_next,
                                          free)
                    o = tail_len[part]
                    for x in range(0, burst.shape[1], BURST):
                        stream_line(arena, blk, o + x, burst, part, x)
                    tail_len[part] = o + burst.shape[1]
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
                blk = chain_block(part, blk, n_block, head, tail, tail_len, full_blocks, block_len, block_next, free)
            o = tail_len[part]
            for q in range(f):
                arena[blk, o + q] = burst[part, q]
            tail_len[part] = o + f
            burst_fill[part] = 0
        if tail[part] >= 0:
            block_len[tail[part]] = tail_len[part]
    skipped[0] += np.int64(n_skipped)
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
def place_run(row, a, e, tp, fp, fullp, slots, bucket_bits, shift0, fnext, pf, lines, base, whole_lines, use_lines):
    """Place row[a:e] in partition tp/fp: first bucket while it has room, else the second, else
    drop; a bucket that fills up gets its bit in fullp (full_buckets). Returns (drops, the next
    fill line to prefetch).

    Slots are not stored one by one: each goes into its bucket's line of 8 in `lines` (this
    worker's, one 64-byte line per bucket of a partition: 1 MiB at 2^14 buckets, L2-resident),
    and a line is streamed to the table whole (stream_line: one 64-byte non-temporal store, no
    read of the line) once its 8th slot is in (the record's builder does the same). The lines a
    pass does not fill are written slot by slot at its end (flush_lines), as is the first line of a
    bucket that already held slots of an earlier add: its other slots are in the table, not in
    `lines` (base[b], the bucket's fill when the partition's pass began, says which slots are
    new), and every line of a table whose rows do not start on 64-byte lines (whole_lines false).
    Without use_lines (a partition with few slots a bucket, where lines would stay partial)
    each slot is stored alone. Slots stored alone or slot by slot use plain stores: an 8-byte
    non-temporal store leaves a partial line in a write-combining buffer, which memory then
    has to read, merge and write back, and on a Xeon (family 6 model 207) random ones took
    ~49 ns a store against ~14 ns for plain ones (the record step's add took 0.47x the time
    with plain stores, stage 2 of a build at 16 partitions 0.67x; in-process A/B).

    Meanwhile the fill row of the partition to come, fnext, is prefetched: one line every
    FILL_PREFETCH_STRIDE slots, from line pf on. A partition's fill lines are cold when it starts
    (an add touched them one step ago), and a slot's placement waits for its fill (prefetched so,
    the record step's stage 2 took 0.77x the time, in-process A/B)."""
    drops = 0
    S = U64(slots)
    L = U64(SLOTS_PER_LINE)
    for i in range(a, e):  # unsigned bucket and slot indices: no negative-index wraparound code
        if i % FILL_PREFETCH_STRIDE == 0 and pf < fnext.shape[0]:
            prefetch1(fnext, pf)
            pf += FILL_LINE
        slot = row[i]
        b1, b2 = bucket_pair(slot >> shift0, bucket_bits)
        b = b2 if fp[b1] >= slots else b1
        f = U64(fp[b])
        if f < S and not use_lines:
            tp[b, f] = slot
            fp[b] = f + U64(1)
            if f + U64(1) == S:
                fullp[b >> U64(6)] |= U64(1) << (b & U64(63))
        elif f < S:
            lane = f & (L - U64(1))
            lines[b, lane] = slot
            fp[b] = f + U64(1)
            if lane == L - U64(1):  # the line is complete
                lo = f - lane
                b0 = U64(base[b])
                if whole_lines and b0 <= lo:
                    stream_line(tp, b, lo, lines, b, 0)
                else:  # its first slots came from an earlier add (or the table's rows are not line-aligned)
                    for x in range(max(b0, lo), f + U64(1)):
                        tp[b, x] = lines[b, x & (L - U64(1))]
            if f + U64(1) == S:
                fullp[b >> U64(6)] |= U64(1) << (b & U64(63))
        else:
            drops += 1
    return drops, pf


@numba.njit(cache=True, inline="always")
def flush_lines(tp, fp, lines, base):
    """Write the slots of the lines a partition's pass left partial (place_run): each bucket's
    last line, from its first new slot on, slot by slot (a pass over the partition's buckets:
    1/55 of a build's slots at 16 partitions)."""
    for b in range(fp.shape[0]):
        f = np.int64(fp[b])
        lane = f & (SLOTS_PER_LINE - 1)
        for x in range(max(np.int64(base[b]), f - lane), f):
            tp[b, x] = lines[b, x & (SLOTS_PER_LINE - 1)]


@numba.njit(cache=True, inline="always")
def partition_slots(p, heads, owner, counts_t, block_len, block_next):
    """Slots staged for partition p: its chunks' counts, or with one stage-1 worker (no chunks
    recorded) the lengths of its chain's blocks."""
    if owner.shape[0] == 0:
        n = 0
        b = heads[0, p]
        while b >= 0:
            n += block_len[b]
            b = block_next[b]
        return n
    n = 0
    for c in range(owner.shape[0]):
        n += np.int64(counts_t[p, c])
    return n


@numba.njit(cache=True, nogil=True)
def stage2_place(order, claims, arena, block_len, block_next, heads, owner, counts_t, table, fill, full, bucket_bits,
                 shift0, dropped, cursor, lines, base):
    """One stage-2 worker: claim partitions from `order` (the next unclaimed one each time, from
    the shared counter claims[0]; a worker that finishes early takes the rest, and a late one
    holds up only the partition it is on) and place each one's staged slots in stream order:
    chunk by chunk (counts_t[p, c] slots of partition p from the chain of owner[c], who claimed
    chunk c; stage 1's counts transposed, so a partition's are contiguous), or, with one stage-1
    worker (no chunks recorded), along its chain. Partitions share nothing, so the bytes do not
    depend on who placed which. cursor (2, workers), the bucket lines `lines` (buckets, 8) and
    base (buckets,), each bucket's fill when the partition's pass began (place_run), are this
    worker's own, allocated by the caller as stage 1's buffers are."""
    n_workers = heads.shape[0]
    slots = table.shape[2]
    sh0 = U64(shift0)
    whole_lines = table.ctypes.data % 64 == 0  # rows are whole lines (slots % 8 == 0) from an aligned start
    arena, table, fill, full, cursor = unmanaged(arena), unmanaged(table), unmanaged(fill), unmanaged(full), unmanaged(cursor)
    lines, base = unmanaged(lines), unmanaged(base)
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
        use_lines = partition_slots(p, heads, owner, counts_t, block_len, block_next) >= (
            LINE_MIN_SLOTS_PER_BUCKET * tp.shape[0])
        if use_lines:
            base[:] = fp
        # the partition this worker takes next, if the workers keep claiming in turn: its fill
        # is prefetched while this one is placed (place_run)
        nxt = c + n_workers
        fnext = fill[order[nxt]] if nxt < order.shape[0] else fill[p, :0]
        pf = 0
        if owner.shape[0] == 0:
            b = heads[0, p]
            while b >= 0:
                d, pf = place_run(arena[b], 0, block_len[b], tp, fp, fullp, slots, bucket_bits, sh0, fnext, pf, lines, base,
                                  whole_lines, use_lines)
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
                    d, pf = place_run(arena[b], o, o + take, tp, fp, fullp, slots, bucket_bits, sh0, fnext, pf, lines,
                                      base, whole_lines, use_lines)
                    drops += d
                    need -= take
                    o += take
                    if o == block_len[b]:
                        blk[w] = block_next[b]
                        o = 0
                    off[w] = o
        if use_lines:
            flush_lines(tp, fp, lines, base)
        dropped[p] += drops
    store_fence()  # the slots' non-temporal stores are visible to every core from here on


# ---- whole-table helpers --------------------------------------------------------------------

@numba.njit(cache=True, nogil=True)
def checksum64(a0, a1, words):
    """Checksum of words[a0:a1], position-sensitive: sum of fmix64(word ^ index mix). Sums of
    ranges add up to the checksum of the whole (mod 2^64)."""
    acc = U64(0)
    for i in range(a0, a1):
        acc += fmix64(words[i] ^ (U64(i) * HASH_MULT))
    return acc
