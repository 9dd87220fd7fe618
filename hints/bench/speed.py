"""`python -m hints bench`: build, seal and lookup speed against the plain-Python reference.

Machines here are shared and noisy, so every figure is measured `repeats` times (default 5),
alternating between the things it is compared with (1 worker, N workers; plain Python and
Numba), and reported as the median with the min-max spread. Claims are ratios of medians
taken in the same run. A rate per worker is the rate divided by the workers. The CPU seconds
the process used are recorded beside the wall time; their ratio, "cores used", shows what a
figure actually got: on a busy machine 2 workers may get one core, and then their ratio to 1
worker says nothing about scaling.

Figures: the plain-Python builder and lookup (the denominators); the build from a token array
(both stages) at the corpus geometry and at 2^14 partitions, into an index made before the
clock, and beside it the first add into a fresh index (made, pre-faulted and built on the clock,
hints.bench.fresh); the background build from `.bin`
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
vectorised loop, 1 and 2 threads) and the random-write floor are sampled all through every run
(hints.bench.host_sampler), and each figure is also given as a share of its host row as it was
while the figure was measured (compute-bound: the vector ceiling of as many threads; memory-bound:
the random-write floor or memcpy), from wall time, and from CPU time against the run's rows. With
`previous` (bench --compare) the shares of two runs are checked to agree within 15%; two workers
are checked against the vector ceiling's own 2/1 ratio. From this CPU's per-core stage rates and
its copy bandwidth, a projection of the record's build (35B tokens on 48 threads in 6.36 s).
"""
import dataclasses

import numpy as np

from ..index import Geometry, HintIndex, ReferenceIndex
from ..index.sealed import summary_words
from ..tokens import iter_chunks
from .figures import MIB, REPEATS, Figure, alternate, timed
from .host_sampler import HostSampler, random_writes_row
from .limits import compute_ceiling, cpu_info, cpu_text, memcpy_bandwidth, memory_latency
from .peak_memory import measure_memory
from .record import RECORD_ADD, bench_record_step, projection
from .shares import REPRO_SCALING, REPRO_TOLERANCE, host_shares, host_shares_cpu, reproducibility, share_text

MEMORY_SLACK = 256 * MIB  # docs/design.md: peak build RSS <= index + staging + 256 MiB
MANY_PARTITIONS = 14      # the record's 2^14 partitions: the second build geometry


def bench_reference(train, query, ref_tokens, ref_query, repeats, log, sampler=None):
    build = Figure("plain-Python reference build", "tok/s", min(ref_tokens, train.size))
    look = Figure("plain-Python reference lookup", "pos/s", min(ref_query, query.size))
    ref = None

    def measure(key):  # a build, then a lookup of the index it built
        nonlocal ref
        if key == "build":
            ref = ReferenceIndex()
            return timed(lambda: ref.add(train[:ref_tokens]))[:2] + (None,)
        return timed(lambda: ref.lookup(query[:ref_query]))[:2] + (None,)

    alternate(dict(build=build, lookup=look), measure, repeats, sampler)
    log(f"  plain Python: build {build.text(digits=3)}, lookup {look.text(digits=3)}")
    return build, look


def bench_build(train, geom, workers, repeats, log, label="", sampler=None):
    """Build figures for 1 and `workers` workers, alternated; returns (figures, stage seconds, last index)."""
    figs = {w: Figure(f"build{label}, {w} worker(s)", "tok/s", train.size, w) for w in sorted({1, workers})}
    idx = None

    def build(w):
        nonlocal idx
        idx = None
        idx = HintIndex(geom, workers=w).reserve(train.size)  # table + staging, timed apart
        return (*timed(lambda: idx.add(train))[:2], dict(idx.build_seconds))

    stages = alternate(figs, build, repeats, sampler)
    for w, f in figs.items():
        s1 = np.median([s["stage1"] for s in stages[w]])
        s2 = np.median([s["stage2"] for s in stages[w]])
        log(f"  build{label}, {w} worker(s): {f.text()} ({f.median / w / 1e6:.1f}M per worker; "
            f"stage 1 {s1:.3f}s, stage 2 {s2:.3f}s, medians)")
    return figs, stages, idx


