"""train_gpt.py: the NanoGPT-speedrun training loop with n-gram hints (entry point).

What this file owns (DESIGN.md, "Training and evaluation"):
  * the run setup: presets (`record` = 8xH100 speedrun shape, `demo` = a few CPU minutes on
    the local standard-library corpus), flags, torchrun ranks (nccl on CUDA, gloo on CPU),
    logs to stdout and logs/<run>.txt, optional wandb;
  * training-time hints: every rank keeps its own small HintIndex that grows with the
    global batches already trained on. The hints of step s are looked up before step s's
    tokens are added, so they come only from steps < s. A background thread per rank
    (HintPrep) loads the batch, looks up its hints and grows the index AHEAD of the GPU
    through a bounded queue; the loop logs how long it waited for that queue;
  * validation: loss with hints AND without, every validation, with the large background
    index (hints/background.py, built from training shards in a separate process while the
    GPUs train) when it is ready, else --val-index, else the training-time index;
  * the speedrun loop: Muon + Adam, lr schedule, untimed warm-up steps that are undone,
    bf16 autocast and torch.compile through model.gpu_paths_enabled(), checkpoints that
    resume exactly (model, optimizers, loader, hint index, RNG; bit-exact where the kernels
    are deterministic, e.g. single-threaded CPU), a summary JSON.

Run:  python train_gpt.py --preset demo                     (CPU, one process)
      torchrun --standalone --nproc_per_node=8 train_gpt.py --preset record
See --help for every flag; run.sh picks the preset from the GPUs it finds.
"""
import argparse
import atexit
import contextlib
import copy
import ctypes
import dataclasses
import datetime
import gc
import glob
import hashlib
import json
import os
import queue
import random
import signal
import sys
import threading
import time
import traceback
import uuid
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from data.loader import DistributedDataLoader, read_tokens, resolve_files  # noqa: E402
from data.shards import shard_token_count  # noqa: E402
from data.tokenizer import VOCAB_SIZE  # noqa: E402
from hints import Geometry, HintIndex, n_kinds  # noqa: E402
from hints.background import BackgroundBuilder, parse_token_count  # noqa: E402
from model import (GPT, GPTConfig, allreduce_grads, autocast_context, build_optimizers,  # noqa: E402
                   gpu_paths_enabled, lr_multiplier, maybe_compile)

REPO_DIR = os.path.dirname(os.path.abspath(__file__))

# ----------------------------------------------------------------------------------------
# Constants (where the numbers come from)

# Dense bf16 tensor-core peak of one H100 SXM (NVIDIA datasheet: 989.4 TFLOPS without
# sparsity); the H200 is the same GH100 chip with more memory, so the same peak. MFU is
# measured against it on every CUDA GPU.
H100_BF16_DENSE_PEAK_FLOPS = 989e12
# The article's record trains on 70.8M tokens: 270 steps x 262,144 tokens (8 ranks x 16
# sequences x 2048 tokens), as modded-nanogpt's records of that time.
RECORD_GLOBAL_BATCH_TOKENS = 262_144
RECORD_STEPS = 270
RECORD_MAX_RANK_BATCH = 16  # sequences of 2048 per GPU, the record's per-rank batch (fewer GPUs: smaller global batch)
# The speedrun scores the first 10,485,760 tokens of the FineWeb val shard.
RECORD_VAL_TOKENS = 10_485_760
# Background (validation) hint index of the record preset: 1.2B training tokens, this repo's
# default (the article sweeps 75M ... 37B); Geometry.for_tokens sizes it at 22 GiB of /dev/shm.
RECORD_HINT_TOKENS = 1_200_000_000
# modded-nanogpt: constant lr, then linear cool-down to 0 over the last ~40% of the steps.
SPEEDRUN_COOLDOWN_FRAC = 0.4
# llm.c GPT-2 124M: 700 warm-up steps of 19,073 (10B tokens at 524,288 per step), then a
# decay over the whole run; gradients clipped at norm 1.0.
GPT2_WARMUP_FRAC = 700 / 19_073
GPT2_GRAD_CLIP = 1.0
# Hint preparation runs this many steps ahead of the GPU (queue depth): enough to absorb
# jitter of the lookup/add, small enough that the prepared batches stay in pinned memory.
PREP_QUEUE_DEPTH = 3
# Lookups for a saved or background index: threads per rank (the index releases the GIL).
VAL_LOOKUP_WORKERS = 4
# On CPU the demo's 50k-wide logits are ~100 MB blocks, which glibc by default maps fresh
# and returns to the OS on every allocation: measured here, ~250k page faults and ~40% of
# each demo step. No mmap for big blocks, no trimming, and growing the heap 1 GiB at a time
# (mallopt M_MMAP_MAX=0, M_TRIM_THRESHOLD=1 TiB, M_TOP_PAD=1 GiB) reuse the memory instead:
# 0 faults and ~25% less time per step (CPU runs only; untouched pages cost nothing).
GLIBC_M_TRIM_THRESHOLD, GLIBC_M_TOP_PAD, GLIBC_M_MMAP_MAX = -1, -2, -4

DEFAULT_LENGTHS = (6, 10, 20)  # the article's n-gram lengths

PRESETS = {
    # 8xH100 speedrun shape (article + modded-nanogpt): speedrun GPT 12 x 768, 6 heads,
    # seq_len 2048, 262k tokens per step, 270 steps = 70.8M tokens; validation on the first
    # 10,485,760 FineWeb val tokens at the end only (a mid-run validation costs time).
    "record": dict(
        arch="speedrun", n_layer=12, n_embd=768, n_head=6, seq_len=2048,
        batch_size=None,  # per rank: RECORD_GLOBAL_BATCH_TOKENS / (world_size x seq_len), <= 16
        steps=RECORD_STEPS, val_tokens=RECORD_VAL_TOKENS, val_every=0, val_batch_size=None,
        train_files="data/fineweb10B/fineweb_train_*.bin", val_files="data/fineweb10B/fineweb_val_*.bin",
        hint_tokens=RECORD_HINT_TOKENS, hint_workers=2, bg_wait=0.0,
        warmup_steps=10, log_every=10,
    ),
    # CPU demo on the local corpus (Python's standard library, data/local_corpus.py).
    # Measured on the 2-core dev box: ~0.6 s per step of 2 x 256 tokens (the 50k-wide LM
    # head dominates), ~3,000 tokens/s forward-only, so 300 steps (~3 min) + 2 validations
    # of 32,768 tokens with and without hints (~23 s each) take ~4 minutes.
    "demo": dict(
        arch="speedrun", n_layer=4, n_embd=256, n_head=4, seq_len=256,
        batch_size=2, steps=300, val_tokens=32_768, val_every=150, val_batch_size=8,
        train_files="data/local_corpus/train_*.bin", val_files="data/local_corpus/val_*.bin",
        hint_tokens=16_000_000,  # more than the corpus holds (~14M): the whole training split
        hint_workers=1, bg_wait=120.0, warmup_steps=0, log_every=10,
    ),
}
GPT2_HEADS = 12  # GPT-2 124M has 12 heads of 64 (the speedrun record uses 6 of 128)


