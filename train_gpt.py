"""train_gpt.py: the NanoGPT speedrun with n-gram hints. A script: it reads top to bottom.

set up -> data -> model -> hint indexes -> resume -> warm-up -> the loop -> summary. main() is that
outline; the run's shared state is one object, train/run.py's Run, and train/ holds the rest.

Training-time hints come only from tokens already trained on (train/hint_prep.py, in a thread
ahead of the GPU): with --hint-repr record from one exact positional index per node over the known
training stream, built by local rank 0 in phases and mapped by the other ranks
(train/positional_hints.py); with "lengths" (every preset's) every rank grows a small index with
each step's global batch after looking up that step's hints. Validation reports loss with and
without hints, with hints from the large index a separate process builds from training shards
while the GPUs train, from the clock's start (hints/index/background.py, docs/record.md), else
--val-index, else the training index (train/evaluate.py). The record preset validates once, at the
end, waiting for that index.
docs/design.md explains the whole; --help lists every flag.

    python train_gpt.py --preset demo                               # CPU, one process
    torchrun --standalone --nproc_per_node=8 train_gpt.py --preset record
"""
import argparse
import atexit
import faulthandler
import json
import os
import random
import signal
import sys

import numpy as np
import torch

from data.loader import SPEEDRUN_VAL_TOKENS
from data.packed_loader import VAL_TOKENS_PER_RANK
from data.tokenizer import VOCAB_SIZE
from data.units import human_tokens, parse_token_count
from hints.index import DEFAULT_LENGTHS, parse_lengths
from model import HINT_REPRS, RECORD_BACKBONE
from model.gpt import ATTN_BLOCK_SIZE
from model.ngram_table import NGRAM_ROWS
from train import checkpoint
from train.common import REPO_DIR, keep_freed_memory
from train.data import open_data, repo_glob
from train.describe import describe_run
from train.hint_indexes import open_hint_indexes
from train.hint_prep import HintPrep
from train.meter import Meter
from train.plan import (FINEWEB100B_TRAIN_TOKENS, RECORD_GLOBAL_BATCH_TOKENS, RECORD_HINT_WORKERS, RECORD_MAX_RANK_BATCH,
                        RECORD_STEPS, add_plan_args, plan_for_run)
from train.record_run import record_main
from train.record_schedule import BLOCK_TOKENS
from train.record_schedule import RECORD_STEPS as RECORD_SCHEDULE_STEPS
from train.record_schedule import TOKENS_PER_STEP as RECORD_TOKENS_PER_STEP
from train.run import resume, start_run
from train.step import LLMC_STEPS, build_model
from train.summary import close_run, run_summary
from train.sync_points import SyncPoints, sync_point
from train.val_hints import arm_background
from train.warmup import warm_up

# The 2025-01-04 record's Muon momentum warm-up (0.85 -> 0.95 over 300 of its 1390 steps), scaled
# to the article's 270 steps.
RECORD_MOMENTUM_WARMUP = round(300 * RECORD_STEPS / 1390)
# The record's data: FineWeb100B, one dataset. It trains on its train shards and validates on its val
# shard; the background index is built from the first of the same train shards (the plan's number;
# the shards it trains on included, the val shard never), as the article's record does.
RECORD_TRAIN_FILES = "data/fineweb100B/fineweb_train_*.bin"
RECORD_VAL_FILES = "data/fineweb100B/fineweb_val_*.bin"
SPEEDRUN_TARGET_VAL_LOSS = 3.28  # the speedrun's target: FineWeb val loss (first 10,485,760 tokens)
LLMC_LENGTHS = (5, 6, 10, 20)
# llmc's training-time index: sized for the run's tokens up to 1B (2^10 x 2^14 x 176, 22 GiB a rank,
# at half a token per slot), not the 10B of a full llm.c run: hinted runs reach the target long
# before (the article: 28 s), and later hints are dropped, not wrong. A short run gets a small one.
LLMC_TRAIN_INDEX_TOKENS = 1_000_000_000
GPT2_HEADS = 12  # GPT-2 124M has 12 heads of 64 (the speedrun record uses 6 of 128)
# The hint representation of the presets on the speedrun and gpt2 archs (the record arch reads the
# record's cells only). Set by the CPU A/B of docs/hints_ab.md (3 seeds, paired, width 128, 150 steps,
# the LM head's rows in both): on man-page prose "lengths" reached a val loss with hints 0.147 lower
# than "record" (median; 0.085-0.179 lower, every seed); on Python source they tied ("lengths" 0.007
# lower at the median; from 0.011 lower to 0.071 higher); at the demo-2025 preset on Python source
# "lengths" was 0.069 lower (0.053-0.147, every seed). "record" (the record's cells and its positional
# index): --hint-repr record.
DEFAULT_HINT_REPR = "lengths"