def bench_shards(pattern, n_tokens, geom, workers, repeats, log, sampler=None):
    """The background build end to end: read .bin shards chunk by chunk and add them."""
    figs = {w: Figure(f"build from shards, {w} worker(s)", "tok/s", n_tokens, w) for w in sorted({1, workers})}

    def build(w):
        idx = HintIndex(geom, workers=w).reserve(n_tokens)
        return timed(lambda: [idx.add(c) for c in iter_chunks(pattern, n_tokens)])[:2] + (None,)

    alternate(figs, build, repeats, sampler)
    for w, f in figs.items():
        log(f"  build from .bin shards (read + stage 1 + stage 2), {w} worker(s): {f.text()} "
            f"({f.median / w / 1e6:.1f}M per worker)")
    return figs


def bench_lookup(idx, query, workers, repeats, label, log, sampler=None):
    figs = {w: Figure(f"lookup {label}, {w} worker(s)", "pos/s", query.size, w) for w in sorted({1, workers})}

    def look(w):
        idx.workers = w
        return timed(lambda: idx.lookup(query))[:2] + (None,)

    def warm(w):  # the state of repeated lookups, not the one the host sampler leaves (alternate)
        idx.workers = w
        idx.lookup(query)

    alternate(figs, look, repeats, sampler, warm=warm)
    for w, f in figs.items():
        log(f"  lookup {label}, {w} worker(s): {f.text(digits=2)} ({f.median / w / 1e6:.2f}M per core)")
    return figs


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
    sampler = HostSampler(workers, geom.n_slots * 8)  # the host rows, sampled all through the run
    ref_build, ref_look = bench_reference(train, query, ref_tokens, ref_query, repeats, log, sampler)
    figs.update(ref_build=ref_build, ref_lookup=ref_look)

    record = None
    if record_step:  # first, on a fresh process: after the builds' GiBs come and go, it measured 1.4x slower
        start = len(sampler)
        sampler.sample()
        rec = bench_record_step(train, repeats, log, geom.lengths)
        sampler.sample()
        record = dict(geometry=rec["geometry"], prefill=rec["prefill"], ms=[1e3 * w for w in rec["step"].wall],
                      cpu_ms=[1e3 * c for c in rec["step"].cpu],
                      lookup_ms=[1e3 * w for w in rec["lookup"].wall], add_ms=[1e3 * w for w in rec["add"].wall],
                      stage1_ms=[s[0] for s in rec["stages_ms"]], stage2_ms=[s[1] for s in rec["stages_ms"]],
                      random_writes_ms=[1e3 * w for w in rec["random_writes"].wall], dropped_share=rec["dropped_share"],
                      threads={str(w): dict(ms=[1e3 * x for x in f["step"].wall], cpu_ms=[1e3 * x for x in f["step"].cpu],
                                            lookup_ms=[1e3 * x for x in f["lookup"].wall],
                                            add_ms=[1e3 * x for x in f["add"].wall])
                               for w, f in rec["threads"].items()},
                      host=sampler.window(start))
    build, stages, idx = bench_build(train, geom, workers, repeats, log, sampler=sampler)
    for w, f in build.items():
        figs[f"build_{w}w"] = f
    from .fresh import bench_fresh  # here: `python -m hints.bench.fresh` runs that module as a script
    # made + first add, beside the warm build
    figs.update(bench_fresh(train, geom, workers, repeats, log, sampler=sampler))
    many = dataclasses.replace(geom, partition_bits=MANY_PARTITIONS,
                               bucket_bits=max(1, geom.partition_bits + geom.bucket_bits - MANY_PARTITIONS))
    build_many, stages_many, _ = bench_build(train, many, workers, repeats, log,
                                             label=f" at {many.n_partitions:,} partitions", sampler=sampler)
    for w, f in build_many.items():
        figs[f"build_many_{w}w"] = f
    if shards:
        for w, f in bench_shards(shards, train.size, geom, workers, repeats, log, sampler).items():
            figs[f"shards_{w}w"] = f

    seal = Figure("seal", "tok/s", train.size, workers)
    sealed = None

    def seal_one(_):
        nonlocal sealed
        sealed = None
        sealed = HintIndex(geom, workers=workers).add(train)
        return timed(sealed.seal)[:2] + (None,)

    alternate(dict(seal=seal), seal_one, repeats, sampler)
    figs["seal"] = seal
    log(f"  seal ({workers} workers): {seal.text()} of tokens built; side table {sealed.side_capacity:,} entries "
        f"({2 * 8 * sealed.side_capacity / MIB:.1f} MiB), summaries "
        f"{geom.n_partitions * geom.n_buckets * summary_words(geom.slots) * 2 / MIB:.1f} MiB")

    for w, f in bench_lookup(idx, query, workers, repeats, "scan (growing index)", log, sampler).items():
        figs[f"lookup_scan_{w}w"] = f
    for w, f in bench_lookup(sealed, query, workers, repeats, "sealed", log, sampler).items():
        figs[f"lookup_sealed_{w}w"] = f

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
    for w, fig in compute_ceiling(train, geom, log, workers, repeats=repeats, sampler=sampler).items():
        figs[f"ceiling_{w}w"] = fig
        res["figures"][f"ceiling_{w}w"] = fig.summary()
    sampler.log(log)
    for key, fig in sampler.rows.items():
        figs[key] = fig
        res["figures"][key] = fig.summary()
    res["figures"]["latency"] = memory_latency(log, repeats=repeats).summary()
    ratios = dict(build_1w_vs_ref=figs["build_1w"].median / ref_build.median,
                  lookup_sealed_1w_vs_ref=figs["lookup_sealed_1w"].median / ref_look.median)
    for w in sorted({1, workers}):
        ratios[f"fresh_{w}w_vs_build_{w}w"] = figs[f"fresh_{w}w"].median / figs[f"build_{w}w"].median
    for key in ("build", "fresh", "build_many", "shards", "lookup_sealed", "memcpy", "ceiling", "vector",
                "random_writes"):
        if f"{key}_{workers}w" in figs and workers > 1:
            one = figs[random_writes_row(1) if key == "random_writes" else f"{key}_1w"]
            runs = np.array(figs[f"{key}_{workers}w"].rates) / np.array(one.rates)
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
        for k in ratios if k.endswith("vs_1w")) + "".join(
        f"; first add into a fresh index / warm build, {k.split('_')[1][:-1]} worker(s) = {v:.2f}x"
        for k, v in ratios.items() if k.startswith("fresh_") and "_vs_build_" in k))
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


def format_table(res):
    """The README's Markdown table of one bench run: median [min-max] of each figure, and its share
    of its host row in the same run; the CPU above it."""
    rows = []
    for key, f in res["figures"].items():
        used, share = f"{f['cores_used']:.2f}", share_text(res, key)
        if key.startswith("memcpy"):
            rows.append((f["name"], f"{f['median'] / 1e9:.1f} GB/s", f"{f['min'] / 1e9:.1f}-{f['max'] / 1e9:.1f} GB/s", used, share))
            continue
        if key == "latency" or key.startswith("random_writes"):  # ns a read, or a write a core
            what = "memory latency: " if key == "latency" else "the random-write floor: "
            w = f["workers"]
            rows.append((what + f["name"], f"{1e9 * w / f['median']:.1f} ns",
                         f"{1e9 * w / f['max']:.1f}-{1e9 * w / f['min']:.1f} ns", used, share))
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
