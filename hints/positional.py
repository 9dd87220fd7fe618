"""PositionalIndex: the exact training-time index over the known training stream, filtered by position.

The loader fixes the training stream's order at the start, so one index over all of it can be
built ahead of the GPU (by local rank 0, in phases: up to step 8, 32, then all) and mapped
read-only by the other ranks of the node. Every entry carries its stream position, so a lookup
for step s counts only occurrences whose follower lies before `before` = step s's first token
(all ranks' earlier batches), at most the `cap` most recent ones (the record's 96). Step 0 gets
no hints. N-grams restart at every BOS and at every `segment` tokens (each rank's slice of a
step), in the index and in the query (hints.cells says the rule exactly).

Layout: one entry per stream position j whose shortest n-gram exists and whose follower s[j+1]
lies in the indexed prefix, as one `table` row of 64-bit words:

    [ key = fmix64(F_L0(j)) | j | follower << 32 | reach << 48 | G_1(j) | ... | G_{K-1}(j) ]

F_L0 is the fingerprint of the shortest n-gram and G_k that of its k-th extension (the tokens
L_{k-1} .. L_k - 1 back from j; 0 where the reach falls short), both hints.exact's fingerprint
(random 64-bit multipliers per distance). Rows are sorted by the key's top SORT_BITS and, among
equal ones, by position (`sort_entries`: a stable parallel radix sort of entries made in stream
order); `directory[b]`
is the first row whose key's top `dir_bits` bits are >= b. A candidate's depth is how many of
its extensions equal the query's in a row, within both reaches, and its follower is in its row:
a lookup reads no stream tokens, and walks back over the newest rows of its run as one stream.

Exactness: fmix64 is a bijection, so equal keys mean equal fingerprints; rows whose top bits
equal the query's but whose full key differs are skipped, not counted against the cap. Two
different token sequences share a fingerprint with probability at most 2^-49 over the random
multipliers (hints.exact's argument: the difference's lowest-order token, times a random
multiplier, is uniform on multiples of 2^s, s <= 15), so with ~10^8 comparisons over a record
run the chance of any wrong cell is below 10^-6. The tests compare every lookup with the
token-exact `hints.reference.reference_cells` and find none.

Files: `save(path)` writes header + arrays page-aligned (a path under /dev/shm is shared memory),
to a temporary name then renamed, so a reader never sees a half-written phase; `load(path)` maps
them read-only (np.memmap: no copy, O(header) time). `build_phases` writes one file per phase.

NumPy + Numba only.
"""
import glob
import os
import struct
import time

import numba
import numpy as np

from . import kernels
from .cells import (BOS, N_TOKEN_IDS, Cells, check_boundary, check_max_followers, reach_into, top_followers,
                    with_kinds, empty_cells)
from .exact import multipliers
from .geometry import DEFAULT_LENGTHS, MAX_LENGTH
from .index import alloc

U64 = np.uint64
SORT_BITS = 42           # entries are sorted by the top 42 bits of their key (3 radix passes of 14)
PART_BITS = 8            # the sort's first split: 256 partitions by the top bits, each then sorted on one thread
SORT_DIGIT = 12          # digit of a partition's LSD radix sort: 3 passes over the other 34 sorted bits
CHUNK = 1 << 16          # stream positions per chunk of the build's parallel loops (at least)
MIN_DIR_BITS = 8
MAX_DIR_BITS = 26        # at most 2^26 + 1 directory entries (512 MiB of int64)
DEFAULT_CAP = 96         # occurrences a position is resolved against, the most recent (the record's)
TRAIN_FOLLOWERS = 2      # distinct followers kept per training position (cells_interface: training 2)
LINEAR_STEPS = 16        # entries a lookup scans for its run's ends before it binary-searches
PREFETCH_AHEAD = 16      # positions between a lookup's directory prefetch and its use
WALK_PREFETCH_LINES = 4  # lines prefetched where a lookup's walk back starts (the hardware follows on)
ENTRIES_PER_LINE = 2     # 64-byte lines hold two 32-byte entries (3 lengths: 4 words)
POS_MASK = U64(0xFFFFFFFF)
MAGIC = b"NGPOSIDX"
VERSION = 3
PAGE = 4096
# magic, version, n_lengths, lengths[8], boundary, segment, tokens, entries, dir_bits
_HEADER = struct.Struct("<8sII8IqqqqI")
HEADER_BYTES = PAGE
MULTS = np.array(multipliers(MAX_LENGTH), dtype=np.uint64)  # hints.exact's fingerprint multipliers A[i]


