"""HintIndex: build (add), query (lookup), persist (save/load) and describe (stats) a hint index.

The table is allocated once (in memory, or as a file: a path under /dev/shm gives shared
memory other processes can map) and, from 64 MiB, faulted in when made, on all workers with
huge pages asked for (`prefault`: no add() pays for the table's page faults). `add` builds in sub-chunks of
`chunk_tokens`: in stage 1 the workers claim chunks of 64k tokens (more with many partitions)
in turn and stage them in a reused, pre-faulted arena (per-worker state on cache lines of its
own); in stage 2 they claim partitions in turn, largest first, and place them. Because every
partition is filled in stream order (chunk by chunk), the bytes do not depend on the chunking
of `add` calls, on the worker count or on which worker took which chunk or partition.

A finished index can be sealed (`seal()`): every bucket is sorted and frequent n-grams get a
side table, so a lookup finds its runs by binary search (see `hints.index.sealed`). A sealed index
returns exactly what it returned before; it is saved and loaded sealed. `add()` on a sealed
index unseals it (its buckets stay valid, lookups go back to scanning). One index must not be
added to while it is looked up from another thread.
"""
import os
import shutil
import tempfile
import threading
import time

import numpy as np

from ..cells import BOS
from ..parallel import alloc, line_aligned, run_ranges, run_split
from ..tokens import as_tokens
from . import build, lookup, sealed, store
from .geometry import SLOTS_PER_LINE, Geometry, human_bytes
from .hashing import HASH_BLOCK, HASH_SCRATCH, hash_arrays
from .results import Hints, OutputMemory, purity_kinds
from .sealed import search_blocks, search_scratch
from .sizing import STAGE_BLOCK, burst_slots, default_chunk_tokens, stage1_chunk


def stage2_order(heads, block_len, block_next):
    """The partitions with staged slots, largest first: the order stage-2 workers claim them in
    (the record: "the fullest partitions are processed first"), so the last ones claimed are
    small. Any order gives the same bytes."""
    sizes = build.staged_sizes(heads, block_len, block_next)
    order = np.argsort(-sizes, kind="stable")
    return order[:np.count_nonzero(sizes)]

# Tables from this size are pre-faulted when made (prefault=None). Smaller ones (tests, tiny
# indexes) fault at first write: 64 MiB of faults took 15-40 ms on one thread of the 2-vCPU
# Xeon of docs/design.md ("Pre-faulting") when its host was quiet, and a pre-fault starts threads.
PREFAULT_MIN_BYTES = 64 << 20


def fault_in(arrays, workers, fd=None):
    """Fault every page of `arrays` in now, on `workers` threads, with huge pages asked for
    (hints.index.memory.prefault); its facts (seconds, how, ...)."""
    from . import memory  # here: `python -m hints.index.memory` runs that module as a script
    return memory.prefault(arrays, workers, fd=fd)


