"""The record's shape, as facts the benchmarks and scripts use: its training-time hint work per step
and rank (`bench_record_step` times it), the threads a rank runs it on, and its builder's 35B
tokens on 48 threads (`projection` sets this host's rates against it).
"""
import numpy as np

from ..index import Geometry, HintIndex
from .figures import Figure, timed
from .limits import scatter_words, write_table

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


def bench_record_step(stream, repeats, log, lengths=(6, 10, 20), threads=RECORD_THREADS):
    """One rank's training-time hint work per step at the record's shape: lookup(RECORD_LOOKUP)
    of the coming positions, then add(RECORD_ADD), into a growing index sized for
    RECORD_INDEX_TOKENS with RECORD_PREFILL tokens in (less when the stream is short). The
    add is split into its two stages, and beside it stands the floor under stage 2: as many
    independent random 8-byte writes into a table of the index's size (its own, on huge pages
    where the kernel allows, as the index's), to new places, timed after every step. Timed
    after all the steps instead, in 8 runs of 5 steps, the lookup's share of the floor ranged
    1.24x from run to run (and between two consecutive runs); timed between the steps, 1.12x
    (1.08x). With threads > 1 a
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
    rng = np.random.default_rng(0)
    table = write_table(geom.n_slots, rng)
    floor = Figure(f"random 8-byte writes into {table.nbytes / 2**30:.1f} GiB, 1 core", "writes/s", RECORD_ADD)
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
        where = rng.integers(0, table.size, RECORD_ADD)
        wf, cf, _ = timed(lambda: scatter_words(table, where))
        if i:
            floor.add(wf, cf)
        pos += RECORD_ADD
    one = idx[1]
    for w in counts[1:]:
        if not (np.array_equal(idx[w].fill, one.fill) and np.array_equal(idx[w].table, one.table)):
            raise AssertionError(f"record step: {w} threads built other bytes than 1")
        idx[w] = None
    idx = one = table = None
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


def projection(res, log, tokens=RECORD_BUILD_TOKENS, threads=RECORD_BUILD_THREADS, bandwidth=NODE_BANDWIDTH,
               bytes_per_token=BYTES_PER_TOKEN):
    """Seconds this host's CPU class would take for the record's build (`tokens` on `threads`
    threads), from this run's own rows: the per-core rates of the 1-worker builds, one thread doing
    both stages in turn: stage 1 (compute) from the build at 2^14 partitions, the record's count
    (its 1 MiB of burst lines), and stage 2 (memory) from the build at the bench's own geometry,
    whose partitions have the record's 2^14 buckets of 176 slots (22 MiB each; the build at 2^14
    partitions keeps the table's size, so its partitions are 16 buckets, 22 KiB, and its stage 2
    runs in cache); and memory bandwidth, the host's 1-core copy rate times the threads, at most
    the record node's. The larger of the two binds; it is set against the record's
    RECORD_BUILD_SECONDS."""
    n = res["train_tokens"]
    s1 = float(np.median([st["stage1"] for st in res["stages_many"][1]]))
    s2 = float(np.median([st["stage2"] for st in res["stages"][1]]))
    per_thread = n / (s1 + s2)
    cores_s = tokens / (threads * per_thread)
    bw = min(threads * res["figures"]["memcpy_1w"]["median"], bandwidth)
    memory_s = tokens * bytes_per_token / bw
    seconds = max(cores_s, memory_s)
    bound = "memory bandwidth" if memory_s > cores_s else "cores"
    cpu = res["cpu"]
    log(f"projection for the record's build ({tokens / 1e9:.0f}B tokens on {threads} threads; it took "
        f"{RECORD_BUILD_SECONDS} s) at this host's per-core rates ({cpu['model']}, LLVM {cpu['llvm_target']}): "
        f"stage 1 {n / s1 / 1e6:.1f}M (at 2^14 partitions) + stage 2 {n / s2 / 1e6:.1f}M tok/s (2^{res['geometry']['bucket_bits']} "
        f"buckets a partition) = {per_thread / 1e6:.1f}M tok/s a thread "
        f"-> cores {cores_s:.1f} s; {bytes_per_token} B/token at {bw / 1e9:.0f} GB/s ({threads} x this host's 1-core "
        f"copy, at most {bandwidth / 1e9:.0f}) -> memory {memory_s:.1f} s; {bound} binds: {seconds:.1f} s, "
        f"{seconds / RECORD_BUILD_SECONDS:.1f}x the record's")
    return dict(tokens=tokens, threads=threads, cpu=cpu["model"], llvm_target=cpu["llvm_target"],
                stage1_per_core=n / s1, stage2_per_core=n / s2, rate_per_thread=per_thread, bandwidth=bw,
                bytes_per_token=bytes_per_token, cores_s=cores_s, memory_s=memory_s, seconds=seconds, bound=bound,
                record_seconds=RECORD_BUILD_SECONDS, vs_record=seconds / RECORD_BUILD_SECONDS)