# ----------------------------------------------------------------------------------------
# Flags

def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Train a speedrun GPT with n-gram hints (training-time hints from tokens already "
        "trained on; validation with and without hints). Presets: record = 8xH100 speedrun shape on "
        "FineWeb10B; demo = a few CPU minutes on the local stdlib corpus. Flags left unset take the "
        "preset's value.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="demo", help="run shape")
    g = p.add_argument_group("data")
    g.add_argument("--train-files", help="glob of training .bin shards")
    g.add_argument("--val-files", help="glob of validation .bin shards")
    g.add_argument("--val-tokens", type=int, help="validate on the first N tokens of the val shards")
    g.add_argument("--seq-len", type=int, help="tokens per sequence")
    g.add_argument("--batch-size", type=int, help="sequences per rank per step")
    g.add_argument("--val-batch-size", type=int, help="sequences per rank per validation batch")
    g = p.add_argument_group("model")
    g.add_argument("--arch", choices=("speedrun", "gpt2"), help="speedrun GPT or the llm.c GPT-2 baseline")
    g.add_argument("--n-layer", type=int)
    g.add_argument("--n-embd", type=int)
    g.add_argument("--n-head", type=int)
    g.add_argument("--vocab-size", type=int, default=VOCAB_SIZE, help="(tests use small ones)")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, help="optimizer steps (timed)")
    g.add_argument("--warmup-steps", type=int, help="untimed steps run first and then undone (compile, autotune)")
    g.add_argument("--lr-scale", type=float, default=1.0, help="multiplies every learning rate")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--compile", dest="compile", action="store_true", default=None,
                   help="torch.compile the model (default: only on the GPU path)")
    g.add_argument("--no-compile", dest="compile", action="store_false")
    g = p.add_argument_group("hints")
    g.add_argument("--no-hints", action="store_true", help="train without hints (ablation)")
    g.add_argument("--hint-lengths", default=",".join(map(str, DEFAULT_LENGTHS)), help="n-gram lengths")
    g.add_argument("--hint-geometry", default="auto",
                   help="training-index geometry: auto (Geometry.for_tokens of the run's training "
                   "tokens), a preset name (tiny, demo, laptop, record) or P,B,S")
    g.add_argument("--hint-workers", type=int, help="threads of the training-time index per rank")
    g.add_argument("--hint-tokens", type=parse_token_count,
                   help="tokens of the background validation index, e.g. 75M, 1.2B, 37B (0 disables it; capped at the training shards)")
    g.add_argument("--bg-wait", type=float, help="seconds the final validation waits for a late background index")
    g.add_argument("--val-index", help="a saved hint index to validate with (when no background index is ready)")
    g = p.add_argument_group("evaluation, logging, checkpoints")
    g.add_argument("--val-every", type=int, help="validate every N steps (0: only at the end)")
    g.add_argument("--log-every", type=int, help="a training log line every N steps")
    g.add_argument("--log-dir", default=os.path.join(REPO_DIR, "logs"), help="where the log file goes")
    g.add_argument("--summary-json", help="write the run's summary here (rank 0)")
    g.add_argument("--save-checkpoint", help="checkpoint path, written at the end (and every --checkpoint-every)")
    g.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps to PATH_stepN")
    g.add_argument("--resume", help="checkpoint to resume from (pass the same flags as the original run)")
    g.add_argument("--wandb", action="store_true", help="log to wandb (offline without WANDB_API_KEY)")
    g.add_argument("--wandb-project", default="ngram-hints-speedrun")
    args = p.parse_args(argv)
    n_head_given = args.n_head is not None
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.arch == "gpt2" and not n_head_given and args.n_embd % (2 * GPT2_HEADS) == 0:
        args.n_head = GPT2_HEADS
    args.hint_lengths = tuple(int(v) for v in str(args.hint_lengths).split(","))
    return args


# ----------------------------------------------------------------------------------------
# Logging

class Log:
    """Prints (rank 0) to stdout and appends to the run's log file; wandb when enabled."""

    def __init__(self, path, master, wandb_run=None):
        self.path, self.master, self.wandb = path, master, wandb_run
        self.file = open(path, "a", buffering=1) if (master and path) else None

    def __call__(self, msg=""):
        if not self.master:
            return
        print(msg, flush=True)
        if self.file:
            self.file.write(msg + "\n")

    def metrics(self, values, step):
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def close(self):
        if self.file:
            self.file.close()
            self.file = None


def human(n):
    """1234567 -> '1.23M'."""
    for unit, div, digits in (("B", 1e9, 2), ("M", 1e6, 1), ("k", 1e3, 1)):
        if abs(n) >= div:
            return f"{n / div:.{digits}f}{unit}"
    return f"{n:.0f}"


# ----------------------------------------------------------------------------------------
# Training-time hints: prepared ahead of the GPU in a background thread

class Prepared(NamedTuple):
    """One step for this rank, as (pinned on CUDA) CPU tensors, with the prep thread's timings."""

    step: int                 # 0-based step index
    x: torch.Tensor           # (B, T) int64 inputs
    y: torch.Tensor           # (B, T) int64 targets
    hint_tokens: torch.Tensor | None  # (B, T, K) int64, -1 = no hint
    hint_kinds: torch.Tensor | None   # (B, T, K) int64, -1 = no hint
    load_s: float             # reading the batch from the shards
    lookup_s: float           # looking up this rank's hints
    add_s: float              # adding the global batch to the index


