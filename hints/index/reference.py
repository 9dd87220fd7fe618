"""Plain-Python references: the naive exact builder, the record's cells, and a slot-level model of the index.

`ReferenceIndex` is the article's naive hint builder: a dict per length from the n-gram
(a tuple of token ids) to the list of tokens that followed it. It counts exactly, so it
defines what a lookup should return; `python -m hints bench` times it against the Numba
build. `reference_slots` replays the index's hashing and first-bucket/second-bucket/drop
placement one position at a time, so tests can compare the Numba table byte for byte,
drops included, and find checksum collisions. `reference_cells` defines the record's
representation (hints.cells): the deepest match among the `cap` most recent earlier occurrences
before a stream position, with document boundaries; every source of Cells is tested against it.
`reference_kind` and `reference_cell` restate the bins of docs/design.md ("Kinds", "Cells") on
their own, as fractions: a reference never calls the code it checks (hints.kinds).
"""
from fractions import Fraction

import numpy as np

from ..cells import BOS, Cells, check_boundary
from .geometry import DEFAULT_LENGTHS
from .hashing import BUCKET_MULT, HASH_MULT, MIX_MULT, SEED_MULT
from .results import Hints

M64 = (1 << 64) - 1
_MULT = int(HASH_MULT)
_SEED = int(SEED_MULT)
_MIX = int(MIX_MULT)
_BUCKET_MULT = int(BUCKET_MULT)


# ---- kinds and cells, as docs/design.md states them ------------------------------------------
# The lowest count and the lowest share (top follower's count / count) of each bin, every edge
# inclusive. Kinds: counts 1 | 2 | 3-4 | 5-8 | 9-16 | 17-32 | 33+; shares <0.3 | 0.3-0.5 | 0.5-0.7 |
# 0.7-0.9 | 0.9-1 | exactly 1. Cells: the same counts; shares <.3 | .3-.5 | .5-.7 | .7-.85 | .85-.95 | >=.95.
COUNT_BIN_LOWS = (1, 2, 3, 5, 9, 17, 33)
KIND_SHARE_LOWS = (Fraction(0), Fraction(3, 10), Fraction(1, 2), Fraction(7, 10), Fraction(9, 10))  # then "exactly 1"
CELL_SHARE_LOWS = (Fraction(0), Fraction(3, 10), Fraction(1, 2), Fraction(7, 10), Fraction(17, 20), Fraction(19, 20))
BINS_PER_DEPTH = 42  # 7 count bins x 6 share bins, for kinds and cells alike


def _bin(value, lows):
    return max(i for i, low in enumerate(lows) if value >= low)


def reference_kind(length_index, count, top):
    """Kind of a hint of one length seen `count` times, `top` of them followed by the hinted token."""
    share = 5 if top == count else _bin(Fraction(top, count), KIND_SHARE_LOWS)
    return length_index * BINS_PER_DEPTH + _bin(count, COUNT_BIN_LOWS) * 6 + share


def reference_cell(depth, count, top):
    """Cell of a position whose deepest length index is `depth` (-1: none), `count` candidates,
    `top` of them followed by the most frequent follower."""
    if depth < 0:
        return -1
    return depth * BINS_PER_DEPTH + _bin(count, COUNT_BIN_LOWS) * 6 + _bin(Fraction(top, count), CELL_SHARE_LOWS)


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
                kind[k, t] = reference_kind(k, total, counts[best])
        return Hints(token=token, count=count, purity=purity, kind=kind)


# ---- the record's cells ----------------------------------------------------------------------

def reference_reach(tokens, boundary=BOS, segment=0):
    """Reach of every position (hints.cells.reach's rule, uncapped): tokens of its segment up to
    and including it; segments start at 0, at multiples of `segment` (0: none) and at each BOS."""
    boundary = check_boundary(boundary)
    out, start = [], 0
    for t, x in enumerate(tokens):
        if (segment and t % segment == 0) or int(x) == boundary:
            start = t
        out.append(t - start + 1)
    return out


