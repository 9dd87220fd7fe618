"""`python -m hints bench`: build, seal and lookup speed against the plain-Python reference.

Machines here are shared and noisy, so every figure is measured `repeats` times (default 5),
alternating between the things it is compared with (1 worker, N workers; plain Python and
Numba), and reported as the median with the min-max spread. Claims are ratios of medians
taken in the same run. A rate per worker is the rate divided by the workers. The CPU seconds
the process used are recorded beside the wall time; their ratio, "cores used", shows what a
figure actually got: on a busy machine 2 workers may get one core, and then their ratio to 1
worker says nothing about scaling.

Figures: the plain-Python builder and lookup (the denominators); the build from a token array
(both stages) at the corpus geometry and at 2^14 partitions; the background build from `.bin`
shards end to end (read + stage 1 + stage 2); sealing; lookup of a growing index (scan) and of
a sealed one; with --record-step, the training-time hint work of one rank per step at the
record's shape on one thread, with the floor under its stage 2 (random writes), and on the
record's threads per rank (wall and CPU time); the copy bandwidth of 1 core
and of 2 cores at once (the most a memory-bound step can gain from a second worker here); the
compute ceiling, stage 1's hashing in cache on 1 thread and on 2 (the most a compute-bound step
can gain from a second worker here); the
host's memory latency (a pointer chase: what lookups wait on, and what moved most between
runs on the same kind of machine). Peak build memory is measured once in a fresh child process.

Host rows (docs/performance.md, "2026-12-03"): the CPU is printed with the figures (vendor, model,
vector flags, LLVM target); the vector ceiling (stage 1's multiplies and shifts in a plain
vectorised loop, 1 and 2 threads) and the random-write floor are measured in every run, and each
figure is also given as a share of its host row (compute-bound: the vector ceiling of as many
threads; memory-bound: the random-write floor or memcpy), from wall time and from CPU time. With
`previous` (bench --compare) the shares of two runs are checked to agree within 15%; two workers
are checked against the vector ceiling's own 2/1 ratio. From this CPU's per-core stage rates and
its copy bandwidth, a projection of the record's build (35B tokens on 48 threads in 6.36 s).
"""
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numba
import numpy as np

from .geometry import Geometry
from .index import HintIndex, alloc
from .kernels import FMIX_C1, HASH_BLOCK, HASH_MULT, SEED_MULT, fmix64, hash_block, unmanaged
from .parallel import line_aligned, run_split
from .reference import ReferenceIndex
from .tokens import iter_chunks

U64 = np.uint64
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPEATS = 5
MIB = 1 << 20
LATENCY_BYTES = 512 * MIB  # pointer chase for memory latency: far larger than any cache here
LATENCY_READS = 1 << 20
# The compute ceiling: each thread hashes its own CEILING_TOKENS tokens (L2-resident with their
# buffers) CEILING_ROUNDS times: ~0.1 s of stage 1's hashing on one core, with no memory traffic.
CEILING_TOKENS = 1 << 15
CEILING_ROUNDS = 2000
# The vector ceiling: each thread runs VECTOR_WORDS positions (in and out 32 KiB each: L1/L2-resident)
# VECTOR_ROUNDS times through a plain loop with stage 1's multiplies and shifts per position (vector_rounds).
VECTOR_WORDS = 1 << 12
VECTOR_ROUNDS = 2000
MEMORY_SLACK = 256 * MIB  # docs/design.md: peak build RSS <= index + staging + 256 MiB
MANY_PARTITIONS = 14      # the record's 2^14 partitions: the second build geometry
# The record's training-time hint work per step and rank (docs/design.md, "Performance"): look up
# the rank's 32,768 positions, add the 262,144-token global batch, into an index sized for the
# 70.8M tokens of the run, with 12M in.
RECORD_LOOKUP = 32_768
RECORD_ADD = 262_144
RECORD_INDEX_TOKENS = 70_800_000
RECORD_PREFILL = 12_000_000
# The record runs a rank's hint work on this many threads (train/plan.py's RECORD_HINT_WORKERS;
# a test keeps the two equal): the record step is also timed so, beside the 1-core figure,
# as wall time and as the CPU time it takes from the node.
RECORD_THREADS = 2
# The record's builder (docs/performance.md, "2026-12-03"): 35B tokens indexed in 6.36 s on 48 threads of its
# node's Xeon Platinum 8468 (Sapphire Rapids), whose memory moves ~600 GB/s (docs/design.md).
RECORD_BUILD_TOKENS = 35e9
RECORD_BUILD_SECONDS = 6.36
RECORD_BUILD_THREADS = 48
NODE_BANDWIDTH = 600e9
# Bytes one token moves through DRAM in a build at the record's geometry, where a worker's
# partition (2^14 buckets x 176 slots x 8 B = 22.5 MiB) is far larger than its share of cache:
#   read: token from the shard (2) + copy into the stream buffer (2 + 2)                =   6
#   stage 1: slot written to its staging block (8: a whole burst line at a time, with a
#            non-temporal store, so the block's line is not read first)                   =   8
#   stage 2: slot read back (8) + one write of its bucket's line (64: a non-temporal store,
#            so the line is not read first; slots of one bucket lie ~16k slots apart in
#            the stream, too far to merge in a write-combining buffer)                     =  72
# (burst lines keep stage 1's scatter in L2; stage 2 writes one slot into a random line).
BYTES_PER_TOKEN = 6 + 8 + 72
# Reproducibility (docs/performance.md): two consecutive runs agree within REPRO_TOLERANCE on every figure as a
# share of its host row, and two workers reach REPRO_SCALING of the vector ceiling's own 2-thread/1-thread ratio.
REPRO_TOLERANCE = 0.15
REPRO_SCALING = 0.9
# CPU flags the bench prints: the vector extensions the kernels' code generation depends on.
CPU_FLAGS = ("avx2", "bmi2", "avx512f", "avx512dq", "avx512vl", "avx512ifma", "avx512_vbmi2", "avx512_fp16", "amx_tile")


