"""A/B of the hint kernels across LLVM CPU targets: the same code compiled for this host and for
other x86 targets (NUMBA_CPU_NAME), e.g. `rocketlake` or `sapphirerapids` (the record's Xeon
Platinum 8468), timed on this machine, interleaved. Optionally also the same package at a git
revision (--against), so that a fix is measured on every target against the code before it.

A CPU target decides which instructions and vector widths the compiler picks (an Intel target
prefers 256-bit vectors, an AMD Zen 4 one 512-bit), not how fast this machine runs them: a
ratio here shows what the code generation alone does on this host's cores. It runs only where
this host has every extension the target's code uses (an AMD Zen 4 runs Ice Lake / Rocket Lake /
Sapphire Rapids code that has no AMX or AVX512-FP16 instructions; a worker that hits one dies
with SIGILL, which is reported).

A target other than `host` compiles with that CPU's own feature set (NUMBA_CPU_FEATURES empty),
as on a machine of that kind; by default Numba would add this host's features to the name.

One worker process per (code, target), each with its own Numba cache (NUMBA_CACHE_DIR), all
started first and then asked in turn, in an order rotated every round, to time one repeat of
a figure: so every variant sees the same moments of a shared machine. Each worker checks that
it built the same bytes and returned the same hints as the first (by checksum).

Figures (--figures):
  ceiling  stage 1's hashing in cache (hints.bench.limits.hash_rounds, one thread): the compute ceiling
  build    a build of --tokens tokens of the training stream, 1 worker: stage 1 and stage 2 apart
  lookup   a sealed lookup of the validation stream, 1 worker

Usage: python scripts/target_ab.py --targets host,rocketlake,sapphirerapids [--against HEAD~1] --rounds 7
       python scripts/target_ab.py --targets rocketlake,rocketlake:-prefer-256-bit --figures ceiling
(on an Intel host, `host,host:-prefer-256-bit` measures 512-bit vectors against LLVM's 256-bit default there)
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from hints_ab import cache_dir, import_copy, materialize, paired, ratio_text  # beside this script

REPO = Path(__file__).resolve().parents[1]

CEILING_TOKENS = 1 << 15  # as hints.bench.limits' compute ceiling: L2-resident with its buffers
CEILING_ROUNDS = 100      # ~3M positions a repeat, 10-30 ms


# ---- worker side ------------------------------------------------------------------------------

def load_package(code):
    if code == "checkout":
        import hints
        return hints
    folder, names = materialize(code, copies=1)
    return import_copy(folder, names[0])


def limits_module(pkg):
    """The module of a hints package that holds hash_rounds (and HASH_BLOCK): hints.bench.limits, or
    hints.bench in revisions from before hints/ had sub-packages (an --against revision may be one)."""
    import importlib
    try:
        return importlib.import_module(pkg.__name__ + ".bench.limits")
    except ModuleNotFoundError:
        return importlib.import_module(pkg.__name__ + ".bench")


def hash_buffers(bench, geom):
    """The buffers hash_rounds hashes a block into: the block's scratch (HASH_SCRATCH words, or in
    revisions before it the prefix sums alone), its keys and its partitions."""
    scratch = getattr(bench, "HASH_SCRATCH", bench.HASH_BLOCK + max(geom.lengths) + 1)
    return (np.zeros(scratch, np.uint64), np.zeros(bench.HASH_BLOCK, np.uint64), np.zeros(bench.HASH_BLOCK, np.uint64))


def worker(args):
    """Prepare every figure once (compiles, warms), then time one repeat per request on stdin."""
    import dataclasses
    pkg = load_package(args.code)
    bench = limits_module(pkg)
    from hints.tokens import read_all
    from data.local_corpus import build_local_corpus
    corpus = build_local_corpus(progress=False)
    train = read_all(corpus["train_pattern"])[:args.tokens]
    query = read_all(corpus["val_pattern"])
    geom = pkg.Geometry.for_tokens(train.size)
    ix = pkg.HintIndex(dataclasses.replace(geom, partition_bits=0, bucket_bits=1, slots=8))
    s = np.resize(train, CEILING_TOKENS)
    bufs = hash_buffers(bench, geom)
    sealed = pkg.HintIndex(geom).add(train).seal() if "lookup" in args.figures else None

    def ceiling():
        t = time.perf_counter()
        h = bench.hash_rounds(s, CEILING_ROUNDS, ix._lengths, ix._pows, geom.partition_bits, ix._bits, ix._shifts, *bufs)
        return dict(seconds=time.perf_counter() - t, check=int(h))

    def build():
        idx = pkg.HintIndex(geom).reserve(train.size)
        t = time.perf_counter()
        idx.add(train)
        wall = time.perf_counter() - t
        return dict(seconds=wall, stage1=idx.build_seconds["stage1"], stage2=idx.build_seconds["stage2"],
                    check=int(idx.data_checksum()))

    def lookup():
        t = time.perf_counter()
        h = sealed.lookup(query)
        return dict(seconds=time.perf_counter() - t, check=int(np.asarray(h.token, np.int64).sum()))

    figures = dict(ceiling=ceiling, build=build, lookup=lookup)
    for name in args.figures:
        figures[name]()  # compile and warm
    from numba.core import config
    print(json.dumps(dict(ready=True, cpu_name=config.CPU_NAME or "host", pid=os.getpid())), flush=True)
    for line in sys.stdin:
        name = line.strip()
        if not name:
            break
        print(json.dumps(figures[name]()), flush=True)


# ---- driver side ------------------------------------------------------------------------------

def start(code, target, args):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("NUMBA_CPU_NAME", None)
    env.pop("NUMBA_CPU_FEATURES", None)
    name, _, features = target.partition(":")
    if name != "host":  # the target's own instruction set, as on a machine of that kind
        env["NUMBA_CPU_NAME"] = name
    if name != "host" or features:
        env["NUMBA_CPU_FEATURES"] = features
    env["NUMBA_CACHE_DIR"] = str(cache_dir() / f"numba-{target.replace(':', '_')}")
    cmd = [sys.executable, __file__, "--worker", "--code", code, "--tokens", str(args.tokens),
           "--figures", ",".join(args.figures)]
    return subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)


def ask(proc, what):
    if what is not None:
        proc.stdin.write(what + "\n")
        proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        rc = proc.wait()
        raise RuntimeError(f"worker died (exit status {rc}{', SIGILL: the target uses an instruction this host lacks' if rc == -4 else ''})")
    return json.loads(line)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--targets", default="host,rocketlake", type=lambda s: s.split(","),
                   help="comma-separated LLVM CPU names ('host': this machine's own), each optionally with "
                        "':FEATURES', LLVM feature changes (e.g. rocketlake:-prefer-256-bit for 512-bit vectors)")
    p.add_argument("--against", help="also time the hints/ of this git revision, on every target")
    p.add_argument("--figures", default="ceiling,build,lookup", type=lambda s: s.split(","))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--tokens", type=int, default=1 << 22, help="training tokens of the build and of the sealed index")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--code", default="checkout", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    bad = [f for f in args.figures if f not in ("ceiling", "build", "lookup")]
    if bad or args.rounds < 1 or args.tokens < 100_000:
        p.error(f"--figures takes ceiling,build,lookup (got {bad}); --rounds >= 1; --tokens >= 100,000")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    codes = ([args.against] if args.against else []) + ["checkout"]
    variants = [(c, t) for c in codes for t in args.targets]
    names = [f"{'this checkout' if c == 'checkout' else c} @ {t}" for c, t in variants]
    procs = [start(c, t, args) for c, t in variants]  # compile in parallel
    try:
        for name, pr in zip(names, procs):
            info = ask(pr, None)
            print(f"  ready: {name} (NUMBA_CPU_NAME={info['cpu_name']})", flush=True)
        times = {f: [] for f in args.figures}
        stages = {f: [] for f in args.figures}
        for r in range(args.rounds):
            for f in args.figures:
                row, st, checks = np.zeros(len(procs)), np.zeros((len(procs), 2)), {}
                for k in [(r + i) % len(procs) for i in range(len(procs))]:
                    out = ask(procs[k], f)
                    row[k] = out["seconds"]
                    st[k] = out.get("stage1", np.nan), out.get("stage2", np.nan)
                    checks[k] = out["check"]
                if len(set(checks.values())) != 1:
                    raise AssertionError(f"{f}: the variants' results differ: {checks}")
                times[f].append(row)
                stages[f].append(st)
        print(f"{args.rounds} rounds, order rotated each round; identical results on every variant")
        for f in args.figures:
            t = np.array(times[f])
            print(f"{f}:")
            for k, name in enumerate(names):
                line = f"  {name:36s} {1e3 * np.median(t[:, k]):9.2f} ms"
                if k:
                    line += f" | / {names[0]}: {ratio_text(paired(t[:, k], t[:, 0]))}"
                print(line)
            if f == "build":
                s = np.array(stages[f])
                for j, stage in enumerate(("stage 1", "stage 2")):
                    for k, name in enumerate(names):
                        line = f"    {stage} {name:28s} {1e3 * np.median(s[:, k, j]):9.2f} ms"
                        if k:
                            line += f" | / {names[0]}: {ratio_text(paired(s[:, k, j], s[:, 0, j]))}"
                        print(line)
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.stdin.close()
                pr.wait()


if __name__ == "__main__":
    main()
