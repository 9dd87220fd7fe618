"""Where validation hints come from, and the same choice on every rank.

The node's background index (hints/index/background.py: built from training shards in its own
process on the cores the ranks leave free, started by `start_background`); a saved index
(`--val-index`, `open_val_index`); or exact counts of the val n-grams in the training tokens
(`--val-hints exact|exact-gpu`, `count_exact_val_hints`). `pick_val_index` chooses among the
indexes and says why: the background index when it is ready on every rank, else --val-index,
else the training-time index.
"""
import atexit
import time
from typing import NamedTuple

import numpy as np

from data.loader import iter_tokens, read_tokens
from hints import Geometry, HintIndex
from hints.cells import BOS
from hints.index import compile_kernels
from hints.index.background import BUILDING, start_for_node
from hints.positional import DEFAULT_CAP, PositionalIndex, exact_cells
from hints.positional import MAGIC as POSITIONAL_MAGIC
from train.data import val_split
from train.placement import lower_priority

def _is_positional(path):
    try:
        with open(path, "rb") as f:
            return f.read(len(POSITIONAL_MAGIC)) == POSITIONAL_MAGIC
    except OSError as e:
        raise SystemExit(f"error: --val-index {path}: cannot read it ({e.strerror})") from None


# Distinct followers kept per validation position in the record's representation (the record's 8).
VAL_FOLLOWERS = 8


class ValSource(NamedTuple):
    """The index a validation uses: kind is 'background', 'val-index', 'training' or None."""

    kind: str | None
    reason: str


def pick_val_index(background_ready, background_state, have_val_index, have_training_index):
    """Which index validates, the same choice on every rank, and why.

    background_ready: one flag per rank (empty when the run builds no background index); the
    background index is used only when it is ready on every rank (the all-ranks minimum), since
    ranks that validated with different indexes would average incomparable losses.
    background_state: what the background builder says of itself (for the reason).
    """
    if background_ready and all(background_ready):
        return ValSource("background", "the background index is ready on every rank")
    if not background_ready:
        why = "no background index in this run"
    elif any(background_ready):
        why = f"the background index is not ready on every rank ({sum(background_ready)} of {len(background_ready)})"
    else:
        why = f"the background index is not ready ({background_state})"
    if have_val_index:
        return ValSource("val-index", f"{why}: using --val-index")
    if have_training_index:
        return ValSource("training", f"{why}: using the training-time index")
    return ValSource(None, f"{why}, no --val-index and no training index: no hinted loss")


# Lookup threads per rank for a saved or background index (the index releases the GIL).
VAL_LOOKUP_WORKERS = 4
# The final validation checks this often whether the background index is ready: the wait is
# training time, and a status read is one pread of a few hundred bytes.
FINAL_WAIT_POLL_S = 0.002


# The article's open rules question about exact validation hints, logged with every run that uses them.
EXACT_RULES_NOTE = ("rules question (the article's): may counting the validation n-grams in the training tokens "
                    "run inside the timed region, as backward passes on it do? The 3.1 s estimate assumes yes; "
                    "this run counts them outside it")


class ExactCells:
    """The record's cells of this rank's val span counted exactly (hints.positional.exact_cells)
    before the clock starts, answered by lookup_cells like an index (`tokens_added`: the training
    tokens counted in)."""

    def __init__(self, span, cells, tokens_added, seconds):
        self.span, self.cells, self.tokens_added, self.seconds = span, cells, int(tokens_added), seconds
        self.backend = "exact cells, cpu"

    def lookup_cells(self, tokens, max_followers, boundary=BOS):
        if not np.array_equal(tokens, self.span) or max_followers != self.cells.followers.shape[1]:
            raise ValueError("exact val cells answer only the val span (and follower count) they were counted for")
        return self.cells

    def describe(self):
        return (f"exact cells of {len(self.span):,} positions against {self.tokens_added:,} training tokens "
                f"in {self.seconds:.2f}s")


