"""Sizing the record's background hint index to the node: how many tokens, which geometry, where.

The article builds 37B FineWeb100B tokens into a 2^14 x 2^14 x 176-slot table (352 GiB,
lengths 6/10/20) on the CPUs of an 8xH100 node while the GPUs train. `plan_record` takes what
a node has (memory, cores, /dev/shm space, tokens on disk or fetchable) and returns the
largest plan that fits, stepping down by halving the tokens and the table together, never by
failing late. It touches nothing: no GPU, no data, no allocation; `node_facts` reads this
machine's numbers. `python -m train.plan --help` prints a plan from the command line; the
trainer's `--plan` prints the same JSON.

What must fit, and where each number comes from:
  * memory: the index file (table + fill counts, in a tmpfs, so RAM) + the builder's staging
    area and interpreter + every training rank, within MAX_MEMORY_FRACTION of the node's
    available memory (the fraction `Geometry.check_fits_memory` enforces at allocation);
  * /dev/shm (or another tmpfs directory given with --hint-shm-dir): the index file;
  * cores: the builder gets the hardware threads the ranks leave free (train/placement.py gives
    each rank whole physical cores, all their threads, so the plan rounds the same way) and
    must finish within BUILD_BUDGET_S at BUILD_TOKENS_PER_CORE_S, because a late index makes
    the final validation wait and the wait counts as training time;
  * tokens: those on disk, plus what the free disk can take of the dataset still to fetch.
"""
import argparse
import dataclasses
import glob
import json
import os
import re
import sys

from data.download import VARIANTS
from data.loader import CHUNK_TOKENS as BUILDER_CHUNK_TOKENS
from data.shards import shard_token_count
from data.units import human_tokens, parse_token_count
from hints.geometry import (DEFAULT_LENGTHS, MAX_MEMORY_FRACTION, PRESETS, TARGET_LOAD, Geometry, _human,
                            available_memory_bytes, parse_lengths)
from hints.index import default_chunk_tokens, stage1_chunk, staging_nbytes
from hints.store import layout
from train.placement import read_topology

# The article's record: 37B FineWeb100B tokens in the 352 GiB 2^14 x 2^14 x 176 table.
RECORD_HINT_TOKENS = 37_000_000_000
RECORD_GEOMETRY = PRESETS["record"]
# Tokens per slot of the article's record (37B in 2^28 x 176 slots = 0.78). A smaller plan
# keeps this load: half the tokens in half the table.
ARTICLE_LOAD = RECORD_HINT_TOKENS / RECORD_GEOMETRY.n_slots
# Below this a background index is not worth its cost: the article's smallest hint corpus.
MIN_HINT_TOKENS = 75_000_000
# The record trains on 70.8M tokens: 270 steps x 262,144 tokens (8 ranks x 16 sequences x 2048),
# as modded-nanogpt's records of the article's time. Each rank's training-time index is sized for
# them (Geometry.for_tokens) and counts in the rank's memory.
RECORD_GLOBAL_BATCH_TOKENS = 262_144
RECORD_STEPS = 270
RECORD_TRAIN_TOKENS = RECORD_STEPS * RECORD_GLOBAL_BATCH_TOKENS
# One training process's host memory besides its training-time index: torch and the CUDA
# runtime's host side (~3 GiB), pinned batches, the validation hints (10.5M positions x 3
# lengths x 6 bytes = 0.2 GiB), compile workers. An estimate with headroom: the record's
# processes have not been measured on a GPU node yet.
RANK_BASE_BYTES = 8 << 30
# The builder process besides its staging area: interpreter, Numba, the chunk being read and
# its copy with history (DESIGN: peak build RSS <= index + staging + 256 MiB).
BUILDER_OVERHEAD_BYTES = 256 << 20
# Per-core build rate the plan counts on: the design's floor, end to end (both stages). Measured
# here at a small geometry: ~70M tokens/s per core (README benchmark); the 352 GiB table misses
# caches more, so the plan keeps to the floor.
BUILD_TOKENS_PER_CORE_S = 25_000_000
# The longest a build may take: the final validation waits for it and the wait counts as
# training time, so a corpus the cores cannot build within about a minute is halved.
BUILD_BUDGET_S = 60.0
# The record's ranks on an 8xH100 node, each keeping 1 core for its loop and `hint_workers`
# for its hint-preparation thread (train_gpt.py reserves the same).
RECORD_RANKS = 8
RECORD_HINT_WORKERS = 2
# Hardware threads per physical core of the article's node (2 x 56-core CPUs with SMT, 224
# threads): what --node-* planning for another node assumes unless --node-threads-per-core says.
RECORD_THREADS_PER_CORE = 2
# FineWeb100B as cached for modded-nanogpt: 100M tokens per train shard (data/download.py).
FINEWEB_SHARD_TOKENS = 100_000_000
FINEWEB100B_TRAIN_TOKENS = VARIANTS["100B"]["max_train_shards"] * FINEWEB_SHARD_TOKENS
SHARD_BYTES_PER_TOKEN = 2  # uint16 tokens (the 1 KiB header per 100M tokens is noise)
# Disk left free after fetching shards: logs, checkpoints, compile caches.
DISK_HEADROOM_BYTES = 20 << 30
DEFAULT_SHM_DIR = "/dev/shm"
# Where the trainer's background index lives: anonymous shared memory (memfd, hints/background.py),
# charged to RAM, not to /dev/shm's tmpfs size, so only the memory budget bounds it.
MEMFD = "memfd (anonymous shared memory)"
# tmpfs sizes itself to half of RAM unless told otherwise (mount(8), tmpfs "size"): the
# /dev/shm a node is assumed to have when only its RAM is given.
TMPFS_DEFAULT_FRACTION = 0.5

