"""`python -m hints build|lookup|stats|bench|positional-bench|exact-bench|scaling|draft-stats`: the hint index from the command line."""
import argparse
import json
import os
import sys
import time

import numpy as np
from tqdm import tqdm

from data.loader import SPEEDRUN_VAL_TOKENS
from data.units import parse_token_count

from .bench import (format_exact_table, format_stats, format_table, hint_stats, ladder_sizes, run_bench, run_exact_bench,
                    run_positional_bench, run_scaling)
from .cells import BOS
from .draft import add_draft_stats_args, run_draft_stats
from .index import DEFAULT_LENGTHS, PRESETS, Geometry, HintIndex, cpu_model, parse_lengths, save_rate
from .tokens import count_tokens, iter_chunks, read_all


def cmd_build(args):
    n = count_tokens(args.tokens, args.max_tokens)
    geom = Geometry.parse(args.geometry, n, args.lengths)
    print(f"building {geom.describe()} from {n:,} tokens with {args.workers} worker(s)")
    idx = HintIndex(geom, workers=args.workers, path=args.out if args.in_place else None,
                    prefault={"auto": None, "on": True, "off": False}[args.prefault])
    if idx.prefault:  # before the build's clock: the table faulted in, apart from the build time
        pf = idx.prefault
        print(f"table pre-faulted in {pf['seconds']:.2f}s on {pf['workers']} thread(s) ({pf['bytes'] / 2**20:,.0f} MiB, "
              f"{pf['how']}; huge pages asked: {pf['madvise_hugepage']}, kernel THP mode {pf['thp_mode']})")
    try:
        t = time.perf_counter()
        with tqdm(total=n, unit="tok", unit_scale=True, desc="build") as bar:
            for chunk in iter_chunks(args.tokens, args.max_tokens):
                idx.add(chunk)
                bar.update(chunk.size)
        dt = time.perf_counter() - t
        if not args.no_seal:
            t = time.perf_counter()
            idx.seal()
            print(f"sealed in {time.perf_counter() - t:.1f}s (side table: {idx.side_capacity:,} entries)")
        idx.save(args.out)
    except BaseException:
        if args.in_place and os.path.exists(args.out):
            os.unlink(args.out)  # a half-built --in-place index is of no use (readers refuse its zero header)
        raise
    s = idx.stats()
    print(f"built in {dt:.1f}s ({n / dt / 1e6:.1f}M tok/s): {s['hints_stored']:,} hints stored, "
          f"{s['dropped']:,} dropped, load {s['load']:.1%}, {s['full_buckets']:,} full buckets -> {args.out}")


def cmd_lookup(args):
    from data.tokenizer import gpt2  # only for showing text
    idx = HintIndex.load(args.index, mmap=True, workers=args.workers)
    if args.text is not None:
        toks = np.array(gpt2().encode(args.text, allowed_special="all"), dtype=np.uint16)
    else:
        toks = read_all(args.tokens, args.start + args.count)[args.start:]
    h = idx.lookup(toks)
    enc = gpt2()
    print("pos  token          " + "  ".join(f"{L:>2}-gram hint (count, purity, kind)" for L in idx.geom.lengths))
    for t in range(toks.size):
        cells = []
        for k in range(idx.geom.n_lengths):
            if h.token[k, t] < 0:
                cells.append(f"{'-':<34}")
            else:
                cells.append(f"{enc.decode([int(h.token[k, t])])!r:<14} ({h.count[k, t]}, {h.purity[k, t]:.2f}, {h.kind[k, t]})".ljust(34))
        print(f"{t:>3}  {enc.decode([int(toks[t])])!r:<14} " + "  ".join(cells))


def boundary_arg(args):
    """--boundaries: 'bos' (n-grams restart at every BOS, the default) or 'none'."""
    return BOS if args.boundaries == "bos" else None


