"""The record arch's validation index: the node's background index, built on the clock, and which
index the final validation reads (train/record_run.py calls this module).

The hinted record builds its validation index on the clock, over the first 350 training shards (35B
tokens) on the CPU cores its ranks leave free, and its final validation reads hints from it. Here the
January 2025 path's machinery does the same (train/val_hints.py, hints/index/background.py): local
rank 0 starts the builder over the first --hint-tokens tokens of --hint-files (default
--train-files), sized to the node by the plan for the planned presets (train/plan.py); before the
clock it reserves and pre-faults its table and reads its shards (armed), and it hashes from the
clock's start. The final validation (off the clock) reads, in order: --val-index if given, else the
background index when it is ready on every rank (waiting up to --bg-wait for it; the wait counts as
training time), else the training stream's positional index. A builder that could not start, died
or is late falls back to the next one, and the log and the summary say which and why; for --preset
record the summary carries the record verdict (train/val_hints.py's record_verdict) as the old path's.
"""
import os
import time

import torch

from train.placement import pin_cuda_rank
from train.plan import (ARTICLE_TRAIN_S, FINEWEB100B_TRAIN_TOKENS, FINEWEB_SHARD_TOKENS, NODE_FLAGS, RECORD_RANKS,
                        PlanError, model_params, plan_from_args, tokens_on_disk)
from train.val_hints import (arm_background, log_kernels_ready, open_val_index, pick_index, record_verdict,
                             start_run_background, wait_for_background)

# The training-time positional index's memory per trained token: one row of 64-bit words per position
# (key, position|follower|reach, one fingerprint per longer length: hints/positional/positional_index.py),
# counted twice: the newest published phase and the build's sort scratch.
POSITIONAL_ROW_WORDS_BESIDES_LENGTHS = 1
POSITIONAL_COPIES = 2
# The record's validation index: its first 350 FineWeb100B training shards of 100M tokens (the record's
# train_gpt.py); the plan starts from it for --preset record and halves it to fit a smaller node.
RECORD_ARCH_HINT_TOKENS = 350 * FINEWEB_SHARD_TOKENS


def positional_bytes(train_tokens, lengths):
    """Host memory of the node's positional index over train_tokens (one per node, all ranks map it)."""
    return POSITIONAL_COPIES * 8 * (len(lengths) + POSITIONAL_ROW_WORDS_BESIDES_LENGTHS) * train_tokens