def _peak_rss():
    """This process's peak resident memory (VmHWM: unlike ru_maxrss, not inherited from a parent)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("VmHWM not found in /proc/self/status")


def _memory_child(geom_json, tokens_path, workers):
    """Run in a fresh interpreter: peak RSS growth of building an index, as JSON on stdout."""
    geom = Geometry(**json.loads(geom_json))
    tokens = np.load(tokens_path)
    HintIndex(Geometry(2, 4, 8, geom.lengths)).add(tokens[:1000])  # load kernels before the baseline
    before = _peak_rss()
    idx = HintIndex(geom, workers=workers)
    idx.add(tokens)
    print(json.dumps(dict(peak_increase=_peak_rss() - before, index_bytes=geom.nbytes, staging_bytes=idx.staging_bytes())))


def measure_memory(geom, tokens, workers):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tokens.npy")
        np.save(path, tokens)
        code = (f"from hints.bench import _memory_child; "
                f"_memory_child({json.dumps(geom.to_dict())!r}, {path!r}, {int(workers)})")
        env = dict(os.environ, PYTHONPATH=REPO_ROOT)  # this checkout's hints, installed or not
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def timed(fn):
    """(wall seconds, process CPU seconds, fn's result)."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


@dataclasses.dataclass
class Figure:
    """One measured rate, repeated: what it is, its unit and the per-repeat values."""

    name: str
    unit: str
    work: float                                  # units of work per repeat (tokens, positions)
    workers: int = 1
    wall: list = dataclasses.field(default_factory=list)
    cpu: list = dataclasses.field(default_factory=list)

    def add(self, wall, cpu):
        self.wall.append(wall)
        self.cpu.append(cpu)

    @property
    def rates(self):
        return np.array([self.work / w for w in self.wall])

    @property
    def median(self):
        return float(np.median(self.rates))

    @property
    def cores_used(self):
        """Median CPU seconds per wall second: how many cores the figure actually got."""
        return float(np.median(np.array(self.cpu) / np.array(self.wall)))

    def summary(self):
        r = self.rates
        return dict(name=self.name, unit=self.unit, workers=self.workers, median=self.median, min=float(r.min()),
                    max=float(r.max()), repeats=len(r), wall_s=self.wall, cpu_s=self.cpu, cores_used=self.cores_used,
                    median_per_cpu_s=float(np.median([self.work / c for c in self.cpu if c > 0] or [np.nan])))

    def text(self, scale=1e6, digits=1):
        r = self.rates / scale
        return (f"{np.median(r):.{digits}f}M {self.unit} [{r.min():.{digits}f}-{r.max():.{digits}f}], "
                f"{self.cores_used:.2f} cores used")


def bench_reference(train, query, ref_tokens, ref_query, repeats, log):
    build = Figure("plain-Python reference build", "tok/s", min(ref_tokens, train.size))
    look = Figure("plain-Python reference lookup", "pos/s", min(ref_query, query.size))
    for _ in range(repeats):
        ref = ReferenceIndex()
        build.add(*timed(lambda: ref.add(train[:ref_tokens]))[:2])
        look.add(*timed(lambda: ref.lookup(query[:ref_query]))[:2])
    log(f"  plain Python: build {build.text(digits=3)}, lookup {look.text(digits=3)}")
    return build, look


def alternate(figs, measure, repeats):
    """Measure each of `figs` `repeats` times, alternating between them, after one untimed round:
    measure(key) -> (wall, cpu, extra); returns each key's extras. Without that round, in eight
    runs of this bench, the first of five repeats was the slowest in 21 of the 48 build figures
    (one in five by chance), at up to 1.68x the median."""
    extras = {k: [] for k in figs}
    for rep in range(repeats + 1):
        for k, fig in figs.items():
            wall, cpu, extra = measure(k)
            if rep:
                fig.add(wall, cpu)
                extras[k].append(extra)
    return extras


def bench_build(train, geom, workers, repeats, log, label=""):
    """Build figures for 1 and `workers` workers, alternated; returns (figures, stage seconds, last index)."""
    figs = {w: Figure(f"build{label}, {w} worker(s)", "tok/s", train.size, w) for w in sorted({1, workers})}
    idx = None

    def build(w):
        nonlocal idx
        idx = None
        idx = HintIndex(geom, workers=w).reserve(train.size)  # table + staging, timed apart
        return (*timed(lambda: idx.add(train))[:2], dict(idx.build_seconds))

    stages = alternate(figs, build, repeats)
    for w, f in figs.items():
        s1 = np.median([s["stage1"] for s in stages[w]])
        s2 = np.median([s["stage2"] for s in stages[w]])
        log(f"  build{label}, {w} worker(s): {f.text()} ({f.median / w / 1e6:.1f}M per worker; "
            f"stage 1 {s1:.3f}s, stage 2 {s2:.3f}s, medians)")
    return figs, stages, idx


def bench_shards(pattern, n_tokens, geom, workers, repeats, log):
    """The background build end to end: read .bin shards chunk by chunk and add them."""
    figs = {w: Figure(f"build from shards, {w} worker(s)", "tok/s", n_tokens, w) for w in sorted({1, workers})}

    def build(w):
        idx = HintIndex(geom, workers=w).reserve(n_tokens)
        return timed(lambda: [idx.add(c) for c in iter_chunks(pattern, n_tokens)])[:2] + (None,)

    alternate(figs, build, repeats)
    for w, f in figs.items():
        log(f"  build from .bin shards (read + stage 1 + stage 2), {w} worker(s): {f.text()} "
            f"({f.median / w / 1e6:.1f}M per worker)")
    return figs


def bench_lookup(idx, query, workers, repeats, label, log):
    figs = {w: Figure(f"lookup {label}, {w} worker(s)", "pos/s", query.size, w) for w in sorted({1, workers})}

    def look(w):
        idx.workers = w
        return timed(lambda: idx.lookup(query))[:2] + (None,)

    alternate(figs, look, repeats)
    for w, f in figs.items():
        log(f"  lookup {label}, {w} worker(s): {f.text(digits=2)} ({f.median / w / 1e6:.2f}M per core)")
    return figs


def bench_record_step(stream, repeats, log, lengths=(6, 10, 20), threads=RECORD_THREADS):
    """One rank's training-time hint work per step at the record's shape: lookup(RECORD_LOOKUP)
    of the coming positions, then add(RECORD_ADD), into a growing index sized for
    RECORD_INDEX_TOKENS with RECORD_PREFILL tokens in (less when the stream is short). The
    add is split into its two stages, and beside it stands the floor under stage 2: as many
    independent random 8-byte writes into a table of the index's size. With threads > 1 a
    second index does the same steps on that many threads, alternating with the first (which
    goes first in every other step), and must end with the same bytes: its wall time, and the
    CPU time it uses, which is what it takes from the background builder."""
    geom = Geometry.for_tokens(RECORD_INDEX_TOKENS, lengths=lengths)
    prefill = max(0, min(RECORD_PREFILL, stream.size - (repeats + 1) * RECORD_ADD))
    if stream.size < prefill + (repeats + 1) * RECORD_ADD:
        raise ValueError(f"--record-step: needs at least {(repeats + 1) * RECORD_ADD:,} tokens, the stream has {stream.size:,}")
    counts = sorted({1, int(threads)})
    idx = {w: HintIndex(geom, workers=w).reserve(RECORD_ADD) for w in counts}
    figs = {w: dict(step=Figure(f"record step: lookup + add, {w} thread(s)", "steps/s", 1, w),
                    lookup=Figure(f"record step: lookup of {RECORD_LOOKUP:,}", "pos/s", RECORD_LOOKUP, w),
                    add=Figure(f"record step: add of {RECORD_ADD:,}", "tok/s", RECORD_ADD, w)) for w in counts}
    for w in counts:
        idx[w].add(stream[:prefill])
    stages, dropped = [], []
    pos = prefill
    for i in range(repeats + 1):  # the first step is a warm-up (first-touch of scratch, caches)
        for w in (counts if i % 2 == 0 else counts[::-1]):
            ix = idx[w]
            wl, cl, _ = timed(lambda: ix.lookup(stream[pos:pos + RECORD_LOOKUP]))
            before, dropped_before = dict(ix.build_seconds), ix.dropped
            wa, ca, _ = timed(lambda: ix.add(stream[pos:pos + RECORD_ADD]))
            if i:
                f = figs[w]
                f["lookup"].add(wl, cl)
                f["add"].add(wa, ca)
                f["step"].add(wl + wa, cl + ca)
                if w == 1:
                    stages.append([ix.build_seconds[s] - before[s] for s in ("stage1", "stage2")])
                    dropped.append((ix.dropped - dropped_before) / RECORD_ADD)
        pos += RECORD_ADD
    one = idx[1]
    for w in counts[1:]:
        if not (np.array_equal(idx[w].fill, one.fill) and np.array_equal(idx[w].table, one.table)):
            raise AssertionError(f"record step: {w} threads built other bytes than 1")
        idx[w] = None
    floor = random_writes(log, one.table, RECORD_ADD, repeats)
    idx = one = None
    f1 = figs[1]
    ms = 1e3 / f1["step"].rates
    s1, s2 = 1e3 * np.median(np.array(stages), axis=0)
    log(f"  record step ({geom.describe()}, {prefill:,} tokens in, 1 thread): "
        f"{np.median(ms):.2f} ms [{ms.min():.2f}-{ms.max():.2f}] ({1e3 * np.median(f1['step'].cpu):.2f} ms of CPU) = lookup {1e3 * np.median(f1['lookup'].wall):.2f} ms "
        f"+ add {1e3 * np.median(f1['add'].wall):.2f} ms (stage 1 {s1:.2f} + stage 2 {s2:.2f}; {RECORD_ADD:,} random writes "
        f"take {1e3 * np.median(floor.wall):.2f} ms) (medians); {np.median(dropped):.0%} of the added slots were "
        f"dropped (both buckets full)")
    for w in counts[1:]:
        f = figs[w]
        wall, cpu = 1e3 * np.array(f["step"].wall), 1e3 * np.array(f["step"].cpu)
        log(f"  record step, {w} threads: {np.median(wall):.2f} ms [{wall.min():.2f}-{wall.max():.2f}] wall "
            f"(lookup {1e3 * np.median(f['lookup'].wall):.2f} + add {1e3 * np.median(f['add'].wall):.2f}), "
            f"{np.median(cpu):.2f} ms of CPU [{cpu.min():.2f}-{cpu.max():.2f}]: "
            f"{np.median(wall / ms):.2f}x the wall and {np.median(cpu / ms):.2f}x the CPU of "
            f"1 thread (medians of per-step ratios)")
    return dict(geometry=geom.to_dict(), prefill=prefill, step=f1["step"], lookup=f1["lookup"], add=f1["add"],
                stages_ms=(1e3 * np.array(stages)).tolist(), random_writes=floor, dropped_share=dropped,
                threads={w: figs[w] for w in counts[1:]})


@numba.njit(cache=True, nogil=True)
def copy_words(src, dst):
    """dst[:] = src: a plain copy loop that releases the GIL, so that two threads copy at once."""
    for i in range(src.shape[0]):
        dst[i] = src[i]


@numba.njit(cache=True, nogil=True)
def scatter_words(table, where):
    """table[where[i]] = i: independent 8-byte writes to random places, what stage 2 does per slot."""
    for i in range(where.shape[0]):
        table[where[i]] = U64(i)


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
    vectorised kernel (kernels.hash_block), into one block's buffers: compute, nothing read or
    written outside the caches."""
    s, prefix = unmanaged(s), unmanaged(prefix)  # as stage 1 takes its slices (kernels.unmanaged)
    acc = U64(0)
    start = lengths[lengths.shape[0] - 1]
    for _ in range(rounds):
        for j in range(start, s.shape[0] - HASH_BLOCK + 1, HASH_BLOCK):
            hash_block(s, j, j + HASH_BLOCK, lengths, pows, partition_bits, bits, shifts, prefix, keys, parts)
            acc ^= keys[0]
    return acc


def compute_ceiling(tokens, geom, log, workers=2, repeats=REPEATS, n=CEILING_TOKENS, rounds=CEILING_ROUNDS):
    """Positions hashed per second by 1 thread and by `workers` threads at once, each hashing its
    own cache-resident copy of `tokens[:n]` with stage 1's kernel, alternated (after one untimed
    round). No memory traffic and nothing shared: their ratio is what this machine's cores give a
    second thread of the builder's own compute, the most a compute-bound build can gain from a
    second worker. Where one thread alone runs at a higher clock than each of two, or the host
    takes a vCPU away now and then, it is well under 2 (docs/performance.md)."""
    ix = HintIndex(dataclasses.replace(geom, partition_bits=0, bucket_bits=1, slots=8))  # for its hash constants
    src = np.resize(tokens, n)  # n tokens (a short stream repeated)
    bufs = []
    for _ in range(workers):
        s = line_aligned(src.shape, np.uint16)
        s[:] = src
        bufs.append((s, line_aligned((HASH_BLOCK + max(geom.lengths) + 1,), np.uint64),
                     line_aligned((HASH_BLOCK,), np.uint64), line_aligned((HASH_BLOCK,), np.uint64)))

    def work(r, *_):
        s, prefix, keys, parts = bufs[r]
        return hash_rounds(s, rounds, ix._lengths, ix._pows, geom.partition_bits, ix._bits, ix._shifts, prefix, keys,
                           parts)

    per_thread = rounds * (src.size - max(geom.lengths)) // HASH_BLOCK * HASH_BLOCK
    figs = {w: Figure(f"compute ceiling: stage 1's hashing in cache, {w} thread(s)", "pos/s", per_thread * w, w)
            for w in sorted({1, workers})}
    alternate(figs, lambda w: timed(lambda: run_split(work, w, w))[:2] + (None,), repeats)
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
    """The vector ceiling's loop: per position, stage 1's multiplies and shifts (kernels.hash_block)
    with none of its data flow: the prefix's multiply-add, then for each of 3 lengths a multiply
    by a power of M and fmix64 (2 multiplies, 3 shift-xors), and the shifts and masks that place
    the checksums: 10 multiplies (stage 1 does 10.75: its prefix sums correct 3 of 4 positions
    with one more). One contiguous load and store a position: the compiler vectorises it to the
    target's widest lanes. Returns a word of the output, so nothing is optimised away."""
    acc = U64(0)
    p1, p2 = FMIX_C1 * HASH_MULT, HASH_MULT * HASH_MULT  # two odd constants standing for M^L
    for r in range(rounds):
        for i in range(src.shape[0]):
            x = src[i] * HASH_MULT + U64(r + 1)
            h0 = fmix64(x * HASH_MULT + SEED_MULT)
            h1 = fmix64(x * p1 + U64(2) * SEED_MULT)
            h2 = fmix64(x * p2 + U64(3) * SEED_MULT)
            dst[i] = ((h0 >> U64(40)) << U64(24)) | ((h1 & U64(0xFFF)) << U64(12)) | (h2 & U64(0xFFF))
        acc ^= dst[r % dst.shape[0]]
    return acc


