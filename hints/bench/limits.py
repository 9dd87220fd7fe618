"""The machine's limits, measured beside the index's figures: copy bandwidth, the compute ceiling
(stage 1's hashing in cache), the vector ceiling (its arithmetic in a plain loop), memory latency
(a pointer chase), the random-write floor under stage 2, and the CPU they were measured on.

Each is a host row of `python -m hints bench` (hints.bench.shares sets every figure against one);
the vector ceiling and the random-write floor are sampled all through a run (hints.bench.host_sampler).
"""
import os
import platform

import numba
import numpy as np

from ..index.hashing import HASH_BLOCK, HASH_MULT, HASH_SCRATCH, MIX_MULT, SEED_MULT, hash_arrays, hash_block
from ..numba_ops import unmanaged
from ..parallel import alloc, line_aligned, run_split
from .figures import MIB, REPEATS, Figure, alternate, timed

U64 = np.uint64
LATENCY_BYTES = 512 * MIB  # pointer chase for memory latency: far larger than any cache here
LATENCY_READS = 1 << 20
# The compute ceiling: each thread hashes its own CEILING_TOKENS tokens (L2-resident with their
# buffers) CEILING_ROUNDS times: ~0.1 s of stage 1's hashing on one core, with no memory traffic.
CEILING_TOKENS = 1 << 15
CEILING_ROUNDS = 2000
# The vector ceiling: a thread runs VECTOR_WORDS positions (in and out 32 KiB each: L1/L2-resident)
# through a plain loop with stage 1's multiplies and shifts per position (vector_rounds), as many
# rounds as its sampler asks (hints.bench.host_sampler).
VECTOR_WORDS = 1 << 12
# CPU flags the bench prints: the vector extensions the kernels' code generation depends on.
CPU_FLAGS = ("avx2", "bmi2", "avx512f", "avx512dq", "avx512vl", "avx512ifma", "avx512_vbmi2", "avx512_fp16", "amx_tile")


@numba.njit(cache=True, nogil=True)
def copy_words(src, dst):
    """dst[:] = src: a plain copy loop that releases the GIL, so that two threads copy at once."""
    for i in range(src.shape[0]):
        dst[i] = src[i]


@numba.njit(cache=True, nogil=True)
def scatter_words(table, where):
    """table[where[i]] = i: independent 8-byte writes to random places, what stage 2 does per slot.
    The random-write floor (hints.bench.host_sampler, hints.bench.record) writes new places each
    time, as each add's slots are new places: written a second time, the same 262,144 places took
    4.2 ns a write against 8.4 ns for fresh ones, because their lines and page-table entries were
    still cached."""
    for i in range(where.shape[0]):
        table[where[i]] = U64(i)


def write_table(n_words, rng):
    """A table of n_words for the random-write floor (scatter_words), apart from any index's: asked
    for huge pages (as an index's table), faulted in, and with scatter_words compiled (1,000
    writes to places drawn from rng)."""
    table = alloc((max(1, n_words),), np.uint64)
    table[:] = 0
    scatter_words(table, rng.integers(0, table.size, 1000))
    return table


