"""The run's hint indexes, opened before the clock.

Training-time: with --hint-repr record one exact positional index per node (local rank 0 builds
it from the clock's start, every rank maps it; train/positional_hints.py), else every rank's small
growing index (none with --no-hints). Validation: --val-index, the node's background index (its
builder started here, on the cores no rank uses) or exact counts of the val n-grams
(train/val_hints.py). The Numba kernels are compiled (or loaded from their cache) here, untimed.
"""
from data.loader import resolve_files
from hints import HintIndex
from train.placement import pin_cuda_rank
from train.plan import train_index_geometry
from train.positional_hints import PositionalHints, node_directory
from train.val_hints import count_exact_val_hints, log_kernels_ready, open_val_index, start_run_background


def open_hint_indexes(run):
    """Fill run.geom, index, positional, val_index, background and exact, logging each."""
    args, d, log, lengths = run.args, run.d, run.log, run.lengths
    run.geom = None if args.no_hints or run.record else train_index_geometry(args, run.steps * run.global_batch)
    run.index = HintIndex(run.geom, workers=args.hint_workers) if run.geom else None
    if run.record and not args.no_hints:  # one per node: local rank 0 builds it, every rank maps it
        run.positional = PositionalHints(node_directory(run.run_id, d.node), args.batch_size, run.seq_len, d.rank,
                                         d.world_size, lengths)
        log(f"training-time hints (record): one exact positional index per node over the run's {run.steps} steps, "
            f"built by local rank 0 in phases from the clock's start; lookups see the tokens before their step "
            f"(cap {run.positional.cap}, {run.positional.max_followers} followers)")
    else:
        log(f"training-time hint index (per rank): {run.geom.describe()}" if run.geom
            else "training-time hints: off (--no-hints)")
    if run.geom or run.positional or args.val_index or args.val_hints == "background":
        log_kernels_ready(lengths, log)
    run.val_index = open_val_index(args.val_index, lengths, log, record=run.record) if args.val_index else None
    if args.switch_hints_at and (not run.with_background
                                 or set(resolve_files(run.hint_files)) & set(resolve_files(run.train_files))):
        raise SystemExit("error: --switch-hints-at: needs a background index built from --hint-files disjoint from "
                         "--train-files (an index holding the training tokens would hint the very tokens being predicted)")
    builder_cpus = None
    if d.cuda:  # each rank on cores of its GPU's NUMA node; the builder on the cores no rank uses
        builder_cpus = pin_cuda_rank(d.local_rank, d.local_world_size, 1 + args.hint_workers, log)
    if run.with_background:
        run.background = start_run_background(args, run.plan, run.hint_files, run.run_id, d, builder_cpus, log,
                                              seal=getattr(args, "bg_seal", True))
    if args.val_hints != "background":
        run.exact = count_exact_val_hints(args.val_hints, run.val_tokens, run.hint_files, args.hint_tokens, lengths,
                                          seq_len=run.seq_len, batch_size=args.val_batch_size, dist=d, log=log,
                                          record=run.record)
