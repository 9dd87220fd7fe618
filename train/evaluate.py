"""Validation: loss with hints and without, over all ranks, and which index the hints come from.

`read_val_tokens` reads the scored val stream; `val_split` gives each rank an equal run of whole
batches of it. `evaluate` runs the model over this rank's share with hints from an index (their
lookups cached per index state in a `ValHintCache` the run owns) and, when asked, without hints.
`pick_val_index` chooses the index to validate with and says why: the background index when it
is ready on every rank, else `--val-index`, else the training-time index.
"""
import time
from typing import NamedTuple

import numpy as np
import torch

from data.loader import iter_tokens, read_tokens
from data.units import human_tokens
from hints import HintIndex
from model import autocast_context


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


class ValHintCache:
    """Hints of a span of the val stream, kept while the index does not change.

    A validation looks up the same span of the same val tokens every time; the training index
    grows between validations, the background and saved indexes do not. The key is the index
    object, its token count and the span; the entry holds the index, so its id stays unique.
    """

    def __init__(self, size=2):
        self.size, self.entries = size, {}

    def get(self, index, val_tokens, start, stop):
        """(n, K) int32 hinted tokens and int16 kinds for val positions [start, stop)."""
        key = (id(index), int(index.tokens_added), id(val_tokens), start, stop)
        hit = self.entries.get(key)
        if hit is not None:
            return hit[1], hit[2]
        h = index.lookup_span(val_tokens, start, stop)
        tok, kind = np.ascontiguousarray(h.token.T), np.ascontiguousarray(h.kind.T)
        while len(self.entries) >= self.size:
            self.entries.pop(next(iter(self.entries)))
        self.entries[key] = (index, tok, kind)
        return tok, kind


@torch.no_grad()
def evaluate(model, val_tokens, index, *, seq_len, batch_size, dist, cache=None, also_without_hints=True):
    """Mean val loss over all ranks with hints from `index` (None: no hinted pass) and, when
    `also_without_hints`, without hints.

    val_tokens: the whole val stream (uint16); each rank takes an equal run of sequences of
    seq_len (+1 target). Returns dict(loss_hints, loss_nohints, tokens, lookup_s).
    """
    device = dist.device
    first, n_seq, bs = val_split(len(val_tokens), seq_len, batch_size, dist.rank, dist.world_size)
    start, stop = first * seq_len, (first + n_seq) * seq_len
    lookup_s = 0.0
    if index is not None:
        t0 = time.perf_counter()
        tok, kind = (cache or ValHintCache()).get(index, val_tokens, start, stop)
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
            if index is not None:
                K = tok.shape[1]
                ht = torch.from_numpy(tok[lo - start:hi - start].astype(np.int64)).view(bs, seq_len, K).to(device)
                hk = torch.from_numpy(kind[lo - start:hi - start].astype(np.int64)).view(bs, seq_len, K).to(device)
                sums[0] += model(x, y, ht, hk).double()
        sums[2] += 1
    dist.all_sum(sums)
    model.train(was_training)
    n = max(sums[2].item(), 1)
    return dict(loss_hints=sums[0].item() / n if index is not None else None,
                loss_nohints=sums[1].item() / n if also_without_hints else None,
                tokens=int(n_seq * seq_len * dist.world_size), lookup_s=lookup_s)


class ValSource(NamedTuple):
    """The index a validation uses: kind is 'background', 'val-index', 'training' or None."""

    kind: str | None
    reason: str


def pick_val_index(background_ready, background_state, have_val_index, have_training_index):
    """Which index validates, the same choice on every rank, and why.

    background_ready: one flag per rank (empty when the run builds no background index); the
    background index is used only when it is ready on every rank (the all-ranks minimum), since
    ranks that validated with different indexes would average incomparable losses.
    background_state: what the background builder says of itself (for the reason).
    """
    if background_ready and all(background_ready):
        return ValSource("background", "the background index is ready on every rank")
    if not background_ready:
        why = "no background index in this run"
    elif any(background_ready):
        why = f"the background index is not ready on every rank ({sum(background_ready)} of {len(background_ready)})"
    else:
        why = f"the background index is not ready ({background_state})"
    if have_val_index:
        return ValSource("val-index", f"{why}: using --val-index")
    if have_training_index:
        return ValSource("training", f"{why}: using the training-time index")
    return ValSource(None, f"{why}, no --val-index and no training index: no hinted loss")


# Lookup threads per rank for a saved or background index (the index releases the GIL).
VAL_LOOKUP_WORKERS = 4


# The article's open rules question about exact validation hints, logged with every run that uses them.
EXACT_RULES_NOTE = ("rules question (the article's): may counting the validation n-grams in the training tokens "
                    "run inside the timed region, as backward passes on it do? The 3.1 s estimate assumes yes; "
                    "this run counts them outside it")