def dir_bits_for(n_entries):
    """Directory bits: about one entry per directory slot, within [MIN_DIR_BITS, MAX_DIR_BITS]."""
    b = max(1, int(n_entries)).bit_length()
    return max(MIN_DIR_BITS, min(MAX_DIR_BITS, b))


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
                keys[o] = kernels.fmix64(fingerprint(s, j, 0, L0, mults))
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
            qkey[t] = kernels.fmix64(fingerprint(q, t, 0, L0, mults))
            qb[t] = np.int64(qkey[t] >> dsh)
            for k in range(1, K):
                qext[t, k - 1] = fingerprint(q, t, lengths[k - 1], lengths[k], mults) if r >= lengths[k] else U64(0)
    A1, A2, A3 = PREFETCH_AHEAD, PREFETCH_AHEAD // 2, PREFETCH_AHEAD // 4
    for t in range(-A1, n):
        u = t + A1
        if u < n and qb[u] >= 0:
            kernels.prefetch1(directory, qb[u])
        u = t + A2
        if 0 <= u < n and qb[u] >= 0:
            lo, hi = directory[qb[u]], directory[qb[u] + 1]
            if hi > lo:
                kernels.prefetch2(e, lo, 0)
                kernels.prefetch2(e, hi - 1, 0)
        u = t + A3
        if 0 <= u < n and qb[u] >= 0:
            lo, hi = run_of(e, directory, qb[u], qkey[u] & sort_mask, sort_mask)
            a = first_after(e, lo, hi, last)
            qlo[u], qa[u] = lo, a
            for x in range(1, 1 + WALK_PREFETCH_LINES * ENTRIES_PER_LINE, ENTRIES_PER_LINE):
                if a - x >= lo:
                    kernels.prefetch2(e, a - x, 0)
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


def _as_stream(tokens, name):
    a = np.asarray(tokens)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise ValueError(f"{name}: expected a 1-D array of integer token ids, got shape {a.shape} dtype {a.dtype}")
    if a.dtype != np.uint16:
        if a.size and (a.min() < 0 or a.max() > 0xFFFF):
            raise ValueError(f"{name}: token ids must be in [0, 65535], found [{a.min()}, {a.max()}]")
        a = a.astype(np.uint16)
    return np.ascontiguousarray(a)


def _check_lengths(lengths):
    lengths = tuple(int(v) for v in lengths)
    if not lengths or len(lengths) > 8 or lengths[0] < 1 or lengths[-1] > MAX_LENGTH or any(
            b <= a for a, b in zip(lengths, lengths[1:])):
        raise ValueError(f"lengths={lengths}: expected 1-8 strictly increasing n-gram lengths in [1, {MAX_LENGTH}]")
    return lengths