def hints_to_arrays(h, B, T):
    """Hints (K, B*T) -> (B, T, K) int64 hinted tokens and kinds."""
    K = h.token.shape[0]
    return (np.ascontiguousarray(h.token.T, dtype=np.int64).reshape(B, T, K),
            np.ascontiguousarray(h.kind.T, dtype=np.int64).reshape(B, T, K))


class HintPrep:
    """Loads batches, looks up their training-time hints and grows the index, one step at a time.

    `prepare()` does one step synchronously (tests call it directly): it reads the next batch,
    looks up hints for this rank's inputs x in `index` (which holds only the global batches of
    earlier steps), THEN adds this step's global batch to `index`. The lookup runs on the
    flattened stream of x, prefixed with the (longest length - 1) stream tokens before it (the
    end of the previous rank's slice, or of the previous step for rank 0), so every position
    has its full n-grams; the prefix outputs are dropped. `start()` runs prepare() in a thread
    that stays at most `depth` steps ahead and never passes `limit` (a step where the main
    loop validates or checkpoints and needs the index and loader as of that step); `get()`
    returns the next step and how long the caller waited for it, and re-raises an error of
    the thread with its traceback.
    """

    def __init__(self, loader, index, rank=0, world_size=1, depth=PREP_QUEUE_DEPTH, pin=False, tail=None):
        if getattr(loader, "align_to_documents", False):
            raise ValueError("HintPrep: needs the loader's contiguous rows (align_to_documents=False): "
                             "x must be this rank's slice of global_tokens")
        self.loader, self.index = loader, index
        self.rank, self.world_size, self.pin = rank, world_size, pin
        self.B, self.T = loader.B, loader.T
        self.context = (max(index.geom.lengths) - 1) if index is not None else 0
        self.tail = np.zeros(0, np.uint16) if tail is None else np.asarray(tail, np.uint16)
        self.next_step = loader.step  # step index prepare() produces next
        self.consumed = loader.step   # steps handed out by get()
        self._queue = queue.Queue(maxsize=depth)
        self._cond = threading.Condition()
        self._limit = self.next_step
        self._stop = False
        self._error = None
        self._thread = None

    # -- one step, synchronously ------------------------------------------------------------
    def prepare(self):
        t0 = time.perf_counter()
        batch = self.loader.next_batch()
        t1 = time.perf_counter()
        B, T, r = self.B, self.T, self.rank
        x = torch.from_numpy(np.ascontiguousarray(batch.x, dtype=np.int64))
        y = torch.from_numpy(np.ascontiguousarray(batch.y, dtype=np.int64))
        ht = hk = None
        t2 = t3 = t1
        if self.index is not None:
            g = batch.global_tokens
            stream = np.concatenate([self.tail, g])  # the previous step's end gives rank 0 its context
            start = len(self.tail) + r * B * T
            tok, kind = hints_to_arrays(self.index.lookup_span(stream, start, start + B * T), B, T)
            ht, hk = torch.from_numpy(tok), torch.from_numpy(kind)
            t2 = time.perf_counter()
            self.index.add(g)  # only now: the hints of this step came from earlier steps
            if self.context:
                self.tail = stream[-self.context:].copy()
            t3 = time.perf_counter()
        if self.pin:
            x, y = x.pin_memory(), y.pin_memory()
            if ht is not None:
                ht, hk = ht.pin_memory(), hk.pin_memory()
        item = Prepared(self.next_step, x, y, ht, hk, t1 - t0, t2 - t1, t3 - t2)
        self.next_step += 1
        return item

    # -- background thread ------------------------------------------------------------------
    def start(self, limit):
        self._limit = limit
        self._thread = threading.Thread(target=self._run, name=f"hint-prep-rank{self.rank}", daemon=True)
        self._thread.start()
        return self

    def _run(self):
        try:
            while True:
                with self._cond:
                    while self.next_step >= self._limit and not self._stop:
                        self._cond.wait()
                    if self._stop:
                        return
                item = self.prepare()
                while not self._stop:
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        pass
        except BaseException as e:  # noqa: BLE001 - handed to the main loop, which re-raises
            self._error = (e, traceback.format_exc())

    def set_limit(self, limit):
        with self._cond:
            self._limit = limit
            self._cond.notify_all()

    def _raise_error(self):
        e, tb = self._error
        raise RuntimeError(f"hint preparation thread (rank {self.rank}) failed at step "
                           f"{self.next_step + 1}:\n{tb}") from e

    def get(self):
        """(the next Prepared step, seconds waited for it). Raises if the thread failed."""
        t0 = time.perf_counter()
        while True:
            try:
                item = self._queue.get(timeout=0.05)
                break
            except queue.Empty:
                if self._error is not None:
                    self._raise_error()
                if self._thread is None or not self._thread.is_alive():
                    raise RuntimeError(f"hint preparation thread (rank {self.rank}) is not running")
        self.consumed += 1
        return item, time.perf_counter() - t0

    def wait_filled(self):
        """Block until the queue holds as many steps as it can before `limit` (after a sync point)."""
        while True:
            target = min(self._queue.maxsize, self._limit - self.consumed)
            if self._queue.qsize() >= target:
                return
            if self._error is not None:
                self._raise_error()
            if not self._thread.is_alive():
                return
            time.sleep(0.001)

    def wait_idle(self):
        """Block until the thread has stopped at its limit: index, loader and tail are as of it."""
        while self.next_step < self._limit:
            if self._error is not None:
                self._raise_error()
            if not self._thread.is_alive():
                raise RuntimeError(f"hint preparation thread (rank {self.rank}) is not running")
            time.sleep(0.001)

    def close(self):
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)


# ----------------------------------------------------------------------------------------
# Validation

_VAL_HINT_CACHE = {}  # (id(index), tokens_added, id(val), rank, world) -> (index, tok, kind)


def read_val_tokens(val_files, n_tokens):
    """The first n_tokens scored val tokens: n_tokens + 1 (the last is only a target)."""
    return read_tokens(val_files, n_tokens + 1, strict=False)


def val_split(n_val, seq_len, batch_size, rank, world_size):
    """This rank's share of the val stream: (first sequence, sequences, batch size)."""
    n_seq = max(n_val - 1, 0) // seq_len
    per_rank = n_seq // world_size
    bs = max(1, min(batch_size, per_rank))
    per_rank = per_rank // bs * bs  # whole batches: one shape, one compiled graph
    return rank * per_rank, per_rank, bs