def cmd_stats(args):
    idx = HintIndex.load(args.index, mmap=True, verify=args.verify, workers=args.workers)
    s = idx.stats()
    print(f"index {args.index}: {idx.geom.describe()}")
    print(f"  tokens added {s['tokens_added']:,}, hints stored {s['hints_stored']:,}, dropped {s['dropped']:,}, "
          f"load {s['load']:.1%}, full buckets {s['full_buckets']:,}")
    hist = np.array(s["fill_histogram"])
    edges = np.linspace(0, idx.geom.slots, 9).astype(int)
    print("  bucket fill histogram: " + ", ".join(
        f"{a}-{b}: {hist[a:b + 1 if b == idx.geom.slots else b].sum() / hist.sum():.1%}" for a, b in zip(edges, edges[1:])))
    if args.tokens:
        n = count_tokens(args.tokens, args.max_tokens)
        toks = read_all(args.tokens, args.max_tokens)
        with tqdm(total=max(0, n - 1), unit="pos", unit_scale=True, desc="stats") as bar:
            st = hint_stats(idx, toks, progress=bar, boundary=boundary_arg(args))
        print(format_stats(st, per_kind=not args.no_kinds))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(index=s, hints=st), f, indent=1)


def bench_tokens(args):
    """(training tokens, query tokens, shard glob or None, what they are) for the benchmarks:
    --tokens (and --query), else the local corpus that --corpus names (stdlib by default)."""
    if args.tokens:
        train = read_all(args.tokens, args.max_tokens)
        query = read_all(args.query, args.query_tokens) if args.query else train[-args.query_tokens:]
        return train, query, None if args.tokens.endswith(".npy") else args.tokens, args.tokens
    corpus_name = getattr(args, "corpus", "stdlib")
    if corpus_name == "prose":
        from data.prose_corpus import build_prose_corpus as build_corpus
    else:
        from data.local_corpus import build_local_corpus as build_corpus
    # the whole corpus, as the demo builds it, read up to --max-tokens: a cap passed to the build would
    # rebuild the shared corpus in place with fewer tokens, under the demo's feet
    corpus = build_corpus()
    train = read_all(corpus["train_pattern"], args.max_tokens)
    query = read_all(corpus["val_pattern"], args.query_tokens)
    return train, query, corpus["train_pattern"], f"{corpus_name} corpus ({corpus['src_dir']})"


def print_and_save(table, res, json_path):
    print()
    print(table)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(res, f, indent=1)


def cmd_bench(args):
    if args.repeats < 1:
        raise ValueError(f"--repeats {args.repeats}: expected at least 1")
    train, query, shards, source = bench_tokens(args)
    geom = Geometry.parse(args.geometry, train.size, args.lengths)
    print(f"corpus: {source}")
    previous = None
    if args.compare:
        try:
            with open(args.compare) as f:
                previous = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"--compare {args.compare}: expected the JSON of an earlier `bench --json` run ({e})")
    res = run_bench(train, query, geom=geom, workers=args.workers, repeats=args.repeats, ref_tokens=args.ref_tokens,
                    shards=shards, record_step=args.record_step, previous=previous)
    res["corpus"] = source
    print_and_save(format_table(res), res, args.json)
    if args.save_rate:  # the per-core rate the record's plan counts on for this CPU class (hints/index/rates.py)
        p = res["projection"]
        entry = save_rate(cpu_model(), p["rate_per_thread"],
                          f"python -m hints bench on {time.strftime('%Y-%m-%d')} ({source}; median of {args.repeats} "
                          f"{'from-shards ' if shards else ''}builds on 1 worker, geometry {geom.describe()})")
        print(f"recorded {p['rate_per_thread'] / 1e6:.1f}M tok/s per core for {cpu_model()}: {entry['source']}")


def cmd_positional_bench(args):
    args.query, args.query_tokens = None, 1
    train, _, _, source = bench_tokens(args)
    print(f"corpus: {source}")
    res = run_positional_bench(train, steps=args.steps, rank_tokens=args.rank_tokens, world=args.world,
                               prefill=args.prefill, compare=not args.no_compare)
    res["corpus"] = source
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


def cmd_exact_bench(args):
    train, query, _, _ = bench_tokens(args)
    res = run_exact_bench(train, query, args.lengths, workers=args.workers, repeats=args.repeats)
    print_and_save(format_exact_table(res), res, args.json)