def vector_ceiling(log, workers=2, repeats=REPEATS, n=VECTOR_WORDS, rounds=VECTOR_ROUNDS):
    """Positions per second through vector_rounds on 1 thread and on `workers` threads at once, each
    on its own cache-resident buffers, alternated (after one untimed round): what this host's cores
    give the arithmetic of stage 1 when nothing else is in the way. Compute-bound figures are
    reported as a share of it, and its own `workers`/1 ratio is what this host can give a second
    worker (the reproducibility criterion's yardstick)."""
    rng = np.random.default_rng(0)
    bufs = []
    for _ in range(workers):
        src = line_aligned((n,), np.uint64)
        src[:] = rng.integers(0, 1 << 16, n, dtype=np.uint64)
        bufs.append((src, line_aligned((n,), np.uint64)))
    figs = {w: Figure(f"vector ceiling: stage 1's multiplies and shifts, plain loop in cache, {w} thread(s)", "pos/s",
                      n * rounds * w, w) for w in sorted({1, workers})}
    alternate(figs, lambda w: timed(lambda: run_split(lambda r, a, b: vector_rounds(*bufs[r], rounds), w, w))[:2]
              + (None,), repeats)
    for w, fig in figs.items():
        log(f"  vector ceiling (stage 1's multiplies and shifts in a plain loop), {w} thread(s): {fig.text(digits=0)}")
    return figs


