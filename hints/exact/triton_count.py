"""TritonCounter: the host side of the exact count with Triton kernels (hints.exact.triton_kernels).

On a CUDA device the kernels are compiled; on a CPU they run in Triton's interpreter (its
TRITON_INTERPRET mode, set only while they are loaded and run), slowly: for tests on small
inputs. The caller is hints.exact.count.count_exact.

Memory. The query table and the per-slot totals take 3 x 8 B x len(lengths) x C, with C the
power of two >= 2 x len(query) (2.4 GB for the 10,485,760 FineWeb validation tokens). The pair
table starts at about 16 B x 2 x len(lengths) x len(query) (1 GiB there) and doubles as it fills, up to
PAIR_MEMORY_FRACTION of the memory free at the start. Training tokens go to the device one
chunk at a time (2 B/token, chunks of up to GPU_CHUNK tokens) behind the longest length's
worth of the previous chunk, so n-grams across chunk boundaries count.

Host syncs. A chunk of m tokens can add at most len(lengths) x m new pairs. The host keeps
an upper bound of the pair table's fill; only when a chunk might push it past PAIR_LOAD does
it read the true fill (the one sync), grow the table or split the chunk. Everything else is
queued on the stream without waiting.
"""
import contextlib
import importlib.util
import os
import sys
import warnings

from ..fingerprint import multipliers
from ..index import DEFAULT_LENGTHS

QUERY_SLOTS_PER_NGRAM = 2  # query table slots per query position: load <= 1/2, short probes for misses
PAIR_LOAD = 0.75           # pair table load kept at or below 3/4 (linear probing stays short; loops end)
GROW_LOAD = 0.5            # ... and doubled once a sync finds it over 1/2
PAIR_SLOT_BYTES = 16       # int64 key + int64 count
MIN_PAIR_SLOTS = 1 << 10
PAIR_MEMORY_FRACTION = 0.5  # the pair table may take up to half the GPU memory free after the query tables
GPU_BLOCK = 512             # positions per program and tile (4 per thread at 4 warps)
GPU_WARPS = 4
PROGRAMS_PER_SM = 8         # persistent grid: enough programs per multiprocessor to hide probe latency
GPU_CHUNK = 1 << 30         # training tokens on the device at once: 2 GiB of uint16
GPU_MIN_STEP = 1 << 26      # a step shorter than this grows the pair table instead (long launches, few syncs)
CPU_BLOCK = 256             # interpreter: its cost is per operation, so wide tiles; still several tiles per program
CPU_PROGRAMS = 3
CPU_CHUNK = 1 << 12
CPU_MAX_PAIR_BYTES = 1 << 26
REDUCE_BLOCK = 1024


@contextlib.contextmanager
def interpreter_env(value="1"):
    """TRITON_INTERPRET=value for the duration (None: unset). Triton reads it when a kernel is
    decorated, and its interpreted language helpers read it when they run."""
    old = os.environ.get("TRITON_INTERPRET")
    if value is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


def load_kernels(interpret):
    """hints.exact.triton_kernels, compiled (interpret=False), or a second copy of it decorated for
    Triton's interpreter, so both can live in one process."""
    if not interpret:
        from . import triton_kernels
        return triton_kernels
    if "triton.language" not in sys.modules:
        with interpreter_env(None):  # triton.language's own jit helpers decorated for compiling, as
            import triton.language  # noqa: F401  the compiled copy needs them (the interpreted one does not)
    name = f"{__package__}._triton_kernels_interpreted"
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), "triton_kernels.py"))
        mod = importlib.util.module_from_spec(spec)
        with interpreter_env():
            spec.loader.exec_module(mod)
        sys.modules[name] = mod
    return mod


def _as_device_tokens(piece, torch):
    """A torch view of a uint16 NumPy piece (read-only memory maps too: the tensor is only read)."""
    if isinstance(piece, torch.Tensor):
        return piece
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the given NumPy array is not writable"
        return torch.from_numpy(piece)


