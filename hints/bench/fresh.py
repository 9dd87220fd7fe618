"""The first add into a fresh index against an add into a warm one (issue 40; docs/design.md, "Pre-faulting").

Fresh: `HintIndex(geom, workers=w)` and its first `add(tokens)` on the clock, as a new user times
them: the table's pre-fault, the staging arena and the build. Warm: the same add into an index
made and reserved before the clock (the bench's build row). Both are alternated, 1 and `workers`
workers, `repeats` times after an untimed round (hints.bench.figures). `python -m hints bench`
reports the fresh rows beside its warm ones; `python -m hints.bench.fresh` measures only these,
with each way's peak memory (a fresh child process each: pre-faulted when made, or faulted at
first write; with --lazy, the first add into an index left to fault at first write as well):

    python -m hints.bench.fresh --tokens 'data/local_corpus/train_*.bin' --max-tokens 20M --geometry 8,12,64
"""
import argparse

import numpy as np

from data.units import parse_token_count

from ..index import DEFAULT_LENGTHS, Geometry, HintIndex, parse_lengths
from ..tokens import read_all
from .figures import REPEATS, Figure, alternate, timed
from .peak_memory import measure_memory


def fresh_add(geom, w, tokens, prefault=None):
    """Make an index and add `tokens` to it: (wall, CPU, the index). prefault=False: its table
    faulted at first write, in stage 2 (the way not taken, measured beside)."""
    return timed(lambda: HintIndex(geom, workers=w, prefault=prefault).add(tokens))


def warm_add(geom, w, tokens):
    """Add `tokens` to an index made and reserved before the clock: (wall, CPU, the index)."""
    idx = HintIndex(geom, workers=w).reserve(tokens.size)
    return timed(lambda: idx.add(tokens))


def bench_fresh(tokens, geom, workers, repeats, log, warm=False, lazy=False, sampler=None):
    """Figures of the first add into a fresh index, 1 and `workers` workers, alternated ({"fresh_<w>w"});
    with `warm`, alternated with the warm add too ({"warm_<w>w"}); with `lazy`, with the first add
    into a fresh index that is not pre-faulted ({"lazy_<w>w"}); with a `sampler`, the host rows beside
    (hints.bench.host_sampler). Logs each, with the pre-fault's seconds."""
    ws = sorted({1, workers})
    figs = {f"fresh_{w}w": Figure(f"first add into a fresh index (made + add), {w} worker(s)", "tok/s", tokens.size, w)
            for w in ws}
    if lazy:
        figs.update({f"lazy_{w}w": Figure(f"first add into a fresh index faulted at first write, {w} worker(s)", "tok/s",
                                          tokens.size, w) for w in ws})
    if warm:
        figs.update({f"warm_{w}w": Figure(f"add into a warm index, {w} worker(s)", "tok/s", tokens.size, w) for w in ws})
    prefault = {}
    ways = dict(fresh=fresh_add, lazy=lambda g, w, t: fresh_add(g, w, t, prefault=False), warm=warm_add)

    def measure(key):
        kind, w = key.split("_")[0], int(key.split("_")[1][:-1])
        wall, cpu, idx = ways[kind](geom, w, tokens)
        if kind == "fresh":
            prefault[w] = idx.prefault
        return wall, cpu, idx.prefault["seconds"] if kind == "fresh" and idx.prefault else None

    extras = alternate(figs, measure, repeats, sampler)
    for key, f in figs.items():
        pf = [s for s in extras[key] if s is not None]
        log(f"  {f.name}: {f.text()}" + (f"; of which the pre-fault {np.median(pf):.3f}s [{min(pf):.3f}-{max(pf):.3f}] "
                                         f"({prefault[f.workers]['how']}, THP mode {prefault[f.workers]['thp_mode']})"
                                         if pf else ""))
    return figs


def ratio(num, den):
    """Median and min-max of num/den over repeats taken in turn (rates of two figures)."""
    r = np.array(num.rates) / np.array(den.rates)
    return float(np.median(r)), float(r.min()), float(r.max())


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m hints.bench.fresh", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", nargs="+", required=True, help=".bin globs or .npy files, concatenated in this order")
    p.add_argument("--max-tokens", type=parse_token_count, default=None, help="use the first N tokens (e.g. 20M)")
    p.add_argument("--geometry", default="auto", help="'auto', a preset or 'P,B,S'")
    p.add_argument("--lengths", type=parse_lengths, default=DEFAULT_LENGTHS)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=REPEATS)
    p.add_argument("--lazy", action="store_true", help="also the first add into a fresh index left to fault at first write")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory children")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.workers < 1:
        p.error(f"--repeats {args.repeats} / --workers {args.workers}: expected at least 1")
    tokens = np.concatenate([read_all(t) for t in args.tokens])[:args.max_tokens]
    geom = Geometry.parse(args.geometry, tokens.size, args.lengths)
    from .limits import cpu_info, cpu_text
    print(f"CPU: {cpu_text(cpu_info())}")
    print(f"{tokens.size:,} tokens, geometry {geom.describe()}, {args.repeats} repeats (median [min-max])")
    HintIndex(Geometry(2, 4, 8, geom.lengths)).add(tokens[:1000])  # load the kernels
    figs = bench_fresh(tokens, geom, args.workers, args.repeats, print, warm=True, lazy=args.lazy)
    kinds = ("fresh", "lazy", "warm") if args.lazy else ("fresh", "warm")
    for w in sorted({1, args.workers}):
        for kind in kinds[:-1]:
            m, lo, hi = ratio(figs[f"{kind}_{w}w"], figs[f"warm_{w}w"])
            print(f"{kind} / warm, {w} worker(s): {m:.2f}x [{lo:.2f}-{hi:.2f}]")
    if args.workers > 1:
        for kind in kinds:
            m, lo, hi = ratio(figs[f"{kind}_{args.workers}w"], figs[f"{kind}_1w"])
            print(f"{kind}: {args.workers} workers / 1: {m:.2f}x [{lo:.2f}-{hi:.2f}]")
    if not args.no_memory:
        for prefault in (True, False):
            mem = measure_memory(geom, tokens, args.workers, prefault=prefault)
            print(f"peak RSS growth, made + add, {args.workers} workers, prefault={prefault}: "
                  f"{mem['peak_increase'] / 2**20:.0f} MiB (table {mem['index_bytes'] / 2**20:.0f} MiB, "
                  f"staging {mem['staging_bytes'] / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