# Each figure's host row (measured in the same run): compute-bound figures against the vector ceiling
# of as many threads, memory-bound ones against memcpy or against the random-write floor (1 core; a
# figure of w workers is taken per worker there). None: the figure is a host row itself.
def host_row(key, workers):
    if key in ("latency", "random_writes") or key.startswith("vector_") or key == "memcpy_1w":
        return None
    if key.startswith("memcpy_"):
        return "memcpy_1w"
    if key.startswith("lookup_"):
        return "random_writes"
    w = workers if key == "seal" else (int(key.rsplit("_", 1)[1][:-1]) if key.endswith("w") else 1)
    return f"vector_{w}w"


def host_shares(res):
    """{figure: share of its host row} from one run's medians (rates per second), and per stage:
    each build's stage 1 against the vector ceiling, stage 2 against the random-write floor; the
    record step's lookup and stage 2 against its own floor (random writes into its table), its
    stage 1 against the vector ceiling."""
    figs, workers = res["figures"], res["workers"]
    shares = {}
    for key, f in figs.items():
        row = host_row(key, workers)
        if row is None or row not in figs:
            continue
        per = f["workers"] if (row in ("random_writes", "memcpy_1w")) else 1
        shares[key] = f["median"] / per / figs[row]["median"]
    n = res["train_tokens"]
    for label, stages in (("build", res["stages"]), ("build_many", res["stages_many"])):
        for w, st in stages.items():
            for stage, row, per in (("stage1", f"vector_{w}w", 1), ("stage2", "random_writes", int(w))):
                if row in figs:
                    shares[f"{label}_{w}w_{stage}"] = n / float(np.median([x[stage] for x in st])) / per / figs[row]["median"]
    if "record_step" in res:  # against its own floor: random writes into the record-shape table
        r, vec = res["record_step"], figs["vector_1w"]["median"]
        floor = RECORD_ADD / (1e-3 * np.median(r["random_writes_ms"]))
        shares["record_lookup"] = RECORD_LOOKUP / (1e-3 * np.median(r["lookup_ms"])) / floor
        shares["record_stage1"] = RECORD_ADD / (1e-3 * np.median(r["stage1_ms"])) / vec
        shares["record_stage2"] = RECORD_ADD / (1e-3 * np.median(r["stage2_ms"])) / floor
    return {k: float(v) for k, v in shares.items()}


