"""In-process A/B of the hint index's kernels: this checkout's `hints` against the same package at
a git revision, with a second copy of that revision beside it (the A/A, which shows what code
placement alone moves: up to 15% here), on the same tokens, in one process, alternating.
Every variant must return the same hints and build the same bytes (asserted; with --new-hash, the
baseline's copies only).

Figures (--figure):
  record-step  per step, the lookups of every rank's 32,768-position slice of the next global
               batch (--ranks of them), then the add of the 262,144-token batch, into an index
               sized for 70.8M tokens with 12M in (the record shape of `python -m hints bench
               --record-step`); paired per lookup and per add.
  build        builds of the whole training stream at each --partition-bits (buckets so that the
               table keeps 2^18 buckets), with --workers workers; paired per build, per stage.
  lookup       lookups of the query stream in blocks of 16,384 (--block; 0: the whole stream in
               one lookup), on a sealed index and on a growing one (scan), with --workers
               workers; paired per block.
Each ratio is time(variant) / time(revision), paired: median [IQR] and the geometric mean with
two standard errors. A change counts where it beats the A/A by more than their errors.

Usage: python scripts/hints_ab.py --against HEAD~1 --figure record-step --rounds 3
The copies of a revision are kept, with their compiled kernels, under ~/.cache/hints-ab/.
"""
import argparse
import importlib
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
LOOKUP_BLOCK = 16_384  # positions a lookup figure times at a time
BASE_COPIES = 2  # copies of the baseline revision: the baseline and its A/A


def cache_dir():
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hints-ab"


