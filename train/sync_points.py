"""The timed loop's sync points: the steps where the clock and the prep thread stop.

A validation (every --val-every steps and at the end), a checkpoint (--save-checkpoint: every
--checkpoint-every steps and at the end), and, from --switch-hints-at on, each log interval's
question whether every rank has the background index, until one does (then training-time hints
are looked up there). At a sync point the prep thread has stopped at that step, so the training
index and the loader are as of it; `sync_point` does the step's work and restarts the clock.
"""
import time

from train import checkpoint
from train.evaluate import validate
from train.val_hints import VAL_LOOKUP_WORKERS


class SyncPoints:
    def __init__(self, run):
        args, total = run.args, run.steps
        self.total = total
        self.val = {s for s in range(1, total + 1) if s == total or (args.val_every and s % args.val_every == 0)}
        self.checkpoint = {s for s in range(1, total + 1) if args.save_checkpoint and (
            s == total or (args.checkpoint_every and s % args.checkpoint_every == 0))}
        self.switch = (set(range(args.switch_hints_at, total, args.log_every))
                       if args.switch_hints_at and run.with_background else set())

    def __contains__(self, step):
        return step in self.val | self.checkpoint | self.switch

    def next_after(self, step):
        """The first sync point after `step` (the prep thread's limit), else the last step."""
        return min((t for t in self.val | self.checkpoint | self.switch if t > step), default=self.total)


def sync_point(run, sync, step):
    """Stop the clock at `step`, wait for the prep thread to stop there, validate, checkpoint and
    switch training-time hints as `sync` says, and restart the clock unless the run ends here."""
    meter, prep, log = run.meter, run.prep, run.log
    meter.stop()
    prep.wait_idle()  # the thread stopped at this step: index and loader are as of `step`
    if step in sync.val:
        meter.record_val(step, validate(run, step), log)
    if step in sync.checkpoint:
        t0, path = time.perf_counter(), checkpoint.step_path(run.args.save_checkpoint, step, step == run.steps)
        checkpoint.save_run(path, step, run.d, model=run.model, optimizers=run.optimizers, loader=run.loader,
                            index=run.index, tail=prep.tail, progress=meter.snapshot(), settings=run.settings,
                            args=run.args)
        log(f"checkpoint: step {step} -> {path} (+ manifest) in {time.perf_counter() - t0:.1f}s")
    background = run.background
    if step in sync.switch and all(run.d.gather(background is not None and background.ready())):
        prep.switch_lookups(background.open(workers=VAL_LOOKUP_WORKERS))
        sync.switch.clear()
        meter.switched_at = step
        log(f"training-time hints: from step {step + 1} on, looked up in the background index "
            f"({background.describe()})")
    if step < run.steps and not meter.target:
        prep.set_limit(sync.next_after(step))
        prep.wait_filled()
        meter.start()