class PositionalIndex:
    """Exact positional index over a prefix of a known stream (module docstring).

    idx = PositionalIndex.build(stream, segment=B*T, upto=None)   # upto: tokens indexed (default all)
    cells = idx.lookup_cells(tokens, before, cap=96, max_followers=2, boundary=BOS)
    idx.save(path); PositionalIndex.load(path)                      # read-only mapping
    """

    ARRAYS = ("table", "directory")

    def __init__(self, tokens, lengths, boundary, segment, dir_bits, path=None, build_s=None, **arrays):
        self.tokens, self.lengths, self.boundary, self.segment = int(tokens), tuple(lengths), boundary, segment
        self.dir_bits, self.path, self.build_s = dir_bits, path, build_s
        for name in self.ARRAYS:
            setattr(self, name, arrays[name])

    @property
    def entries(self):
        return int(self.table.shape[0])

    @property
    def nbytes(self):
        return sum(getattr(self, a).nbytes for a in self.ARRAYS)

    @classmethod
    def build(cls, stream, segment=0, upto=None, lengths=DEFAULT_LENGTHS, boundary=BOS, dir_bits=None):
        """Index stream[:upto] (all when None); n-grams restart at each multiple of `segment`
        (0: never) and at every `boundary` token (None: never). dir_bits: the directory's size
        (default: about one entry per bucket; tests make it small, so buckets hold many keys)."""
        t0 = time.perf_counter()
        lengths = _check_lengths(lengths)
        boundary = check_boundary(boundary)
        stream = _as_stream(stream, "stream")
        upto = stream.shape[0] if upto is None else int(upto)
        if not 0 <= upto <= stream.shape[0]:
            raise ValueError(f"upto={upto}: expected 0 <= upto <= len(stream) = {stream.shape[0]}")
        if upto >= 1 << 32:
            raise ValueError(f"upto={upto}: positions are uint32, at most 2^32 - 1 tokens")
        segment = int(segment)
        if segment < 0:
            raise ValueError(f"segment={segment}: expected tokens per rank slice (> 0) or 0 for none")
        s = stream[:upto]
        rs = np.empty(upto, np.uint8)
        reach_into(s, boundary, segment, lengths[-1], rs)
        n_max = max(0, upto - 1)
        keys, pos = np.empty(n_max, np.uint64), np.empty(n_max, np.uint32)
        threads = numba.get_num_threads()  # the parallel loops split into 4 chunks per thread
        n = make_entries(s, rs, upto, lengths[0], MULTS, keys, pos, threads)
        tk, tp = np.empty(n, np.uint64), np.empty(n, np.uint32)
        starts = np.empty((1 << PART_BITS) + 1, np.int64)
        sort_entries(keys, pos, n, tk, tp, starts, threads)
        del tk, tp
        table = alloc((n, len(lengths) + 1), np.uint64)  # huge pages: fewer TLB misses in the lookups' walks
        make_table(s, rs, keys[:n], pos[:n], np.array(lengths, np.int64), MULTS, table)
        del keys, pos
        dir_bits = dir_bits_for(n) if dir_bits is None else int(dir_bits)
        directory = alloc(((1 << dir_bits) + 1,), np.int64)
        make_directory(table, n, dir_bits, directory, starts)
        return cls(upto, lengths, boundary, segment, dir_bits, build_s=time.perf_counter() - t0, table=table,
                   directory=directory)

    def lookup_cells(self, tokens, before, cap=DEFAULT_CAP, max_followers=TRAIN_FOLLOWERS, boundary=BOS):
        """Cells of every position of `tokens` (one segment: n-grams restart at its start and at
        each `boundary` token) from the occurrences whose follower lies before stream position
        `before`, at most the `cap` most recent (None: all) of each shortest n-gram."""
        q = _as_stream(tokens, "tokens")
        F = check_max_followers(max_followers)
        b = check_boundary(boundary)
        if b != self.boundary:
            raise ValueError(f"boundary={boundary!r}: this index was built with boundary {self.boundary} "
                             "(the query and the index must restart alike)")
        before = int(before)
        if before < 0:
            raise ValueError(f"before={before}: expected a stream position >= 0")
        if before > self.tokens:
            raise ValueError(f"before={before}: this index holds only the stream's first {self.tokens:,} tokens "
                             "(wait for the phase that covers it)")
        if cap is not None and int(cap) < 1:
            raise ValueError(f"cap={cap!r}: expected an integer >= 1 (the record's 96) or None for all")
        n = q.shape[0]
        if n == 0:
            return empty_cells(0, F)
        rq = np.empty(n, np.uint8)
        reach_into(q, b, 0, self.lengths[-1], rq)
        depth = np.empty(n, np.int8)
        count = np.empty(n, np.int32)
        out_tok = np.empty((n, F), np.int32)
        out_cnt = np.empty((n, F), np.int32)
        lookup_kernel(q, rq, self.table, self.directory, self.dir_bits, np.array(self.lengths, np.int64), MULTS,
                      before - 2, 0 if cap is None else int(cap), depth, count, out_tok, out_cnt)
        return with_kinds(depth, count, out_tok, out_cnt)

    # ---- files --------------------------------------------------------------------------------
    def save(self, path):
        """Write the index to `path` (temporary name, then an atomic rename)."""
        path = os.fspath(path)
        lengths = list(self.lengths) + [0] * (8 - len(self.lengths))
        header = _HEADER.pack(MAGIC, VERSION, len(self.lengths), *lengths, self.boundary, self.segment,
                              self.tokens, self.entries, self.dir_bits)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(header.ljust(HEADER_BYTES, b"\0"))
            for name in self.ARRAYS:
                f.write(b"\0" * (-f.tell() % PAGE))
                f.write(np.ascontiguousarray(getattr(self, name)).tobytes())
        os.replace(tmp, path)
        self.path = path
        return path

    @classmethod
    def load(cls, path):
        """Map a saved index read-only (no copy; another process may map the same file)."""
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                head = f.read(_HEADER.size)
        except OSError as e:
            raise FileNotFoundError(f"{path}: cannot read a positional index ({e.strerror})") from None
        if len(head) < _HEADER.size or head[:8] != MAGIC:
            raise ValueError(f"{path}: not a positional hint index (bad magic)")
        magic, version, nl, *rest = _HEADER.unpack(head)
        if version != VERSION:
            raise ValueError(f"{path}: positional index version {version}, expected {VERSION}")
        lengths, (boundary, segment, tokens, n, dir_bits) = rest[:nl], rest[8:]
        shapes = dict(table=((n, nl + 1), np.uint64), directory=(((1 << dir_bits) + 1,), np.int64))
        size, off, arrays = os.path.getsize(path), HEADER_BYTES, {}
        for name in cls.ARRAYS:
            shape, dtype = shapes[name]
            off += -off % PAGE
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            if off + nbytes > size:
                raise ValueError(f"{path}: truncated positional index ({name} ends past the file's {size} bytes)")
            arrays[name] = (np.memmap(path, dtype=dtype, mode="r", offset=off, shape=shape) if nbytes
                            else np.zeros(shape, dtype))
            off += nbytes
        return cls(tokens, lengths, boundary, segment, dir_bits, path=path, **arrays)

    def __repr__(self):
        return (f"PositionalIndex({self.tokens:,} tokens, {self.entries:,} entries, {self.nbytes / 2**20:.0f} MiB, "
                f"lengths={self.lengths}, segment={self.segment}, boundary={self.boundary})")


