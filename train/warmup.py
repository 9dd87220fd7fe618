"""The untimed warm-up: run a few training steps and a validation pass so that torch.compile
builds (and autotunes) their graphs before the clock starts, then undo them. The model and the
optimizers return to exactly their state before; the run's loader and hint indexes are never
touched (the warm-up reads from its own loader, and hints from a throwaway index)."""
import copy
import dataclasses
import time

from data.loader import DistributedDataLoader
from hints import Geometry, HintIndex
from train.evaluate import evaluate
from train.hint_prep import HintPrep
from train.positional_hints import PositionalHints, node_directory


def warm_up(run):
    """--warmup-steps steps and one validation batch per rank on throwaway data and hints, then undone; logged."""
    args, d, T = run.args, run.d, run.seq_len
    warm_positional = None  # the record's representation warms up on a throwaway index of the warm-up's steps
    if run.positional:
        warm_positional = PositionalHints(node_directory(run.run_id + "-warmup", d.node), args.batch_size, T, d.rank,
                                          d.world_size, run.lengths)
        if d.local_rank == 0:
            warm_positional.start_build(run.train_files, args.warmup_steps, args.align_documents)
    warm_index = HintIndex(dataclasses.replace(Geometry.preset("tiny"), lengths=run.lengths)) if run.index else (
        warm_positional.trained(1) if run.positional else None)  # hints for the warm-up's validation graph
    loader = DistributedDataLoader(run.train_files, args.batch_size, T, rank=d.rank, world_size=d.world_size,
                                   align_to_documents=args.align_documents)
    warm = HintPrep(loader, None if run.positional else warm_index, d.rank, d.world_size, pin=d.cuda,
                    positional=warm_positional)
    val_tokens = run.val_tokens[:T * d.world_size * args.val_batch_size + 1]
    seconds = warm_up_and_undo(
        run.model, run.optimizers, lambda i: run.train_step(warm.prepare(), run.start_step + i), args.warmup_steps,
        lambda: evaluate(run.train_model, val_tokens, warm_index, seq_len=T, batch_size=args.val_batch_size, dist=d,
                         record=run.record), d)
    run.log(f"warm-up: {args.warmup_steps} steps in {seconds:.1f}s (untimed, then undone)")


def warm_up_and_undo(model, optimizers, train_step, steps, evaluate, dist):
    """train_step(i) for i < steps, then evaluate(); restore model and optimizers; seconds taken."""
    t0 = time.perf_counter()
    saved_model = copy.deepcopy(model.state_dict())
    saved_opts = [copy.deepcopy(opt.state_dict()) for opt in optimizers]
    for i in range(steps):
        train_step(i)
    evaluate()
    dist.sync()
    model.load_state_dict(saved_model)
    for opt, state in zip(optimizers, saved_opts):
        opt.load_state_dict(state)
    return time.perf_counter() - t0
