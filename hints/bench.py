"""`python -m hints bench`: build and lookup speed against the plain-Python reference, in one run.

Machines here are shared and noisy, so every claim is a ratio of timings taken in the same
run: Numba build (1 worker, N workers) over the plain-Python builder, N workers over 1,
and lookup positions/s per core. Each Numba timing is the best of REPEATS runs, alternated
between worker counts. Peak build memory is measured in a fresh child process.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from .geometry import Geometry
from .index import HintIndex
from .reference import ReferenceIndex

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPEATS = 3
MIB = 1 << 20
MEMORY_SLACK = 256 * MIB  # docs/design.md: peak build RSS <= index + staging + 256 MiB


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


def _time(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def run_bench(train, query, geom=None, workers=2, ref_tokens=200_000, ref_query=20_000, log=print):
    """Benchmark on a training stream `train` and a query stream `query` (uint16 arrays)."""
    geom = geom or Geometry.for_tokens(train.size)
    log(f"bench: {train.size:,} training tokens, {query.size:,} query positions, geometry {geom.describe()}")
    HintIndex(Geometry(2, 4, 8, geom.lengths)).add(train[:1000]).lookup(query[:1000])  # load compiled kernels

    ref = ReferenceIndex(geom.lengths)
    t_ref, _ = _time(lambda: ref.add(train[:ref_tokens]))
    t_ref_q, _ = _time(lambda: ref.lookup(query[:ref_query]))
    res = dict(geometry=geom.to_dict(), train_tokens=int(train.size), query_tokens=int(query.size), workers=workers,
               ref_build_tps=min(ref_tokens, train.size) / t_ref, ref_lookup_pps=min(ref_query, query.size) / t_ref_q)
    log(f"  plain-Python reference: build {res['ref_build_tps'] / 1e6:.3f}M tok/s, lookup {res['ref_lookup_pps'] / 1e6:.3f}M pos/s")

    build, alloc, stages, idx = {}, {}, {}, None
    for w in [1, workers] * REPEATS:
        t_alloc, idx = _time(lambda: HintIndex(geom, workers=w).reserve(train.size))  # table + staging
        t_build, _ = _time(lambda: idx.add(train))
        if t_build < build.get(w, np.inf):
            build[w], alloc[w], stages[w] = t_build, t_alloc, dict(idx.build_seconds)
    for w in sorted(build):
        tps = train.size / build[w]
        res[f"build_tps_{w}w"] = tps
        res[f"build_with_alloc_tps_{w}w"] = train.size / (build[w] + alloc[w])
        res[f"stage1_share_{w}w"] = stages[w]["stage1"] / build[w]
        log(f"  build, {w} worker(s): {tps / 1e6:.1f}M tok/s ({tps / w / 1e6:.1f}M per worker; stage 1 "
            f"{stages[w]['stage1']:.2f}s, stage 2 {stages[w]['stage2']:.2f}s; with allocation+prefault "
            f"{res[f'build_with_alloc_tps_{w}w'] / 1e6:.1f}M tok/s)")
    res.update(dropped=idx.dropped, hints_stored=idx.hints_stored, load=idx.hints_stored / geom.n_slots)

    look = {}
    for w in [1, workers] * REPEATS:
        idx.workers = w
        t, _ = _time(lambda: idx.lookup(query))
        look[w] = min(look.get(w, np.inf), t)
    for w in sorted(look):
        res[f"lookup_pps_{w}w"] = query.size / look[w]
        log(f"  lookup, {w} worker(s): {query.size / look[w] / 1e6:.2f}M pos/s ({query.size / look[w] / w / 1e6:.2f}M per core)")

    mem = measure_memory(geom, train, workers)
    res.update(memory=mem)
    budget = mem["index_bytes"] + mem["staging_bytes"] + MEMORY_SLACK
    log(f"  peak build memory: +{mem['peak_increase'] / MIB:.0f} MiB (index {mem['index_bytes'] / MIB:.0f} MiB + "
        f"staging {mem['staging_bytes'] / MIB:.0f} MiB + 256 MiB = {budget / MIB:.0f} MiB budget; "
        f"staging {mem['staging_bytes'] / (8 * min(train.size, idx.chunk_tokens)):.2f} x 8 B per staged token)")

    res["ratio_build_1w_vs_ref"] = res["build_tps_1w"] / res["ref_build_tps"]
    res[f"ratio_build_{workers}w_vs_1w"] = res[f"build_tps_{workers}w"] / res["build_tps_1w"]
    res["ratio_lookup_1w_vs_ref"] = res["lookup_pps_1w"] / res["ref_lookup_pps"]
    log(f"ratios: build 1 worker / plain Python = {res['ratio_build_1w_vs_ref']:.0f}x; "
        f"build {workers} workers / 1 = {res[f'ratio_build_{workers}w_vs_1w']:.2f}x; "
        f"lookup 1 worker / plain Python = {res['ratio_lookup_1w_vs_ref']:.0f}x")
    return res


def format_table(res):
    """The README's Markdown table of one bench run."""
    w = res["workers"]
    rows = [
        ("plain-Python reference build", f"{res['ref_build_tps'] / 1e6:.3f}M tok/s", "1x"),
        ("build, 1 worker (both stages)", f"{res['build_tps_1w'] / 1e6:.1f}M tok/s", f"{res['ratio_build_1w_vs_ref']:.0f}x reference"),
        (f"build, {w} workers", f"{res[f'build_tps_{w}w'] / 1e6:.1f}M tok/s", f"{res[f'ratio_build_{w}w_vs_1w']:.2f}x 1 worker"),
        ("lookup, 1 worker (3 lengths)", f"{res['lookup_pps_1w'] / 1e6:.2f}M pos/s", f"{res['ratio_lookup_1w_vs_ref']:.0f}x reference"),
        (f"lookup, {w} workers", f"{res[f'lookup_pps_{w}w'] / 1e6:.2f}M pos/s", f"{res[f'lookup_pps_{w}w'] / res['lookup_pps_1w']:.2f}x 1 worker"),
    ]
    mem = res["memory"]
    rows.append(("peak build memory over baseline", f"{mem['peak_increase'] / MIB:.0f} MiB",
                 f"budget {(mem['index_bytes'] + mem['staging_bytes'] + MEMORY_SLACK) / MIB:.0f} MiB"))
    out = ["| measurement | value | ratio |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(out)