def plan_record_index(args, hint_files, device):
    """The background index sized to the node for the record arch (train/plan.py's plan_from_args with
    the record's ranks: its model and n-gram table share, its packed rows, the node's positional index
    shared by its ranks). A plan that cannot fit ends the run with one line naming the flag."""
    other_node = any(getattr(args, k) is not None for k in NODE_FLAGS)
    world = int(os.environ.get("WORLD_SIZE", 0)) or args.node_ranks or (RECORD_RANKS if other_node else 1)
    train_tokens = args.steps * args.tokens_per_step
    params = model_params("record", args.n_layer, args.n_embd, args.vocab_size) + args.ngram_rows * args.n_embd // world
    model = dict(params=params, batch_tokens=max(args.tokens_per_step, args.val_batch_tokens) // world,
                 vocab=args.vocab_size, n_embd=args.n_embd, n_layer=args.n_layer)
    try:
        return plan_from_args(args, hint_files, FINEWEB100B_TRAIN_TOKENS, args.hint_workers, train_tokens=train_tokens,
                              index_in_memfd=True, device=device, model=model,
                              default_tokens=RECORD_ARCH_HINT_TOKENS if args.preset == "record" else None,
                              train_index_bytes=-(-positional_bytes(train_tokens, args.hint_lengths) // world),
                              train_seconds=ARTICLE_TRAIN_S if args.preset == "record" else None)
    except PlanError as e:  # a CPU rank too large is the plan's "--batch-size" error: this arch sizes it so
        message = str(e).replace("--batch-size:", "--tokens-per-step / --val-batch-tokens:").replace(
            "a smaller --batch-size or --seq-len", "smaller --tokens-per-step or --val-batch-tokens")
        raise SystemExit(f"error: {message}") from None


def plan_record_run(args, hint_files, planned):
    """Before any process starts: the plan (--plan, or a planned preset's background index when the run
    builds one), which sets --hint-tokens to its number; None without one (--hint-tokens then as given,
    unset: 0). A run's plan covers only the tokens its hint shards hold (--plan says what to fetch; this
    path fetches nothing, and a table sized for tokens not there would only cost memory and time)."""
    if args.val_hints != "background":
        raise SystemExit(f"error: argument --val-hints: the record arch validates with --val-index, its background "
                         f"index or its positional index; got {args.val_hints!r}")
    plan = None
    builds = not args.no_hints and not args.val_index and args.hint_tokens != 0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.plan or (planned and builds):
        if not args.plan and args.hint_tokens is None:  # a run fetches nothing: it plans the tokens its shards
            # hold (at most the record's), not the plan's corpus it would have to fetch, so a small corpus gets
            # its whole index whatever memory the node has left for a large one
            args.hint_tokens = min(RECORD_ARCH_HINT_TOKENS, tokens_on_disk(hint_files))
        plan = plan_record_index(args, hint_files, device) if args.plan or args.hint_tokens else None
        if plan is not None and not args.plan:
            args.hint_tokens = plan.hint_tokens
    args.hint_tokens = args.hint_tokens or 0
    return plan


class RecordValIndex:
    """The record run's validation index: the background builder (started here when the run asks for
    one: hints on, --hint-tokens > 0, no --val-index), the clock's start and stop, and the final pick.

        vi = RecordValIndex(args, d, log, run_id, hint_files, plan)   # before the warm-up
        vi.arm()                  # before the clock: untimed, every rank
        vi.clock_started()        # at the clock's start: the builder hashes from now
        vi.clock_stopped()        # after the last step
        index, waited = vi.final(training_index)   # the final validation's index (off the clock)
        vi.facts(attempt)         # the summary's keys;  vi.close()
    """

    def __init__(self, args, d, log, run_id, hint_files, plan):
        self.args, self.d, self.log, self.plan = args, d, log, plan
        self.hint_files, self.background, self.source = hint_files, None, None
        self.started_at = self.stopped_at = None  # time.monotonic() of the clock's start and stop
        self.waited = 0.0
        self.on_clock_start = []  # the builder's go (arm_background's, as on the Meter of train/meter.py)
        self.index_tokens = 0
        self.with_background = not args.no_hints and args.hint_tokens > 0 and not args.val_index
        if not self.with_background:
            return
        # the builder and the final validation's lookups load the kernels from Numba's cache: untimed, here
        log_kernels_ready(args.hint_lengths, log)
        cpus = None
        if d.cuda:  # each rank on cores of its GPU's NUMA node; the builder on the cores no rank uses
            cpus = pin_cuda_rank(d.local_rank, d.local_world_size, 1 + args.hint_workers, log)
        self.background = start_run_background(args, plan, hint_files, run_id, d, cpus, log)

    def arm(self):
        """Before the clock (every rank): wait until the builder is armed (at most --bg-wait; inf: until
        armed or failed), so that it hashes its first token at the clock's start."""
        if self.with_background:  # this path has no Meter: arm_background appends the builder's go to ours
            arm_background(self.background, self, self.d, self.log,
                           timeout_s=None if self.args.bg_wait == float("inf") else self.args.bg_wait)

    def clock_started(self):
        """The clock's start (every rank; the owner's builder gets its go)."""
        self.started_at = time.monotonic()
        for go in self.on_clock_start:
            go(self.started_at)

    def clock_stopped(self):
        self.stopped_at = time.monotonic()

    def final(self, training_index):
        """(index, seconds waited) for the final validation, the same on every rank: --val-index, else
        the background index when ready (waiting up to --bg-wait; the wait is training time), else
        the training stream's index. Logs which and why."""
        args, d = self.args, self.d
        val_index = None
        if args.val_index:
            val_index = open_val_index(args.val_index, args.hint_lengths, self.log, record=True)
        if self.with_background and args.bg_wait > 0:
            self.waited = wait_for_background(self.background, args.bg_wait, d, self.log, self.stopped_at)
        self.source, index = pick_index(self.with_background, self.background, val_index, training_index, d)
        self.index_tokens = int(index.tokens_added) if index is not None else 0
        self.log(f"final validation: hints from the {self.source.kind} index ({self.index_tokens:,} tokens; "
                 f"{self.source.reason})")
        return index, self.waited

    def facts(self, attempt):
        """The summary's keys: which index validated and why, its tokens, the builder's status, the wait,
        and (an attempt: --preset record with hints, its background index, the whole schedule) rank 0's
        record verdict, as the January 2025 path's summary (train/summary.py)."""
        status = None
        if self.background is not None:
            status = dict(self.background.status(), final_validation_s=self.stopped_at - self.started_at
                          if self.stopped_at is not None and self.started_at is not None else None,
                          final_wait_s=self.waited)
        source = self.source
        final_val = dict(index=source.kind if source else None, index_reason=source.reason if source else None)
        valid, reason = self.d.broadcast(record_verdict(attempt and self.with_background, final_val, status))
        return dict(val_index=final_val["index"], val_index_reason=final_val["index_reason"],
                    hint_tokens_val=self.index_tokens, hint_files=self.hint_files if self.with_background else None,
                    bg_wait_s=self.waited, background=status, record_valid=valid, record_reason=reason,
                    plan=self.plan.to_dict() if self.plan else None)

    def close(self):
        """Every rank is done with the background index: its owner stops the builder and frees it."""
        self.d.barrier()
        if self.background is not None:
            self.background.close()