def host_shares_cpu(res):
    """The same shares from rates per CPU second (work / the process's CPU time, a per-core rate):
    what the figure's code does while it runs, less moved by time the host gives to others (a
    shared host took 3/4 of this bench's core at times, "cores used" 0.15-0.3). Figures only."""
    figs = res["figures"]
    out = {}
    for key, f in figs.items():
        row = host_row(key, res["workers"])
        if row in figs and np.isfinite(f.get("median_per_cpu_s", np.nan)):
            out[key] = float(f["median_per_cpu_s"] / figs[row]["median_per_cpu_s"])
    return out


def reproducibility(res, previous=None):
    """The criterion of docs/performance.md: (1) with `previous` (an earlier run's JSON), every
    host-relative share of both runs agrees within REPRO_TOLERANCE (larger / smaller - 1); (2) in
    this run, two workers reach REPRO_SCALING of the vector ceiling's own 2-thread/1-thread ratio
    (the builds' and the in-cache hashing's ratios)."""
    out = {}
    ratios = res["ratios"]
    vec = ratios.get(f"vector_{res['workers']}w_vs_1w")
    if vec:
        scaling = {k[:-len("_vs_1w")]: ratios[k] / vec for k in ratios
                   if k.endswith("_vs_1w") and not k.startswith(("vector", "memcpy", "lookup"))}
        out["scaling_vs_vector"] = scaling
        out["scaling_met"] = bool(scaling) and all(v >= REPRO_SCALING for v in scaling.values())
    if previous is not None:
        a, b = res["shares"], previous.get("shares", {})
        common = sorted(set(a) & set(b))
        if not common:
            raise ValueError("--compare: the earlier run's JSON has no host-relative shares (made before they existed?)")
        dev = {k: max(a[k], b[k]) / min(a[k], b[k]) - 1 for k in common}
        out["agreement"] = dev
        out["worst"] = max(dev, key=dev.get)
        out["agreement_met"] = all(v <= REPRO_TOLERANCE for v in dev.values())
        a, b = res.get("shares_cpu", {}), previous.get("shares_cpu", {})
        common = sorted(set(a) & set(b))
        if common:
            dev = {k: max(a[k], b[k]) / min(a[k], b[k]) - 1 for k in common}
            out["agreement_cpu"] = dev
            out["worst_cpu"] = max(dev, key=dev.get)
            out["agreement_cpu_met"] = all(v <= REPRO_TOLERANCE for v in dev.values())
    return out


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


