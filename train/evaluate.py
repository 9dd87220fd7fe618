"""Validation: loss with hints and without, over all ranks, and which index the hints come from.

`evaluate` runs the model over this rank's share of the val stream (`val_split`, train/data.py)
with hints from an index (their lookups cached per index state in a `ValHintCache` the run owns)
and, when asked, without hints.
`validate` is one validation of a run: the index train/val_hints.py picks, both losses, a log line.
In the record's representation (`record=True`) the hints are Cells (hints/cells.py): the index's
`lookup_cells` over this rank's span as one segment (n-grams restart at its start and at every BOS),
keeping 8 followers a position (the record's validation setting).
"""
import time

import numpy as np
import torch

from data.units import human_tokens
from hints.cells import BOS, document_hints
from model import autocast_context
from train.data import val_split
from train.positional_hints import cells_to_arrays
from train.val_hints import VAL_FOLLOWERS, ValSource, pick_index, wait_for_background


def val_hint_arrays(index, tokens, start, stop, record=False):
    """The model's hint inputs for positions [start, stop) of a token stream, from `index`: a
    tuple of arrays of stop - start rows, (n, K) int64 hinted tokens and kinds, each position's
    n-grams read from the stream before it back to its document's BOS (hints.cells.document_hints). Validation (ValHintCache) and generation
    (train/inference.py) both call this, so a position gets the same hints in either.
    record: the record's cells of tokens[start:stop] as one segment (the module docstring):
    (n, F) followers, (n,) cells and (n, F) float32 counts."""
    if record:
        cells = index.lookup_cells(tokens[start:stop], max_followers=VAL_FOLLOWERS, boundary=BOS)
        return tuple(a.reshape(stop - start, *a.shape[2:]) for a in cells_to_arrays(cells, 1, stop - start))
    h = document_hints(index, tokens, start, stop, index.lengths)
    return tuple(np.ascontiguousarray(a.T, dtype=np.int64) for a in (h.token, h.kind))


class ValHintCache:
    """Hints of a span of the val stream, kept while the index does not change.

    A validation looks up the same span of the same val tokens every time; the training index
    grows between validations, the background and saved indexes do not. The key is the index
    object, its token count and the span; the entry holds the index, so its id stays unique.
    """

    def __init__(self, size=2):
        self.size, self.entries = size, {}

    def get(self, index, val_tokens, start, stop, record=False):
        """val_hint_arrays() of val positions [start, stop)."""
        key = (id(index), int(index.tokens_added), id(val_tokens), start, stop, record)
        hit = self.entries.get(key)
        if hit is not None:
            return hit[1]
        arrays = val_hint_arrays(index, val_tokens, start, stop, record)
        while len(self.entries) >= self.size:
            self.entries.pop(next(iter(self.entries)))
        self.entries[key] = (index, arrays)
        return arrays


@torch.no_grad()
def evaluate(model, val_tokens, index, *, seq_len, batch_size, dist, cache=None, also_without_hints=True, record=False):
    """Mean val loss over all ranks with hints from `index` (None: no hinted pass) and, when
    `also_without_hints`, without hints.

    val_tokens: the whole val stream (uint16); each rank takes an equal run of sequences of
    seq_len (+1 target). record: the hints are Cells (the module docstring).
    Returns dict(loss_hints, loss_nohints, tokens, lookup_s).
    """
    device = dist.device
    first, n_seq, bs = val_split(len(val_tokens), seq_len, batch_size, dist.rank, dist.world_size)
    start, stop = first * seq_len, (first + n_seq) * seq_len
    lookup_s = 0.0
    if index is not None:
        t0 = time.perf_counter()
        arrays = (cache or ValHintCache()).get(index, val_tokens, start, stop, record)
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
            if also_without_hints:
                sums[1] += model(x, y).double()
            if index is not None:  # val_hint_arrays' arrays, rows lo..hi of the span
                hints = [torch.from_numpy(a[lo - start:hi - start]).view(bs, seq_len, *a.shape[1:]).to(device)
                         for a in arrays]
                sums[0] += model(x, y, *hints).double()
        sums[2] += 1
    dist.all_sum(sums)
    model.train(was_training)
    n = max(sums[2].item(), 1)
    return dict(loss_hints=sums[0].item() / n if index is not None else None,
                loss_nohints=sums[1].item() / n if also_without_hints else None,
                tokens=int(n_seq * seq_len * dist.world_size), lookup_s=lookup_s)


def validate(run, step):
    """One validation of `run` (train/run.py's Run) at `step`: at the end, wait for a late
    background index (up to --bg-wait seconds); pick the index on every rank alike; evaluate with
    and without hints; log one line. The run's with_background: it asked for a background index
    (the same on every rank, even where run.background is None because it could not start or attach
    there). run.exact: exact hints counted before training (count_exact_val_hints), which then give
    every hinted loss.
    Returns evaluate()'s dict plus index (kind), index_reason, index_tokens, index_desc and
    bg_wait_s (seconds waited for the background index: training time, as the speedrun counts it)."""
    dist, log, total, exact = run.d, run.log, run.steps, run.exact
    t0, waited = time.perf_counter(), 0.0
    if exact is not None:
        source, index = ValSource("exact", f"exact counts ({exact.backend}, {exact.seconds:.1f}s before training)"), exact
    else:
        if run.with_background and step == total and run.args.bg_wait > 0:
            waited = wait_for_background(run.background, run.args.bg_wait, dist, log, run.meter.stopped_at)
        source, index = pick_index(run.with_background, run.background, run.val_index, run.training_index(step), dist)
    res = evaluate(run.train_model, run.val_tokens, index, seq_len=run.seq_len, batch_size=run.args.val_batch_size,
                   dist=dist, cache=run.cache, record=run.record)
    n = int(index.tokens_added) if index is not None else 0
    res.update(index=source.kind, index_reason=source.reason, index_tokens=n, bg_wait_s=waited,
               index_desc=f"{source.kind or 'none'}, {human_tokens(n)} tokens")
    hinted = f"{res['loss_hints']:.4f}" if res["loss_hints"] is not None else "n/a"
    log(f"step {step}/{total} val_loss_hints {hinted} val_loss_nohints {res['loss_nohints']:.4f} "
        f"(hints: {res['index_desc']}; {source.reason}) [{res['tokens']:,} val tokens, "
        f"{time.perf_counter() - t0:.1f}s, lookup {res['lookup_s'] * 1e3:.0f}ms]")
    log.metrics({"val/loss_hints": res["loss_hints"], "val/loss_nohints": res["loss_nohints"]}, step)
    return res