def cmd_scaling(args):
    max_tokens = parse_token_count(args.max_tokens) if args.max_tokens else count_tokens(args.train)
    sizes = ladder_sizes(max_tokens, parse_token_count(args.min_tokens))
    val = read_all(args.val, args.val_tokens)
    geom = Geometry.parse(args.geometry, max_tokens, args.lengths)
    print(f"hint-corpus ladder {[f'{n:,}' for n in sizes]} over {args.train}; {val.size:,} validation tokens")
    run_scaling(args.train, val, sizes, args.out, geometry=geom, workers=args.workers, boundary=boundary_arg(args))


BOUNDARIES_HELP = ("document boundaries: 'bos' (default) restarts n-grams at every BOS token (GPT-2's "
                   "<|endoftext|>), as training and validation lookups do; 'none' lets them run across documents")


def cmd_draft_stats(args):
    run_draft_stats(args)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m hints", description="Build, query and measure n-gram hint indexes.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p, tokens_required=True):
        p.add_argument("--tokens", required=tokens_required, help="token shards (.bin glob, llm.c format) or .npy file(s)")
        p.add_argument("--max-tokens", type=parse_token_count, default=None, help="use at most this many tokens (e.g. 75M)")
        p.add_argument("--workers", type=int, default=2, help="worker threads (nogil Numba kernels)")

    p = sub.add_parser("build", help="build an index from token shards and save it")
    common(p)
    p.add_argument("--out", required=True, help="index file to write (a path under /dev/shm is shared memory)")
    p.add_argument("--geometry", default="auto", help="preset (" + ", ".join(PRESETS) + "), 'auto' (sized for the tokens) or 'P,B,S'")
    p.add_argument("--lengths", type=parse_lengths, default=DEFAULT_LENGTHS, help="n-gram lengths, increasing")
    p.add_argument("--in-place", action="store_true", help="build directly in the --out file instead of in memory")
    p.add_argument("--prefault", choices=("auto", "on", "off"), default="auto",
                   help="fault the table in before the build, on all workers with huge pages (auto: tables of 64 MiB "
                        "or more); its time is reported apart from the build's")
    p.add_argument("--no-seal", action="store_true",
                   help="save the index unsealed (default: seal it first: sorted buckets and a side table, "
                        "for fast lookups; sealing adds about 1/22 of the table at 176 slots plus the side table)")
    p.set_defaults(fn=cmd_build)

    p = sub.add_parser("lookup", help="show the hints for a piece of text or a token range")
    p.add_argument("--index", required=True)
    p.add_argument("--text", default=None, help="text to tokenize and look up")
    p.add_argument("--tokens", default=None, help="token shards or .npy to take positions from")
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--count", type=int, default=40)
    p.add_argument("--workers", type=int, default=1)
    p.set_defaults(fn=cmd_lookup)

    p = sub.add_parser("stats", help="index fill, and hint coverage/accuracy per length and kind on a token stream")
    p.add_argument("--index", required=True)
    common(p, tokens_required=False)
    p.add_argument("--verify", action="store_true", help="also verify the data checksum (reads the whole file)")
    p.add_argument("--no-kinds", action="store_true", help="omit the per-kind table")
    p.add_argument("--boundaries", choices=("bos", "none"), default="bos", help=BOUNDARIES_HELP)
    p.add_argument("--json", default=None, help="write the numbers to this JSON file")
    p.set_defaults(fn=cmd_stats)

    p = sub.add_parser("bench", help="time build, seal and lookup against the plain-Python reference "
                                     "(median and min-max of repeats)")
    common(p, tokens_required=False)
    p.add_argument("--corpus", choices=("stdlib", "prose"), default="stdlib",
                   help="without --tokens: Python's standard-library source (stdlib) or the Linux man-pages "
                        "project as English text (prose; Debian packages manpages, manpages-dev)")
    p.add_argument("--repeats", type=int, default=5, help="times each figure is measured (alternated)")
    p.add_argument("--record-step", action="store_true",
                   help="also time one rank's training-time hint work per step at the record's shape, on 1 thread "
                   "and on the record's 2 threads per rank (wall and CPU time)")
    p.add_argument("--query", default=None, help="query tokens (default: the corpus's validation split)")
    p.add_argument("--query-tokens", type=int, default=1_000_000)
    p.add_argument("--ref-tokens", type=int, default=200_000, help="tokens the plain-Python builder is timed on")
    p.add_argument("--geometry", default="auto")
    p.add_argument("--lengths", type=parse_lengths, default=DEFAULT_LENGTHS, help="n-gram lengths, increasing")
    p.add_argument("--json", default=None)
    p.add_argument("--save-rate", action="store_true", help="record the measured per-core build rate for this CPU "
                   "model in hints/index/build_rates.json, where the record's plan (train/plan.py) looks it up")
    p.add_argument("--compare", default=None, help="an earlier run's --json: check that every figure's share of its "
                   "host row agrees within 15%% (the reproducibility criterion)")
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("positional-bench", help="training-time hint work per rank per step at the record's shape: the "
                       "exact positional index (lookup_cells) against today's growing index (lookup + add), "
                       "alternated; and the positional index's build time per phase")
    common(p, tokens_required=False)
    p.add_argument("--corpus", choices=("stdlib", "prose"), default="stdlib",
                   help="without --tokens: Python's standard-library source or the man-pages prose corpus")
    p.add_argument("--steps", type=int, default=10, help="steps timed (each alternates new and today's)")
    p.add_argument("--rank-tokens", type=int, default=16_384, help="tokens per rank per step (the record's 16,384)")
    p.add_argument("--world", type=int, default=8, help="ranks (the record's 8: 131,072 tokens a step)")
    p.add_argument("--prefill", type=parse_token_count, default=12_000_000,
                   help="tokens already trained on when the timed steps start (the record's shape: 12M)")
    p.add_argument("--no-compare", action="store_true", help="time the positional index only")
    p.add_argument("--json", default=None)
    p.set_defaults(fn=cmd_positional_bench)

    p = sub.add_parser("exact-bench", help="time hints for a validation stream: index build + lookup vs exact "
                       "count (torch on CPU; Triton: interpreter for correctness, GPU when present)")
    common(p, tokens_required=False)
    p.add_argument("--query", default=None, help="query tokens (default: the corpus's validation split)")
    p.add_argument("--query-tokens", type=parse_token_count, default=SPEEDRUN_VAL_TOKENS, help="first N query tokens (default: the speedrun's 10,485,760)")
    p.add_argument("--lengths", type=parse_lengths, default=DEFAULT_LENGTHS, help="n-gram lengths, increasing")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per path (median, min-max)")
    p.add_argument("--json", default=None)
    p.set_defaults(fn=cmd_exact_bench)

    p = sub.add_parser("scaling", help="coverage/accuracy of hints on validation tokens vs hint-corpus size (table, CSV, JSON, plots)")
    p.add_argument("--train", required=True, help="training shards the hint corpus comes from (.bin glob)")
    p.add_argument("--val", required=True, help="validation shards (.bin glob)")
    p.add_argument("--val-tokens", type=parse_token_count, default=SPEEDRUN_VAL_TOKENS, help="first N validation tokens (default: the speedrun's)")
    p.add_argument("--min-tokens", default="75M", help="smallest hint corpus of the doubling ladder (e.g. 75M)")
    p.add_argument("--max-tokens", default=None, help="largest hint corpus (e.g. 37B; default: all training tokens)")
    p.add_argument("--geometry", default="auto")
    p.add_argument("--lengths", type=parse_lengths, default=DEFAULT_LENGTHS, help="n-gram lengths, increasing")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default="runs/scaling", help="output directory")
    p.add_argument("--boundaries", choices=("bos", "none"), default="bos", help=BOUNDARIES_HELP)
    p.set_defaults(fn=cmd_scaling)

    p = sub.add_parser("draft-stats", help="replay a text as llama-lookup-stats does: n-gram drafting's acceptance, "
                       "drafting time per drafted token, the caches' build/load time and memory")
    add_draft_stats_args(p)
    p.set_defaults(fn=cmd_draft_stats)

    args = ap.parse_args(argv)
    if args.cmd == "lookup" and (args.text is None) == (args.tokens is None):
        ap.error("lookup: give exactly one of --text or --tokens")
    try:
        args.fn(args)
    except (ValueError, OSError, MemoryError) as e:  # bad input, or a file the OS refused: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