def materialize(rev, copies=BASE_COPIES, root=None):
    """`copies` copies of the `hints` package at git revision `rev`, each under a name of its own
    in one folder (reused, with its compiled kernels, when they are there already; import_copy
    imports them). Returns (folder, names)."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True,
                         text=True)
    if sha.returncode:
        raise SystemExit(f"hints_ab: --against {rev}: not a commit of {REPO} ({sha.stderr.strip()})")
    sha = sha.stdout.strip()
    folder = Path(root or cache_dir()) / sha
    names = [f"hints_{sha[:10]}_{k}" for k in range(copies)]
    missing = [name for name in names if not (folder / name / "__init__.py").is_file()]
    if missing:
        folder.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", sha, "hints"],
                                 capture_output=True, check=True).stdout
    for name in missing:
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(tmp, filter="data")
            shutil.move(os.path.join(tmp, "hints"), folder / name)  # whole or not at all
    return folder, names


def import_copy(folder, name):
    """The package folder/name, imported under its own name (its relative imports resolve inside it)."""
    init = Path(folder) / name / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def paired(t, base):
    """Ratios t / base, paired: median, quartiles, geometric mean and two standard errors of it."""
    r = np.asarray(t, dtype=np.float64) / np.asarray(base, dtype=np.float64)
    lr = np.log(r)
    gm = float(np.exp(lr.mean()))
    se2 = float(2 * gm * lr.std(ddof=1) / np.sqrt(r.size)) if r.size > 1 else float("nan")
    return dict(median=float(np.median(r)), q1=float(np.percentile(r, 25)), q3=float(np.percentile(r, 75)),
                geomean=gm, two_se=se2, n=int(r.size))


def ratio_text(p):
    return (f"median {p['median']:.3f} [IQR {p['q1']:.3f}-{p['q3']:.3f}], geomean {p['geomean']:.3f} "
            f"+- {p['two_se']:.3f} (n={p['n']})")


def report(names, times, what):
    """One line per variant: its median time per item, and its ratio to the first variant."""
    for k, name in enumerate(names):
        line = f"  {name:24s} {what} {1e3 * np.median(times[:, k]):8.2f} ms"
        if k:
            line += f"  | vs {names[0]}: {ratio_text(paired(times[:, k], times[:, 0]))}"
        print(line)


def same_hints(a, b, where):
    for field in ("token", "count", "purity", "kind"):
        if not np.array_equal(getattr(a, field), getattr(b, field)):
            raise AssertionError(f"{where}: the variants' lookups differ in {field}")


def rotated(n, start):
    """The variants 0..n-1 in the order a repeat takes them: rotated by `start`, so that each
    goes first, second and last equally often."""
    return [(start + k) % n for k in range(n)]


def timed_lookups(idxs, q, start, where, same=None):
    """Seconds of each variant's lookup of q, taken in an order rotated by `start`; the hints of
    the first `same` variants (all by default) must be equal."""
    order = rotated(len(idxs), start)
    row, out = np.zeros(len(idxs)), {}
    for k in order:
        t = time.perf_counter()
        out[k] = idxs[k].lookup(q)
        row[k] = time.perf_counter() - t
    for k in range(1, len(idxs) if same is None else same):
        same_hints(out[k], out[0], where)
    return row


def same_index(idxs, names, where, same=None):
    for ix, name in zip(idxs[1:same], names[1:same]):
        if not (np.array_equal(np.asarray(ix.fill), np.asarray(idxs[0].fill)) and ix.dropped == idxs[0].dropped
                and np.array_equal(np.asarray(ix.table), np.asarray(idxs[0].table))):
            raise AssertionError(f"{where}: {name} built other bytes than {names[0]}")


def record_step(mods, names, train, args):
    from hints.bench import RECORD_ADD, RECORD_INDEX_TOKENS, RECORD_LOOKUP, RECORD_PREFILL
    steps = min(args.steps, (train.size - RECORD_PREFILL) // RECORD_ADD - 1)
    if steps < 1 or args.ranks * RECORD_LOOKUP > RECORD_ADD:
        raise SystemExit(f"hints_ab: the record step needs {RECORD_PREFILL + 2 * RECORD_ADD:,} tokens and --ranks <= "
                         f"{RECORD_ADD // RECORD_LOOKUP}; the stream has {train.size:,}, --ranks is {args.ranks}")
    look, add = [], []
    for rnd in range(args.rounds):
        idxs = []
        for m in mods:
            ix = m.HintIndex(m.Geometry.for_tokens(RECORD_INDEX_TOKENS), workers=1).reserve(RECORD_ADD)
            ix.add(train[:RECORD_PREFILL])
            idxs.append(ix)
        pos = RECORD_PREFILL
        for s in range(steps + 1):  # the first step warms up
            for rank in range(args.ranks):
                q = train[pos + rank * RECORD_LOOKUP:pos + (rank + 1) * RECORD_LOOKUP]
                row = timed_lookups(idxs, q, s + rank, f"round {rnd}, step {s}, rank {rank}", args.same)
                if s:
                    look.append(row)
            row = np.zeros(len(mods))
            for k in rotated(len(mods), s):
                t = time.perf_counter()
                idxs[k].add(train[pos:pos + RECORD_ADD])
                row[k] = time.perf_counter() - t
            if s:
                add.append(row)
            pos += RECORD_ADD
        same_index(idxs, names, f"round {rnd}", args.same)
        idxs = None
    print(f"record step: {args.rounds} round(s) of {steps} steps, {args.ranks} lookups of {RECORD_LOOKUP:,} a step; "
          f"identical hints and tables{args.same_note}")
    report(names, np.array(look), "lookup")
    report(names, np.array(add), "add   ")


def build(mods, names, train, args):
    for pb in args.partition_bits:
        total, stages = [], []
        for r in range(args.rounds + 1):  # the first round warms up
            row, st, idxs = np.zeros(len(mods)), np.zeros((len(mods), 2)), [None] * len(mods)
            for k in rotated(len(mods), r):
                m = mods[k]
                ix = m.HintIndex(m.Geometry(partition_bits=pb, bucket_bits=18 - pb), workers=args.workers)
                ix.reserve(train.size)
                t = time.perf_counter()
                ix.add(train)
                row[k] = time.perf_counter() - t
                st[k] = ix.build_seconds["stage1"], ix.build_seconds["stage2"]
                idxs[k] = ix
            same_index(idxs, names, f"build at {pb} partition bits, round {r}", args.same)
            idxs = None
            if r:
                total.append(row)
                stages.append(st)
        stages = np.array(stages)
        print(f"build at 2^{pb} partitions, {args.workers} worker(s), {args.rounds} round(s); identical tables"
              f"{args.same_note}")
        report(names, np.array(total), "build ")
        report(names, stages[:, :, 0], "stage 1")
        report(names, stages[:, :, 1], "stage 2")


def lookup(mods, names, train, query, args):
    size = args.block or query.size
    blocks = [query[i:i + size] for i in range(0, query.size - size + 1, size)]
    if not blocks:
        raise SystemExit(f"hints_ab: the query stream has {query.size:,} positions, fewer than one block of {size:,}")
    for sealed in (True, False):
        idxs = []
        for m in mods:
            ix = m.HintIndex(m.Geometry.for_tokens(train.size), workers=args.workers).add(train)
            idxs.append(ix.seal() if sealed else ix)
        times = []
        for r in range(args.rounds + 1):
            for b, q in enumerate(blocks):
                row = timed_lookups(idxs, q, r + b, f"block {b}", args.same)
                if r:
                    times.append(row)
        print(f"lookup, {'sealed' if sealed else 'scan (growing index)'}, {len(blocks)} block(s) of {size:,}, "
              f"{args.workers} worker(s), {args.rounds} round(s); identical hints{args.same_note}")
        report(names, np.array(times), "lookup")
        idxs = None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--against", required=True, help="git revision whose hints/ is the baseline (and its A/A copy)")
    p.add_argument("--figure", choices=("record-step", "build", "lookup"), default="record-step")
    p.add_argument("--tokens", help="training token shards (.bin glob); default: the local standard-library corpus")
    p.add_argument("--query", help="query token shards (.bin glob); default: the corpus's validation split")
    p.add_argument("--rounds", type=int, default=3, help="fresh indexes per variant, one after the other")
    p.add_argument("--steps", type=int, default=10, help="record-step: steps a round (as many as the stream has)")
    p.add_argument("--ranks", type=int, default=8, help="record-step: lookups a step, one per rank's slice")
    p.add_argument("--workers", type=int, default=1, help="build and lookup: workers")
    p.add_argument("--block", type=int, default=LOOKUP_BLOCK,
                   help="lookup: positions a lookup takes (0: the whole query stream in one lookup)")
    p.add_argument("--partition-bits", type=lambda s: [int(x) for x in s.split(",")], default=[4, 14],
                   help="build: comma-separated partition bits (the table keeps 2^18 buckets of 176 slots)")
    p.add_argument("--new-hash", action="store_true",
                   help="this checkout hashes n-grams differently from the baseline, so its slots land elsewhere and "
                        "its hints differ where two n-grams collide: only the baseline's two copies are checked for "
                        "equal bytes and hints (the test suite checks the checkout against its plain-Python reference)")
    args = p.parse_args(argv)
    args.same = BASE_COPIES if args.new_hash else None  # the variants whose bytes and hints must agree
    args.same_note = f" (among the {BASE_COPIES} copies of {args.against}: --new-hash)" if args.new_hash else ""
    if args.rounds < 1 or args.steps < 1 or args.ranks < 1 or args.workers < 1:
        p.error("--rounds, --steps, --ranks and --workers must be at least 1")
    if args.block < 0:
        p.error(f"--block {args.block}: expected 0 (the whole query) or a number of positions")
    return args


def main(argv=None):
    args = parse_args(argv)
    folder, base = materialize(args.against)
    mods = [import_copy(folder, n) for n in base] + [importlib.import_module("hints")]
    names = [f"{args.against} ({n[-1]})" for n in base] + ["this checkout"]
    from hints.tokens import read_all
    if args.tokens:
        train = read_all(args.tokens)
        query = read_all(args.query) if args.query else train[-LOOKUP_BLOCK * 8:]
    else:
        from data.local_corpus import build_local_corpus
        corpus = build_local_corpus()
        train, query = read_all(corpus["train_pattern"]), read_all(corpus["val_pattern"])
    print(f"variants: {', '.join(names)} (hints/ of {args.against} from {folder})")
    if args.figure == "record-step":
        record_step(mods, names, train, args)
    elif args.figure == "build":
        build(mods, names, train, args)
    else:
        lookup(mods, names, train, query, args)


if __name__ == "__main__":
    main()
