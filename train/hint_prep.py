"""Training-time hints, prepared ahead of the GPU.

Two sources, one per hint representation (model/gpt.py's hint_repr):
  record   train/positional_hints.py: the node's exact positional index over the known training
           stream, built ahead by local rank 0 and mapped by every rank; a lookup for step s sees
           only tokens before step s's first token. Nothing is added during training.
  lengths  every rank keeps a small HintIndex that grows with the global batches already trained
           on: `HintPrep` looks up the hints of this rank's inputs in it (it holds only earlier
           steps) and only then adds the step's global batch. It serves the "lengths"
           representation (the positional index gives Cells, not per-length hints) and runs whose
           data order is not known ahead. Its lookups restart n-grams at every BOS
           (hints.cells.document_hints); they read the stream across ranks' slices and steps.
`HintPrep` loads a step's batch and prepares its hints; a background thread runs it ahead of the
GPU through a bounded queue; the loop logs how long it waited for it.
"""
import queue
import threading
import time
import traceback
from typing import NamedTuple

import numpy as np
import torch

from hints.cells import document_hints

# Hint preparation runs this many steps ahead of the GPU (queue depth): enough to absorb
# jitter of the lookup/add, small enough that the prepared batches stay in pinned memory.
PREP_QUEUE_DEPTH = 3


class Prepared(NamedTuple):
    """One step for this rank, as (pinned on CUDA) CPU tensors, with the prep thread's timings."""

    step: int                 # 0-based step index
    x: torch.Tensor           # (B, T) int64 inputs
    y: torch.Tensor           # (B, T) int64 targets
    hint_tokens: torch.Tensor | None  # (B, T, K) int64, -1 = no hint (record: the followers (B, T, F))
    hint_kinds: torch.Tensor | None   # (B, T, K) int64, -1 = no hint (record: the cells (B, T))
    load_s: float             # reading the batch from the shards
    lookup_s: float           # looking up this rank's hints
    add_s: float              # adding the global batch to the index (lengths only)
    hint_weights: torch.Tensor | None = None  # record: the followers' counts (B, T, F) float32


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

    def __init__(self, loader, index, rank=0, world_size=1, depth=PREP_QUEUE_DEPTH, pin=False, tail=None,
                 positional=None):
        self.loader, self.index, self.positional = loader, index, positional  # positional: the record's source
        self.lookup_index = index  # where lookups go: the training index, or after a switch the large one
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
        self.started_at = None  # time.monotonic() of the first prepare(): on the clock in a run

    # -- one step, synchronously ------------------------------------------------------------
    def prepare(self):
        if self.started_at is None:
            self.started_at = time.monotonic()
        t0 = time.perf_counter()
        batch = self.loader.next_batch()
        t1 = time.perf_counter()
        B, T, r = self.B, self.T, self.rank
        x = torch.from_numpy(np.ascontiguousarray(batch.x, dtype=np.int64))
        y = torch.from_numpy(np.ascontiguousarray(batch.y, dtype=np.int64))
        ht = hk = hw = None
        t2 = t3 = t1
        if self.positional is not None:
            ht, hk, hw = (torch.from_numpy(a) for a in self.positional.lookup(np.asarray(batch.x).reshape(-1),
                                                                               self.next_step))
            t2 = t3 = time.perf_counter()
        elif self.index is not None:
            g = batch.global_tokens
            stream = np.concatenate([self.tail, g])  # the previous step's end gives rank 0 its context
            start = len(self.tail) + r * B * T
            h = document_hints(self.lookup_index, stream, start, start + B * T, self.index.lengths)
            tok, kind = hints_to_arrays(h, B, T)
            ht, hk = torch.from_numpy(tok), torch.from_numpy(kind)
            t2 = time.perf_counter()
            self.index.add(g)  # only now: the hints of this step came from earlier steps
            if self.context:
                self.tail = stream[-self.context:].copy()
            t3 = time.perf_counter()
        if self.pin:
            x, y = x.pin_memory(), y.pin_memory()
            ht, hk, hw = (t.pin_memory() if t is not None else None for t in (ht, hk, hw))
        item = Prepared(self.next_step, x, y, ht, hk, t1 - t0, t2 - t1, t3 - t2, hw)
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

    def switch_lookups(self, index):
        """From the next prepared step on, look hints up in `index` (the training index still grows,
        for checkpoints). Call only while the thread is idle at its limit (after wait_idle)."""
        self.lookup_index = index

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