# The record's validation batch: 262,144 tokens a rank on its 8 ranks (data/packed_loader.py).
RECORD_VAL_BATCH_TOKENS = 8 * VAL_TOKENS_PER_RANK

PRESETS = {
    # The hinted record (RECORD.md): its 11 x 512 model, 4 heads, the hashed n-gram table, and its recipe
    # (train/record_schedule.py): 570 steps x 131,072 BOS-aligned packed tokens (16,384 a rank on 8),
    # ANVIL + Adam, the warm-up then a full reset, tail averages, one final validation of 10,485,760
    # tokens in batches of 2,097,152 with the canonical mask, with and without the record's hints.
    "record": dict(arch="record", n_layer=11, n_embd=512, n_head=4, steps=RECORD_SCHEDULE_STEPS,
                   tokens_per_step=RECORD_TOKENS_PER_STEP, block_tokens=BLOCK_TOKENS, ngram_rows=NGRAM_ROWS,
                   val_tokens=SPEEDRUN_VAL_TOKENS, val_batch_tokens=RECORD_VAL_BATCH_TOKENS,
                   hint_lengths=DEFAULT_LENGTHS,
                   hint_repr="record", fp8="on", train_files=RECORD_TRAIN_FILES, val_files=RECORD_VAL_FILES,
                   log_every=25, val_every=0, warmup_steps=0,
                   # the validation index: built on the clock from the first training shards (the record's 350,
                   # 35B tokens), sized to the node by train/plan.py; the final validation waits for it however
                   # long it takes (the record's was ready 6.42-6.54 s into its 7.07 s run; the wait is training
                   # time), and a builder that died fails the attempt (train/record_val_index.py)
                   hint_tokens=None, hint_workers=1, bg_wait=float("inf")),
    # The January 2025 backbone's record attempt (the previous record preset): speedrun GPT 12 x 768,
    # 6 heads, seq_len 2048, ~262k tokens a step, 270 steps, then one validation (the first 10,485,760
    # FineWeb val tokens, off the clock) with hints at or below 3.28 as the target. The background index
    # is built on the clock and the final validation waits for it however long it takes (the wait is
    # training time); a builder that died fails the attempt (docs/record.md).
    "record-2025": dict(arch="speedrun", n_layer=12, n_embd=768, n_head=6, seq_len=2048, hint_lengths=DEFAULT_LENGTHS,
                   batch_size=None, steps=RECORD_STEPS, val_tokens=SPEEDRUN_VAL_TOKENS,
                   val_every=0, target_val_loss=SPEEDRUN_TARGET_VAL_LOSS, **RECORD_BACKBONE,
                   muon_momentum_warmup=RECORD_MOMENTUM_WARMUP, grad_sync="overlap", compile_mode="regions",
                   val_batch_size=None, train_files=RECORD_TRAIN_FILES, val_files=RECORD_VAL_FILES,
                   hint_tokens=None,  # None: the plan's (train/plan.py), up to the article's 35B
                   hint_workers=RECORD_HINT_WORKERS, bg_wait=float("inf"), warmup_steps=10, log_every=10,
                   hint_repr=DEFAULT_HINT_REPR,
                   bg_seal=False),  # ready as soon as built: sealing is a pass over the table on the clock, and
                                    # only speeds up the validation's lookups, which are off it
    # The record arch on the CPU: a small width and table, documents cut in blocks of 16 tokens, the
    # recipe scaled to 84 steps (every stage and switch in miniature; RecordSchedule's MIN_STEPS).
    "demo": dict(arch="record", n_layer=11, n_embd=128, n_head=4, steps=84, tokens_per_step=1024,
                 block_tokens=16, ngram_rows=65_536, val_tokens=16_384, val_batch_tokens=4096,
                 hint_lengths=DEFAULT_LENGTHS, hint_repr="record", fp8="off",
                 train_files="data/local_corpus/train_*.bin", val_files="data/local_corpus/val_*.bin",
                 log_every=10, val_every=0, warmup_steps=0, hint_workers=1,
                 hint_tokens=16_000_000,  # more than the corpus holds (~14.4M): the whole training split
                 # its 14.4M tokens were ready 1.6-2.0 s after the clock started on a loaded 2-core host (2 builder
                 # workers; docs/runs.md), minutes before the last step; 60 s leaves a busier host 30x that
                 bg_wait=60.0),
    # The January 2025 backbone's CPU demo on the local corpus (Python's standard library,
    # data/local_corpus.py; the demo before the record arch). Measured on a 2-core box: ~0.6 s per
    # step of 2 x 256 tokens, so 300 steps + 2 validations of 32,768 tokens with and without hints
    # take ~4 minutes.
    "demo-2025": dict(arch="speedrun", n_layer=4, n_embd=256, n_head=4, seq_len=256, batch_size=2, steps=300,
                 hint_lengths=DEFAULT_LENGTHS, grad_sync="allreduce", compile_mode="model",
                 val_tokens=32_768, val_every=150, val_batch_size=8,
                 train_files="data/local_corpus/train_*.bin", val_files="data/local_corpus/val_*.bin",
                 hint_tokens=16_000_000,  # more than the corpus holds (~14M): the whole training split
                 hint_workers=1, bg_wait=120.0, warmup_steps=0, log_every=10, hint_repr=DEFAULT_HINT_REPR),
    # The article's second result: llm.c's GPT-2 124M recipe (AdamW, 64 x 1024 tokens per rank =
    # 524,288 per step on 8 GPUs, 700 warm-up steps of 18,865 for 10B tokens) with hints of four
    # lengths, one shorter than 6, from the largest FineWeb100B corpus the node holds (the plan).
    # 5,6,10,20: measured with `python -m hints scaling` on held-out text against 3 and 4 (docs/design.md).
    "llmc": dict(arch="gpt2", n_layer=12, n_embd=768, n_head=12, seq_len=1024, batch_size=64, steps=LLMC_STEPS,
                 hint_lengths=LLMC_LENGTHS, val_tokens=SPEEDRUN_VAL_TOKENS, val_every=25,
                 target_val_loss=SPEEDRUN_TARGET_VAL_LOSS, val_batch_size=16,
                 train_files="data/fineweb10B/fineweb_train_*.bin", val_files="data/fineweb10B/fineweb_val_*.bin",
                 hint_files="data/fineweb100B/fineweb_train_*.bin", hint_tokens=None,
                 hint_workers=RECORD_HINT_WORKERS, bg_wait=0.0, warmup_steps=10, log_every=10,
                 train_index_max_tokens=LLMC_TRAIN_INDEX_TOKENS, grad_sync="overlap", compile_mode="regions",
                 hint_repr=DEFAULT_HINT_REPR),
}
PLANNED_PRESETS = ("record", "record-2025", "llmc")  # their background index is sized to the node by train/plan.py


