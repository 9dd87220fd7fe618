"""The run's shared state: one `Run` that the set-up fills and the loop's calls take.

`start_run` opens the run's processes and its log; train_gpt.py then gives the run its data, its
model and its hint indexes (train/hint_indexes.py), and the warm-up, the sync points and the summary
(train/warmup.py, train/sync_points.py, train/summary.py) read what they need from it instead of a
dozen names threaded through every call. `resume` restores it from a checkpoint set.
"""
import dataclasses
import sys

import torch

from model import gpu_paths_enabled
from train import checkpoint
from train.common import init_dist, new_run_id, open_log
from train.evaluate import ValHintCache


@dataclasses.dataclass
class Run:
    args: object  # train_gpt.py's parsed flags, the preset's values filled in
    d: object  # train.common.Dist: rank, world, device
    log: object  # train.common.Log
    run_id: str
    plan: object = None  # train.plan's node plan for the background index (planned presets), else None
    hint_files: str = None  # the glob the background index (and --val-hints exact) read
    # data
    train_files: str = None
    loader: object = None  # data.loader.DistributedDataLoader of the training stream
    val_tokens: object = None  # the val stream (uint16)
    # model (train.step.build_model)
    model: object = None
    train_model: object = None  # the compiled model (the model itself when not compiled)
    optimizers: list = None
    train_step: object = None
    # hint indexes (train/hint_indexes.py)
    geom: object = None  # the per-rank training-time index's geometry ("lengths"), else None
    index: object = None  # that index (hints.HintIndex)
    positional: object = None  # the record representation's node index (train.positional_hints)
    val_index: object = None  # --val-index, opened
    background: object = None  # the node's background index (hints/index/background.py), when it started here
    exact: object = None  # --val-hints exact|exact-gpu: the counted val hints
    cache: ValHintCache = dataclasses.field(default_factory=ValHintCache)  # val hints per index and span
    # progress
    settings: dict = None  # what a resumed run must share with the saved one (checkpoint.run_settings)
    start_step: int = 0
    tail: object = None  # the hint stream's tail a resumed run continues from
    saved: dict = dataclasses.field(default_factory=dict)  # the meter's progress a resumed run continues
    meter: object = None  # train.meter.Meter: the clock
    prep: object = None  # train.hint_prep.HintPrep: the thread preparing the steps' batches and hints

    @property
    def seq_len(self):
        return self.args.seq_len

    @property
    def steps(self):
        return self.args.steps

    @property
    def global_batch(self):
        """Tokens per step over all ranks."""
        return self.d.world_size * self.args.batch_size * self.args.seq_len

    @property
    def lengths(self):
        return self.args.hint_lengths

    @property
    def record(self):
        """The record's hint representation (cells from the positional index)."""
        return self.args.hint_repr == "record"

    @property
    def with_background(self):
        """The run asked for a background index (the same on every rank, started there or not)."""
        return self.args.val_hints == "background" and self.args.hint_tokens > 0

    def training_index(self, step):
        """The training-time hints as of `step`: the positional index's, else the growing index."""
        return self.positional.trained(step) if self.positional else self.index


def start_run(args, plan, hint_files):
    """The run's processes (torchrun or one), its id and its log, with the run's first lines."""
    d = init_dist()
    run_id = new_run_id(args.preset, d)
    log = open_log(args.log_dir, run_id, d, args.wandb_project if args.wandb else None, vars(args))
    log(f"run {run_id}: {' '.join(sys.argv)}")
    if plan:
        log(f"plan: {plan.reason}")
    log(f"torch {torch.__version__}, {d.world_size} process(es), device {d.device}"
        + (f" ({torch.cuda.get_device_name(d.device)})" if d.cuda else f", {torch.get_num_threads()} threads")
        + f", GPU paths {'on' if gpu_paths_enabled() else 'off'}")
    return Run(args, d, log, run_id, plan, hint_files)


def resume(run):
    """--resume: the model, optimizers, loader, training index and progress from a checkpoint set
    made with the same settings (checkpoint.restore_run checks them)."""
    run.start_step, run.index, run.tail, run.saved = checkpoint.restore_run(
        run.args.resume, run.d, settings=run.settings, model=run.model, optimizers=run.optimizers, loader=run.loader,
        index=run.index, global_batch=run.global_batch, hint_workers=run.args.hint_workers)
    run.log(f"resumed from {run.args.resume} at step {run.start_step} "
            f"(training index {run.index.tokens_added if run.index else 0:,} tokens)")