def count_exact_val_hints(mode, val_tokens, train_files, max_tokens, lengths, *, seq_len, batch_size, dist, log,
                          record=False):
    """Exact validation hints (`--val-hints exact|exact-gpu`): this rank's share of the val
    positions, counted in the first max_tokens training tokens by hints.exact (torch on any
    device, or the Triton kernels on CUDA), before the clock starts. record: the record's cells
    (hints.positional.exact_cells, on the CPU; exact-gpu is refused)."""
    from hints.exact import exact_val_hints
    if mode == "exact-gpu" and not dist.cuda:
        raise SystemExit(f"error: --val-hints exact-gpu needs a CUDA device; this run is on {dist.device} "
                         f"(use --val-hints exact)")
    if record and mode == "exact-gpu":
        raise SystemExit("error: --val-hints exact-gpu counts per-length hints; the record's representation "
                         "(--hint-repr record) counts its cells on the CPU: use --val-hints exact")
    if max_tokens <= 0:
        raise SystemExit(f"error: --val-hints {mode} counts in the first --hint-tokens training tokens; "
                         f"give --hint-tokens > 0")
    first, n_seq, _ = val_split(len(val_tokens), seq_len, batch_size, dist.rank, dist.world_size)
    if record:
        t0 = time.perf_counter()
        span = np.asarray(val_tokens[first * seq_len:(first + n_seq) * seq_len])
        train = read_tokens(train_files, max_tokens, strict=False)
        cells = exact_cells(span, train, max_followers=VAL_FOLLOWERS, lengths=lengths, boundary=BOS)
        exact = ExactCells(span, cells, len(train), time.perf_counter() - t0)
        log(f"val hints: {exact.describe()}, outside the timed region")
        log(EXACT_RULES_NOTE)
        return exact
    exact = exact_val_hints(val_tokens, iter_tokens(train_files, max_tokens=max_tokens), lengths,
                            backend="triton" if mode == "exact-gpu" else "torch", device=dist.device,
                            start=first * seq_len, stop=(first + n_seq) * seq_len)
    log(f"val hints: {exact.describe()}, outside the timed region")
    log(EXACT_RULES_NOTE)
    return exact


class PositionalValIndex:
    """A saved hints.positional.PositionalIndex as a validation index (the record's representation
    only): Cells from every occurrence it holds, at most the cap most recent per n-gram."""

    def __init__(self, index):
        self.index, self.tokens_added = index, index.tokens

    def lookup_cells(self, tokens, max_followers, boundary=BOS):
        return self.index.lookup_cells(tokens, self.tokens_added, cap=DEFAULT_CAP, max_followers=max_followers,
                                       boundary=boundary)


def open_val_index(path, lengths, log, record=False):
    """A saved index for validation (`--val-index`), mapped read-only; refused unless built with the
    model's lengths. record: a saved hints.positional.PositionalIndex serves too (scripts/cpu_ab.py
    --hints builds one over a corpus's training split)."""
    if record and _is_positional(path):
        idx = PositionalIndex.load(path)
        if tuple(idx.lengths) != tuple(lengths):
            raise SystemExit(f"error: --val-index {path}: built with n-gram lengths {tuple(idx.lengths)}, "
                             f"the model's --hint-lengths are {tuple(lengths)}")
        log(f"--val-index {path}: positional, {idx.tokens:,} tokens, {idx.entries:,} entries")
        return PositionalValIndex(idx)
    try:
        idx = HintIndex.load(path, mmap=True, workers=VAL_LOOKUP_WORKERS)
    except (ValueError, OSError) as e:
        raise SystemExit(f"error: --val-index {path}: {e}") from None
    if idx.geom.lengths != tuple(lengths):
        raise SystemExit(f"error: --val-index {path}: built with n-gram lengths {idx.geom.lengths}, "
                         f"the model's --hint-lengths are {tuple(lengths)}")
    log(f"--val-index {path}: {idx.tokens_added:,} tokens, {idx.geom.describe()}")
    return idx


def wait_for_background(background, bg_wait, dist, log, clock_stopped):
    """At the final validation: the seconds from the clock's stop (`clock_stopped`, time.monotonic())
    until the background index was ready, waiting up to bg_wait seconds while it builds; 0 when it
    was ready before the clock stopped. Training time (an index that got ready after the last step
    kept the run waiting, however short the gap), the same on every rank. Rank 0 decides when to
    stop waiting and tells the others, so a builder that died before its first status write (which
    only the owner sees) costs no rank the whole wait."""
    waited = 0.0
    if dist.master and background is not None:
        st = background.status()
        if st["state"] in BUILDING:
            limit = "until it is ready or fails" if bg_wait == float("inf") else f"up to {bg_wait:.0f}s"
            log(f"final validation: waiting {limit} for the background index ({background.describe()}); "
                f"the wait counts as training time")
            background.wait(bg_wait, poll_s=FINAL_WAIT_POLL_S)
            waited = time.monotonic() - clock_stopped
        elif st["state"] == "ready" and st["clock_start"] + st["ready_s"] > clock_stopped:
            waited = time.monotonic() - clock_stopped  # ready since the clock stopped: the run waited for it
            log(f"final validation: the background index got ready {st['clock_start'] + st['ready_s'] - clock_stopped:.3f}s "
                f"after the clock stopped; the {waited:.3f}s since count as training time")
    return dist.broadcast(waited)