_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "KB": 10**3, "M": 1 << 20, "MIB": 1 << 20, "MB": 10**6,
               "G": 1 << 30, "GIB": 1 << 30, "GB": 10**9, "T": 1 << 40, "TIB": 1 << 40, "TB": 10**12}


class PlanError(ValueError):
    """A request the node cannot hold; the message names the flag to change."""


def parse_size(text, flag="size"):
    """'2TiB', '256GiB', '1.5T' (binary), '2TB' (decimal) or a byte count -> bytes."""
    if isinstance(text, (int, float)):
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).upper() if m else None
    if unit not in _SIZE_UNITS:
        raise ValueError(f"{flag} {text!r}: expected a size like 2TiB, 256GiB, 512G or 2TB")
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def size_arg(flag):
    """An argparse type for a size flag: its errors name the flag and the expected form."""
    def parse(text):
        try:
            return parse_size(text, flag)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = "size"
    return parse


def staging_bytes(geom, workers, staged_tokens):
    """Bytes of HintIndex's staging area for add() calls of `staged_tokens` with `workers`
    (hints.index.staging_nbytes, for the sub-chunk size the index uses)."""
    n = min(int(staged_tokens), default_chunk_tokens(geom, workers))
    return staging_nbytes(geom, workers, n, stage1_chunk(geom))


def index_file_bytes(geom):
    """What the index file takes in /dev/shm: header, fill counts, slot table."""
    return layout(geom)[2]


def rank_bytes(train_tokens=RECORD_TRAIN_TOKENS, lengths=DEFAULT_LENGTHS):
    """Host memory of one training rank: its base and its training-time index."""
    return RANK_BASE_BYTES + Geometry.for_tokens(max(1, train_tokens), lengths=lengths).nbytes


def geometry_for(n_tokens, lengths):
    """The article's geometry scaled by powers of two to hold n_tokens at the article's load
    (37B -> 2^14 x 2^14 x 176; 18.5B -> 2^13 x 2^14 x 176; ...)."""
    return Geometry.for_tokens(n_tokens, slots=RECORD_GEOMETRY.slots, lengths=lengths, load=ARTICLE_LOAD,
                               max_bucket_bits=RECORD_GEOMETRY.bucket_bits)