def random_writes(log, table, n, repeats=REPEATS):
    """Independent 8-byte writes to random places of `table` (a used index's, whose contents they
    spoil), 1 core: the floor under stage 2, which writes each slot into a random line. Each
    repeat writes n places of its own, as each add's slots are new places: written a second
    time, the same 262,144 places took 4.2 ns a write against 8.4 ns for fresh ones, because
    their lines and page-table entries were still cached. The index's own memory, because a
    fresh allocation may get other pages (measured: 1.8 ms once, 14 ms median the next run,
    when huge pages ran short)."""
    table = table.reshape(-1)
    nbytes = table.nbytes
    rng = np.random.default_rng(0)
    scatter_words(table, rng.integers(0, table.size, 1000))
    fig = Figure(f"random 8-byte writes into {nbytes / 2**30:.1f} GiB, 1 core", "writes/s", n)
    for _ in range(repeats):
        where = rng.integers(0, table.size, n)
        fig.add(*timed(lambda: scatter_words(table, where))[:2])
    log(f"  random 8-byte writes into {nbytes / 2**30:.1f} GiB, 1 core, new places each repeat: "
        f"{1e9 / fig.median:.1f} ns per write [{1e9 / fig.rates.max():.1f}-{1e9 / fig.rates.min():.1f}]")
    return fig


def projection(res, log, tokens=RECORD_BUILD_TOKENS, threads=RECORD_BUILD_THREADS, bandwidth=NODE_BANDWIDTH,
               bytes_per_token=BYTES_PER_TOKEN):
    """Seconds this host's CPU class would take for the record's build (`tokens` on `threads`
    threads), from this run's own rows: the per-core rates of the 1-worker build at the record's
    2^14 partitions (stage 1, compute; stage 2, memory-bound, at this host's memory), one thread
    doing both in turn; and memory bandwidth, the host's 1-core copy rate times the threads, at
    most the record node's. The larger of the two binds; it is set against the record's
    RECORD_BUILD_SECONDS."""
    stages = res["stages_many"][1]
    s1 = float(np.median([st["stage1"] for st in stages]))
    s2 = float(np.median([st["stage2"] for st in stages]))
    n = res["train_tokens"]
    per_thread = n / (s1 + s2)
    cores_s = tokens / (threads * per_thread)
    bw = min(threads * res["figures"]["memcpy_1w"]["median"], bandwidth)
    memory_s = tokens * bytes_per_token / bw
    seconds = max(cores_s, memory_s)
    bound = "memory bandwidth" if memory_s > cores_s else "cores"
    cpu = res["cpu"]
    log(f"projection for the record's build ({tokens / 1e9:.0f}B tokens on {threads} threads; it took "
        f"{RECORD_BUILD_SECONDS} s) at this host's per-core rates ({cpu['model']}, LLVM {cpu['llvm_target']}): "
        f"stage 1 {n / s1 / 1e6:.1f}M + stage 2 {n / s2 / 1e6:.1f}M tok/s = {per_thread / 1e6:.1f}M tok/s a thread "
        f"-> cores {cores_s:.1f} s; {bytes_per_token} B/token at {bw / 1e9:.0f} GB/s ({threads} x this host's 1-core "
        f"copy, at most {bandwidth / 1e9:.0f}) -> memory {memory_s:.1f} s; {bound} binds: {seconds:.1f} s, "
        f"{seconds / RECORD_BUILD_SECONDS:.1f}x the record's")
    return dict(tokens=tokens, threads=threads, cpu=cpu["model"], llvm_target=cpu["llvm_target"],
                stage1_per_core=n / s1, stage2_per_core=n / s2, rate_per_thread=per_thread, bandwidth=bw,
                bytes_per_token=bytes_per_token, cores_s=cores_s, memory_s=memory_s, seconds=seconds, bound=bound,
                record_seconds=RECORD_BUILD_SECONDS, vs_record=seconds / RECORD_BUILD_SECONDS)