def pick_index(with_background, background, val_index, train_index, dist):
    """(ValSource, index) for a validation, the same on every rank: pick_val_index over every
    rank's readiness, and a background index that fails to open on any rank falls back on all."""
    have = (val_index is not None, train_index is not None)
    ready = dist.gather(background is not None and background.ready()) if with_background else []
    source = pick_val_index(ready, background.describe() if background is not None else "failed to start", *have)
    index = None
    if source.kind == "background":
        error = None
        try:
            index = background.open(workers=VAL_LOOKUP_WORKERS)
        except Exception as e:  # noqa: BLE001 - reported; the same fallback as a builder not ready
            error = f"{type(e).__name__}: {e}"
        errors = [e for e in dist.gather(error) if e]
        if errors:
            index, source = None, pick_val_index([False], f"open failed: {errors[0]}", *have)
    if source.kind != "background":
        index = {"val-index": val_index, "training": train_index}.get(source.kind)
    return source, index




def start_background(hint_files, hint_tokens, lengths, geometry, run_id, dist, hint_workers, cpus, log, workers=None,
                     seal=True):
    """The node's background index: local rank 0 starts the builder (on `cpus`, else all but the
    cores the ranks keep: one for the loop and hint_workers for the prep thread each; `workers`
    threads, default one per cpu), at a lower priority than the ranks; the other local ranks
    attach. The builder only gets ready until the clock starts (arm_background). None where it
    could not start."""
    background = start_for_node(hint_files, hint_tokens, lengths, f"nghints-{run_id}-n{dist.node}",
                                owner=dist.local_rank == 0, barrier=dist.barrier, log=log,
                                reserve_cpus=dist.local_world_size * (1 + hint_workers), geometry=geometry, cpus=cpus,
                                workers=workers, seal=seal)
    if background is not None:
        atexit.register(background.close)  # any exit, errors included, stops the build and frees its memory
        if background.process is not None:
            lower_priority(background.process.pid)  # training ranks first where cores are shared
    return background


def log_kernels_ready(lengths, log):
    """Compile the hint kernels (or load them from Numba's cache) before the clock, and say how long it took."""
    log(f"hint kernels: ready in {compile_kernels(lengths):.1f}s (compiled once per checkout, then loaded from "
        f"Numba's cache; untimed)")


def start_run_background(args, plan, hint_files, run_id, dist, cpus, log, seal=True):
    """start_background for a run's flags: the plan's geometry and builder threads, else --hint-geometry
    (a bad one ends the run naming the flag), else the builder's own sizing."""
    try:
        geometry = plan.geometry if plan else (Geometry.parse(args.hint_geometry, args.hint_tokens, args.hint_lengths)
                                               if args.hint_geometry else None)
    except ValueError as e:
        raise SystemExit(f"error: argument --hint-geometry: {e}") from None
    return start_background(hint_files, args.hint_tokens, args.hint_lengths, geometry, run_id, dist, args.hint_workers,
                            cpus, log, workers=plan.builder_threads if plan else None, seal=seal)


def arm_background(background, meter, dist, log, timeout_s=None):
    """Before the clock: wait (untimed; at most timeout_s, None: until armed or failed) until the
    owner's builder has reserved and pre-faulted its table and read its shards, then have the
    clock's first start release it (meter.on_clock_start). Every rank passes the barrier at the
    end, so the clock starts after the builder is armed. A builder still not armed gets its go
    all the same and starts when it is (its build_started_s says how late)."""
    if background is not None and background.process is not None:
        state = background.wait_armed(timeout_s)
        st = background.status()
        pf = st.get("prefault") or {}
        if state == "armed":
            log(f"background hints: armed before the clock: table reserved and pre-faulted in {pf.get('seconds', 0):.2f}s "
                f"on {pf.get('workers')} threads ({pf.get('how')}; huge pages asked: {pf.get('madvise_hugepage')}, "
                f"kernel shmem THP mode {pf.get('thp_mode')}), {st.get('page_cache_bytes', 0) / 2**30:.2f} GiB of "
                f"shards read into the page cache in {st.get('page_cache_s', 0):.2f}s; it hashes from the clock's start")
        else:
            log(f"background hints: the builder is {background.describe()} before the clock")
        meter.on_clock_start.append(background.go)
    dist.barrier()


def record_verdict(attempt, final_val, background_status):
    """(record_valid, reason) of a run: (None, None) when it is no record attempt (another preset, a
    --no-hints baseline, a run without a background index). An attempt counts only when its final validation used the background
    index, built on the clock (no token indexed before the clock started)."""
    if not attempt:
        return None, None
    if final_val.get("index") != "background":
        return False, f"the final validation did not use the background index ({final_val.get('index_reason')})"
    done = (background_status or {}).get("tokens_done_at_clock_start")
    if done is None:
        return False, "the background builder's tokens at the clock's start were not measured"
    if done:
        return False, f"the background builder had indexed {done:,} tokens before the clock started"
    return True, "the final validation used the background index, built from the clock's start"
