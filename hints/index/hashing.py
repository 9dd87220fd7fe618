"""N-gram hashing of the hashed index: rolling hashes of every length, the slot key, the bucket pair.

All hash arithmetic is uint64 and wraps mod 2^64. For stream position j (the index of the next
token) and length L, with j >= L (the contract `hints.index.reference` reproduces in plain Python):

    R_L(j) = sum_{k=1..L} (s[j-k] + 1) * M^(k-1)            mod 2^64, rolled in O(1) per j
    h_L(j) = MIX_MULT * (R_L(j) + SEED[length index])       mod 2^64

and every field is taken from the top of h (multiply-shift: the top bits of a product depend on
every bit of R, whose low bits alone would depend only on the tokens' low bits). The shortest
length's h gives the partition (top P bits) and its checksum (the next bits); each longer
length's checksum is the top bits of its own h, with 0 reserved for "absent".
Both buckets are a function of the shortest checksum alone (`bucket_pair`). Stage 1 of the
build and both lookups hash 256 positions at a time with every length in a vectorised pass
(`hash_block`); the stream's first positions, where some lengths are absent, go one at a time
(`init_states`, `slot_key`, `roll`). Multiplying by MIX_MULT distributes over R_L(j) = P(j) -
P(j-L) M^L, so a block multiplies P(j) by it once for all lengths, and each length then costs
one multiply a position (with MurmurHash3's fmix64 finaliser in its place, each length cost
three: hashing a block took 1.5-1.6x the time).
"""
import numba
import numpy as np

from ..numba_ops import FMIX_C1
from .geometry import MAX_LENGTH

U64 = np.uint64

HASH_MULT = U64(0x9E3779B97F4A7C15)     # odd 64-bit multiplier of the rolling polynomial (golden ratio)
SEED_MULT = U64(0xC2B2AE3D27D4EB4F)     # per-length seed = (k + 1) * SEED_MULT, so lengths hash apart
BUCKET_MULT = U64(0xD6E8FEB86659FD93)   # odd multiplier of the multiply-shift bucket hash
MIX_MULT = FMIX_C1                      # odd multiplier of h_L's multiply-shift (MurmurHash3's fmix64 first constant)
HASH_BLOCK = 256                        # positions hashed per vectorised block (L1-resident buffers)
# A block's hash scratch (`hash_block`'s `prefix`): its prefix sums P(a) (HASH_BLOCK + MAX_LENGTH + 1
# words), then MIX_MULT * P(j) of its positions (HASH_BLOCK words)
PREFIX_WORDS = HASH_BLOCK + MAX_LENGTH + 1
HASH_SCRATCH = PREFIX_WORDS + HASH_BLOCK
# M^i for i = 0..127: a block's prefix sums (HASH_BLOCK + MAX_LENGTH positions) run in four quarters
# of at most 80, joined with these powers
MULT_POWS = np.array([pow(int(HASH_MULT), i, 1 << 64) for i in range(128)], dtype=np.uint64)


def hash_arrays(geom):
    """The hash parameters of a geometry as the kernels take them: (lengths, pows, bits, shifts),
    with pows[k] = M^L_k (what rolling a length-L_k state past a token subtracts)."""
    lengths = np.array(geom.lengths, dtype=np.int64)
    pows = np.array([pow(int(HASH_MULT), L, 1 << 64) for L in geom.lengths], dtype=np.uint64)
    return lengths, pows, np.array(geom.checksum_bits, dtype=np.int64), np.array(geom.key_shifts, dtype=np.int64)


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
    h0 = MIX_MULT * (r[0] + SEED_MULT)
    part = (h0 >> U64(63 - partition_bits)) >> U64(1)
    c0 = (h0 >> U64(64 - partition_bits - bits[0])) & ((U64(1) << U64(bits[0])) - U64(1))
    key = c0 << U64(shifts[0])
    for k in range(1, lengths.shape[0]):
        if j >= lengths[k]:
            c = (MIX_MULT * (r[k] + U64(k + 1) * SEED_MULT)) >> U64(64 - bits[k])
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
    length, into keys[:j1-j0] and parts[:j1-j0]; prefix is the block's scratch (HASH_SCRATCH words).

    Vectorised over positions: with the prefix polynomial P(a) = sum_{k<a} (s[k]+1) M^(a-1-k)
    (one multiply-add per token, the only sequential step: prefix_sums), h_L(j) = MIX_MULT P(j)
    - P(j-L) (MIX_MULT M^L) + MIX_MULT SEED_L for every length at once (MIX_MULT P(j) once, for
    all of them), and each length's pass over the block is a loop without branches."""
    base = j0 - lengths[lengths.shape[0] - 1]
    prefix_sums(s, base, j1 - 1 - base, prefix)  # P(j) for j < j1 reads s[:j1-1] only
    n = j1 - j0
    o = j0 - base
    now = prefix[o:o + n]  # P(j) for the block's positions, and P(j - L) below: slices, because with
    #                        computed indices the loads compiled to gathers (hash_block took 2.1x the time)
    mixed = prefix[PREFIX_WORDS:PREFIX_WORDS + n]  # MIX_MULT P(j), written by the first length's pass
    L, pw = lengths[0], MIX_MULT * pows[0]
    seed = MIX_MULT * SEED_MULT
    top = U64(63 - partition_bits)
    c0_shift = U64(64 - partition_bits - bits[0])
    c0_mask = (U64(1) << U64(bits[0])) - U64(1)
    sh0 = U64(shifts[0])
    before = prefix[o - L:o - L + n]
    for i in range(n):
        x = MIX_MULT * now[i]
        mixed[i] = x
        h0 = x - before[i] * pw + seed
        parts[i] = (h0 >> top) >> U64(1)
        keys[i] = ((h0 >> c0_shift) & c0_mask) << sh0
    for k in range(1, lengths.shape[0]):
        L, pw = lengths[k], MIX_MULT * pows[k]
        seed = MIX_MULT * (U64(k + 1) * SEED_MULT)
        c_shift = U64(64 - bits[k])
        sh = U64(shifts[k])
        before = prefix[o - L:o - L + n]
        for i in range(n):
            c = (mixed[i] - before[i] * pw + seed) >> c_shift
            c += U64(c == U64(0))
            keys[i] |= c << sh