@dataclasses.dataclass
class Plan:
    hint_tokens: int          # tokens the background builder adds (0: no background index)
    geometry: Geometry        # of the background index
    table_bytes: int          # the slot table (the article's 352 GiB)
    index_bytes: int          # the file in shm_path: table + fill counts + header
    staging_bytes: int        # the builder's staging area
    rank_bytes: int           # host memory per training rank (estimate)
    n_ranks: int
    memory_bytes: int         # all of it: index + staging + builder + ranks
    budget_bytes: int         # what the node allows: MAX_MEMORY_FRACTION of its memory
    builder_cores: int
    build_seconds: float      # estimate at BUILD_TOKENS_PER_CORE_S
    shm_path: str             # directory the index file goes in
    fetch_tokens: int         # tokens to download before the run (beyond those on disk)
    halvings: int             # times the default plan was halved to fit
    reason: str               # one line: what was chosen and why
    notes: list               # each step down or cap, in order
    node: dict                # the facts the plan was made from

    def to_dict(self):
        d = dataclasses.asdict(self)
        d["geometry"] = dict(partition_bits=self.geometry.partition_bits, bucket_bits=self.geometry.bucket_bits,
                             slots=self.geometry.slots, lengths=list(self.geometry.lengths))
        return d

    def to_json(self):
        return json.dumps(self.to_dict(), indent=1)