def count_exact_val_hints(mode, val_tokens, train_files, max_tokens, lengths, *, seq_len, batch_size, dist, log):
    """Exact validation hints (`--val-hints exact|exact-gpu`): this rank's share of the val
    positions, counted in the first max_tokens training tokens by hints.exact (torch on any
    device, or the Triton kernels on CUDA), before the clock starts."""
    from hints.exact import exact_val_hints
    if mode == "exact-gpu" and not dist.cuda:
        raise SystemExit(f"error: --val-hints exact-gpu needs a CUDA device; this run is on {dist.device} "
                         f"(use --val-hints exact)")
    if max_tokens <= 0:
        raise SystemExit(f"error: --val-hints {mode} counts in the first --hint-tokens training tokens; "
                         f"give --hint-tokens > 0")
    first, n_seq, _ = val_split(len(val_tokens), seq_len, batch_size, dist.rank, dist.world_size)
    exact = exact_val_hints(val_tokens, iter_tokens(train_files, max_tokens=max_tokens), lengths,
                            backend="triton" if mode == "exact-gpu" else "torch", device=dist.device,
                            start=first * seq_len, stop=(first + n_seq) * seq_len)
    log(f"val hints: {exact.describe()}, outside the timed region")
    log(EXACT_RULES_NOTE)
    return exact


def open_val_index(path, lengths, log):
    """A saved index for validation (`--val-index`), mapped read-only; refused unless built with the model's lengths."""
    try:
        idx = HintIndex.load(path, mmap=True, workers=VAL_LOOKUP_WORKERS)
    except (ValueError, OSError) as e:
        raise SystemExit(f"error: --val-index {path}: {e}") from None
    if idx.geom.lengths != tuple(lengths):
        raise SystemExit(f"error: --val-index {path}: built with n-gram lengths {idx.geom.lengths}, "
                         f"the model's --hint-lengths are {tuple(lengths)}")
    log(f"--val-index {path}: {idx.tokens_added:,} tokens, {idx.geom.describe()}")
    return idx


def wait_for_background(background, bg_wait, dist, log):
    """At the final validation: wait up to bg_wait seconds while the build runs; the seconds
    waited, the same on every rank. Rank 0 decides when to stop waiting and tells the others, so
    a builder that died before its first status write (which only the owner sees) costs no rank
    the whole wait."""
    waited = 0.0
    if dist.master and background is not None and background.status()["state"] in ("starting", "running"):
        log(f"final validation: waiting up to {bg_wait:.0f}s for the background index ({background.describe()}); "
            f"the wait counts as training time")
        t0 = time.perf_counter()
        background.wait(bg_wait)
        waited = time.perf_counter() - t0
    return dist.broadcast(waited)


def pick_index(with_background, background, val_index, train_index, dist):
    """(ValSource, index) for a validation, the same on every rank: pick_val_index over every
    rank's readiness, and a background index that fails to open on any rank falls back on all."""
    have = (val_index is not None, train_index is not None)
    ready = dist.gather(background is not None and background.ready()) if with_background else []
    source = pick_val_index(ready, background.describe() if background is not None else "failed to start", *have)
    index = None
    if source.kind == "background":
        error = None
        try:
            index = background.open(workers=VAL_LOOKUP_WORKERS)
        except Exception as e:  # noqa: BLE001 - reported; the same fallback as a builder not ready
            error = f"{type(e).__name__}: {e}"
        errors = [e for e in dist.gather(error) if e]
        if errors:
            index, source = None, pick_val_index([False], f"open failed: {errors[0]}", *have)
    if source.kind != "background":
        index = {"val-index": val_index, "training": train_index}.get(source.kind)
    return source, index


def validate(model, val_tokens, *, step, total, with_background, background, bg_wait, val_index, train_index,
             seq_len, batch_size, dist, cache, log, exact=None):
    """One validation of a run: at the end, wait for a late background index (up to bg_wait
    seconds); pick the index on every rank alike; evaluate with and without hints; log one line.
    with_background: the run asked for a background index (the same on every rank, even where
    `background` is None because it could not start or attach there). exact: exact hints counted
    before training (count_exact_val_hints), which then give every hinted loss.
    Returns evaluate()'s dict plus index (kind), index_reason, index_tokens, index_desc and
    bg_wait_s (seconds waited for the background index: training time, as the speedrun counts it)."""
    t0, waited = time.perf_counter(), 0.0
    if exact is not None:
        source, index = ValSource("exact", f"exact counts ({exact.backend}, {exact.seconds:.1f}s before training)"), exact
    else:
        if with_background and step == total and bg_wait > 0:
            waited = wait_for_background(background, bg_wait, dist, log)
        source, index = pick_index(with_background, background, val_index, train_index, dist)
    res = evaluate(model, val_tokens, index, seq_len=seq_len, batch_size=batch_size, dist=dist, cache=cache)
    n = int(index.tokens_added) if index is not None else 0
    res.update(index=source.kind, index_reason=source.reason, index_tokens=n, bg_wait_s=waited,
               index_desc=f"{source.kind or 'none'}, {human_tokens(n)} tokens")
    hinted = f"{res['loss_hints']:.4f}" if res["loss_hints"] is not None else "n/a"
    log(f"step {step}/{total} val_loss_hints {hinted} val_loss_nohints {res['loss_nohints']:.4f} "
        f"(hints: {res['index_desc']}; {source.reason}) [{res['tokens']:,} val tokens, "
        f"{time.perf_counter() - t0:.1f}s, lookup {res['lookup_s'] * 1e3:.0f}ms]")
    log.metrics({"val/loss_hints": res["loss_hints"], "val/loss_nohints": res["loss_nohints"]}, step)
    return res
