"""Plain-Python references: the naive exact builder, and a slot-level model of the index.

`ReferenceIndex` is the article's naive hint builder: a dict per length from the n-gram
(a tuple of token ids) to the list of tokens that followed it. It counts exactly, so it
defines what a lookup should return; `python -m hints bench` times it against the Numba
build. `reference_slots` replays the index's hashing and first-bucket/second-bucket/drop
placement one position at a time, so tests can compare the Numba table byte for byte,
drops included, and find checksum collisions.
"""
import numpy as np

from . import kernels
from .geometry import DEFAULT_LENGTHS
from .index import Hints
from .kinds import kind_of

M64 = (1 << 64) - 1
_MULT = int(kernels.HASH_MULT)
_SEED = int(kernels.SEED_MULT)
_C1, _C2 = int(kernels.FMIX_C1), int(kernels.FMIX_C2)
_BUCKET_MULT = int(kernels.BUCKET_MULT)


class ReferenceIndex:
    """Exact n-gram follower lists; same stream and lookup semantics as HintIndex."""

    def __init__(self, lengths=DEFAULT_LENGTHS):
        self.lengths = tuple(lengths)
        self.followers = [dict() for _ in self.lengths]
        self.tail = []
        self.tokens_added = 0

    def add(self, tokens):
        s = self.tail + [int(x) for x in tokens]
        for j in range(len(self.tail), len(s)):
            nxt = s[j]
            for L, table in zip(self.lengths, self.followers):
                if j >= L:
                    key = tuple(s[j - L:j])
                    if key in table:
                        table[key].append(nxt)
                    else:
                        table[key] = [nxt]
        self.tokens_added += len(s) - len(self.tail)
        self.tail = s[-max(self.lengths):]
        return self

    def follower_counts(self, k, ngram):
        """{next token: count} for the n-gram of length index k (empty when unseen)."""
        counts = {}
        for x in self.followers[k].get(tuple(int(v) for v in ngram), ()):
            counts[x] = counts.get(x, 0) + 1
        return counts

    def lookup(self, tokens):
        q = [int(x) for x in tokens]
        K, n = len(self.lengths), len(q)
        token = np.full((K, n), -1, dtype=np.int32)
        count = np.zeros((K, n), dtype=np.int32)
        purity = np.zeros((K, n), dtype=np.float32)
        kind = np.full((K, n), -1, dtype=np.int16)
        for t in range(n):
            for k, L in enumerate(self.lengths):
                if t + 1 < L:
                    continue
                counts = self.follower_counts(k, q[t - L + 1:t + 1])
                if not counts:
                    continue
                best = min(counts, key=lambda x: (-counts[x], x))  # most frequent, ties to the smallest id
                total = sum(counts.values())
                token[k, t], count[k, t] = best, total
                purity[k, t] = np.float32(counts[best] / total)
                kind[k, t] = kind_of.py_func(k, total, counts[best])
        return Hints(token=token, count=count, purity=purity, kind=kind)


# ---- slot-level model ------------------------------------------------------------------------

def fmix64(h):
    h ^= h >> 33
    h = (h * _C1) & M64
    h ^= h >> 33
    h = (h * _C2) & M64
    return h ^ (h >> 33)


def ngram_hash(ngram, k):
    """h_L of an n-gram (a sequence of ids) of length index k."""
    r = 0
    for x in ngram:
        r = (r * _MULT + int(x) + 1) & M64
    return fmix64((r + (k + 1) * _SEED) & M64)


def slot_of(geom, stream, j):
    """(partition, first bucket, second bucket, slot word) of stream position j >= lengths[0]."""
    bits, shifts, lengths = geom.checksum_bits, geom.key_shifts, geom.lengths
    h0 = ngram_hash(stream[j - lengths[0]:j], 0)
    part = h0 >> (64 - geom.partition_bits) if geom.partition_bits else 0
    c0 = (h0 >> (64 - geom.partition_bits - bits[0])) & ((1 << bits[0]) - 1)
    key = c0 << shifts[0]
    for k in range(1, len(lengths)):
        if j >= lengths[k]:
            c = ngram_hash(stream[j - lengths[k]:j], k) & ((1 << bits[k]) - 1)
            key |= (c or 1) << shifts[k]
    x = (c0 * _BUCKET_MULT) & M64
    b = geom.bucket_bits
    b1 = x >> (64 - b)
    b2 = b1 ^ (((x >> (64 - 2 * b)) & ((1 << b) - 1)) | 1)
    return part, b1, b2, key | int(stream[j])


def reference_slots(geom, stream):
    """Replay the build of a whole stream: (fill uint16 array, table uint64 array, dropped)."""
    stream = [int(x) for x in stream]
    fill = np.zeros((geom.n_partitions, geom.n_buckets), dtype=np.uint16)
    table = np.zeros((geom.n_partitions, geom.n_buckets, geom.slots), dtype=np.uint64)
    dropped = 0
    for j in range(geom.lengths[0], len(stream)):
        p, b1, b2, slot = slot_of(geom, stream, j)
        b = b1 if fill[p, b1] < geom.slots else b2
        if fill[p, b] < geom.slots:
            table[p, b, fill[p, b]] = slot
            fill[p, b] += 1
        else:
            dropped += 1
    return fill, table, dropped
