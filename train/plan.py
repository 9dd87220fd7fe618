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
  * cores: each rank keeps the threads it really runs (its loop, its hint-prep thread and that
    thread's index workers) on whole physical cores (train/placement.py gives each rank whole
    cores, all their threads, so the plan rounds the same way); the builder gets the rest, one
    thread per free core, and must finish within BUILD_BUDGET_S at the per-core rate recorded
    for the node's CPU class (hints/index/rates.py: `python -m hints bench --save-rate`), else at the
    design floor BUILD_TOKENS_PER_CORE_S; the plan says which rate it used, when the index will
    be ready after the clock starts, and whether that is before the last step, because a late
    index makes the final validation wait and the wait counts as training time;
  * ranks: host memory from the model and the device: a CUDA rank's host side, or a CPU rank's
    weights, optimizer state and activations, plus its training-time index;
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
from hints.index import (DEFAULT_LENGTHS, MAX_MEMORY_FRACTION, PRESETS, TARGET_LOAD, Geometry, available_memory_bytes,
                         cpu_model, default_chunk_tokens, file_bytes, human_bytes, load_rates, parse_lengths,
                         stage1_chunk, staging_nbytes)
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
RECORD_MAX_RANK_BATCH = 16  # sequences of 2048 per GPU (fewer GPUs: a smaller global batch)
RECORD_STEPS = 270
RECORD_TRAIN_TOKENS = RECORD_STEPS * RECORD_GLOBAL_BATCH_TOKENS
# One CUDA training process's host memory besides its training-time index: torch and the CUDA
# runtime's host side (~3 GiB), pinned batches, the validation hints (10.5M positions x 3
# lengths x 6 bytes = 0.2 GiB), compile workers. An estimate with headroom: the record's
# processes have not been measured on a GPU node yet. (The model lives in GPU memory.)
RANK_BASE_BYTES = 8 << 30
# A CPU training process besides its model and index: the interpreter with torch and Numba
# (~0.5 GiB resident) and the 1 GiB heap pad train_gpt.py keeps on CPU (keep_freed_memory).
RANK_BASE_CPU_BYTES = 3 << 29
# A CPU rank's model: float32 weights, gradients and two optimizer states per parameter.
PARAM_STATE_BYTES = 16
# A CPU rank's activations per token of a batch: float32 logits three times (the logits, the
# soft-capped copy and the loss's softmax/gradient) over the padded vocabulary, and per layer
# ACTIVATION_FLOATS_PER_LAYER x n_embd floats saved for backward (the attention's q, k, v and
# output, the MLP's 4x-wide hidden twice, the norms and residuals: ~24, rounded up).
LOGIT_COPIES = 3
ACTIVATION_FLOATS_PER_LAYER = 32
# From the clock's start to the builder's first hash: the go message and the first read from the
# page cache (the article's record: "training rows ready 0.11 s").
BUILDER_START_S = 0.11
# The article's record: 7.065 s from the clock's start to the last step (its statistics, 16 runs):
# what the plan compares the index's ready time with unless --train-seconds says otherwise.
ARTICLE_TRAIN_S = 7.065
# The builder process besides its staging area: interpreter, Numba, the chunk being read and
# its copy with history (DESIGN: peak build RSS <= index + staging + 256 MiB).
BUILDER_OVERHEAD_BYTES = 256 << 20
# Per-core build rate the plan counts on when none is recorded for the node's CPU class: the
# design's floor, end to end (both stages). Measured here at a small geometry: ~130M tokens/s per
# core (README benchmark); the 352 GiB table misses caches more, so without a rate measured on
# the node's CPU class the plan keeps to the floor.
BUILD_TOKENS_PER_CORE_S = 25_000_000
# The record node's CPU class, assumed when --node-* describes another node and --node-cpu does not say.
RECORD_CPU = "Intel(R) Xeon(R) Platinum 8468"
# The longest a build may take: the final validation waits for it and the wait counts as
# training time, so a corpus the cores cannot build within about a minute is halved.
BUILD_BUDGET_S = 60.0
# The record's ranks on an 8xH100 node, each keeping 1 core for its loop and `hint_workers`
# for its hint-preparation thread (train_gpt.py reserves the same).
RECORD_RANKS = 8
RECORD_HINT_WORKERS = 2
# Hardware threads per physical core of the article's node (64 cores with SMT, 128 threads): what
# --node-* planning for another node assumes unless --node-threads-per-core says.
RECORD_THREADS_PER_CORE = 2
# FineWeb100B as cached for modded-nanogpt: 100M tokens per train shard (data/download.py).
FINEWEB_SHARD_TOKENS = 100_000_000
FINEWEB100B_TRAIN_TOKENS = VARIANTS["100B"]["max_train_shards"] * FINEWEB_SHARD_TOKENS
SHARD_BYTES_PER_TOKEN = 2  # uint16 tokens (the 1 KiB header per 100M tokens is noise)
# Disk left free after fetching shards: logs, checkpoints, compile caches.
DISK_HEADROOM_BYTES = 20 << 30
DEFAULT_SHM_DIR = "/dev/shm"
# Where the trainer's background index lives: anonymous shared memory (memfd, hints/index/background.py),
# charged to RAM, not to /dev/shm's tmpfs size, so only the memory budget bounds it.
MEMFD = "memfd (anonymous shared memory)"
# tmpfs sizes itself to half of RAM unless told otherwise (mount(8), tmpfs "size"): the
# /dev/shm a node is assumed to have when only its RAM is given.
TMPFS_DEFAULT_FRACTION = 0.5