def run_bench(train, query, geom=None, workers=2, repeats=REPEATS, ref_tokens=200_000, ref_query=10_000,
              shards=None, record_step=False, memory=True, previous=None, log=print):
    """Benchmark on a training stream `train` and a query stream `query` (uint16 arrays);
    `shards` (a .bin glob of the same stream) adds the from-shards build; `previous` (an earlier
    run's result) is checked against this one (reproducibility)."""
    geom = geom or Geometry.for_tokens(train.size)
    cpu = cpu_info()
    log(f"CPU: {cpu_text(cpu)}")
    log(f"bench: {train.size:,} training tokens, {query.size:,} query positions, geometry {geom.describe()}, "
        f"{repeats} repeats (median [min-max])")
    HintIndex(Geometry(2, 4, 8, geom.lengths)).add(train[:1000]).lookup(query[:1000])  # load compiled kernels
    HintIndex(Geometry(2, 4, 8, geom.lengths)).add(train[:1000]).seal().lookup(query[:1000])
    figs = {}
    ref_build, ref_look = bench_reference(train, query, ref_tokens, ref_query, repeats, log)
    figs.update(ref_build=ref_build, ref_lookup=ref_look)

    record = None
    if record_step:  # first, on a fresh process: after the builds' GiBs come and go, it measured 1.4x slower
        rec = bench_record_step(train, repeats, log, geom.lengths)
        record = dict(geometry=rec["geometry"], prefill=rec["prefill"], ms=[1e3 * w for w in rec["step"].wall],
                      cpu_ms=[1e3 * c for c in rec["step"].cpu],
                      lookup_ms=[1e3 * w for w in rec["lookup"].wall], add_ms=[1e3 * w for w in rec["add"].wall],
                      stage1_ms=[s[0] for s in rec["stages_ms"]], stage2_ms=[s[1] for s in rec["stages_ms"]],
                      random_writes_ms=[1e3 * w for w in rec["random_writes"].wall], dropped_share=rec["dropped_share"],
                      threads={str(w): dict(ms=[1e3 * x for x in f["step"].wall], cpu_ms=[1e3 * x for x in f["step"].cpu],
                                            lookup_ms=[1e3 * x for x in f["lookup"].wall],
                                            add_ms=[1e3 * x for x in f["add"].wall])
                               for w, f in rec["threads"].items()})
    build, stages, idx = bench_build(train, geom, workers, repeats, log)
    for w, f in build.items():
        figs[f"build_{w}w"] = f
    many = dataclasses.replace(geom, partition_bits=MANY_PARTITIONS,
                               bucket_bits=max(1, geom.partition_bits + geom.bucket_bits - MANY_PARTITIONS))
    build_many, stages_many, _ = bench_build(train, many, workers, repeats, log, label=f" at {many.n_partitions:,} partitions")
    for w, f in build_many.items():
        figs[f"build_many_{w}w"] = f
    if shards:
        for w, f in bench_shards(shards, train.size, geom, workers, repeats, log).items():
            figs[f"shards_{w}w"] = f

    seal = Figure("seal", "tok/s", train.size, workers)
    sealed = None
    for _ in range(repeats):
        sealed = None
        sealed = HintIndex(geom, workers=workers).add(train)
        seal.add(*timed(sealed.seal)[:2])
    figs["seal"] = seal
    log(f"  seal ({workers} workers): {seal.text()} of tokens built; side table {sealed.side_capacity:,} entries "
        f"({sealed._side[2].nbytes / MIB:.1f} MiB), summaries {sealed._side[0].nbytes / MIB:.1f} MiB")

    for w, f in bench_lookup(idx, query, workers, repeats, "scan (growing index)", log).items():
        figs[f"lookup_scan_{w}w"] = f
    for w, f in bench_lookup(sealed, query, workers, repeats, "sealed", log).items():
        figs[f"lookup_sealed_{w}w"] = f
    figs["random_writes"] = random_writes(log, idx.table, RECORD_ADD, repeats)  # the scan is done with idx

    res = dict(cpu=cpu, geometry=geom.to_dict(), train_tokens=int(train.size), query_tokens=int(query.size), workers=workers,
               repeats=repeats, dropped=idx.dropped, hints_stored=idx.hints_stored,
               load=idx.hints_stored / geom.n_slots, side_capacity=sealed.side_capacity,
               stages={w: v for w, v in stages.items()}, stages_many={w: v for w, v in stages_many.items()},
               figures={k: f.summary() for k, f in figs.items()})
    if record is not None:
        res["record_step"] = record

    if memory:
        mem = measure_memory(geom, train, workers)
        res.update(memory=mem)
        budget = mem["index_bytes"] + mem["staging_bytes"] + MEMORY_SLACK
        log(f"  peak build memory: +{mem['peak_increase'] / MIB:.0f} MiB (index {mem['index_bytes'] / MIB:.0f} MiB + "
            f"staging {mem['staging_bytes'] / MIB:.0f} MiB + 256 MiB = {budget / MIB:.0f} MiB budget)")

    for w, fig in memcpy_bandwidth(log, workers, repeats=repeats).items():
        figs[f"memcpy_{w}w"] = fig
        res["figures"][f"memcpy_{w}w"] = fig.summary()
    for w, fig in compute_ceiling(train, geom, log, workers, repeats=repeats).items():
        figs[f"ceiling_{w}w"] = fig
        res["figures"][f"ceiling_{w}w"] = fig.summary()
    for w, fig in vector_ceiling(log, workers, repeats=repeats).items():
        figs[f"vector_{w}w"] = fig
        res["figures"][f"vector_{w}w"] = fig.summary()
    res["figures"]["latency"] = memory_latency(log, repeats=repeats).summary()
    ratios = dict(build_1w_vs_ref=figs["build_1w"].median / ref_build.median,
                  lookup_sealed_1w_vs_ref=figs["lookup_sealed_1w"].median / ref_look.median)
    for key in ("build", "build_many", "shards", "lookup_sealed", "memcpy", "ceiling", "vector"):
        if f"{key}_{workers}w" in figs and workers > 1:
            runs = np.array(figs[f"{key}_{workers}w"].rates) / np.array(figs[f"{key}_1w"].rates)
            ratios[f"{key}_{workers}w_vs_1w"] = float(np.median(runs))
            ratios[f"{key}_{workers}w_vs_1w_min"] = float(runs.min())
    res["ratios"] = ratios
    res["shares"] = host_shares(res)
    res["shares_cpu"] = host_shares_cpu(res)
    res["reproducibility"] = rep = reproducibility(res, previous)
    res["projection"] = projection(res, log)
    log("ratios (medians): build 1 worker / plain Python = {:.0f}x; sealed lookup 1 worker / plain Python = {:.0f}x".format(
        ratios["build_1w_vs_ref"], ratios["lookup_sealed_1w_vs_ref"]) + "".join(
        f"; {k.replace('_', ' ')} = {ratios[k]:.2f}x (min over repeats {ratios[k + '_min']:.2f}x)"
        for k in ratios if k.endswith("vs_1w")))
    log("shares of the host rows (medians): " + "; ".join(f"{k} {v:.3g}" for k, v in res["shares"].items()))
    if "scaling_vs_vector" in rep:
        log(f"reproducibility: two workers / the vector ceiling's own {workers}/1 ratio: " + ", ".join(
            f"{k} {v:.2f}" for k, v in rep["scaling_vs_vector"].items()) +
            f" ({'met' if rep['scaling_met'] else 'NOT met'}: each >= {REPRO_SCALING})")
    if "agreement" in rep:
        log(f"reproducibility: against the earlier run, the host-relative shares differ by at most "
            f"{100 * rep['agreement'][rep['worst']]:.1f}% ({rep['worst']}; "
            f"{'met' if rep['agreement_met'] else 'NOT met'}: each <= {100 * REPRO_TOLERANCE:.0f}%)")
    if "agreement_cpu" in rep:
        log(f"  the same from rates per CPU second: at most {100 * rep['agreement_cpu'][rep['worst_cpu']]:.1f}% "
            f"({rep['worst_cpu']}; {'met' if rep['agreement_cpu_met'] else 'NOT met'})")
    return res


