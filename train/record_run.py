"""`train_gpt.py --arch record`: the hinted record's run, top to bottom (the record's train_gpt.py main):

set up -> data (the BOS-aligned packed loader, the validation reader) -> model, n-gram table and
optimizers -> the untimed warm-up over every configuration, then the full reset -> the clock: the
training-time hints' index build (local rank 0, in a thread), the prefix table, the steps with their
tail ticks, the canonical mask, the tail ship -> the final validation (off the clock) with the
averaged weights, the canonical mask, without and with hints -> the summary.

Validation hints (train/record_val_index.py): --val-index if given, else the node's background index,
built on the clock over the first --hint-tokens training tokens as the record's (35B on its node) and
waited for up to --bg-wait, else the training stream's positional index as of the run's end.
What is not the record's here: the prefix table
and the canonical mask need GPT-2's vocabulary (a smaller --vocab-size, the tests', runs without
them, and the log says so); no intermediate validation, checkpoints or resume on this path.
"""
import hashlib
import json
import os
import threading
import time

import numpy as np
import torch
import torch.distributed as dist

from data.canonical_mask import build_canonical_mask
from data.manifest import check_token_ids
from data.packed_loader import PackedLoader, ValidationReader
from data.prefix_tokens import prefix_table
from data.tokenizer import VOCAB_SIZE
from hints.cells import BOS
from model import gpu_paths_enabled
from model.ngram_table import NgramTable
from model.record_flops import train_flops_per_token
from model.record_gpt import RecordGPT
from model.record_loss import SampledSoftmax
from train.data import repo_glob
from train.meter import H100_BF16_DENSE_PEAK_FLOPS
from train.positional_hints import PositionalHints, cells_to_arrays, node_directory
from train.record_loop import Batches, RecordTrainer, record_hints
from train.record_optim import RecordOptimizers
from train.record_setup import record_config, record_gpu_memory, record_schedule, tokens_per_rank
from train.record_val_index import RecordValIndex, plan_record_run
from train.run import start_run
from train.val_hints import VAL_FOLLOWERS

DEMO_FILES = "data/local_corpus/train_*.bin"
# Threads of the canonical mask's build beside training (the record builds it on the cores its ranks leave).
CANON_MASK_THREADS = 1