def exact_cells(query, train, max_followers=8, lengths=DEFAULT_LENGTHS, boundary=BOS):
    """Exact cells of every position of `query` (one segment) against all of `train` (no position
    filter, no cap): what HintIndex.lookup_cells gives where nothing was dropped or collided.
    Walks every occurrence of each query position's shortest n-gram: for tests and corpora of
    modest size (a frequent n-gram's occurrences are walked once per position that ends in it)."""
    train = _as_stream(train, "train")
    return PositionalIndex.build(train, lengths=lengths, boundary=boundary).lookup_cells(
        query, train.shape[0], cap=None, max_followers=max_followers, boundary=boundary)


def phase_ends(steps, global_tokens, phases=(8, 32)):
    """Stream ends of the build phases: the tokens before each phase's last step (up to steps 8,
    32, then all, as the record), each covering the lookups of the steps up to it."""
    ends = [int(p) * int(global_tokens) for p in phases if p < steps] + [int(steps) * int(global_tokens)]
    return sorted(set(ends))


def phase_path(directory, end):
    return os.path.join(directory, f"positional-{end:015d}.idx")


def build_phases(stream, ends, directory, segment=0, lengths=DEFAULT_LENGTHS, boundary=BOS, log=None):
    """Build and save one index per phase end (in order), each published by an atomic rename as
    soon as it is done; returns the paths. Readers take the newest phase that covers them
    (`load_covering`)."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for end in ends:
        idx = PositionalIndex.build(stream, segment=segment, upto=end, lengths=lengths, boundary=boundary)
        paths.append(idx.save(phase_path(directory, end)))
        if log:
            log(f"positional index phase: {end:,} tokens, {idx.entries:,} entries, built in {idx.build_s:.2f}s")
    return paths


def load_covering(directory, before, timeout=None, poll=0.01):
    """The saved phase with the fewest tokens >= `before` (waits up to `timeout` seconds for it:
    None waits forever)."""
    t0 = time.perf_counter()
    while True:
        ends = sorted(int(os.path.basename(p)[11:26]) for p in glob.glob(os.path.join(directory, "positional-*.idx")))
        ok = [e for e in ends if e >= before]
        if ok:
            return PositionalIndex.load(phase_path(directory, ok[0]))
        if timeout is not None and time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"{directory}: no positional index phase covers stream position {before:,} "
                               f"after {timeout}s (phases so far end at {ends})")
        time.sleep(poll)