def share_text(res, key):
    """'0.21 of the vector ceiling' (or of memcpy, of the random writes); 'host row' for a host row."""
    v = res.get("shares", {}).get(key)
    if v is None:
        return "host row" if key in res["figures"] and host_row(key, res["workers"]) is None else ""
    if key.startswith("memcpy"):
        row = "memcpy, 1 core (per core)"
    elif key.startswith(("lookup", "record_lookup")) or key.endswith("stage2"):
        row = "random writes" + ("" if "_1w" in key or key.startswith("record") else " (per worker)")
    else:
        row = "vector ceiling"
    cpu = res.get("shares_cpu", {}).get(key)
    return f"{v:.3g} of {row}" + (f" ({cpu:.3g} per CPU second)" if cpu is not None else "")


def format_table(res):
    """The README's Markdown table of one bench run: median [min-max] of each figure, and its share
    of its host row in the same run; the CPU above it."""
    rows = []
    for key, f in res["figures"].items():
        used, share = f"{f['cores_used']:.2f}", share_text(res, key)
        if key.startswith("memcpy"):
            rows.append((f["name"], f"{f['median'] / 1e9:.1f} GB/s", f"{f['min'] / 1e9:.1f}-{f['max'] / 1e9:.1f} GB/s", used, share))
            continue
        if key in ("latency", "random_writes"):
            what = "memory latency: " if key == "latency" else "the random-write floor: "
            rows.append((what + f["name"], f"{1e9 / f['median']:.1f} ns", f"{1e9 / f['max']:.1f}-{1e9 / f['min']:.1f} ns",
                         used, share))
            continue
        digits = 3 if key.startswith("ref") else (2 if "lookup" in key else 1)
        per = f" ({f['median'] / f['workers'] / 1e6:.{digits}f}M per worker)" if f["workers"] > 1 and key != "seal" else ""
        rows.append((f["name"], f"{f['median'] / 1e6:.{digits}f}M {f['unit']}{per}",
                     f"{f['min'] / 1e6:.{digits}f}-{f['max'] / 1e6:.{digits}f}M", used, share))
        if key.startswith("build_") and f"{key}_stage1" in res.get("shares", {}):
            for stage in ("stage1", "stage2"):
                rows.append((f"  {f['name']}: {stage.replace('stage', 'stage ')}", "", "", "", share_text(res, f"{key}_{stage}")))
    if "record_step" in res:
        r = res["record_step"]
        for name, key, sk in (("record step: lookup + add (1 core)", "ms", None),
                              ("record step, 1 thread: CPU (the process's CPU time a step)", "cpu_ms", None),
                              ("  of which lookup", "lookup_ms", "record_lookup"),
                              ("  of which add", "add_ms", None), ("    add, stage 1", "stage1_ms", "record_stage1"),
                              ("    add, stage 2", "stage2_ms", "record_stage2"),
                              (f"{RECORD_ADD:,} random 8-byte writes (the floor under stage 2)", "random_writes_ms", None)):
            v = np.array(r[key])
            rows.append((name, f"{np.median(v):.2f} ms", f"{v.min():.2f}-{v.max():.2f} ms", "", share_text(res, sk) if sk else ""))
        for w, t in r.get("threads", {}).items():
            for name, key in ((f"record step, {w} threads: wall", "ms"), (f"record step, {w} threads: CPU", "cpu_ms")):
                v = np.array(t[key])
                rows.append((name, f"{np.median(v):.2f} ms", f"{v.min():.2f}-{v.max():.2f} ms", "", ""))
    if "memory" in res:
        mem = res["memory"]
        rows.append(("peak build memory over baseline", f"{mem['peak_increase'] / MIB:.0f} MiB",
                     f"budget {(mem['index_bytes'] + mem['staging_bytes'] + MEMORY_SLACK) / MIB:.0f} MiB", "", ""))
    out = [f"CPU: {cpu_text(res['cpu'])}" if "cpu" in res else "", "",
           f"| measurement ({res['repeats']} repeats) | median | min-max | cores used | share of its host row |",
           "|---|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows]
    return "\n".join(out)