def plan_record(node_ram_bytes, node_cores, node_tokens, shm_bytes, disk_bytes=None, n_ranks=RECORD_RANKS,
                rank_ram_bytes=None, requested_tokens=None, requested_geometry=None, lengths=DEFAULT_LENGTHS,
                shm_dirs=None, fetchable_tokens=0, hint_workers=RECORD_HINT_WORKERS,
                train_tokens=RECORD_TRAIN_TOKENS, default_tokens=RECORD_HINT_TOKENS,
                build_tokens_per_core_s=BUILD_TOKENS_PER_CORE_S, build_budget_s=BUILD_BUDGET_S,
                threads_per_core=1):
    """The largest background-index plan the node holds.

    node_ram_bytes: memory the run may use (MemAvailable); node_cores: hardware threads it may use
    (threads_per_core of them to a physical core);
    node_tokens: training tokens on disk; shm_bytes: free bytes of /dev/shm; disk_bytes: free
    disk for shards still to fetch (None: fetch nothing); fetchable_tokens: the dataset's tokens
    not on disk. shm_dirs: [(path, free bytes), ...] tried in order, /dev/shm first (default
    [(/dev/shm, shm_bytes)]). requested_tokens / requested_geometry (a Geometry, a preset name,
    'P,B,S' or 'auto'): the --hint-tokens / --hint-geometry overrides, kept as given or refused
    with a PlanError naming the flag. Unrequested sizes start at the article's and halve together.
    """
    lengths = tuple(int(x) for x in lengths)
    shm_dirs = list(shm_dirs) if shm_dirs else [(DEFAULT_SHM_DIR, int(shm_bytes))]
    rank = rank_bytes(train_tokens, lengths) if rank_ram_bytes is None else int(rank_ram_bytes)
    budget = int(MAX_MEMORY_FRACTION * node_ram_bytes)
    notes = []
    node = dict(ram_bytes=int(node_ram_bytes), cores=int(node_cores), tokens_on_disk=int(node_tokens),
                shm=[[p, int(b)] for p, b in shm_dirs], disk_bytes=disk_bytes, fetchable_tokens=int(fetchable_tokens),
                n_ranks=int(n_ranks), hint_workers=int(hint_workers), threads_per_core=int(threads_per_core))

    # cores: what the ranks leave, else share them all. Each rank runs 1 + hint_workers threads on
    # whole physical cores (train/placement.py), so it holds that many threads rounded up to a core.
    if threads_per_core < 1:
        raise PlanError(f"--node-threads-per-core must be >= 1, got {threads_per_core}")
    reserved = n_ranks * -(-(1 + hint_workers) // threads_per_core) * threads_per_core
    cores = node_cores - reserved if node_cores > reserved else node_cores
    if node_cores <= reserved:
        notes.append(f"no free core ({node_cores} cores, {reserved} kept by {n_ranks} rank(s)): "
                     f"the builder shares all {node_cores}")

    # tokens the node can reach: on disk, plus what the free disk takes of the rest of the dataset
    fetch_cap = 0
    if disk_bytes is not None and fetchable_tokens > 0:
        fetch_cap = min(int(fetchable_tokens), max(0, int(disk_bytes) - DISK_HEADROOM_BYTES) // SHARD_BYTES_PER_TOKEN)
    reachable = int(node_tokens) + fetch_cap

    geom_given = requested_geometry not in (None, "auto")
    if geom_given and not isinstance(requested_geometry, Geometry):
        requested_geometry = Geometry.parse(requested_geometry, lengths=lengths)
    if requested_tokens is not None:
        tokens = int(requested_tokens)
    elif geom_given:
        tokens = min(default_tokens, int(ARTICLE_LOAD * requested_geometry.n_slots))
    else:
        tokens = int(default_tokens)
    if tokens > reachable:
        where = f"{human_tokens(node_tokens)} on disk" + (f" + {human_tokens(fetch_cap)} the free disk can fetch"
                                                          if fetch_cap else "")
        notes.append(f"{human_tokens(tokens)} tokens asked, capped at the {where}")
        tokens = reachable

    def sized(n):
        geom = requested_geometry if geom_given else geometry_for(max(n, 1), lengths)
        stage = staging_bytes(geom, cores, min(n, BUILDER_CHUNK_TOKENS)) if n > 0 else 0
        index = index_file_bytes(geom)
        return geom, index, stage, index + stage + BUILDER_OVERHEAD_BYTES + n_ranks * rank

    def flag():
        return "--hint-geometry" if geom_given else "--hint-tokens"

    halvings = 0
    while True:
        if tokens < (1 if requested_tokens is not None else MIN_HINT_TOKENS):
            notes.append("no background index: --hint-tokens 0" if requested_tokens == 0 else
                         f"no background index: {human_tokens(tokens)} tokens is below the {human_tokens(MIN_HINT_TOKENS)} "
                         f"worth building; validation uses the training-time index")
            return _plan(0, RECORD_GEOMETRY if not geom_given else requested_geometry, 0, 0, rank, n_ranks,
                         n_ranks * rank, budget, cores, 0.0, shm_dirs[0][0], 0, halvings, notes, node)
        geom, index, stage, total = sized(tokens)
        shm_path = next((p for p, free in shm_dirs if free >= index), None)
        build_s = tokens / (cores * build_tokens_per_core_s)
        problem = None
        if total > budget:
            problem = (f"{_human(index)} index + {_human(stage)} staging + {n_ranks} x {_human(rank)} ranks "
                       f"= {_human(total)} > {MAX_MEMORY_FRACTION:.0%} of {_human(node_ram_bytes)}")
            if requested_tokens is not None or geom_given:
                raise PlanError(f"{flag()}: {geom.describe()} for {human_tokens(tokens)} tokens does not fit this node's "
                                f"memory ({problem}); ask for less (the default plan halves to fit)")
        elif shm_path is None:
            spaces = ", ".join(f"{p} has {_human(free)} free" for p, free in shm_dirs)
            problem = f"the {_human(index)} index file does not fit: {spaces}"
            if requested_tokens is not None or geom_given:
                raise PlanError(f"{flag()}: {problem}; give a larger tmpfs with --hint-shm-dir DIR, or ask for less")
        elif build_s > build_budget_s:
            if requested_tokens is not None:
                notes.append(f"--hint-tokens {human_tokens(tokens)}: ~{build_s:.0f} s to build on {cores} cores, "
                             f"over the {build_budget_s:.0f} s budget; kept as asked (the wait counts as training time)")
            else:
                problem = (f"{human_tokens(tokens)} tokens take ~{build_s:.0f} s on {cores} cores at "
                           f"{human_tokens(build_tokens_per_core_s)} tok/s/core, over the {build_budget_s:.0f} s budget")
        if problem is None:
            break
        notes.append(f"halved: {problem}")
        tokens //= 2
        halvings += 1

    if shm_path != shm_dirs[0][0]:
        notes.append(f"index in {shm_path}: {shm_dirs[0][0]} has {_human(shm_dirs[0][1])} free, "
                     f"less than the {_human(index)} index")
    return _plan(tokens, geom, index, stage, rank, n_ranks, total, budget, cores, build_s, shm_path,
                 max(0, tokens - int(node_tokens)), halvings, notes, node)


def _plan(tokens, geom, index, stage, rank, n_ranks, total, budget, cores, build_s, shm_path, fetch, halvings,
          notes, node):
    if tokens:
        reason = (f"{_human(geom.table_bytes)} table + {_human(stage)} staging + {n_ranks} x {_human(rank)} ranks "
                  f"fits in {_human(budget)} of {_human(node['ram_bytes'])}; {human_tokens(tokens)} tokens on "
                  f"{cores} {'free ' if node['cores'] > cores else ''}cores (~{build_s:.0f} s), index in {shm_path}")
        if halvings:
            reason += f"; halved {halvings}x to fit"
        if fetch:
            reason += f"; fetch {human_tokens(fetch)} tokens first"
    else:
        reason = notes[-1]
    return Plan(hint_tokens=int(tokens), geometry=geom, table_bytes=geom.table_bytes if tokens else 0,
                index_bytes=int(index), staging_bytes=int(stage), rank_bytes=int(rank), n_ranks=int(n_ranks),
                memory_bytes=int(total), budget_bytes=int(budget), builder_cores=int(cores),
                build_seconds=float(build_s), shm_path=shm_path, fetch_tokens=int(fetch), halvings=halvings,
                reason=reason, notes=notes, node=node)


# ---- this machine -------------------------------------------------------------------------

def free_bytes(path):
    """Free bytes of the filesystem holding `path` (or its nearest existing parent)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def tokens_on_disk(pattern):
    """Tokens in the shards matching `pattern` (headers only); 0 when none match."""
    return sum(shard_token_count(f) for f in sorted(glob.glob(os.path.expanduser(pattern))) if os.path.isfile(f))


def local_threads_per_core():
    """Hardware threads per physical core of this machine (the most any core has; 1 where /sys
    does not say)."""
    try:
        return max(len(c.cpus) for c in read_topology().cores)
    except (OSError, ValueError):
        return 1


def node_facts(hint_files, shm_dirs=(DEFAULT_SHM_DIR,), dataset_tokens=0):
    """This machine's numbers for plan_record: available memory, usable cores, free space of
    each shm directory, tokens on disk in `hint_files`, and the free disk beside them for the
    rest of a dataset of `dataset_tokens`."""
    on_disk = tokens_on_disk(hint_files)
    return dict(node_ram_bytes=available_memory_bytes() or 0, node_cores=len(os.sched_getaffinity(0)),
                threads_per_core=local_threads_per_core(),
                node_tokens=on_disk, shm_bytes=free_bytes(shm_dirs[0]),
                shm_dirs=[(d, free_bytes(d)) for d in shm_dirs],
                disk_bytes=free_bytes(os.path.dirname(hint_files) or "."),
                fetchable_tokens=max(0, int(dataset_tokens) - on_disk))


# ---- flags (shared with train_gpt.py) ---------------------------------------------------------

def add_plan_args(parser, plan_flag=True):
    """--plan and the --node-* / --hint-shm-dir flags (train_gpt.py adds the same)."""
    g = parser.add_argument_group("record plan (background index sized to the node)")
    if plan_flag:
        g.add_argument("--plan", action="store_true", help="print the plan as JSON and exit (touches no GPU or data)")
    g.add_argument("--node-ram", type=size_arg("--node-ram"),
                   help="plan for a node with this much memory, e.g. 2TiB (default: this machine's MemAvailable)")
    g.add_argument("--node-cores", type=int, help="hardware threads of that node (default: this process's CPU affinity)")
    g.add_argument("--node-threads-per-core", type=int, help="hardware threads per physical core of that node "
                   f"(default: this machine's, or {RECORD_THREADS_PER_CORE} when --node-* describes another node)")
    g.add_argument("--node-tokens", type=parse_token_count,
                   help="training tokens that node has or will fetch, e.g. 37B (default: the shards on disk here, "
                   "plus what free disk can fetch)")
    g.add_argument("--node-ranks", type=int, help="training ranks on that node (default: $LOCAL_WORLD_SIZE, "
                   f"else {RECORD_RANKS} when --node-* describes another node, else 1)")
    g.add_argument("--node-shm", type=size_arg("--node-shm"),
                   help=f"free /dev/shm of that node (default: this machine's, or {round(TMPFS_DEFAULT_FRACTION * 100)}%% of --node-ram)")
    g.add_argument("--hint-shm-dir", help="another tmpfs directory for the index when /dev/shm is too small")
    g.add_argument("--node-rank-ram", type=size_arg("--node-rank-ram"),
                   help=f"host memory each training rank needs besides its training index (default "
                   f"{RANK_BASE_BYTES >> 30} GiB, a GPU rank's; small CPU rehearsals need far less)")
    return parser


def plan_from_args(args, hint_files, dataset_tokens=0, hint_workers=RECORD_HINT_WORKERS,
                   train_tokens=RECORD_TRAIN_TOKENS, index_in_memfd=False, default_tokens=None):
    """plan_record for the flags of add_plan_args plus --hint-tokens / --hint-geometry /
    --hint-lengths: this machine's facts, with each --node-* flag given replacing its fact.
    index_in_memfd: the index lives in anonymous shared memory (the trainer's background
    builder), which only RAM bounds, instead of a file in /dev/shm or --hint-shm-dir.
    default_tokens: the corpus the plan starts from before halving (default the article's 37B)."""
    other_node = any(getattr(args, k) is not None
                     for k in ("node_ram", "node_cores", "node_threads_per_core", "node_tokens", "node_shm"))
    kw = node_facts(hint_files, dataset_tokens=dataset_tokens)
    if args.node_ram is not None:
        kw["node_ram_bytes"] = args.node_ram
        kw["shm_bytes"] = int(TMPFS_DEFAULT_FRACTION * args.node_ram)
    if args.node_shm is not None:
        kw["shm_bytes"] = args.node_shm
    if args.node_cores is not None:
        kw["node_cores"] = args.node_cores
    if args.node_threads_per_core is not None:
        kw["threads_per_core"] = args.node_threads_per_core
    elif other_node:
        kw["threads_per_core"] = RECORD_THREADS_PER_CORE
    if args.node_tokens is not None:  # what that node has or will fetch: nothing more to fetch
        kw.update(node_tokens=args.node_tokens, disk_bytes=None, fetchable_tokens=0)
    if args.node_ram is not None or args.node_shm is not None:
        kw["shm_dirs"] = [(DEFAULT_SHM_DIR, kw["shm_bytes"])]
    if args.hint_shm_dir:
        kw["shm_dirs"] = kw["shm_dirs"] + [(args.hint_shm_dir, free_bytes(args.hint_shm_dir))]
    if index_in_memfd:  # the trainer's builder: only RAM bounds the index
        kw["shm_dirs"] = [(MEMFD, kw["node_ram_bytes"])]
    lengths = parse_lengths(getattr(args, "hint_lengths", None) or DEFAULT_LENGTHS)
    ranks = args.node_ranks or int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or (RECORD_RANKS if other_node else 1)
    if args.node_rank_ram is not None:
        kw["rank_ram_bytes"] = args.node_rank_ram + Geometry.for_tokens(max(1, train_tokens), lengths=lengths).nbytes
    if default_tokens:
        kw["default_tokens"] = default_tokens
    return plan_record(n_ranks=ranks, lengths=lengths, requested_tokens=getattr(args, "hint_tokens", None),
                       requested_geometry=getattr(args, "hint_geometry", None), hint_workers=hint_workers,
                       train_tokens=train_tokens, **kw)


def plan_for_run(args, hint_files, train_tokens, default_tokens=None):
    """The trainer's plan (--plan, and the record and llmc presets): plan_from_args for an index in
    memfd, with each rank's training-time index as --train-index-geometry makes it. A plan that
    cannot fit ends the run with one line naming the flag."""
    train_geom = Geometry.parse(args.train_index_geometry, train_tokens, args.hint_lengths)
    try:
        return plan_from_args(args, hint_files, FINEWEB100B_TRAIN_TOKENS, args.hint_workers,
                              int(train_geom.n_slots * TARGET_LOAD), index_in_memfd=True, default_tokens=default_tokens)
    except PlanError as e:
        raise SystemExit(f"error: {e}") from None


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m train.plan", description="Size the record's background hint index "
                                "to a node (this machine by default) and print the plan as JSON.")
    add_plan_args(p, plan_flag=False)
    p.add_argument("--hint-tokens", type=parse_token_count, help="tokens of the background index, e.g. 37B "
                   "(default: the largest that fits, up to the article's 37B)")
    p.add_argument("--hint-geometry", help="geometry of the background index: a preset, P,B,S or auto (default: "
                   "the article's 2^14 x 2^14 x 176, halved to fit)")
    p.add_argument("--hint-lengths", default="6,10,20", help="n-gram lengths")
    p.add_argument("--hint-files", default="data/fineweb100B/fineweb_train_*.bin",
                   help="training shards the background index is built from")
    args = p.parse_args(argv)
    try:
        plan = plan_from_args(args, args.hint_files, dataset_tokens=FINEWEB100B_TRAIN_TOKENS)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(plan.to_json())
    print(f"plan: {plan.reason}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