# Flags that describe another node than this machine (the record's, unless they say otherwise).
NODE_FLAGS = ("node_ram", "node_cores", "node_threads_per_core", "node_tokens", "node_shm")

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
    return file_bytes(geom, sealed=False, side_capacity=0)


def rank_bytes(train_tokens=RECORD_TRAIN_TOKENS, lengths=DEFAULT_LENGTHS, index_bytes=None, device="cuda", model=None):
    """Host memory of one training rank: its training-time index (index_bytes, else one sized for
    train_tokens) and, on CUDA, the host side of a GPU process; on a CPU, the process, the model
    and its activations (`model`: dict of params, batch_tokens, vocab, n_embd, n_layer)."""
    index = Geometry.for_tokens(max(1, train_tokens), lengths=lengths).nbytes if index_bytes is None else index_bytes
    if device == "cuda":
        return RANK_BASE_BYTES + int(index)
    m = model or {}
    padded_vocab = -(-m.get("vocab", 0) // 128) * 128
    activations = m.get("batch_tokens", 0) * 4 * (LOGIT_COPIES * padded_vocab
                                                   + ACTIVATION_FLOATS_PER_LAYER * m.get("n_layer", 0) * m.get("n_embd", 0))
    return RANK_BASE_CPU_BYTES + PARAM_STATE_BYTES * m.get("params", 0) + activations + int(index)


def model_params(arch, n_layer, n_embd, vocab, value_embeds=0):
    """Parameters of the trainer's model, closely enough for memory: 12 d^2 per block, the token
    embedding, an untied head (the speedrun GPT's; GPT-2 ties it) and the value embeddings."""
    return 12 * n_layer * n_embd ** 2 + (2 if arch == "speedrun" else 1) * vocab * n_embd + value_embeds * vocab * n_embd


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
    builder_cores: int        # physical cores the ranks leave free (the builder's, all their threads)
    builder_threads: int      # the builder's worker threads: one per free core
    build_seconds: float      # estimate at build_rate
    build_rate: float         # tokens/s per builder thread the estimate uses
    build_rate_source: str    # where that rate comes from: given, recorded for a CPU class, or the design floor
    ready_s: float            # estimate: when the index is ready, in seconds from the clock's start
    train_seconds: float      # what ready_s is compared with: the expected time to the last step (None: unknown)
    ready_before_last_step: bool  # ready_s <= train_seconds (None when train_seconds is unknown)
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
                threads_per_core=1, build_rate_source="the design floor", train_seconds=None):
    """The largest background-index plan the node holds.

    node_ram_bytes: memory the run may use (MemAvailable); node_cores: physical cores it may use
    (threads_per_core hardware threads each);
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

    # cores: what the ranks leave, else share them all. Each rank runs 1 + hint_workers threads (its
    # loop; its hint-prep thread, which runs the first of the index's hint_workers ranges itself,
    # and hint_workers - 1 pool threads) on whole physical cores (train/placement.py).
    if threads_per_core < 1:
        raise PlanError(f"--node-threads-per-core must be >= 1, got {threads_per_core}")
    rank_threads = 1 + hint_workers
    reserved = n_ranks * -(-rank_threads // threads_per_core)
    cores = node_cores - reserved if node_cores > reserved else node_cores
    node.update(rank_threads=rank_threads, rank_cores_kept=int(min(reserved, node_cores)))
    if node_cores <= reserved:
        notes.append(f"no free core ({node_cores} cores, {reserved} kept by {n_ranks} rank(s) of {rank_threads} "
                     f"threads): the builder shares all {node_cores}")

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
        stage = staging_bytes(geom, cores, min(n, BUILDER_CHUNK_TOKENS)) if n > 0 else 0  # one worker per core
        index = index_file_bytes(geom)
        return geom, index, stage, index + stage + BUILDER_OVERHEAD_BYTES + n_ranks * rank

    def flag():
        return "--hint-geometry" if geom_given else "--hint-tokens"

    rate = (float(build_tokens_per_core_s), build_rate_source, train_seconds)
    halvings = 0
    while True:
        if tokens < (1 if requested_tokens is not None else MIN_HINT_TOKENS):
            notes.append("no background index: --hint-tokens 0" if requested_tokens == 0 else
                         f"no background index: {human_tokens(tokens)} tokens is below the {human_tokens(MIN_HINT_TOKENS)} "
                         f"worth building; validation uses the training-time index")
            return _plan(0, RECORD_GEOMETRY if not geom_given else requested_geometry, 0, 0, rank, n_ranks,
                         n_ranks * rank, budget, cores, 0.0, shm_dirs[0][0], 0, halvings, notes, node, rate)
        geom, index, stage, total = sized(tokens)
        shm_path = next((p for p, free in shm_dirs if free >= index), None)
        build_s = tokens / (cores * build_tokens_per_core_s)  # one builder thread per free core
        problem = None
        if total > budget:
            problem = (f"{human_bytes(index)} index + {human_bytes(stage)} staging + {n_ranks} x {human_bytes(rank)} ranks "
                       f"= {human_bytes(total)} > {MAX_MEMORY_FRACTION:.0%} of {human_bytes(node_ram_bytes)}")
            if requested_tokens is not None or geom_given:
                raise PlanError(f"{flag()}: {geom.describe()} for {human_tokens(tokens)} tokens does not fit this node's "
                                f"memory ({problem}); ask for less (the default plan halves to fit)")
        elif shm_path is None:
            spaces = ", ".join(f"{p} has {human_bytes(free)} free" for p, free in shm_dirs)
            problem = f"the {human_bytes(index)} index file does not fit: {spaces}"
            if requested_tokens is not None or geom_given:
                raise PlanError(f"{flag()}: {problem}; give a larger tmpfs with --hint-shm-dir DIR, or ask for less")
        elif build_s > build_budget_s:
            if requested_tokens is not None:
                notes.append(f"--hint-tokens {human_tokens(tokens)}: ~{build_s:.0f} s to build on {cores} cores, "
                             f"over the {build_budget_s:.0f} s budget; kept as asked (the wait counts as training time)")
            else:
                problem = (f"{human_tokens(tokens)} tokens take ~{build_s:.0f} s on {cores} cores at "
                           f"{human_tokens(build_tokens_per_core_s)} tok/s/core ({build_rate_source}), over the "
                           f"{build_budget_s:.0f} s budget")
        if problem is None:
            break
        notes.append(f"halved: {problem}")
        tokens //= 2
        halvings += 1

    if shm_path != shm_dirs[0][0]:
        notes.append(f"index in {shm_path}: {shm_dirs[0][0]} has {human_bytes(shm_dirs[0][1])} free, "
                     f"less than the {human_bytes(index)} index")
    return _plan(tokens, geom, index, stage, rank, n_ranks, total, budget, cores, build_s, shm_path,
                 max(0, tokens - int(node_tokens)), halvings, notes, node, rate)


def _plan(tokens, geom, index, stage, rank, n_ranks, total, budget, cores, build_s, shm_path, fetch, halvings,
          notes, node, rate):
    per_s, source, train_s = rate
    ready_s = BUILDER_START_S + build_s if tokens else 0.0
    before = None if train_s is None or not tokens else ready_s <= train_s
    if tokens:
        when = (f"ready ~{ready_s:.1f} s after the clock starts"
                + ("" if before is None else f", {'before' if before else 'AFTER'} the last step (~{train_s:.2f} s)"))
        reason = (f"{human_bytes(geom.table_bytes)} table + {human_bytes(stage)} staging + {n_ranks} x {human_bytes(rank)} ranks "
                  f"fits in {human_bytes(budget)} of {human_bytes(node['ram_bytes'])}; {human_tokens(tokens)} tokens on "
                  f"{cores} builder threads, one per {'free ' if node['cores'] > cores else ''}core, at "
                  f"{per_s / 1e6:.1f}M tok/s each ({source.split(':')[0]}): {when}; index in {shm_path}")
        if halvings:
            reason += f"; halved {halvings}x to fit"
        if fetch:
            reason += f"; fetch {human_tokens(fetch)} tokens first"
    else:
        reason = notes[-1]
    return Plan(hint_tokens=int(tokens), geometry=geom, table_bytes=geom.table_bytes if tokens else 0,
                index_bytes=int(index), staging_bytes=int(stage), rank_bytes=int(rank), n_ranks=int(n_ranks),
                memory_bytes=int(total), budget_bytes=int(budget), builder_cores=int(cores), builder_threads=int(cores),
                build_seconds=float(build_s), build_rate=float(per_s), build_rate_source=source, ready_s=float(ready_s),
                train_seconds=train_s, ready_before_last_step=before, shm_path=shm_path, fetch_tokens=int(fetch), halvings=halvings,
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


def local_cores():
    """Physical cores this process may run on (every usable CPU its own core where /sys does not say)."""
    try:
        return len(read_topology().cores)
    except (OSError, ValueError):
        return len(os.sched_getaffinity(0))


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
    return dict(node_ram_bytes=available_memory_bytes() or 0, node_cores=local_cores(),
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
    g.add_argument("--node-cores", type=int, help="physical cores of that node (default: those of this process's "
                   "CPU affinity)")
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
                   help=f"host memory each training rank needs besides its training index (default: from the "
                   f"model and the device: {RANK_BASE_BYTES >> 30} GiB for a GPU rank's host side; a CPU rank's model, "
                   f"optimizer state and activations)")
    g.add_argument("--node-cpu", help=f"CPU model of that node, for its recorded build rate (default: this "
                   f"machine's, or {RECORD_CPU!r} when --node-* describes another node)")
    g.add_argument("--build-rate", type=parse_token_count, help="builder tokens/s per core to plan with, e.g. 100M "
                   "(default: the rate recorded for the node's CPU class in hints/index/build_rates.json, else the design "
                   f"floor of {BUILD_TOKENS_PER_CORE_S // 10**6}M)")
    g.add_argument("--train-seconds", type=float, help="expected seconds from the clock's start to the last step, "
                   f"which the index's ready time is compared with (default for the record: the article's {ARTICLE_TRAIN_S} s)")
    return parser


def build_rate(args, other_node):
    """(tokens/s per builder thread, where it comes from): --build-rate, else the rate recorded for
    the node's CPU class (hints/index/rates.py), else the design floor."""
    if getattr(args, "build_rate", None):
        return float(args.build_rate), "given with --build-rate"
    model = getattr(args, "node_cpu", None) or (RECORD_CPU if other_node else cpu_model())
    entry = load_rates().get(model)
    if entry:
        return float(entry["tokens_per_s_per_core"]), f"recorded for {model}: {entry['source']}"
    return float(BUILD_TOKENS_PER_CORE_S), f"the design floor: no rate recorded for {model}"