class HintIndex:
    """path: None (anonymous memory), a file path (a new file, 0600, blocks reserved; under
    /dev/shm it is shared memory), or an open file descriptor (int) of an empty file this index
    fills, such as a memfd shared with other processes (hints/index/background.py).

    prefault: fault the table in now, on all `workers` threads, with huge pages where the kernel
    allows (its facts in `self.prefault`), so that no add() pays for it; None (the default): for
    tables of PREFAULT_MIN_BYTES or more in memory or a file, always on a file descriptor (a
    memfd is reserved this way: no SIGBUS later). docs/design.md, "Pre-faulting"."""

    def __init__(self, geom, workers=1, path=None, chunk_tokens=None, prefault=None):
        if isinstance(geom, str):
            geom = Geometry.preset(geom)
        if int(workers) < 1:
            raise ValueError(f"workers={workers}: expected >= 1")
        fd = path if isinstance(path, int) else None
        if fd is not None:
            if prefault is False:
                raise ValueError(f"prefault=False with file descriptor {fd}: a table on a file descriptor is always "
                                 f"reserved and pre-faulted (a sparse memfd would fail with SIGBUS when memory runs short)")
            path = f"/proc/self/fd/{fd}"  # the same file, for the memory maps and save()
        self._init_state(geom, workers, path, chunk_tokens)
        if path is None:  # fresh anonymous memory: zeros, faulted in here or at first write
            geom.check_fits_memory()
            self.fill = alloc((geom.n_partitions, geom.n_buckets), np.uint16)
            self.table = alloc((geom.n_partitions, geom.n_buckets, geom.slots), np.uint64)
        elif fd is None:
            self._check_space(path)
            store.create_file(path, geom)
            self.fill, self.table = store.map_arrays(path, geom, "r+")
        else:  # shared memory (a memfd): sized, then reserved by the pre-fault below
            geom.check_fits_memory(what=f"hint index on file descriptor {fd}")
            os.ftruncate(fd, store.layout(geom)[2])
            self.fill, self.table = store.map_arrays(path, geom, "r+")
        if fd is not None or (geom.nbytes >= PREFAULT_MIN_BYTES if prefault is None else prefault):
            self.prefault = fault_in([self.fill, self.table], self.workers, fd)

    def _init_state(self, geom, workers, path, chunk_tokens=None, tokens_added=0, history=None, dropped=0):
        """Everything but the table: shared by a new index and a loaded one."""
        self.geom, self.workers, self.path = geom, int(workers), path
        self.readonly = False
        self.sealed = False
        self._side = None  # sealed: (bucket summaries, side-table offsets, side table), see hints.index.sealed
        self._scratch_free = []  # per-worker lookup scratch (counters, sort buffers), reused
        self._scratch_lock = threading.Lock()
        self._outputs = OutputMemory()  # lookups' output arrays, reused once no result refers to them
        self.tokens_added = int(tokens_added)
        self.history = np.zeros(0, dtype=np.uint16) if history is None else history
        self._dropped = np.zeros(geom.n_partitions, dtype=np.int64)  # per partition (stage 2; stage 1's in [0])
        self._full = None  # build.full_buckets of the fill: made by the first add(), kept by stage 2
        self._dropped[0] = dropped
        self.chunk_tokens = int(chunk_tokens or default_chunk_tokens(geom, self.workers))
        self.stage1_chunk = stage1_chunk(geom)  # positions a stage-1 worker claims at a time
        self._stage = None
        self.build_seconds = {"stage1": 0.0, "stage2": 0.0}
        self.prefault = None  # the table's pre-fault (hints.index.memory.prefault's facts), or None: faulted at first write
        self._lengths, self._pows, self._bits, self._shifts = hash_arrays(geom)

    def _check_space(self, path):
        d = os.path.dirname(os.path.abspath(path))
        free = shutil.disk_usage(d).free
        if self.geom.nbytes > free:
            raise MemoryError(f"hint index file {path}: geometry {self.geom.describe()} needs "
                              f"{human_bytes(self.geom.nbytes)}, but {d} has {human_bytes(free)} free")
        if os.path.realpath(d).startswith("/dev/shm"):
            self.geom.check_fits_memory(what=f"shared-memory hint index {path}")

    # ---- build ----------------------------------------------------------------------------
    def _staging(self, n):
        """Staging arena for sub-chunks of up to n tokens; allocated (and pre-faulted) once."""
        if self._stage is not None and self._stage["capacity"] >= n and self._stage["stage1_chunk"] == self.stage1_chunk:
            return self._stage
        g, w = self.geom, self.workers
        n_blocks = -(-n // STAGE_BLOCK) + w * g.n_partitions + 1  # full blocks + one partial per worker and partition
        n_chunks = -(-n // self.stage1_chunk)
        max_len = int(self._lengths.max())
        st = dict(
            capacity=n,
            stage1_chunk=self.stage1_chunk,
            arena=alloc((n_blocks, STAGE_BLOCK), np.uint64),
            block_len=np.zeros(n_blocks, dtype=np.int64),
            block_next=np.zeros(n_blocks, dtype=np.int64),
            claims=line_aligned((1,), np.int64),  # next unclaimed stage-1 chunk
            free=line_aligned((1,), np.int64),    # next unused block
            # chunk -> worker, and slots per (chunk, partition): only needed to interleave workers
            owner=np.zeros(n_chunks if w > 1 else 0, dtype=np.int32),
            counts=np.zeros((n_chunks if w > 1 else 0, g.n_partitions), dtype=np.uint32),
            workers=[dict(  # each worker's own state, on cache lines of its own
                head=line_aligned((g.n_partitions,), np.int64),
                tail=line_aligned((g.n_partitions,), np.int64),
                tail_len=line_aligned((g.n_partitions,), np.int64),
                full_blocks=line_aligned((g.n_partitions,), np.int64),
                staged=line_aligned((g.n_partitions,), np.int64),
                burst=line_aligned((g.n_partitions, burst_slots(g)), np.uint64),
                burst_fill=line_aligned((g.n_partitions,), np.uint8),
                skipped=line_aligned((1,), np.int64),  # slots not staged: both buckets full
                r=line_aligned((max_len,), np.uint64),  # hash buffers (K <= max_len rolling states)
                prefix=line_aligned((HASH_SCRATCH,), np.uint64),
                keys=line_aligned((HASH_BLOCK,), np.uint64),
                parts=line_aligned((HASH_BLOCK,), np.uint64),
            ) for _ in range(w)],
            cursors=[line_aligned((2, w), np.int64) for _ in range(w)],  # stage 2: where each is in every chain
            placing=[dict(  # stage 2: each worker's bucket lines (build.place_run)
                lines=line_aligned((g.n_buckets, SLOTS_PER_LINE), np.uint64),
                base=line_aligned((g.n_buckets,), np.uint16),  # a fill, as the table's fill is
            ) for _ in range(w)],
            ext=np.empty(max_len + n, dtype=np.uint16),
        )
        for ws in st["workers"]:
            ws["burst_fill"][:] = 0
        # stage 1 writes each full burst line to its block with one aligned 64-byte store
        assert st["arena"].ctypes.data % 64 == 0 and STAGE_BLOCK % burst_slots(g) == 0
        fault_in([st["arena"]], w)
        self._stage = st
        return st

    def reserve(self, n_tokens):
        """Allocate and pre-fault the staging area for add() calls of up to n_tokens now, rather
        than in the first add(); it is reused by every later add()."""
        self._staging(min(int(n_tokens), self.chunk_tokens))
        return self

    def staging_bytes(self):
        """Bytes of the hint staging area (arena, chains, burst lines), not the input token buffer."""
        if self._stage is None:
            return 0
        arrays = [v for k, v in self._stage.items() if isinstance(v, np.ndarray) and k != "ext"]
        arrays += [v for ws in self._stage["workers"] + self._stage["placing"] for v in ws.values()] + self._stage["cursors"]
        return sum(a.nbytes for a in arrays)

    def add(self, tokens):
        """Append tokens to the stream and store one hint per new position."""
        if self.readonly:
            raise RuntimeError(f"hint index {self.path} is opened read-only (mmap); load it with mmap=False to add")
        tokens = as_tokens(tokens)
        if tokens.size == 0:
            return self
        self.sealed, self._side = False, None  # appended slots break the sort; the scan reads any order
        max_len = int(self._lengths.max())
        st = self._staging(min(tokens.size, self.chunk_tokens))
        g, w = self.geom, self.workers
        if self._full is None:
            self._full = build.full_buckets(self.fill, g.slots)
        for c0 in range(0, tokens.size, self.chunk_tokens):
            chunk = tokens[c0:c0 + self.chunk_tokens]
            h = self.history.size
            ext = st["ext"][:h + chunk.size]
            ext[:h] = self.history
            ext[h:] = chunk
            n_chunks = -(-chunk.size // self.stage1_chunk)
            for ws in st["workers"]:
                ws["head"][:] = -1
                ws["tail"][:] = -1
                ws["tail_len"][:] = 0
                ws["full_blocks"][:] = 0
                ws["staged"][:] = 0
            st["claims"][0] = 0
            st["free"][0] = 0
            owner = st["owner"][:n_chunks]
            counts = st["counts"][:n_chunks]
            t0 = time.perf_counter()
            run_split(lambda r, r0, r1: [build.stage1_worker(  # stage 1: workers claim chunks in turn
                ext, h, h + chunk.size, self.stage1_chunk, n_chunks, st["claims"], owner, counts, k, self._lengths, self._pows,
                g.partition_bits, g.bucket_bits, self._bits, self._shifts, self._full, st["arena"], st["block_len"],
                st["block_next"], st["free"], **st["workers"][k]) for k in range(r0, r1)], w, w)
            t1 = time.perf_counter()
            for ws in st["workers"]:
                self._dropped[0] += ws["skipped"][0]
                ws["skipped"][0] = 0
            heads = np.stack([ws["head"] for ws in st["workers"]])
            order = stage2_order(heads, st["block_len"], st["block_next"])
            counts_t = np.ascontiguousarray(counts.T)  # per partition, its chunks' counts in a row
            st["claims"][0] = 0
            run_split(lambda r, w0, w1: [build.stage2_place(  # stage 2: workers claim partitions in turn
                order, st["claims"], st["arena"], st["block_len"], st["block_next"], heads, owner, counts_t, self.table,
                self.fill, self._full, g.bucket_bits, int(self._shifts[0]), self._dropped, st["cursors"][k], **st["placing"][k])
                for k in range(w0, w1)], min(w, order.size), min(w, order.size))
            self.build_seconds["stage1"] += t1 - t0
            self.build_seconds["stage2"] += time.perf_counter() - t1
            self.history = ext[-min(ext.size, max_len):].copy()
            self.tokens_added += chunk.size
        return self

    # ---- seal -----------------------------------------------------------------------------
    def seal(self):
        """Sort every bucket, write the bucket summaries and build the side table of frequent
        n-grams (two O(table) passes over the partitions, `workers` at a time; see hints.index.sealed).
        Lookups then search instead of scanning and return exactly what they returned before.
        Returns self."""
        if self.sealed:
            return self
        if self.readonly:
            raise RuntimeError(f"hint index {self.path} is opened read-only (mmap); load it with mmap=False to seal")
        g = self.geom
        summary = alloc((g.n_partitions, g.n_buckets, sealed.summary_words(g.slots)), np.uint16)
        side_off = np.zeros(g.n_partitions + 1, dtype=np.int64)
        side = np.zeros(0, dtype=np.uint64)

        def seal(first_pass):
            def seal_range(p0, p1):
                sc = self._take_scratch()
                try:
                    sealed.seal_partitions(p0, p1, self.table, self.fill, g.bucket_bits, self._shifts, self._bits,
                                                   first_pass, summary, side_off, side, sc["counts"], sc["runs"][0])
                finally:
                    self._give_scratch(sc)
            run_ranges(seal_range, g.n_partitions, self.workers)

        seal(True)  # sort, summarise, count each partition's side entries into side_off[p + 1]
        found = side_off[1:]
        cap = np.where(found > 0, 1 << np.ceil(np.log2(np.maximum(found, 1) * sealed.SIDE_LOAD)).astype(np.int64), 0)
        side_off[1:] = np.cumsum(cap)
        if side_off[-1]:
            side = np.zeros(2 * int(side_off[-1]), dtype=np.uint64)
            seal(False)
        self._side = (summary, side_off, side)
        self.sealed = True
        return self

    @property
    def lengths(self):
        """The n-gram lengths it indexes (as hints.exact.ExactHints has them)."""
        return self.geom.lengths

    @property
    def side_capacity(self):
        """Entries the sealed index's side table has room for (0 when unsealed)."""
        return int(self._side[1][-1]) if self.sealed else 0

    # ---- query ----------------------------------------------------------------------------
    def _take_scratch(self):
        with self._scratch_lock:
            if self._scratch_free:
                return self._scratch_free.pop()
        return lookup.new_scratch(self.geom.n_lengths, self.geom.slots)

    def _give_scratch(self, scratch):
        with self._scratch_lock:
            self._scratch_free.append(scratch)

    def search_arrays(self):
        """A sealed index's arrays as `search_sealed` (hints.index.sealed) takes them, in one tuple:
        the table, the bucket summaries, the side table and the hash parameters. With a scratch
        from search_scratch(), a kernel looks positions up from inside Numba (the drafter does)."""
        if not self.sealed:
            raise ValueError(f"{self!r}: not sealed; seal() it first (the search reads sorted buckets)")
        g = self.geom
        summary, side_off, side = self._side
        return (np.asarray(self.table), np.asarray(summary), side_off, side, self._lengths, self._pows,
                g.partition_bits, g.bucket_bits, self._bits, self._shifts)

    def search_scratch(self):
        """One worker's scratch for `search_sealed`, its own (not shared with this index's lookups)."""
        return search_scratch(lookup.new_scratch(self.geom.n_lengths, self.geom.slots))

    def lookup_counts(self, tokens, hints=False):
        """Raw lookup: (top token int32, n-gram count int32, top follower's count int32), each (K, n);
        with hints=True, Hints (purity and kind computed by each worker right after its range).
        A sealed index's workers claim blocks of positions in turn (sealed.search_claimed,
        sealed.search_blocks); a growing index's take one contiguous range each (its scan keeps
        frozen runs across the positions of a range)."""
        q = as_tokens(tokens)
        K, n = self.geom.n_lengths, q.size
        tok, cnt, top, purity, kind = self._outputs.outputs(K, n)
        g = self.geom
        if self.sealed:
            arrays = self.search_arrays()
            claims = line_aligned((1,), np.int64)
            starts = search_blocks(n, self.workers)
            workers = max(1, min(self.workers, starts.size - 1))

            def search(r, *_):
                sc = self._take_scratch()
                try:
                    sealed.search_claimed(q, arrays, search_scratch(sc), tok, cnt, top, purity, kind, hints, claims,
                                          starts)
                finally:
                    self._give_scratch(sc)

            run_split(search, workers, workers)
        else:
            def look(r, t0, t1):
                sc = self._take_scratch()
                try:
                    lookup.with_frozen_runs(sc, K, g.slots)
                    lookup.lookup_scan(
                        t0, t1, q, self.table, self.fill, self._lengths, self._pows, g.partition_bits, g.bucket_bits,
                        self._bits, self._shifts, tok, cnt, top, sc["counts"], sc["runs"], sc["keys"], sc["parts"],
                        sc["order"], sc["spare"], sc["hist"], sc["prefix"], sc["small_i"], sc["small_u"],
                        sc["frozen_keys"], sc["frozen_vals"], sc["frozen_runs"], sc["frozen_tops"],
                        sc["frozen_used"])
                finally:
                    self._give_scratch(sc)
                if hints:
                    purity_kinds(t0, t1, cnt, top, purity, kind)

            run_split(look, n, self.workers)
        if hints:
            return Hints(token=tok, count=cnt, purity=purity, kind=kind)
        return tok, cnt, top

    def lookup(self, tokens):
        """Hints for every position t of a 1-D token array (n-gram tokens[t-L+1..t])."""
        return self.lookup_counts(tokens, hints=True)

    def lookup_cells(self, tokens, max_followers=8, boundary=BOS):
        """The record's cells of every position of `tokens` (hints.cells; hints.index.index_cells says how):
        `tokens` is one segment, its n-grams restarting at its start and at every `boundary` token."""
        from .index_cells import index_cells
        return index_cells(self, as_tokens(tokens), max_followers, boundary)

    def lookup_span(self, stream, start, stop):
        """Hints for positions start..stop-1 of a longer stream, each with its whole n-grams:
        equal to lookup(stream) at those positions, but reads only the (longest length - 1)
        tokens before start as context."""
        lo = max(0, start - (max(self.geom.lengths) - 1))
        h = self.lookup(stream[lo:stop])
        k = start - lo
        return Hints(token=h.token[:, k:], count=h.count[:, k:], purity=h.purity[:, k:], kind=h.kind[:, k:])

    # ---- persistence ----------------------------------------------------------------------
    def data_checksum(self):
        def checksum(words):
            return sum(run_ranges(lambda a0, a1: int(build.checksum64(a0, a1, words)), words.size, self.workers))
        a = checksum(np.asarray(self.table).reshape(-1))
        fill = np.asarray(self.fill).reshape(-1)
        # fill is uint16; view it as uint64 words (a copy only for geometries of < 4 buckets)
        b = checksum(fill.view(np.uint64) if fill.nbytes % 8 == 0 else fill.astype(np.uint64))
        c = (a * 0x100000001B3 + b) % (1 << 64)
        if self.sealed:
            for a in self._side:
                c = (c * 0x100000001B3 + checksum(np.asarray(a).reshape(-1).view(np.uint64))) % (1 << 64)
        return c

    def _header(self):
        return store.pack_header(self.geom, self.tokens_added, self.hints_stored, self.dropped,
                                 self.data_checksum(), self.history, self.sealed, self.side_capacity)

    def _write_side(self, f):
        """Write the side table at its offsets in an open index file (sealed indexes only)."""
        lay = store.layout(self.geom, self.side_capacity)
        for name, a in zip(store.SEALED_ARRAYS, self._side):
            f.seek(lay[name])
            np.ascontiguousarray(a).tofile(f)

    def save(self, path=None):
        """Write the index to `path` (default: its own file backing). Returns the path."""
        path = path or self.path
        if path is None:
            raise ValueError("save(): no path given and the index has no file backing")
        total = store.file_bytes(self.geom, self.sealed, self.side_capacity)
        if self.path is not None and os.path.abspath(path) == os.path.abspath(self.path):
            self.fill.flush()
            self.table.flush()
            with open(path, "r+b") as f:
                f.truncate(total)  # room for the side table, or none once unsealed
                if self.sealed:
                    self._write_side(f)
            store.write_header(path, self._header())
            return path
        # a private temp file beside path (O_EXCL, 0600), its blocks reserved before writing, then
        # fsync and rename: a failure leaves neither a partial index at path nor the temp file
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp",
                                   dir=os.path.dirname(os.path.abspath(path)))
        try:
            with os.fdopen(fd, "wb") as f:
                fill_off, table_off, _ = store.layout(self.geom)
                store.reserve(f.fileno(), total, path)
                f.write(self._header())
                f.seek(fill_off)
                np.ascontiguousarray(self.fill).tofile(f)
                f.seek(table_off)
                np.ascontiguousarray(self.table).tofile(f)
                if self.sealed:
                    self._write_side(f)
                f.truncate(total)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path

    @classmethod
    def load(cls, path, mmap=True, verify=None, workers=1):
        """Open a saved index. mmap=True maps it read-only (header-only cost); mmap=False reads
        it into memory. The data checksum is verified on full loads, or when verify=True; the
        header and the bucket fill counts always are (a corrupt file is a ValueError naming it)."""
        hdr = store.read_header(path)
        geom = hdr["geometry"]
        self = cls.__new__(cls)
        self._init_state(geom, workers, path, tokens_added=hdr["tokens_added"], history=hdr["history"],
                         dropped=hdr["dropped"])
        if not mmap:
            geom.check_fits_memory()
        fill, table = store.map_arrays(path, geom, "r")
        fill = np.array(fill) if mmap else fill  # a private copy: the counts checked are the counts used
        store.check_fill(path, fill, geom.slots, hdr["hints_stored"])
        if hdr["sealed"]:
            summary, side_off, side = store.map_sealed(path, geom, hdr["side_capacity"], "r")
            side_off, side = np.array(side_off), np.array(side)  # small: private copies, checked as used
            store.check_side(path, side_off, side, hdr["side_capacity"])
            self._side = (summary if mmap else np.array(summary), side_off, side)
            self.sealed = True
        if mmap:
            self.fill, self.table = fill, table
            self.readonly = True
        else:
            self.fill, self.table = alloc(fill.shape, np.uint16), alloc(table.shape, np.uint64)
            self.fill[:], self.table[:] = fill, table
            self.path = None
            verify = True if verify is None else verify
        if verify:
            got = self.data_checksum()
            if got != hdr["data_checksum"]:
                raise ValueError(f"hint index {path}: data checksum mismatch (stored {hdr['data_checksum']:#x}, "
                                 f"computed {got:#x}); the file is corrupt")
        return self

    # ---- description ----------------------------------------------------------------------
    @property
    def hints_stored(self):
        return int(np.asarray(self.fill, dtype=np.int64).sum())

    @property
    def dropped(self):
        return int(self._dropped.sum())

    def stats(self):
        g = self.geom
        fill = np.asarray(self.fill).reshape(-1)
        hist = np.bincount(fill, minlength=g.slots + 1)
        stored = int(fill.sum(dtype=np.int64))
        return dict(
            geometry=g.to_dict(),
            table_bytes=g.table_bytes,
            tokens_added=int(self.tokens_added),
            hints_stored=stored,
            dropped=self.dropped,
            sealed=self.sealed,
            side_capacity=self.side_capacity,
            load=stored / g.n_slots,
            full_buckets=int(hist[g.slots]),
            fill_histogram=hist.tolist(),
        )

    def __repr__(self):
        return f"HintIndex({self.geom.describe()}, tokens={self.tokens_added:,}, stored={self.hints_stored:,}, dropped={self.dropped:,})"


def compile_kernels(lengths):
    """Compile the kernels of a run's hint work, or load them from Numba's cache, on a tiny index:
    the build and the scan lookup of a growing index in memory (the training index), then the
    background index's path: built in a memfd, sealed or not, saved, and looked up mapped
    read-only (Numba compiles read-only arrays apart). A memfd needs no writable directory, as
    the background builder's does not. A run calls this before its clock starts, so that no step
    or validation pays for it: in a fresh checkout each lookup's first call took ~20 s on a
    2-core machine. Returns the seconds taken."""
    t0 = time.perf_counter()
    stream = (np.arange(4 * max(lengths)) % 7).astype(np.uint16)
    geom = Geometry(0, 1, SLOTS_PER_LINE, tuple(lengths))
    HintIndex(geom).add(stream).lookup(stream)
    for seal in (True, False):  # the background index mapped read-only: sealed, or as built (the record's)
        fd = os.memfd_create("hint-kernels.idx", os.MFD_CLOEXEC)
        try:
            idx = HintIndex(geom, path=fd).add(stream)
            saved = (idx.seal() if seal else idx).save()
            HintIndex.load(saved, mmap=True).lookup(stream)
        finally:
            os.close(fd)
    return time.perf_counter() - t0