class TritonCounter:
    """Counts the followers of one query's n-grams in a training stream fed by add(), on the GPU
    (or in Triton's interpreter on CPU). result() gives (token, count, top count) int32 (K, n)."""

    def __init__(self, query, lengths, device, block=None, programs=None, pair_capacity=None, max_pair_bytes=None):
        import torch
        self.torch, self.device, self.lengths = torch, device, tuple(lengths)
        self.interpret = device.type != "cuda"
        self.kernels = load_kernels(self.interpret)
        K, n = len(self.lengths), int(query.size)
        self.n_query, self.lmax, self.bounds = n, self.lengths[-1], (0,) + self.lengths
        if self.interpret:
            self.block, self.warps = int(block or CPU_BLOCK), 1
            self.programs = int(programs or CPU_PROGRAMS)
            self.default_chunk_tokens, self.min_step = CPU_CHUNK, self.block
        else:
            self.block, self.warps = int(block or GPU_BLOCK), GPU_WARPS
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            self.programs = int(programs or sms * PROGRAMS_PER_SM)
            self.default_chunk_tokens, self.min_step = GPU_CHUNK, GPU_MIN_STEP
        if self.block < 1 or self.block & (self.block - 1):
            raise ValueError(f"block={self.block}: expected a power of two")
        self.cap_bits = max(4, (QUERY_SLOTS_PER_NGRAM * max(n, 1) - 1).bit_length())
        cap = 1 << self.cap_bits
        self.A = torch.tensor([a - (1 << 64) if a >> 63 else a for a in multipliers(self.lmax)],
                              dtype=torch.int64, device=device)
        self.scratch = torch.zeros(self.programs * self.block, dtype=torch.int64, device=device)
        self.keys = torch.zeros(K * cap, dtype=torch.int64, device=device)
        self.slots = torch.empty(K * max(n, 1), dtype=torch.int32, device=device)
        if n:
            q = torch.zeros(self.lmax + n, dtype=torch.uint16, device=device)  # LMAX zeros, then the query
            q[self.lmax:] = _as_device_tokens(query, torch).to(device)
            self._launch(self.kernels.insert_queries, self._grid(n), q, n, self.A, self.keys, self.slots,
                         self.scratch, BOUNDS=self.bounds, CAP_BITS=self.cap_bits, BLOCK=self.block)
        # the pair table
        if max_pair_bytes is None:
            if self.interpret:
                max_pair_bytes = CPU_MAX_PAIR_BYTES
            else:
                free, _ = torch.cuda.mem_get_info(device)
                max_pair_bytes = int(PAIR_MEMORY_FRACTION * (free - 2 * self.keys.numel() * 8))
        self.max_pair_bits = max(1, int(max_pair_bytes) // PAIR_SLOT_BYTES).bit_length() - 1
        want = int(pair_capacity or max(MIN_PAIR_SLOTS, 2 * K * n))
        self.pair_bits = min(self.max_pair_bits, max(1, (want - 1).bit_length()))
        self.pairs = torch.zeros(2 << self.pair_bits, dtype=torch.int64, device=device)
        self.fill = torch.zeros(1, dtype=torch.int64, device=device)
        self.fill_bound = 0  # >= the true fill; the true fill is read only when this might be too much
        self.ext = torch.zeros(self.lmax, dtype=torch.uint16, device=device)  # the last LMAX tokens, then a chunk
        self.seen = 0
        self.syncs = 0
        self.launches = 0  # count_stream launches
        self.growths = []  # the pair table's fill bound at each doubling

    def _grid(self, n):
        return (max(1, min(self.programs, -(-n // self.block))),)

    def _launch(self, kernel, grid, *args, **meta):
        if self.interpret:
            with interpreter_env():
                kernel[grid](*args, **meta)
        else:
            kernel[grid](*args, **meta, num_warps=self.warps)

    @property
    def pair_slots(self):
        return 1 << self.pair_bits

    def _grow(self):
        self.growths.append(self.fill_bound)
        new = self.torch.zeros(4 << self.pair_bits, dtype=self.torch.int64, device=self.device)
        self._launch(self.kernels.grow_pairs, self._grid(self.pair_slots), self.pairs, self.pair_slots, new,
                     self.scratch, PAIR_BITS=self.pair_bits + 1, BLOCK=self.block)
        self.pairs, self.pair_bits = new, self.pair_bits + 1

    def add(self, piece):
        """Count the followers in the next piece of the training stream (a 1-D uint16 array or
        an integer tensor)."""
        K, done, m_all = len(self.lengths), 0, len(piece)
        while done < m_all:
            m = m_all - done
            if self.fill_bound + K * m > PAIR_LOAD * self.pair_slots:
                self.fill_bound = int(self.fill.item())  # the only host sync
                self.syncs += 1
                while self.pair_bits < self.max_pair_bits and (
                        self.fill_bound > GROW_LOAD * self.pair_slots
                        or (PAIR_LOAD * self.pair_slots - self.fill_bound) // K < min(m, self.min_step)):
                    self._grow()
                m = min(m, int(PAIR_LOAD * self.pair_slots - self.fill_bound) // K)
                if m < 1:
                    raise MemoryError(
                        f"exact count: the pair table holds {self.fill_bound:,} (query n-gram, follower) pairs "
                        f"in {self.pair_slots:,} slots and may not grow past 2^{self.max_pair_bits} slots "
                        f"({PAIR_SLOT_BYTES << self.max_pair_bits:,} bytes); pass a larger max_pair_bytes")
            self._count(piece[done:done + m])
            self.fill_bound += K * m
            done += m

    def _count(self, piece):
        torch = self.torch
        m, lmax = len(piece), self.lmax
        if self.ext.numel() < lmax + m:
            ext = torch.empty(lmax + m, dtype=torch.uint16, device=self.device)
            ext[:lmax] = self.ext[:lmax]
            self.ext = ext
        self.ext[lmax:lmax + m].copy_(_as_device_tokens(piece, torch))
        first = min(self.seen, lmax) - lmax  # stream index of ext[0]; only whether first + j >= L matters
        self.launches += 1
        self._launch(self.kernels.count_stream, self._grid(m), self.ext, lmax + m, first, self.A, self.keys,
                     self.pairs, self.fill, self.scratch, BOUNDS=self.bounds, CAP_BITS=self.cap_bits,
                     PAIR_BITS=self.pair_bits, BLOCK=self.block)
        self.ext[:lmax] = self.ext[m:m + lmax].clone()
        self.seen += m

    def stats(self):
        return dict(training_tokens=self.seen, pairs=int(self.fill.item()), pair_slots=self.pair_slots,
                    pair_table_bytes=PAIR_SLOT_BYTES * self.pair_slots, query_slots=1 << self.cap_bits,
                    launches=self.launches, syncs=self.syncs, growths=len(self.growths))

    def result(self):
        """(hinted token, n-gram count, top follower's count): int32 NumPy arrays (K, n)."""
        torch = self.torch
        K, n = len(self.lengths), self.n_query
        total = torch.zeros(self.keys.numel(), dtype=torch.int64, device=self.device)
        best = torch.zeros_like(total)
        self._launch(self.kernels.reduce_pairs, (-(-self.pair_slots // REDUCE_BLOCK),), self.pairs, self.pair_slots,
                     total, best, BLOCK=REDUCE_BLOCK)
        out = [torch.empty(K * n, dtype=torch.int32, device=self.device) for _ in range(3)]
        if n:
            self._launch(self.kernels.gather_hints, (-(-K * n // REDUCE_BLOCK),), self.slots, n, K * n, total, best,
                         *out, CAP_BITS=self.cap_bits, BLOCK=REDUCE_BLOCK)
        return tuple(x.view(K, n).cpu().numpy() for x in out)


def compile_for_gpu(arch=90, lengths=DEFAULT_LENGTHS, block=GPU_BLOCK, warps=GPU_WARPS):
    """Compile every kernel for an NVIDIA GPU of compute capability `arch` (90: Hopper) without
    one: Triton's front end, LLVM and the ptxas that ships with Triton. {kernel name: PTX}.
    Catches what the interpreter cannot (types, constexpr use, lowering of the atomics)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    k = load_kernels(False)
    bounds = (0,) + tuple(lengths)
    specs = {
        "insert_queries": ({"q_ptr": "*u16", "n": "i32", "a_ptr": "*i64", "keys_ptr": "*i64", "slot_ptr": "*i32",
                            "scratch_ptr": "*i64"}, dict(BOUNDS=bounds, CAP_BITS=25, BLOCK=block)),
        "count_stream": ({"tok_ptr": "*u16", "end": "i32", "first": "i32", "a_ptr": "*i64", "keys_ptr": "*i64",
                          "pairs_ptr": "*i64", "fill_ptr": "*i64", "scratch_ptr": "*i64"},
                         dict(BOUNDS=bounds, CAP_BITS=25, PAIR_BITS=31, BLOCK=block)),
        "grow_pairs": ({"old_ptr": "*i64", "n_old": "i64", "new_ptr": "*i64", "scratch_ptr": "*i64"},
                       dict(PAIR_BITS=32, BLOCK=block)),
        "reduce_pairs": ({"pairs_ptr": "*i64", "n_pairs": "i64", "total_ptr": "*i64", "best_ptr": "*i64"},
                         dict(BLOCK=REDUCE_BLOCK)),
        "gather_hints": ({"slot_ptr": "*i32", "n": "i32", "n_all": "i32", "total_ptr": "*i64", "best_ptr": "*i64",
                          "tok_ptr": "*i32", "cnt_ptr": "*i32", "top_ptr": "*i32"}, dict(CAP_BITS=25, BLOCK=REDUCE_BLOCK)),
    }
    out = {}
    for name, (sig, meta) in specs.items():
        src = ASTSource(fn=getattr(k, name), signature={**sig, **{m: "constexpr" for m in meta}}, constexprs=meta)
        out[name] = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps)).asm["ptx"]
    return out