def plan_from_args(args, hint_files, dataset_tokens=0, hint_workers=RECORD_HINT_WORKERS,
                   train_tokens=RECORD_TRAIN_TOKENS, index_in_memfd=False, default_tokens=None, device=None,
                   model=None, train_index_bytes=None, train_seconds=None):
    """plan_record for the flags of add_plan_args plus --hint-tokens / --hint-geometry /
    --hint-lengths: this machine's facts, with each --node-* flag given replacing its fact.
    index_in_memfd: the index lives in anonymous shared memory (the trainer's background
    builder), which only RAM bounds, instead of a file in /dev/shm or --hint-shm-dir.
    default_tokens: the corpus the plan starts from before halving (default the article's 37B).
    device ('cuda' or 'cpu'; default: cuda for another node or where an NVIDIA device exists),
    model (rank_bytes' dict) and train_index_bytes size each rank; train_seconds: see --train-seconds."""
    other_node = any(getattr(args, k) is not None for k in NODE_FLAGS)
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
    index_bytes = (Geometry.for_tokens(max(1, train_tokens), lengths=lengths).nbytes if train_index_bytes is None
                   else int(train_index_bytes))
    if other_node:  # the record's kind of node: GPU ranks
        device = "cuda"
    elif device is None:
        device = "cuda" if os.path.exists("/dev/nvidiactl") else "cpu"
    if args.node_rank_ram is not None:
        kw["rank_ram_bytes"] = args.node_rank_ram + index_bytes
    else:
        kw["rank_ram_bytes"] = rank_bytes(index_bytes=index_bytes, device=device, model=model)
        ranks_total = ranks * kw["rank_ram_bytes"]
        if device == "cpu" and model and ranks_total > MAX_MEMORY_FRACTION * kw["node_ram_bytes"]:
            raise PlanError(f"--batch-size: {ranks} CPU rank(s) of {human_bytes(kw['rank_ram_bytes'])} (model, optimizer "
                            f"state, {model['batch_tokens']:,} tokens of activations a step, a {human_bytes(index_bytes)} "
                            f"training index) do not fit in {MAX_MEMORY_FRACTION:.0%} of {human_bytes(kw['node_ram_bytes'])}; "
                            f"give a smaller --batch-size or --seq-len")
    kw["build_tokens_per_core_s"], kw["build_rate_source"] = build_rate(args, other_node)
    train_s = getattr(args, "train_seconds", None) or train_seconds
    kw["train_seconds"] = train_s
    if default_tokens:
        kw["default_tokens"] = default_tokens
    return plan_record(n_ranks=ranks, lengths=lengths, requested_tokens=getattr(args, "hint_tokens", None),
                       requested_geometry=getattr(args, "hint_geometry", None), hint_workers=hint_workers,
                       train_tokens=train_tokens, **kw)