def count(minimum):
    """An argparse type: an int >= minimum (argparse names the flag when it is not)."""
    def parse(text):
        v = int(text)
        if v < minimum:
            raise argparse.ArgumentTypeError(f"{text}: expected an integer >= {minimum}")
        return v
    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Train a speedrun GPT with n-gram hints. Flags left unset take "
                                "the preset's value.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="demo", help="record: 8xH100; demo: a few CPU minutes")
    g = p.add_argument_group("data")
    g.add_argument("--train-files", help="glob of training .bin shards")
    g.add_argument("--val-files", help="glob of validation .bin shards")
    g.add_argument("--val-tokens", type=parse_token_count, help="validate on the first N tokens of the val shards")
    g.add_argument("--seq-len", type=count(1), help="tokens per sequence")
    g.add_argument("--batch-size", type=count(1), help="sequences per rank per step")
    g.add_argument("--val-batch-size", type=count(1), help="sequences per rank per validation batch")
    g.add_argument("--align-documents", action="store_true", help="start every training sequence at an "
                   "end-of-text token within its first seq-len tokens (training-time hints stay causal)")
    g = p.add_argument_group("model")
    g.add_argument("--arch", choices=("speedrun", "gpt2", "record"), help="speedrun GPT (January 2025), the llm.c "
                   "GPT-2 baseline, or the hinted record's model and recipe (train/record_run.py)")
    g.add_argument("--n-layer", type=count(2))
    g.add_argument("--n-embd", type=count(2))
    g.add_argument("--n-head", type=count(1))
    g.add_argument("--vocab-size", type=count(2), default=VOCAB_SIZE, help="(tests use small ones)")
    for flag, what in (("unet-skips", "U-net skip connections with learned weights"),
                       ("embed-skips", "each block mixes in the embedding output x0"),
                       ("window-attn", "sliding-window attention, masked at documents, the window growing in training")):
        g.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, help=f"speedrun backbone: {what}")
    g.add_argument("--value-embeds", type=count(0), help="speedrun backbone: value-embedding tables (0: none)")
    g.add_argument("--no-attn-layers", type=lambda t: tuple(int(i) for i in t.split(",") if i),
                   help="speedrun backbone: blocks without attention, e.g. 7 ('' for none)")
    g.add_argument("--rope", choices=("full", "half"), help="speedrun backbone: rotary on every pair or half of them")
    g.add_argument("--head-init-std", type=float, default=0.0, help="speedrun: the LM head's init std (0: zeros, "
                   "modded-nanogpt's; the hinted record's is 0.005, docs/design.md 'Which table the hints read')")
    g.add_argument("--attn-block-size", type=count(1), default=ATTN_BLOCK_SIZE,
                   help="tokens per attention block of --window-attn (the window grows in whole blocks)")
    g = p.add_argument_group("the record arch (--arch record)")
    g.add_argument("--tokens-per-step", type=count(1), help="packed tokens a step over all ranks (record: 131,072)")
    g.add_argument("--block-tokens", type=count(1), help="tokens of an attention block, the unit of the windows and "
                   "document cuts (record: 128)")
    g.add_argument("--ngram-rows", type=count(4), help="rows of the hashed bigram/trigram table (record: 84,602,880)")
    g.add_argument("--val-batch-tokens", type=count(1),
                   help="validation tokens a batch over all ranks (record: 2,097,152)")
    g.add_argument("--fp8", choices=("on", "off"), help="the record's fp8 training GEMMs (model/fp8.py: real fp8 on "
                   "the GPU path, a quantize round trip on the CPU; record: on, demo: off, the CPU round trip "
                   "being most of a demo step's time)")
    g.add_argument("--no-canonical-mask", action="store_true", help="final validation without the canonical-token mask")
    g.add_argument("--stop-after", type=count(1), help="train only the first N steps of the --steps schedule, then "
                   "validate the last iterate (no tail ship; tests and quick checks)")
    g.add_argument("--record-warmup", action=argparse.BooleanOptionalAction, default=True,
                   help="the untimed warm-up over every training configuration, then the full reset")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=count(1), help="optimizer steps (timed)")
    g.add_argument("--warmup-steps", type=count(0), help="untimed steps run first and then undone (compile)")
    g.add_argument("--lr-scale", type=float, default=1.0, help="multiplies every learning rate")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the model (default: on the GPU path only)")
    g.add_argument("--compile-mode", choices=("model", "regions"), help="compile the whole model, or each block and "
                   "the head (regions: gradients complete block by block, so --grad-sync overlap overlaps)")
    g.add_argument("--grad-sync", choices=("allreduce", "overlap"), help="average gradients after backward, or in "
                   "buckets started during backward with Muon reduce-scattering its own matrices")
    g.add_argument("--muon-momentum-warmup", type=count(0), help="steps over which Muon's momentum rises from "
                   "0.85 to 0.95 (0: constant 0.95)")
    g = p.add_argument_group("hints")
    g.add_argument("--no-hints", action="store_true", help="train without hints (ablation)")
    g.add_argument("--hint-lengths", type=parse_lengths, help="n-gram lengths, e.g. 6,10,20")
    g.add_argument("--hint-repr", choices=HINT_REPRS, help="lengths: one hint per length from a per-rank growing "
                   "index (every preset's); record: the speedrun record's, one cell per position at the deepest match "
                   "and its followers, from one exact positional index per node (docs/hints_ab.md)")
    g.add_argument("--train-index-geometry", help="training-time index geometry: auto (sized for the run's "
                   "training tokens), a preset or P,B,S (default: the preset's, else auto)")
    g.add_argument("--hint-files", help="shards the background index is built from (default: --train-files)")
    g.add_argument("--hint-geometry", help="background index geometry (record: the plan's; else auto), a preset or P,B,S")
    g.add_argument("--hint-workers", type=count(1), help="threads of the training-time index per rank")
    g.add_argument("--hint-tokens", type=parse_token_count, help="tokens of the background validation index, "
                   "e.g. 75M, 1.2B, 37B (0: none; capped at the shards; record: the plan's)")
    g.add_argument("--bg-wait", type=float, help="seconds the final validation waits for a late background index, "
                   "then falls back (inf: until it is ready or fails; the record preset's)")
    g.add_argument("--val-index", help="a saved hint index to validate with when no background index is ready")
    g.add_argument("--switch-hints-at", type=count(0), default=0, help="from this step on, look training-time hints "
                   "up in the background index once it is ready on every rank (faster, timing-fragile; needs "
                   "--hint-files disjoint from --train-files; 0: never)")
    g.add_argument("--val-hints", choices=("background", "exact", "exact-gpu"), default="background",
                   help="validation hints from the background index (else --val-index, else the training index), or "
                   "exact counts of the val n-grams in the first --hint-tokens training tokens (torch; Triton on CUDA)")
    g = p.add_argument_group("evaluation, logging, checkpoints")
    g.add_argument("--val-every", type=count(0), help="validate every N steps (0: only at the end)")
    g.add_argument("--target-val-loss", type=float, help="stop at the first validation with hints at or below this "
                   "loss and report the training time to it (the speedrun's metric; record: 3.28)")
    g.add_argument("--log-every", type=count(1), help="a training log line every N steps")
    g.add_argument("--log-dir", default=os.path.join(REPO_DIR, "logs"), help="where the log file goes")
    g.add_argument("--summary-json", help="write the run's summary here (rank 0)")
    g.add_argument("--save-checkpoint", help="checkpoint path, written at the end (and every --checkpoint-every)")
    g.add_argument("--checkpoint-every", type=count(0), default=0, help="also checkpoint every N steps to PATH_stepN")
    g.add_argument("--resume", help="checkpoint to resume from (the same flags as the saved run)")
    g.add_argument("--describe", action="store_true", help="print the run's model and recipe as JSON and exit "
                   "(no data, no GPU, no download)")
    g.add_argument("--wandb", action="store_true", help="log to wandb (offline without WANDB_API_KEY)")
    g.add_argument("--wandb-project", default="ngram-hints-speedrun")
    add_plan_args(p)
    args = p.parse_args(argv)
    n_head_given = args.n_head is not None
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.train_index_geometry = args.train_index_geometry or "auto"
    for key, default in (("unet_skips", False), ("embed_skips", False), ("window_attn", False), ("value_embeds", 0),
                         ("no_attn_layers", ()), ("rope", "full"), ("muon_momentum_warmup", 0)):
        if getattr(args, key) is None:  # the Nov 2024 backbone unless the preset or a flag says otherwise
            setattr(args, key, default)
    if args.arch == "gpt2" and not n_head_given and args.n_embd % (2 * GPT2_HEADS) == 0:
        args.n_head = GPT2_HEADS
    if args.window_attn and args.seq_len % args.attn_block_size:
        p.error(f"argument --window-attn: --seq-len {args.seq_len} must be a multiple of --attn-block-size "
                f"{args.attn_block_size}")
    if args.switch_hints_at and args.hint_repr == "record":
        p.error("argument --switch-hints-at: serves --hint-repr lengths only (the record's training hints come "
                "from the positional index)")
    if args.bg_wait < 0:
        p.error(f"argument --bg-wait: {args.bg_wait}: expected seconds >= 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.describe:
        return print(json.dumps(describe_run(args), indent=1))
    if args.arch == "record":
        return record_main(args, planned=args.preset in PLANNED_PRESETS)
    hint_files = repo_glob(args.hint_files or args.train_files)
    plan = None  # the background index sized to this node (or --node-*), before any GPU, data or allocation
    if args.plan or (args.preset in PLANNED_PRESETS and args.val_hints == "background" and args.hint_tokens != 0):
        plan = plan_for_run(args, hint_files, default_tokens=FINEWEB100B_TRAIN_TOKENS if args.preset == "llmc" else None,
                            device="cuda" if torch.cuda.is_available() else "cpu")
        if args.plan:
            return print(plan.to_json())
        args.hint_tokens = plan.hint_tokens
    args.hint_tokens = args.hint_tokens or 0
    run = start_run(args, plan, hint_files)  # the processes, the run id, the log; train/run.py's Run holds the rest
    d, log = run.d, run.log

    # -- data ----------------------------------------------------------------------------------
    if args.batch_size is None:  # record: ~262k tokens per step over all ranks
        args.batch_size = max(1, min(RECORD_MAX_RANK_BATCH, RECORD_GLOBAL_BATCH_TOKENS // (d.world_size * args.seq_len)))
    args.val_batch_size = args.val_batch_size or args.batch_size
    B, T, total = args.batch_size, args.seq_len, args.steps
    run.train_files, _, run.loader, run.val_tokens = open_data(
        args, d, log, local_corpus=args.preset == "demo-2025" and args.train_files == PRESETS["demo-2025"]["train_files"])

    # -- model and optimizers --------------------------------------------------------------------
    torch.manual_seed(args.seed), np.random.seed(args.seed), random.seed(args.seed)
    run.model, run.train_model, run.optimizers, run.train_step = build_model(args, d, total)
    cfg = run.model.cfg
    log(f"model: {args.arch} {cfg.n_layer} layers x {cfg.n_embd} wide, {cfg.n_head} heads, seq_len {T}, "
        f"{sum(p.numel() for p in run.model.parameters()) / 1e6:.1f}M parameters, backbone features "
        f"{cfg.speedrun_features() or 'none'}")
    log(f"training: {total} steps x {run.global_batch:,} tokens ({d.world_size} x {B} x {T}) = "
        f"{human_tokens(total * run.global_batch)} tokens, lr x{args.lr_scale}, {run.train_step.describe()}")

    # -- hint indexes: training-time, validation, the background builder (train/hint_indexes.py) ----
    open_hint_indexes(run)

    # -- resume ------------------------------------------------------------------------------------
    run.settings = checkpoint.run_settings(args, cfg, run.geom, run.train_files)
    if args.resume:
        resume(run)

    # -- untimed warm-up (compiles the training and validation graphs), then undone ---------------
    if args.warmup_steps > 0:
        warm_up(run)

    # -- the timed loop: sync points (validation, checkpoints) stop the clock and the prep thread ----
    sync = SyncPoints(run)
    meter = run.meter = Meter(d, run.global_batch, run.model.flops_per_token(T), run.saved, args.target_val_loss)
    if run.with_background:  # the builder gets ready before the clock and hashes from its start
        arm_background(run.background, meter, d, log, timeout_s=None if args.bg_wait == float("inf") else args.bg_wait)
    positional = run.positional
    if positional and d.local_rank == 0:  # its n-grams are hashed on the clock: the build starts at its first start
        meter.on_clock_start.append(lambda _: positional.start_build(run.train_files, total, args.align_documents, log))
    # the prep thread prepares nothing before the clock: its lookups and adds are hint work, on the clock
    run.prep = HintPrep(run.loader, run.index, d.rank, d.world_size, pin=d.cuda, tail=run.tail,
                        positional=positional).start(limit=run.start_step)
    meter.on_clock_start.append(lambda _: run.prep.set_limit(sync.next_after(run.start_step)))
    try:
        meter.start()
        for step in range(run.start_step, total + 1):
            if step > run.start_step and step in sync:
                sync_point(run, sync, step)  # stops the clock; validates, checkpoints, switches; restarts it
            if step == total or meter.target:
                break
            item, waited = run.prep.get()
            meter.record(run.train_step(item, step), waited, item)
            done = step + 1
            if done in (total, run.start_step + 1) or done % args.log_every == 0 or done in sync.val | sync.checkpoint:
                line, metrics = meter.interval_line(done, total)
                log(line + (f" | bg index {run.background.describe()}" if run.background else ""))
                log.metrics(metrics, done)
        meter.stop()
    finally:
        run.prep.close()

    # -- summary (train/summary.py) ------------------------------------------------------------------
    summary = run_summary(run)
    close_run(run, summary)
    return summary


if __name__ == "__main__":
    if not torch.cuda.is_available():
        keep_freed_memory()
    # torchrun stops the other workers with SIGTERM when one fails: exit through the finally
    # blocks, which stop the prep thread and the background index build.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    faulthandler.enable()  # a crash in C++ (SIGSEGV, SIGABRT) prints every thread's Python stack
    main()
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        # The run is done: its summary and log are written and its process group is destroyed
        # (train/common.py, Dist.close). What torch's gloo objects leave to interpreter shutdown
        # and C++ static destructors can still abort the process ("terminate called without an
        # active exception", SIGABRT: once in a two-rank CPU test run), which torchrun reports as a
        # failed run. So the exit handlers run now, the streams are flushed, and the process ends
        # without that teardown.
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
