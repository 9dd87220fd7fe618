"""The run's end: its summary (the JSON that --summary-json writes and scripts/compare.py reads),
the record attempt's verdict, and the close.

`run_summary` gathers the run's facts from train/run.py's Run and hands them to the meter, which
logs the final lines and adds the last validation and the timing totals (train/meter.py).
`close_run` writes the JSON (rank 0), closes the background index once every rank is done with it,
and exits 1 when a record attempt failed (docs/record.md).
"""
import json
import os

from train import checkpoint
from train.val_hints import record_verdict


def run_summary(run):
    """The summary dict, the same on every rank, with rank 0's record verdict."""
    args, d, meter, background, positional = run.args, run.d, run.meter, run.background, run.positional
    # the final validation: when the clock stopped for it (seconds after the clock's start, as the builder's
    # ready_s) and how long it then waited for the index (training time)
    stopped = meter.stopped_at - meter.clock_start if meter.stopped_at is not None else None
    bg_status = dict(background.status(), final_validation_s=stopped,
                     final_wait_s=meter.last_val.get("bg_wait_s", 0.0)) if background else None
    # rank 0's verdict on every rank (it owns node 0's builder, and only the owner measured it at the clock's start)
    # (a record attempt: the record preset with hints and its background index; --no-hints, --hint-tokens 0 and
    # --val-hints exact runs are experiments)
    attempt = args.preset == "record-2025" and not args.no_hints and run.with_background
    record_valid, record_reason = d.broadcast(record_verdict(attempt, meter.last_val, bg_status))
    steps = meter.target[0] if meter.target else run.steps
    digests = d.gather(checkpoint.param_digest(run.model))
    facts = {
        "run_id": run.run_id, "preset": args.preset, "arch": args.arch, "world_size": d.world_size,
        "device": str(d.device), "resumed_from_step": run.start_step if args.resume else None,
        "seq_len": run.seq_len, "batch_size": args.batch_size, "hint_lengths": list(run.lengths),
        "hint_kinds": run.model.cfg.n_hint_kinds, "no_hints": args.no_hints,
        "hint_tokens_train": int(run.index.tokens_added) if run.index is not None else (
            run.steps * run.global_batch if positional is not None else 0),
        "hint_repr": args.hint_repr,
        "positional_build_s": positional.build_s if positional is not None else None,
        "positional_build_started_s": (positional.started_at - meter.clock_start  # seconds after the clock's start
                                       if positional is not None and positional.started_at is not None else None),
        "positional_phases": positional.phases if positional is not None else None,
        "hint_prep_started_s": (run.prep.started_at - meter.clock_start  # the prep thread's first step, after the clock's start
                                if run.prep.started_at is not None and meter.clock_start is not None else None),
        "background": bg_status, "record_valid": record_valid, "record_reason": record_reason,
        "val_hint_path": args.val_hints, "val_hints_count_s": run.exact.seconds if run.exact else None,
        "val_hints_in_timed_region": False, "hints_switched_at_step": meter.switched_at,
        "plan": run.plan.to_dict() if run.plan else None,
        "checkpoint": args.save_checkpoint, "log_file": run.log.path,
    }
    return meter.finish(run.log, steps, digests, **facts)


def close_run(run, summary):
    """Write the summary (rank 0, --summary-json), close the background index, the log and the
    processes; SystemExit(1) when the run was a record attempt that failed."""
    args, d, log = run.args, run.d, run.log
    if d.master and args.summary_json:
        os.makedirs(os.path.dirname(os.path.abspath(args.summary_json)), exist_ok=True)
        with open(args.summary_json, "w") as f:
            json.dump(summary, f, indent=1)
        log(f"summary: {args.summary_json}")
    d.barrier()  # every rank is done with the background index before its owner removes it
    if run.background is not None:
        run.background.close()
    if summary["record_valid"] is False:
        log(f"record attempt FAILED: {summary['record_reason']}")
    log.close()
    d.close()
    if summary["record_valid"] is False:
        raise SystemExit(1)