def memcpy_bandwidth(log, workers=2, nbytes=256 * MIB, repeats=REPEATS):
    """Copy bandwidth (bytes read + written per second) of 1 core and of `workers` cores at once,
    each copying its own buffers, alternated: their ratio is the most any memory-bound step
    (stage 2 of a build) can gain from more workers on this machine."""
    bufs = [(np.ones(nbytes // 8, dtype=np.uint64), np.zeros(nbytes // 8, dtype=np.uint64)) for _ in range(workers)]
    for src, dst in bufs:
        copy_words(src, dst)  # compile, and fault every page in
    figs = {w: Figure(f"memcpy, {w} core(s) (read + write)", "B/s", 2 * nbytes * w, w) for w in sorted({1, workers})}
    for _ in range(repeats):
        for w, fig in figs.items():
            fig.add(*timed(lambda: run_split(lambda r, a, b: copy_words(*bufs[r]), w, w))[:2])
    for w, fig in figs.items():
        log(f"  memcpy, {w} core(s): {fig.median / 1e9:.1f} GB/s read + written [{fig.rates.min() / 1e9:.1f}-"
            f"{fig.rates.max() / 1e9:.1f}]")
    return figs


@numba.njit(cache=True, nogil=True)
def hash_rounds(s, rounds, lengths, pows, partition_bits, bits, shifts, prefix, keys, parts):
    """Hash the positions of s (past the longest length) `rounds` times over with stage 1's
    vectorised kernel (hints.index.hashing.hash_block), into one block's buffers: compute, nothing read or
    written outside the caches. Scripts hand it buffers of their own, so it checks the one whose size
    changed with the hash: hash_block indexes without bounds checks (a check inside it, once a block,
    made stage 1 take 1.1x the time), and a short scratch would be overrun."""
    if prefix.shape[0] < HASH_SCRATCH:
        raise ValueError("hash_rounds: the block scratch `prefix` is shorter than hints.index.hashing.HASH_SCRATCH")
    s, prefix = unmanaged(s), unmanaged(prefix)  # as stage 1 takes its slices (hints.numba_ops.unmanaged)
    acc = U64(0)
    start = lengths[lengths.shape[0] - 1]
    for _ in range(rounds):
        for j in range(start, s.shape[0] - HASH_BLOCK + 1, HASH_BLOCK):
            hash_block(s, j, j + HASH_BLOCK, lengths, pows, partition_bits, bits, shifts, prefix, keys, parts)
            acc ^= keys[0]
    return acc


def compute_ceiling(tokens, geom, log, workers=2, repeats=REPEATS, n=CEILING_TOKENS, rounds=CEILING_ROUNDS,
                    sampler=None):
    """Positions hashed per second by 1 thread and by `workers` threads at once, each hashing its
    own cache-resident copy of `tokens[:n]` with stage 1's kernel, alternated (after one untimed
    round). No memory traffic and nothing shared: their ratio is what this machine's cores give a
    second thread of the builder's own compute, the most a compute-bound build can gain from a
    second worker. Where one thread alone runs at a higher clock than each of two, or the host
    takes a vCPU away now and then, it is well under 2 (docs/performance.md)."""
    lengths, pows, bits, shifts = hash_arrays(geom)
    src = np.resize(tokens, n)  # n tokens (a short stream repeated)
    bufs = []
    for _ in range(workers):
        s = line_aligned(src.shape, np.uint16)
        s[:] = src
        bufs.append((s, line_aligned((HASH_SCRATCH,), np.uint64),
                     line_aligned((HASH_BLOCK,), np.uint64), line_aligned((HASH_BLOCK,), np.uint64)))

    def work(r, *_):
        s, prefix, keys, parts = bufs[r]
        return hash_rounds(s, rounds, lengths, pows, geom.partition_bits, bits, shifts, prefix, keys, parts)

    per_thread = rounds * (src.size - max(geom.lengths)) // HASH_BLOCK * HASH_BLOCK
    figs = {w: Figure(f"compute ceiling: stage 1's hashing in cache, {w} thread(s)", "pos/s", per_thread * w, w)
            for w in sorted({1, workers})}
    alternate(figs, lambda w: timed(lambda: run_split(work, w, w))[:2] + (None,), repeats, sampler)
    for w, fig in figs.items():
        log(f"  compute ceiling (stage 1's hashing in cache), {w} thread(s): {fig.text(digits=0)}")
    return figs


def cpu_info():
    """The CPU the figures were measured on: vendor, model, logical CPUs, the vector flags of
    CPU_FLAGS it has, and the LLVM target Numba compiled for (NUMBA_CPU_NAME, or the host's name)."""
    import llvmlite.binding as ll
    from numba.core import config
    info = dict(vendor=platform.machine(), model=platform.processor() or platform.machine(), family="", cpu_model="",
                flags=[])
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block
                key, _, val = (x.strip() for x in line.partition(":"))
                if key == "vendor_id":
                    info["vendor"] = val
                elif key == "model name":
                    info["model"] = val
                elif key == "cpu family":
                    info["family"] = val
                elif key == "model":
                    info["cpu_model"] = val
                elif key == "flags":
                    have = set(val.split())
                    info["flags"] = [fl for fl in CPU_FLAGS if fl in have]
    except OSError:
        pass
    info.update(logical_cpus=os.cpu_count(), llvm_host=ll.get_host_cpu_name(),
                llvm_target=config.CPU_NAME or ll.get_host_cpu_name(), llvm_features_override=config.CPU_FEATURES)
    return info


def cpu_text(cpu):
    return (f"{cpu['vendor']} {cpu['model']} (family {cpu['family']}, model {cpu['cpu_model']}), "
            f"{cpu['logical_cpus']} logical CPUs; flags {' '.join(cpu['flags']) or '-'}; LLVM target {cpu['llvm_target']}"
            + (f" (host {cpu['llvm_host']})" if cpu["llvm_target"] != cpu["llvm_host"] else ""))


@numba.njit(cache=True, nogil=True)
def vector_rounds(src, dst, rounds):
    """The vector ceiling's loop: per position, stage 1's multiplies and shifts (hints.index.hashing.hash_block)
    with none of its data flow: the prefix's multiply-add, the multiply by MIX_MULT that all
    lengths share, then for each of 3 lengths a multiply by its constant and the shifts and masks
    that place the checksums: 5 multiplies (stage 1 does 5.75: its prefix sums correct 3 of 4
    positions with one more). One contiguous load and store a position: the compiler vectorises
    it to the target's widest lanes. Returns a word of the output, so nothing is optimised away."""
    acc = U64(0)
    p0 = MIX_MULT * HASH_MULT  # three different odd constants standing for MIX_MULT M^L (equal ones would share a multiply)
    p1 = p0 * HASH_MULT
    p2 = p1 * HASH_MULT
    for r in range(rounds):
        for i in range(src.shape[0]):
            x = src[i] * HASH_MULT + U64(r + 1)
            m = MIX_MULT * x
            h0 = m - x * p0 + SEED_MULT
            h1 = (m - x * p1 + U64(2) * SEED_MULT) >> U64(52)
            h2 = (m - x * p2 + U64(3) * SEED_MULT) >> U64(52)
            h1 += U64(h1 == U64(0))
            h2 += U64(h2 == U64(0))
            dst[i] = ((h0 >> U64(40)) << U64(24)) | (h1 << U64(12)) | h2
        acc ^= dst[r % dst.shape[0]]
    return acc


@numba.njit(cache=True, nogil=True)
def chase(nxt, n):
    """Follow n links of nxt from 0: each read's address is the last read's value."""
    i = 0
    for _ in range(n):
        i = nxt[i]
    return i


def memory_latency(log, nbytes=LATENCY_BYTES, reads=LATENCY_READS, repeats=REPEATS):
    """Nanoseconds per dependent random read from memory, 1 core: a pointer chase through one
    random cycle over the cache lines of nbytes (on huge pages, like the index's table). Not a
    figure of the index: the host's memory latency at the time of the run, which lookups and
    stage 2 wait on (258-330 ns here on an evening when every lookup ran 1.6-3.2x slower than in
    an earlier run of this bench)."""
    n = nbytes // 8
    nxt = alloc((n,), np.int64)
    lines = np.random.default_rng(0).permutation(n // 8) * 8  # one word a cache line, in a random cycle
    nxt[lines] = np.roll(lines, -1)
    chase(nxt, 1000)
    fig = Figure(f"dependent random reads in {nbytes / 2**30:.2f} GiB, 1 core", "reads/s", reads)
    for _ in range(repeats):
        fig.add(*timed(lambda: chase(nxt, reads))[:2])
    log(f"  memory latency (dependent random reads, 1 core): {1e9 / fig.median:.0f} ns per read "
        f"[{1e9 / fig.rates.max():.0f}-{1e9 / fig.rates.min():.0f}]")
    return fig
