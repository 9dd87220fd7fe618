"""Numba kernels of the hint index: n-gram hashing, the two build stages, checksums (lookup: `hints.lookup`).

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
def prefetch2(typingctx, arr, i, j):
    """Hint the CPU to load arr[i, j]'s cache line (no fault, no wait)."""
    return types.void(arr, i, j), _prefetch_codegen


@intrinsic
def prefetch3(typingctx, arr, i, j, k):
    """Hint the CPU to load arr[i, j, k]'s cache line (no fault, no wait)."""
    return types.void(arr, i, j, k), _prefetch_codegen


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


@intrinsic
def cttz(typingctx, x):
    """Count of trailing zero bits of a uint64 (the index of its lowest set bit)."""
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [ir.IntType(64), ir.IntType(1)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.cttz.i64")
        return builder.call(fn, [args[0], ir.Constant(ir.IntType(1), 0)])
    return types.uint64(types.uint64), codegen


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
    # flush partial burst lines (block length is a multiple of BURST, so they always fit).
    # The block-chain append is written out twice on purpose: a shared inline helper made
    # stage 1 about 1.4x slower (python -m hints bench, 70.7M -> 50.1M tok/s on one worker).
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


# ---- build, stage 2 -------------------------------------------------------------------------

@numba.njit(cache=True, nogil=True)
def staged_sizes(heads, block_len, block_next):
    """Slots staged per partition (walks the block chains, not the slots)."""
    n_ranges, n_part = heads.shape
    sizes = np.zeros(n_part, dtype=np.int64)
    for w in range(n_ranges):
        for p in range(n_part):
            blk = heads[w, p]
            while blk >= 0:
                sizes[p] += block_len[blk]
                blk = block_next[blk]
    return sizes


@numba.njit(cache=True, nogil=True)
def stage2_place(parts, arena, block_len, block_next, heads, table, fill, bucket_bits, shift0, dropped):
    """Place the staged slots of the partitions in `parts`, each walking its chains in range
    order (= stream order): first bucket while it has room, else the second, else drop."""
    n_ranges = heads.shape[0]
    slots = table.shape[2]
    for p in parts:
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
