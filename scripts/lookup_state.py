"""What a sealed lookup's time depends on beside its code: the cache it finds, and the host's moment.

Two measurements, on sealed indexes of one corpus (the man-pages prose by default: its 44 MiB
index fits a large L3, so what the cache holds shows most there):

  after-sample  lookups of the validation split timed right after an untimed lookup (warm) and
                right after one sample of `python -m hints bench`'s host rows (the vector loop and
                the random writes, hints.bench.host_sampler), alternated: the state the bench's
                lookups were timed from before it warmed them (hints.bench.figures.alternate).
  rounds        --indexes indexes built alike from the same tokens, each lookup timed after an
                untimed one, every index once a round for --rounds rounds: if a slow lookup came
                from an index's own state (where its pages lie), its column would stay slow; if it
                came from the host (other tenants on the shared cache and memory), the whole row
                moves together.

Each cell is the median of --repeats lookups, in million positions a second. Nothing here is a
claim about the code's speed; hints_ab.py measures that, paired and in one process.

Usage: python scripts/lookup_state.py [--corpus prose|stdlib] [--rounds 6] [--indexes 4]
"""
import argparse
import time

import numpy as np

from hints.bench import HostSampler
from hints.index import Geometry, HintIndex
from hints.tokens import read_all


def median_rate(idx, query, repeats, before):
    """Median positions a second of `repeats` lookups of query, each timed right after before()."""
    times = []
    for _ in range(repeats):
        before()
        t0 = time.perf_counter()
        idx.lookup(query)
        times.append(time.perf_counter() - t0)
    return query.size / float(np.median(times))


def after_sample(train, query, workers, repeats, log):
    """Warm against after a host sample, alternated, for 1 and `workers` workers: {(workers, state): rates}."""
    geom = Geometry.for_tokens(train.size)
    idx = HintIndex(geom, workers=workers).add(train).seal()
    sampler = HostSampler(workers, geom.n_slots * 8)
    rates = {}
    for w in sorted({1, workers}):
        idx.workers = w
        idx.lookup(query)
        for _ in range(2):
            for state, before in (("warm", lambda: idx.lookup(query)), ("after a host sample", sampler.sample)):
                rates.setdefault((w, state), []).append(median_rate(idx, query, repeats, before))
    for (w, state), r in rates.items():
        log(f"  {w} worker(s), {state:20s} " + "  ".join(f"{x / 1e6:6.2f}M" for x in r))
    return rates


def rounds(train, query, n_indexes, n_rounds, repeats, log):
    """The rounds x indexes table of warm lookup rates (1 worker)."""
    geom = Geometry.for_tokens(train.size)
    idxs = [HintIndex(geom, workers=2).add(train).seal() for _ in range(n_indexes)]
    for idx in idxs:
        idx.workers = 1
        idx.lookup(query)
    table = np.zeros((n_rounds, n_indexes))
    log("  round  " + "  ".join(f"index {i}" for i in range(n_indexes)))
    for r in range(n_rounds):
        for i, idx in enumerate(idxs):
            table[r, i] = median_rate(idx, query, repeats, lambda: idx.lookup(query))
        log(f"  {r:5d}  " + "  ".join(f"{x / 1e6:6.2f}M" for x in table[r]))
    within = np.median(table.max(axis=1) / table.min(axis=1))
    across = np.median(table.max(axis=0) / table.min(axis=0))
    log(f"  fastest / slowest: within a round (median over rounds) {within:.3f}x; across the rounds "
        f"(median over indexes) {across:.3f}x")
    return table


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--corpus", choices=("prose", "stdlib"), default="prose",
                   help="the local corpus (built on first use, as python -m hints bench --corpus does)")
    p.add_argument("--tokens", help="training token shards (.bin glob) instead of --corpus")
    p.add_argument("--query", help="query token shards (.bin glob); with --tokens")
    p.add_argument("--mode", choices=("after-sample", "rounds", "both"), default="both")
    p.add_argument("--workers", type=int, default=2, help="after-sample: workers beside 1")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--indexes", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5, help="lookups a cell (median)")
    args = p.parse_args(argv)
    for name in ("workers", "rounds", "indexes", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} {getattr(args, name)}: expected at least 1")
    if args.tokens:
        if not args.query:
            p.error("--tokens needs --query (the positions to look up)")
        train, query = read_all(args.tokens), read_all(args.query)
    else:
        if args.corpus == "prose":
            from data.prose_corpus import build_prose_corpus as build_corpus
        else:
            from data.local_corpus import build_local_corpus as build_corpus
        corpus = build_corpus()
        train, query = read_all(corpus["train_pattern"]), read_all(corpus["val_pattern"])
    print(f"{train.size:,} training tokens, {query.size:,} query positions, "
          f"{Geometry.for_tokens(train.size).describe()}; M positions a second, medians of {args.repeats}")
    if args.mode in ("after-sample", "both"):
        print("lookup timed right after a lookup (warm) or right after a host sample, alternated twice:")
        after_sample(train, query, args.workers, args.repeats, print)
    if args.mode in ("rounds", "both"):
        print(f"{args.indexes} indexes built alike, a warm lookup of each a round (1 worker):")
        rounds(train, query, args.indexes, args.rounds, args.repeats, print)


if __name__ == "__main__":
    main()