def val_hints(index, val_tokens, start, stop):
    """Hints for val positions [start, stop) as (n, K) int32 tokens and int16 kinds (cached)."""
    key = (id(index), int(index.tokens_added), id(val_tokens), start, stop)
    hit = _VAL_HINT_CACHE.get(key)
    if hit is not None:
        return hit[1], hit[2]
    h = index.lookup_span(val_tokens, start, stop)
    tok = np.ascontiguousarray(h.token.T)
    kind = np.ascontiguousarray(h.kind.T)
    while len(_VAL_HINT_CACHE) >= 2:
        _VAL_HINT_CACHE.pop(next(iter(_VAL_HINT_CACHE)))
    _VAL_HINT_CACHE[key] = (index, tok, kind)  # keeps the index alive, so its id stays unique
    return tok, kind


@torch.no_grad()
def evaluate(model, val_tokens, index, *, seq_len, batch_size, device, rank=0, world_size=1, nohints=True):
    """Mean val loss with hints from `index` (None: skipped) and without hints (nohints=False:
    skipped), over all ranks.

    val_tokens: the whole val stream (uint16); each rank takes an equal run of sequences of
    seq_len (+1 target). Returns dict(loss_hints, loss_nohints, tokens, lookup_s).
    """
    first, n_seq, bs = val_split(len(val_tokens), seq_len, batch_size, rank, world_size)
    start, stop = first * seq_len, (first + n_seq) * seq_len
    lookup_s = 0.0
    if index is not None:
        t0 = time.perf_counter()
        tok, kind = val_hints(index, val_tokens, start, stop)
        lookup_s = time.perf_counter() - t0
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss with hints, without, batches
    for b in range(0, n_seq, bs):
        lo, hi = start + b * seq_len, start + (b + bs) * seq_len
        buf = torch.from_numpy(val_tokens[lo:hi + 1].astype(np.int64))
        x = buf[:-1].view(bs, seq_len).to(device, non_blocking=True)
        y = buf[1:].view(bs, seq_len).to(device, non_blocking=True)
        with autocast_context(device):
            if nohints:
                sums[1] += model(x, y).double()
            if index is not None:
                K = tok.shape[1]
                ht = torch.from_numpy(tok[lo - start:hi - start].astype(np.int64)).view(bs, seq_len, K).to(device)
                hk = torch.from_numpy(kind[lo - start:hi - start].astype(np.int64)).view(bs, seq_len, K).to(device)
                sums[0] += model(x, y, ht, hk).double()
        sums[2] += 1
    if world_size > 1:
        dist.all_reduce(sums)
    model.train(was_training)
    n = max(sums[2].item(), 1)
    return dict(loss_hints=sums[0].item() / n if index is not None else None,
                loss_nohints=sums[1].item() / n if nohints else None,
                tokens=int(n_seq * seq_len * world_size), lookup_s=lookup_s)


# ----------------------------------------------------------------------------------------
# Background validation index (hints/background.py)

class Background:
    """This rank's view of the node's background index build: the builder (local rank 0) or
    an attached handle (other local ranks). Every call is guarded: a failing builder is
    reported and validation falls back, the run goes on."""

    def __init__(self, handle, owner, name, log):
        self.handle, self.owner, self.name, self.log = handle, owner, name, log
        self.index = None
        self.error = None
        self.announced = False
        self.closed = False

    @classmethod
    def start(cls, files, max_tokens, lengths, local_rank, name, log, barrier, reserve_cpus=0):
        """Local rank 0 starts the builder (on the cores after the first `reserve_cpus`, which
        the training ranks keep); after `barrier()` the other local ranks attach."""
        handle, error = None, None
        if local_rank == 0:
            try:
                geom = Geometry.for_tokens(max_tokens, lengths=lengths)
                handle = BackgroundBuilder(files, max_tokens, geometry=geom, name=name, log=log,
                                           reserve_cpus=reserve_cpus)
                handle.start()
            except Exception as e:  # noqa: BLE001 - reported; validation falls back
                error, handle = f"{type(e).__name__}: {e}", None
        barrier()
        if local_rank != 0:
            try:
                handle = BackgroundBuilder.attach(name)
            except Exception as e:  # noqa: BLE001
                error = f"attach failed: {type(e).__name__}: {e}"
        self = cls(handle, local_rank == 0, name, log)
        self.error = error
        if error:
            log(f"background index: not building ({error}); validation falls back to the other indexes")
        return self

    def status(self):
        if self.handle is None:
            return {"state": "failed", "error": self.error}
        try:
            return dict(self.handle.status())
        except Exception as e:  # noqa: BLE001
            return {"state": "failed", "error": f"status(): {type(e).__name__}: {e}"}

    def ready(self):
        try:
            return self.handle is not None and bool(self.handle.ready())
        except Exception:  # noqa: BLE001
            return False

    def describe(self):
        st = self.status()
        state = st.get("state")
        if state == "starting":
            return "bg index starting"
        if state == "running":
            done, total = st.get("tokens_done") or 0, st.get("tokens_total") or 0
            rate, eta = st.get("tokens_per_s") or 0, st.get("eta_s")
            eta_txt = f", eta {eta:.0f}s" if eta is not None else ""
            return f"bg index {human(done)}/{human(total)} tok, {human(rate)} tok/s{eta_txt}"
        if state == "ready":
            return f"bg index ready ({human(st.get('tokens_done') or 0)} tok)"
        return f"bg index failed ({st.get('error')})"

    def poll(self):
        """Log 'background index ready' once; returns the status dict."""
        st = self.status()
        if st.get("state") == "ready" and not self.announced:
            self.announced = True
            self.log(f"background index ready: {human(st.get('tokens_done') or 0)} tokens "
                     f"({st.get('tokens_per_s') or 0:,.0f} tokens/s)")
        return st

    def open(self):
        if self.index is None:
            self.index = self.handle.open(workers=VAL_LOOKUP_WORKERS)
        return self.index

    def building(self):
        return self.status().get("state") in ("starting", "running")

    def close(self):
        """Stop the build and remove its shared memory (owner only; once)."""
        if self.owner and self.handle is not None and not self.closed:
            self.closed = True
            try:
                self.handle.close()
            except Exception as e:  # noqa: BLE001
                self.log(f"background index: close failed: {e}")


