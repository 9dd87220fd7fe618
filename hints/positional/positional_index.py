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
L_{k-1} .. L_k - 1 back from j; 0 where the reach falls short), both hints.fingerprint's
(random 64-bit multipliers per distance). Rows are sorted by the key's top SORT_BITS and, among
equal ones, by position (`kernels.sort_entries`: a stable parallel radix sort of entries made in stream
order); `directory[b]`
is the first row whose key's top `dir_bits` bits are >= b. A candidate's depth is how many of
its extensions equal the query's in a row, within both reaches, and its follower is in its row:
a lookup reads no stream tokens, and walks back over the newest rows of its run as one stream.

Exactness: fmix64 is a bijection, so equal keys mean equal fingerprints; rows whose top bits
equal the query's but whose full key differs are skipped, not counted against the cap. Two
different token sequences share a fingerprint with probability at most 2^-49 over the random
multipliers (hints.fingerprint's argument: the difference's lowest-order token, times a random
multiplier, is uniform on multiples of 2^s, s <= 15), so with ~10^8 comparisons over a record
run the chance of any wrong cell is below 10^-6. The tests compare every lookup with the
token-exact `hints.index.reference.reference_cells` and find none.

Files: `save(path)` writes header + arrays page-aligned (a path under /dev/shm is shared memory),
to a temporary name then renamed, so a reader never sees a half-written phase; `load(path)` maps
them read-only (np.memmap: no copy, O(header) time). `phases.build_phases` writes one file per phase.

NumPy + Numba only.
"""
import os
import struct
import time

import numba
import numpy as np

from ..cells import BOS, check_boundary, check_max_followers, empty_cells, reach_into, with_kinds
from ..index import DEFAULT_LENGTHS, MAX_LENGTH
from ..parallel import alloc
from .kernels import MULTS, PART_BITS, lookup_kernel, make_directory, make_entries, make_table, sort_entries

MIN_DIR_BITS = 8
MAX_DIR_BITS = 26        # at most 2^26 + 1 directory entries (512 MiB of int64)
DEFAULT_CAP = 96         # occurrences a position is resolved against, the most recent (the record's)
TRAIN_FOLLOWERS = 2      # distinct followers kept per training position (cells_interface: training 2)
MAGIC = b"NGPOSIDX"
VERSION = 3
PAGE = 4096
# magic, version, n_lengths, lengths[8], boundary, segment, tokens, entries, dir_bits
_HEADER = struct.Struct("<8sII8IqqqqI")
HEADER_BYTES = PAGE


def dir_bits_for(n_entries):
    """Directory bits: about one entry per directory slot, within [MIN_DIR_BITS, MAX_DIR_BITS]."""
    b = max(1, int(n_entries)).bit_length()
    return max(MIN_DIR_BITS, min(MAX_DIR_BITS, b))


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