def weights_digest(model) -> str:
    """SHA-256 of every parameter's bytes: equal on all ranks iff they hold the same weights."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


class CanonicalMaskBuild:
    """The canonical mask built by rank 0 in a thread (data/canonical_mask.py), started on the clock;
    result() joins it and broadcasts it to every rank (a collective), on the device."""

    def __init__(self, vocab_size: int, d):
        self.vocab_size, self.d, self.mask, self.error = vocab_size, d, None, None
        self.thread = None
        if d.master:
            self.thread = threading.Thread(target=self._build, name="canonical-mask-build", daemon=True)
            self.thread.start()

    def _build(self):
        try:
            self.mask = torch.from_numpy(build_canonical_mask(self.vocab_size, threads=CANON_MASK_THREADS))
        except BaseException as e:  # noqa: BLE001 - result() reports it on the main thread
            self.error = e

    def result(self) -> torch.Tensor:
        if self.thread is not None:
            self.thread.join()
            if self.error is not None:
                raise RuntimeError(f"the canonical mask build failed: {self.error!r}") from self.error
        V = self.vocab_size
        mask = (self.mask if self.d.master else torch.empty(V, V // 8, dtype=torch.uint8)).to(self.d.device)
        if self.d.distributed:
            dist.broadcast(mask, 0)
        return mask


def open_record_data(args, d, log, schedule):
    """(train files, the run's loader, a loader factory, the validation reader), every shard checked."""
    if args.train_files == DEMO_FILES and d.local_rank == 0:
        from data.local_corpus import build_local_corpus
        build_local_corpus(progress=d.master)
    d.barrier()
    train_files, val_files = repo_glob(args.train_files), repo_glob(args.val_files)
    T = tokens_per_rank(args, d.world_size)
    if args.val_batch_tokens % d.world_size:
        raise SystemExit(f"error: argument --val-batch-tokens: {args.val_batch_tokens:,} does not split over "
                         f"{d.world_size} ranks")

    def loader(cuts, rank=d.rank):
        return PackedLoader(train_files, cuts, tokens_per_rank=T, rank=rank, world_size=d.world_size)

    try:
        for files in (train_files, val_files):
            check_token_ids(files, args.vocab_size, log=log, progress=d.master)
        reader = ValidationReader(val_files, tokens_per_rank=args.val_batch_tokens // d.world_size, rank=d.rank,
                                  world_size=d.world_size, val_tokens=args.val_tokens)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    log(f"data: train {train_files} (packed rows of {T:,} tokens a rank, documents cut at "
        f"{sorted({st.cut_tokens for st in schedule.stages})} tokens by stage), val {val_files} "
        f"({len(reader)} batches of {reader.batch_tokens:,} tokens)")
    return train_files, loader, reader


def step_speed(cfg, schedule, steps: int, loop_s: float, hint_s: float, d) -> dict:
    """The timed steps' speed (loop_s: their wall time, clock start to the last step's end after a device
    sync; hint_s: the loop's time in the hint lookups): ms/step, tokens/s, the model FLOPs per token
    (model/record_flops.py, averaged over the steps trained), MFU against the H100's dense bf16 peak on
    CUDA (None elsewhere), the hints' share of step time and the peak GPU memory (None off CUDA)."""
    n = max(steps, 1)
    step_ms = max(loop_s / n * 1e3, 1e-9)
    tokens_per_s = steps * schedule.tokens_per_step / loop_s if loop_s > 0 else 0.0
    flops = sum(train_flops_per_token(cfg, schedule.plan(s)) for s in range(steps)) / n
    mfu = flops * tokens_per_s / (H100_BF16_DENSE_PEAK_FLOPS * d.world_size) if d.cuda else None
    return dict(steps_timed=steps, loop_time_s=loop_s, step_ms=step_ms, tokens_per_s=tokens_per_s,
                flops_per_token=flops, mfu=mfu, hint_ms_per_step=hint_s / n * 1e3,
                hint_share=hint_s / n * 1e3 / step_ms,
                peak_memory_gib=torch.cuda.max_memory_allocated(d.device) / 2**30 if d.cuda else None)


def speed_line(s: dict) -> str:
    mfu = f"MFU {s['mfu']:.1%}" if s["mfu"] is not None else "MFU n/a (no CUDA)"
    mem = f"peak memory {s['peak_memory_gib']:.1f} GiB" if s["peak_memory_gib"] is not None else "peak memory n/a"
    return (f"speed: {s['steps_timed']} steps in {s['loop_time_s']:.1f}s, {s['step_ms']:.1f}ms/step, "
            f"{s['tokens_per_s']:,.0f} tok/s, {s['flops_per_token'] / 1e6:.1f} MFLOP/token, {mfu}; hint lookups "
            f"{s['hint_ms_per_step']:.2f}ms/step ({s['hint_share']:.1%} of step time); {mem}")


def record_main(args, planned=False):
    """The run; planned: the preset's background index is sized to the node (train/plan.py)."""
    hint_files = repo_glob(args.hint_files or args.train_files)
    plan = plan_record_run(args, hint_files, planned)
    if args.plan:  # the node's host plan and, per GPU, what its ranks hold (train/record_memory.py)
        return print(json.dumps({**plan.to_dict(), "gpu_memory": record_gpu_memory(args, plan.n_ranks)}, indent=1))
    run = start_run(args, plan, hint_files)
    d, log = run.d, run.log
    schedule = record_schedule(args)
    train_files, loader, reader = open_record_data(args, d, log, schedule)
    cut = lambda step: schedule.plan(step).cut_tokens  # noqa: E731
    T = tokens_per_rank(args, d.world_size)

    # -- model, table, optimizers ----------------------------------------------------------------------
    torch.manual_seed(args.seed), np.random.seed(args.seed)
    cfg = record_config(args, schedule)
    model = RecordGPT(cfg, world_size=d.world_size).to(d.device)
    if gpu_paths_enabled() and d.cuda:
        model.cast_to_record_dtypes()
    if d.distributed:
        for t in model.state_dict().values():
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                dist.broadcast(t, 0)
    table = NgramTable(args.ngram_rows, cfg.model_dim, world_size=d.world_size, rank=d.rank,
                       dtype=torch.bfloat16 if d.cuda else torch.float32, device=d.device,
                       period4_start=schedule.table_switch)
    optimizers = RecordOptimizers(model.labelled_params(), schedule, table=table, rank=d.rank,
                                  world_size=d.world_size)
    sampled = SampledSoftmax(cfg.padded_vocab_size, rank=d.rank, world_size=d.world_size)
    positional = None
    if not args.no_hints:
        positional = PositionalHints(node_directory(run.run_id, d.node), 1, T, d.rank, d.world_size,
                                     args.hint_lengths)
    hint_s = [0.0]  # the loop's wall time in the hint lookups (any wait for the index, the copy to the device)

    def hints(batch, step):
        t = time.perf_counter()
        out = record_hints(*positional.lookup(batch.inputs, step), d.device)
        hint_s[0] += time.perf_counter() - t
        return out

    hints = hints if positional else None
    trainer = RecordTrainer(model, table, optimizers, schedule, sampled, device=d.device, hints=hints)
    val_source = RecordValIndex(args, d, log, run.run_id, hint_files, plan)  # the background builder starts here
    params = sum(p.numel() for p in model.parameters())
    log(f"model: record {cfg.model_dim} wide, {cfg.n_head} heads of {cfg.head_dim}, {params / 1e6:.2f}M parameters, "
        f"n-gram table {args.ngram_rows:,} x {cfg.model_dim} ({d.world_size} shard(s)), fp8 {cfg.fp8}")
    log(f"recipe: {schedule.steps} steps x {schedule.tokens_per_step:,} tokens, stages at "
        f"{[st.first_step for st in schedule.stages]}, switches {schedule.switches()}")

    # -- the untimed warm-up over every configuration, then the full reset ----------------------------
    warmup_s = None
    if args.record_warmup:
        warm = schedule.warmup_steps()
        t0 = time.perf_counter()
        trainer.run(warm, Batches(loader([cut(s) for s in warm])), warmup=True)
        trainer.reset()
        d.sync()
        warmup_s = time.perf_counter() - t0
        log(f"warm-up: steps {warm} in {warmup_s:.1f}s (untimed, then reset)")

    steps = min(schedule.steps, args.stop_after or schedule.steps)  # the steps this run trains

    # -- the clock ----------------------------------------------------------------------------------------
    val_source.arm()  # untimed: the builder reserves its table and reads its shards, then waits for the clock
    d.barrier()
    d.sync()
    t0 = time.perf_counter()
    val_source.clock_started()
    if positional is not None and d.local_rank == 0:  # its build is training-side work: on the clock
        positional.start_build(train_files, steps, log=log, loader=loader(cut, rank=0))
    gpt2_vocab = args.vocab_size >= VOCAB_SIZE
    mask = None
    if gpt2_vocab and not args.no_canonical_mask:  # rank 0 builds it in a thread beside training (the record's)
        mask = CanonicalMaskBuild(cfg.padded_vocab_size, d)
    if gpt2_vocab:
        trainer.prefix_table = torch.from_numpy(prefix_table(cfg.padded_vocab_size)).to(d.device)
    losses = []

    def on_step(step, loss):
        losses.append(loss)
        done = step + 1
        if done % args.log_every == 0 or done in (1, schedule.steps):
            line = (f"step {done}/{schedule.steps} train_loss {loss.item() / T:.4f} (MTP and prefix terms, per token) "
                    f"train_time {time.perf_counter() - t0:.1f}s")
            log(line)

    trainer.run(list(range(steps)), Batches(loader(cut)), on_step=on_step)
    d.sync()
    loop_s = time.perf_counter() - t0  # the steps alone: what ms/step, tokens/s and MFU are measured on
    canon_mask = mask.result() if mask is not None else None
    if steps == schedule.steps:
        optimizers.ship()
    d.sync()
    train_s = time.perf_counter() - t0
    val_source.clock_stopped()
    log(f"training: {steps} of {schedule.steps} steps in {train_s:.1f}s; "
        f"{'tail-averaged weights' if steps == schedule.steps else 'stopped early: the last iterate, no tail ship'}; "
        f"prefix term {'on' if gpt2_vocab else 'off (not GPT-2 vocabulary)'}, "
        f"canonical mask {'on' if canon_mask is not None else 'off'}")

    # -- the final validation (off the clock) -------------------------------------------------------------
    val_hints, val_index = None, None
    if positional is not None:
        if d.local_rank == 0:
            positional.wait_built()
        d.barrier()
        # --val-index, else the background index (a wait for it is training time), else the training stream's
        val_index, waited = val_source.final(positional.trained(steps))
        train_s += waited

    if val_index is not None:
        def val_hints(tokens):
            cells = val_index.lookup_cells(tokens, max_followers=VAL_FOLLOWERS, boundary=BOS)
            return record_hints(*cells_to_arrays(cells, 1, len(tokens)), d.device)

    t_val = time.perf_counter()
    res = trainer.validate(reader, val_hints=val_hints, canon_mask=canon_mask, dist=d)
    val_s = time.perf_counter() - t_val
    hinted = f"{res['val_loss_hints']:.4f}" if res["val_loss_hints"] is not None else "n/a"
    source = f"hints from the {val_source.source.kind} index" if val_source.source else "no hints"
    log(f"step {steps}/{schedule.steps} val_loss_hints {hinted} val_loss_nohints {res['val_loss_nohints']:.4f} "
        f"[{res['val_tokens']:,} val tokens, {source}, canonical mask "
        f"{'on' if canon_mask is not None else 'off'}, train_time {train_s:.1f}s]")
    speed = step_speed(cfg, schedule, steps, loop_s, hint_s[0], d)
    log(speed_line(speed))
    summary = dict(run_id=run.run_id, preset=args.preset, arch="record", world_size=d.world_size,
                   device=str(d.device), log_file=run.log.path, tokens_per_rank=T, ngram_rows=args.ngram_rows,
                   warmup_time_s=warmup_s, val_time_s=val_s, **speed,
                   steps=schedule.steps, steps_trained=steps, tokens_per_step=schedule.tokens_per_step,
                   # every trained token is a packed input (the loader drops remainders); the training-time
                   # index covers the stream trained on (docs/design.md's summary keys)
                   train_tokens=steps * schedule.tokens_per_step,
                   hint_tokens_train=steps * schedule.tokens_per_step if positional is not None else 0,
                   train_time_s=train_s,
                   tail_shipped=steps == schedule.steps, warmup=args.record_warmup, no_hints=args.no_hints,
                   canonical_mask=canon_mask is not None,
                   **val_source.facts(attempt=args.preset == "record" and steps == schedule.steps),
                   prefix_term=gpt2_vocab, train_losses=[x.item() / T for x in losses],
                   param_digests=d.gather(weights_digest(model)), **res)
    if d.master and args.summary_json:
        os.makedirs(os.path.dirname(os.path.abspath(args.summary_json)), exist_ok=True)
        with open(args.summary_json, "w") as f:
            json.dump(summary, f, indent=1)
    val_source.close()
    if summary["record_valid"] is False:
        log(f"record attempt FAILED: {summary['record_reason']}")
    log.close()
    d.close()
    if summary["record_valid"] is False:
        raise SystemExit(1)
    return summary