def reference_cells(stream, query, before=None, cap=None, max_followers=8, lengths=DEFAULT_LENGTHS,
                    boundary=BOS, segment=0):
    """Cells of every position of `query` against the occurrences in `stream`, by brute force.

    An occurrence is a stream position j whose shortest n-gram exists (stream reach >= lengths[0],
    segments of `segment` tokens and BOS restarts) and whose follower stream[j + 1] lies before
    `before` (None: the stream's end). Query position t (one segment: the query array, BOS
    restarts) is resolved against the `cap` most recent occurrences (None: all) of its shortest
    n-gram: a candidate matches min(tokens agreeing backward from j and t, both reaches, the
    longest length) deep; depth is the deepest length any reaches; the cell counts the
    candidates reaching that length and their followers."""
    s = [int(x) for x in stream]
    q = [int(x) for x in query]
    lengths = tuple(int(v) for v in lengths)
    L0, Lmax = lengths[0], lengths[-1]
    end = len(s) if before is None else min(len(s), int(before))
    rs, rq = reference_reach(s, boundary, segment), reference_reach(q, boundary)
    occ = {}
    for j in range(len(s)):
        if rs[j] >= L0 and j + 1 < end:
            occ.setdefault(tuple(s[j - L0 + 1:j + 1]), []).append(j)
    n, F = len(q), int(max_followers)
    depth = np.full(n, -1, np.int8)
    count = np.zeros(n, np.int32)
    followers = np.full((n, F), -1, np.int32)
    fcounts = np.zeros((n, F), np.int32)
    for t in range(n):
        if rq[t] < L0:
            continue
        found = occ.get(tuple(q[t - L0 + 1:t + 1]), [])
        if cap is not None:
            found = found[len(found) - min(len(found), int(cap)):]
        if not found:
            continue
        matched = []
        for j in found:
            a = 0
            while a < Lmax and j - a >= 0 and t - a >= 0 and s[j - a] == q[t - a]:
                a += 1
            matched.append((min(a, rq[t], rs[j]), s[j + 1]))
        deepest = max(m for m, _ in matched)
        d = max(k for k, L in enumerate(lengths) if L <= deepest)
        tally = {}
        for m, x in matched:
            if m >= lengths[d]:
                tally[x] = tally.get(x, 0) + 1
        ranked = sorted(tally.items(), key=lambda kv: (-kv[1], kv[0]))[:F]
        depth[t], count[t] = d, sum(tally.values())
        for f, (x, c) in enumerate(ranked):
            followers[t, f], fcounts[t, f] = x, c
    return Cells(depth=depth, count=count, followers=followers, follower_counts=fcounts,
                 kind=np.array([reference_cell(d, c, f) for d, c, f in zip(depth, count, fcounts[:, 0])],
                               dtype=np.int16))


# ---- slot-level model ------------------------------------------------------------------------

def ngram_hash(ngram, k):
    """h_L of an n-gram (a sequence of ids) of length index k."""
    r = 0
    for x in ngram:
        r = (r * _MULT + int(x) + 1) & M64
    return (_MIX * (r + (k + 1) * _SEED)) & M64


def slot_of(geom, stream, j):
    """(partition, first bucket, second bucket, slot word) of stream position j >= lengths[0]."""
    bits, shifts, lengths = geom.checksum_bits, geom.key_shifts, geom.lengths
    h0 = ngram_hash(stream[j - lengths[0]:j], 0)
    part = h0 >> (64 - geom.partition_bits) if geom.partition_bits else 0
    c0 = (h0 >> (64 - geom.partition_bits - bits[0])) & ((1 << bits[0]) - 1)
    key = c0 << shifts[0]
    for k in range(1, len(lengths)):
        if j >= lengths[k]:
            c = ngram_hash(stream[j - lengths[k]:j], k) >> (64 - bits[k])
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