# ----------------------------------------------------------------------------------------
# Checkpoints

def checkpoint_paths(path, world_size, rank):
    """(main file, this rank's side file or None, hint index file)."""
    return path, (f"{path}.rank{rank}" if rank > 0 else None), path + ".hints"


def rng_state():
    state = dict(torch=torch.get_rng_state(), numpy=np.random.get_state(), python=random.getstate())
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state):
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def param_digest(model):
    """SHA-256 of every parameter's bytes: equal on all ranks iff they hold the same weights."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------------------
# Main

def main(argv=None):
    args = parse_args(argv)

    # -- distributed setup ------------------------------------------------------------------
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    distributed = world_size > 1
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        torch.set_float32_matmul_precision("high")
    else:
        device = torch.device("cpu")
    if distributed:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    master = rank == 0

    def barrier():
        if distributed:
            dist.barrier(device_ids=[local_rank]) if use_cuda else dist.barrier()

    def broadcast(obj):
        if not distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    run_id = broadcast(f"{datetime.datetime.now():%Y%m%d-%H%M%S}-{args.preset}-{uuid.uuid4().hex[:6]}")
    log_path = None
    if master:
        os.makedirs(args.log_dir, exist_ok=True)
        log_path = os.path.join(args.log_dir, f"{run_id}.txt")
    wandb_run = None
    if args.wandb and master:
        import wandb
        wandb_run = wandb.init(project=args.wandb_project, name=run_id, config=vars(args),
                               mode="online" if os.environ.get("WANDB_API_KEY") else "offline")
    log = Log(log_path, master, wandb_run)
    log(f"run {run_id}: {' '.join(sys.argv)}")
    log(f"torch {torch.__version__}, {world_size} process(es), device {device}"
        + (f" ({torch.cuda.get_device_name(device)})" if use_cuda else f", {torch.get_num_threads()} threads")
        + f", GPU paths {'on' if gpu_paths_enabled() else 'off'}")

    # -- data ----------------------------------------------------------------------------------
    if args.preset == "demo" and args.train_files == PRESETS["demo"]["train_files"] and \
            not glob.glob(os.path.join(REPO_DIR, args.train_files)):
        if local_rank == 0:
            from data.local_corpus import build_local_corpus
            log("demo: building the local corpus from Python's standard library (first use only)")
            build_local_corpus(progress=master)
        barrier()

    def repo_glob(pattern):
        return pattern if os.path.isabs(pattern) or glob.glob(pattern) else os.path.join(REPO_DIR, pattern)

    train_files, val_files = repo_glob(args.train_files), repo_glob(args.val_files)
    if args.batch_size is None:  # record: ~262k tokens per step over all ranks
        args.batch_size = max(1, min(RECORD_MAX_RANK_BATCH, RECORD_GLOBAL_BATCH_TOKENS // (world_size * args.seq_len)))
    if args.val_batch_size is None:
        args.val_batch_size = args.batch_size
    B, T = args.batch_size, args.seq_len
    global_batch = world_size * B * T
    total_train_tokens = args.steps * global_batch
    if args.preset == "record" and global_batch != RECORD_GLOBAL_BATCH_TOKENS:
        log(f"note: global batch is {global_batch:,} tokens ({world_size} ranks x {B} x {T}); the record "
            f"uses {RECORD_GLOBAL_BATCH_TOKENS:,} on 8 GPUs")
    loader = DistributedDataLoader(train_files, B, T, rank=rank, world_size=world_size, log=log if master else None)
    val_tokens = read_val_tokens(val_files, args.val_tokens)
    if len(val_tokens) < args.val_tokens + 1:
        log(f"note: val shards hold {len(val_tokens):,} tokens, fewer than --val-tokens {args.val_tokens:,}")
    _, n_val_seq, _ = val_split(len(val_tokens), T, args.val_batch_size, 0, world_size)
    if n_val_seq == 0:
        raise SystemExit(f"validation: {len(val_tokens):,} val tokens make no sequence of {T} + 1 per rank "
                         f"({world_size} ranks); give more --val-tokens or val files")
    log(f"data: train {train_files} ({loader.stream.total:,} tokens), val {val_files} "
        f"({n_val_seq * T * world_size:,} tokens scored)")

    # -- model and optimizers ------------------------------------------------------------------
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    random.seed(args.seed)
    lengths = args.hint_lengths
    cfg = GPTConfig(vocab_size=args.vocab_size, n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                    arch=args.arch, max_seq_len=T, n_hint_lengths=len(lengths), n_hint_kinds=n_kinds(len(lengths)))
    model = GPT(cfg).to(device)
    optimizers = build_optimizers(model, arch=args.arch, lr_scale=args.lr_scale, rank=rank, world_size=world_size)
    compile_model = gpu_paths_enabled() if args.compile is None else args.compile
    if compile_model:
        train_model = maybe_compile(model) if gpu_paths_enabled() else torch.compile(model, dynamic=False)
    else:
        train_model = model
    n_params = sum(p.numel() for p in model.parameters())
    n_matmul = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks.") and p.ndim >= 2) \
        + model.lm_head.weight.numel()
    # PaLM (Chowdhery et al. 2022, App. B): 6N per token for the matmuls, plus 12 L d T for attention.
    flops_per_token = 6 * n_matmul + 12 * cfg.n_layer * cfg.n_embd * T
    if args.arch == "gpt2":
        lr_warmup, cooldown, grad_clip = round(GPT2_WARMUP_FRAC * args.steps), 1.0, GPT2_GRAD_CLIP
    else:
        lr_warmup, cooldown, grad_clip = 0, SPEEDRUN_COOLDOWN_FRAC, None
    log(f"model: {args.arch} {cfg.n_layer} layers x {cfg.n_embd} wide, {cfg.n_head} heads, seq_len {T}, "
        f"{n_params / 1e6:.1f}M parameters ({n_matmul / 1e6:.1f}M in matmuls), compile {'on' if compile_model else 'off'}")
    log(f"training: {args.steps} steps x {global_batch:,} tokens ({world_size} x {B} x {T}) = "
        f"{human(total_train_tokens)} tokens, lr x{args.lr_scale} (warm-up {lr_warmup}, cool-down {cooldown:.0%})")

    # -- hint indexes ----------------------------------------------------------------------------
    index = None
    if not args.no_hints:
        geom = Geometry.parse(args.hint_geometry, total_train_tokens, lengths)
        index = HintIndex(geom, workers=args.hint_workers)
        log(f"training-time hint index (per rank): {geom.describe()}, {args.hint_workers} worker(s)")
    else:
        log("training-time hints: off (--no-hints)")
    val_index = None
    if args.val_index:
        val_index = HintIndex.load(args.val_index, mmap=True, workers=VAL_LOOKUP_WORKERS)
        if val_index.geom.lengths != lengths:
            log(f"warning: --val-index has lengths {val_index.geom.lengths}, the model {lengths}")
        log(f"--val-index {args.val_index}: {val_index.tokens_added:,} tokens, {val_index.geom.describe()}")
    background = None
    if args.hint_tokens > 0:
        available = sum(shard_token_count(f) for f in resolve_files(train_files))
        bg_tokens = min(args.hint_tokens, available)
        if bg_tokens < args.hint_tokens:
            log(f"note: --hint-tokens {args.hint_tokens:,} capped at the {available:,} tokens of the training shards")
        node = int(os.environ.get("GROUP_RANK", 0))
        # the training ranks of this node keep one core each for the loop and hint_workers for
        # their prep thread; the builder takes the rest
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        background = Background.start(train_files, bg_tokens, lengths, local_rank, f"nghints-{run_id}-n{node}",
                                      log, barrier, reserve_cpus=local_world * (1 + args.hint_workers))
        atexit.register(background.close)  # any exit, errors included, stops the build and frees /dev/shm

    # -- resume --------------------------------------------------------------------------------
    start_step, tail, progress = 0, None, {}
    if args.resume:
        main_path, side_path, index_path = checkpoint_paths(args.resume, world_size, rank)
        ck = torch.load(main_path, map_location="cpu", weights_only=False)
        if ck["world_size"] != world_size:
            raise SystemExit(f"--resume {args.resume}: saved with {ck['world_size']} ranks, running {world_size}")
        if ck["model_config"] != dataclasses.asdict(cfg):
            raise SystemExit(f"--resume {args.resume}: model config {ck['model_config']} differs from {dataclasses.asdict(cfg)}")
        model.load_state_dict(ck["model"])
        mine = ck if rank == 0 else torch.load(side_path, map_location="cpu", weights_only=False)
        for opt, state in zip(optimizers, mine["optimizers"]):
            opt.load_state_dict(state)
        loader.load_state_dict(ck["loader"])
        if index is not None:
            if not ck["hint_index"]:
                raise SystemExit(f"--resume {args.resume}: the checkpoint has no hint index (saved with --no-hints?)")
            index = HintIndex.load(index_path, mmap=False, workers=args.hint_workers)
            tail = ck["hint_tail"]
        start_step, progress = ck["step"], ck["progress"]
        set_rng_state(mine["rng"])
        log(f"resumed from {args.resume} at step {start_step} (loader at shard {ck['loader']['shard']}, "
            f"training index {index.tokens_added if index is not None else 0:,} tokens)")

    # -- the schedule of sync points (validation, checkpoints, the end) ---------------------------
    total = args.steps

    def is_val(s):
        return s == total or (args.val_every > 0 and s % args.val_every == 0)

    def is_ckpt(s):
        return bool(args.save_checkpoint) and (s == total or (args.checkpoint_every > 0 and s % args.checkpoint_every == 0))

    sync_steps = [s for s in range(start_step + 1, total + 1) if is_val(s) or is_ckpt(s)] or [total]

    def next_sync(s):
        return next((t for t in sync_steps if t > s), total)

    def set_lr(step):
        mult = lr_multiplier(step, total, warmup_steps=lr_warmup, cooldown_frac=cooldown)
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * mult

    def train_step(item, step):
        x = item.x.to(device, non_blocking=True)
        y = item.y.to(device, non_blocking=True)
        ht = item.hint_tokens.to(device, non_blocking=True) if item.hint_tokens is not None else None
        hk = item.hint_kinds.to(device, non_blocking=True) if item.hint_kinds is not None else None
        set_lr(step)
        with autocast_context(device):
            loss = train_model(x, y, ht, hk)
        loss.backward()
        allreduce_grads(model)
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        return loss.detach()

    def sync_device():
        if use_cuda:
            torch.cuda.synchronize(device)

    # -- untimed warm-up, then undone ------------------------------------------------------------
    if args.warmup_steps > 0:
        t0 = time.perf_counter()
        saved_model = {k: v.detach().clone() for k, v in model.state_dict().items()}
        saved_opts = [copy.deepcopy(opt.state_dict()) for opt in optimizers]
        warm_loader = DistributedDataLoader(train_files, B, T, rank=rank, world_size=world_size, log=None)
        warm_index = HintIndex(dataclasses.replace(Geometry.preset("tiny"), lengths=lengths))
        warm = HintPrep(warm_loader, warm_index if index is not None else None, rank, world_size, pin=use_cuda)
        for i in range(args.warmup_steps):
            train_step(warm.prepare(), start_step + i)
        # the validation graphs (with and without hints) compile here too, not in the first validation
        evaluate(train_model, val_tokens[:T * world_size * args.val_batch_size + 1], warm_index, seq_len=T,
                 batch_size=args.val_batch_size, device=device, rank=rank, world_size=world_size)
        sync_device()
        model.load_state_dict(saved_model)
        for opt, state in zip(optimizers, saved_opts):
            opt.load_state_dict(state)
        del saved_model, saved_opts, warm, warm_index, warm_loader
        log(f"warm-up: {args.warmup_steps} steps in {time.perf_counter() - t0:.1f}s (untimed, then undone: "
            f"model, optimizers, loader and hint index start fresh)")

    # -- the loop ------------------------------------------------------------------------------------
    prep = HintPrep(loader, index, rank, world_size, pin=use_cuda, tail=tail).start(limit=next_sync(start_step))
    train_losses = list(progress.get("train_losses", []))
    val_history = list(progress.get("val_history", []))
    totals = dict(train_s=progress.get("train_s", 0.0), wait_s=progress.get("wait_s", 0.0),
                  lookup_s=progress.get("lookup_s", 0.0), add_s=progress.get("add_s", 0.0),
                  load_s=progress.get("load_s", 0.0), steps_timed=progress.get("steps_timed", 0))
    interval = dict(losses=[], wait=0.0, lookup=0.0, add=0.0, steps=0, t0=0.0)
    last = dict(val=None, val_index=None, val_index_tokens=0)
    timer = dict(start=None)
    bg_status = None

    def timer_start():
        sync_device()
        timer["start"] = time.perf_counter()

    def timer_stop():
        sync_device()
        if timer["start"] is not None:
            totals["train_s"] += time.perf_counter() - timer["start"]
            timer["start"] = None

    def train_time():
        return totals["train_s"] + (time.perf_counter() - timer["start"] if timer["start"] is not None else 0.0)

    def choose_val_index(final):
        """(index, description, kind) for this validation, the same on every rank."""
        bg_ok = 0
        if background is not None:
            if final and args.bg_wait > 0 and background.building():
                log(f"final validation: waiting up to {args.bg_wait:.0f}s for the background index ({background.describe()})")
                deadline = time.perf_counter() + args.bg_wait
                while background.building() and time.perf_counter() < deadline:
                    time.sleep(0.5)
            bg_ok = int(background.ready())
            if distributed:
                flag = torch.tensor([bg_ok], device=device)
                dist.all_reduce(flag, op=dist.ReduceOp.MIN)
                bg_ok = int(flag.item())
        if bg_ok:
            try:
                idx = background.open()
                return idx, f"background index, {human(idx.tokens_added)} tokens", "background"
            except Exception as e:  # noqa: BLE001
                log(f"background index: open failed ({type(e).__name__}: {e}); falling back")
        elif background is not None:
            log(f"background index not used for this validation: {background.describe()}")
        if val_index is not None:
            return val_index, f"--val-index, {human(val_index.tokens_added)} tokens", "val-index"
        if index is not None:
            return index, f"training index, {human(index.tokens_added)} tokens", "training"
        return None, "no hint index", None

    def validate(step):
        t0 = time.perf_counter()
        idx, desc, kind = choose_val_index(final=step == total)
        res = evaluate(train_model, val_tokens, idx, seq_len=T, batch_size=args.val_batch_size, device=device,
                       rank=rank, world_size=world_size)
        hinted = f"{res['loss_hints']:.4f}" if res["loss_hints"] is not None else "n/a"
        if kind != "training":
            desc += f" | training index: {human(index.tokens_added)} tokens" if index is not None else " | no training index"
        log(f"step {step}/{total} val_loss_hints {hinted} val_loss_nohints {res['loss_nohints']:.4f} "
            f"(hints from: {desc}) [{res['tokens']:,} val tokens, "
            f"{time.perf_counter() - t0:.1f}s, lookup {res['lookup_s'] * 1e3:.0f}ms]")
        log.metrics({"val/loss_hints": res["loss_hints"], "val/loss_nohints": res["loss_nohints"]}, step)
        last.update(val=res, val_index=kind, val_index_desc=desc,
                    val_index_tokens=int(idx.tokens_added) if idx is not None else 0)
        val_history.append(dict(step=step, loss_hints=res["loss_hints"], loss_nohints=res["loss_nohints"],
                                index=kind, index_tokens=last["val_index_tokens"]))

    def save_checkpoint(step):
        t0 = time.perf_counter()
        path = args.save_checkpoint
        if step != total:
            root, ext = os.path.splitext(path)
            path = f"{root}_step{step:06d}{ext}"
        main_path, side_path, index_path = checkpoint_paths(path, world_size, rank)
        opt_states = [opt.state_dict() for opt in optimizers]
        snapshot = dict(train_losses=train_losses, val_history=val_history, **totals)
        if master:
            os.makedirs(os.path.dirname(os.path.abspath(main_path)), exist_ok=True)
            if index is not None:
                index.save(index_path)
            torch.save(dict(format=1, step=step, world_size=world_size, args=vars(args),
                            model_config=dataclasses.asdict(cfg), model=model.state_dict(),
                            optimizers=opt_states, loader=loader.state_dict(),
                            hint_index=index is not None, hint_tail=prep.tail, rng=rng_state(),
                            progress=snapshot), main_path + ".tmp")
            os.replace(main_path + ".tmp", main_path)
        else:
            torch.save(dict(step=step, optimizers=opt_states, rng=rng_state()), side_path + ".tmp")
            os.replace(side_path + ".tmp", side_path)
        barrier()
        log(f"checkpoint: step {step} -> {main_path} (+ hint index {index_path if index is not None else 'none'})"
            f" in {time.perf_counter() - t0:.1f}s")
        return main_path

    def log_interval(step):
        nonlocal bg_status
        losses = torch.stack(interval["losses"]).float()
        if distributed:
            dist.all_reduce(losses)
            losses /= world_size
        losses = losses.tolist()
        first = step - len(losses) + 1
        train_losses.extend([first + i, v] for i, v in enumerate(losses))
        now = train_time()
        n = interval["steps"]
        step_s = (now - interval["t0"]) / max(n, 1)
        tok_s = global_batch / step_s if step_s > 0 else 0.0
        wait_ms, prep_ms = interval["wait"] / n * 1e3, (interval["lookup"] + interval["add"]) / n * 1e3
        parts = [f"step {step}/{total} loss {sum(losses) / len(losses):.4f}",
                 f"{step_s * 1e3:.1f}ms/step {tok_s:,.0f} tok/s"]
        if use_cuda:
            parts.append(f"MFU {flops_per_token * tok_s / (H100_BF16_DENSE_PEAK_FLOPS * world_size):.1%}")
        parts.append(f"hint wait {wait_ms:.2f}ms prep {prep_ms:.1f}ms ({prep_ms / max(step_s * 1e3, 1e-9):.1%} of step)")
        parts.append(f"train {now:.1f}s")
        if background is not None:
            bg_status = background.poll()
            parts.append(background.describe())
        log(" | ".join(parts))
        log.metrics({"train/loss": losses[-1], "train/step_ms": step_s * 1e3, "train/tokens_per_s": tok_s,
                     "hints/wait_ms": wait_ms, "hints/prep_ms": prep_ms}, step)
        interval.update(losses=[], wait=0.0, lookup=0.0, add=0.0, steps=0, t0=now)

    finished = False
    try:
        prep.wait_filled()  # the queue starts full, as the speedrun's clock would want
        timer_start()
        interval["t0"] = train_time()
        for step in range(start_step, total + 1):
            if step > start_step or step == total:
                at_val, at_ckpt = is_val(step), is_ckpt(step)
                if at_val or at_ckpt:
                    timer_stop()
                    prep.wait_idle()  # the thread stopped at this step: index and loader are as of `step`
                    if at_val:
                        validate(step)
                    if at_ckpt:
                        save_checkpoint(step)
                    if step < total:
                        prep.set_limit(next_sync(step))
                        prep.wait_filled()
                    timer_start()
                    interval["t0"] = train_time()
            if step == total:
                break
            item, waited = prep.get()
            assert item.step == step, f"prepared step {item.step}, expected {step}"
            loss = train_step(item, step)
            interval["losses"].append(loss)
            interval["wait"] += waited
            interval["lookup"] += item.lookup_s
            interval["add"] += item.add_s
            interval["steps"] += 1
            totals["wait_s"] += waited
            totals["lookup_s"] += item.lookup_s
            totals["add_s"] += item.add_s
            totals["load_s"] += item.load_s
            totals["steps_timed"] += 1
            done = step + 1
            if done == total or done == start_step + 1 or done % args.log_every == 0 or is_val(done) or is_ckpt(done):
                log_interval(done)
        timer_stop()
        finished = True
    finally:
        prep.close()
        if not finished and background is not None:
            background.close()

    # -- summary -----------------------------------------------------------------------------------
    n_timed = max(totals["steps_timed"], 1)
    train_s = totals["train_s"]
    tok_s = n_timed * global_batch / train_s if train_s > 0 else 0.0
    step_ms = max(train_s / n_timed * 1e3, 1e-9)
    prep_ms = (totals["lookup_s"] + totals["add_s"]) / n_timed * 1e3
    wait_ms = totals["wait_s"] / n_timed * 1e3
    mfu = flops_per_token * tok_s / (H100_BF16_DENSE_PEAK_FLOPS * world_size) if use_cuda else None
    digests = [param_digest(model)]
    if distributed:
        gathered = [None] * world_size
        dist.all_gather_object(gathered, digests[0])
        digests = gathered
    res = last["val"] or {}
    if background is not None:
        bg_status = background.poll()
    fmt = lambda v: f"{v:.4f}" if v is not None else "n/a"  # noqa: E731
    log(f"final: val_loss_hints {fmt(res.get('loss_hints'))} val_loss_nohints {fmt(res.get('loss_nohints'))} "
        f"(hints from: {last.get('val_index_desc', 'n/a')})")
    log(f"final: {total} steps, {human(total * global_batch)} tokens, train time {train_s:.1f}s, "
        f"{step_ms:.1f}ms/step, {tok_s:,.0f} tok/s" + (f", MFU {mfu:.1%}" if mfu is not None else "")
        + (f", peak memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB" if use_cuda else ""))
    log(f"final: hints: prep {prep_ms:.2f}ms/step in the background thread (lookup "
        f"{totals['lookup_s'] / n_timed * 1e3:.2f} + add {totals['add_s'] / n_timed * 1e3:.2f}) = "
        f"{prep_ms / step_ms:.1%} of step time; loop waited {wait_ms:.3f}ms/step ({wait_ms / step_ms:.2%}), "
        f"{totals['wait_s'] * 1e3:.1f}ms in all")
    if distributed and len(set(digests)) != 1:
        log(f"WARNING: ranks hold different weights: {digests}")
    summary = dict(
        run_id=run_id, preset=args.preset, arch=args.arch, world_size=world_size, device=str(device),
        steps=total, resumed_from_step=start_step if args.resume else None,
        seq_len=T, batch_size=B, global_batch_tokens=global_batch, train_tokens=total * global_batch,
        val_loss_hints=res.get("loss_hints"), val_loss_nohints=res.get("loss_nohints"), val_tokens=res.get("tokens"),
        val_index=last["val_index"], val_index_desc=last.get("val_index_desc"),
        hint_tokens_train=int(index.tokens_added) if index is not None else 0,
        hint_tokens_val=last["val_index_tokens"], no_hints=args.no_hints,
        train_time_s=train_s, steps_timed=totals["steps_timed"], step_ms=step_ms, tokens_per_s=tok_s, mfu=mfu,
        hint_prep_ms_per_step=prep_ms, hint_lookup_ms_total=totals["lookup_s"] * 1e3,
        hint_add_ms_total=totals["add_s"] * 1e3, hint_prep_share=prep_ms / step_ms if step_ms else None,
        hint_wait_ms_total=totals["wait_s"] * 1e3, hint_wait_ms_per_step=wait_ms,
        hint_wait_share=wait_ms / step_ms if step_ms else None, data_load_ms_total=totals["load_s"] * 1e3,
        background=bg_status, train_losses=train_losses, val_history=val_history,
        param_digests=digests, ranks_in_sync=len(set(digests)) == 1,
        checkpoint=args.save_checkpoint, log_file=log_path,
        peak_memory_gib=torch.cuda.max_memory_allocated(device) / 2**30 if use_cuda else None,
    )
    if master and args.summary_json:
        os.makedirs(os.path.dirname(os.path.abspath(args.summary_json)), exist_ok=True)
        with open(args.summary_json, "w") as f:
            json.dump(summary, f, indent=1)
        log(f"summary: {args.summary_json}")
    barrier()  # every rank is done with the background index before its owner removes it
    if background is not None:
        background.close()
    log.close()
    if wandb_run is not None:
        wandb_run.finish()
    if distributed:
        # Free gloo/nccl work objects (and the tensors they hold) while the interpreter is
        # alive: left to interpreter shutdown, gloo's threads can abort the process (SIGABRT).
        gc.collect()
        dist.destroy_process_group()
    return summary


def keep_freed_memory():
    """CPU runs: keep large freed blocks in the heap (see GLIBC_M_MMAP_MAX); glibc only."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(GLIBC_M_MMAP_MAX, 0)
        libc.mallopt(GLIBC_M_TRIM_THRESHOLD, 1 << 40)
        libc.mallopt(GLIBC_M_TOP_PAD, 1 << 30)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        keep_freed_memory()
    # torchrun stops the other workers with SIGTERM when one fails: exit through the finally
    # blocks, which stop the prep thread and the background index build.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