def train_index_geometry(args, train_tokens):
    """The training-time index each rank grows: --train-index-geometry ('auto': sized for the run's
    training tokens, at most the preset's train_index_max_tokens, llmc's 1B)."""
    cap = getattr(args, "train_index_max_tokens", None)
    return Geometry.parse(args.train_index_geometry, min(train_tokens, cap) if cap else train_tokens, args.hint_lengths)


def run_shape(args, world_size):
    """(tokens per optimizer step, per-rank batch tokens) of a run: the record's 262,144 per step
    over however many ranks when the preset leaves --batch-size to the world size."""
    batch = args.batch_size or max(1, min(RECORD_MAX_RANK_BATCH, RECORD_GLOBAL_BATCH_TOKENS // (world_size * args.seq_len)))
    return batch * args.seq_len * world_size, batch * args.seq_len


def plan_for_run(args, hint_files, default_tokens=None, device=None):
    """The trainer's plan (--plan, and the record and llmc presets): plan_from_args for an index in
    memfd, with each rank sized from the model and the device (its training-time index as
    train_index_geometry makes it). A plan that cannot fit ends the run with one line naming the flag."""
    other_node = any(getattr(args, k) is not None for k in NODE_FLAGS)
    world = int(os.environ.get("WORLD_SIZE", 0)) or args.node_ranks or (RECORD_RANKS if other_node else 1)
    per_step, rank_batch = run_shape(args, world)
    train_geom = train_index_geometry(args, args.steps * per_step)
    model = dict(params=model_params(args.arch, args.n_layer, args.n_embd, args.vocab_size, args.value_embeds or 0),
                 batch_tokens=max(rank_batch, (args.val_batch_size or 0) * args.seq_len), vocab=args.vocab_size,
                 n_embd=args.n_embd, n_layer=args.n_layer)
    try:
        return plan_from_args(args, hint_files, FINEWEB100B_TRAIN_TOKENS, args.hint_workers,
                              index_in_memfd=True, default_tokens=default_tokens, device=device, model=model,
                              train_index_bytes=train_geom.nbytes,
                              train_seconds=ARTICLE_TRAIN_S if args.preset == "record-2025" else None)
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
        plan = plan_from_args(args, args.hint_files, dataset_tokens=FINEWEB100B_TRAIN_TOKENS, train_seconds=ARTICLE_TRAIN_S)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(plan.to_json())
    print(f"plan: {plan.reason}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
