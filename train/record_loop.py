"""The record arch's per-step work: one training step (a rank's packed batch -> the step's plan ->
the n-gram table's cycle -> forward and backward with the plan's windows, MTP and prefix weights and
sampled-softmax candidates -> every optimizer -> the fp8 scales), a run of steps (timed, or the
warm-up's), the reset after the warm-up, and the final validation.

A run of steps (`RecordTrainer.run`) walks a list of steps with their batches by position: the
timed run is steps 0..N-1 on the run's loader; the warm-up is RecordSchedule.warmup_steps() on a
loader of its own whose i-th batch is cut at the i-th warm-up step's length (the record's warm-up
reads the first batches of a fresh loader). At the start of each table cycle the n-gram table pulls
the rows of every step of the cycle (train/record_optim.py cycle_steps), so the batches are read up
to a cycle ahead. The warm-up differs from the timed run as the record's does: no hints, no prefix
term, the tables update on every odd step, no tail ticks; afterwards `reset` restores the initial
weights and every optimizer, table, window, fp8 and sampling state, so the timed run starts as if
there had been no warm-up (tests/test_record_run.py checks it bit for bit).

Gradients are not synchronised here: each optimizer reduces its own parameters' gradients over the
ranks (ANVIL reduce-scatters the banks, Adam all-reduces its two-step sums, value_embeds and the
table exchange their rows at the events), as the record's.
"""
import copy

import numpy as np
import torch

from data.packed_loader import record_split, segment_starts
from model.record_gpt import RecordHints
from train.record_optim import cycle_steps


def odd_step(step: int) -> bool:
    """The warm-up's table cadence: every odd step (its Adam steps)."""
    return step % 2 == 1


class Batches:
    """A loader's batches by position, read ahead on demand and dropped once used."""

    def __init__(self, loader):
        self.loader, self.ready, self.read = loader, {}, 0

    def get(self, i: int):
        while self.read <= i:
            self.ready[self.read] = self.loader.next_batch()
            self.read += 1
        return self.ready[i]

    def drop(self, i: int) -> None:
        self.ready.pop(i, None)


class RecordTrainer:
    """The record arch's model, table and optimizers, and the per-step work on them (module docstring).

    hints(batch, step) -> RecordHints or None gives a timed step's training-time hints; prefix_table
    (int64 (V,) tensor, -1 = none) turns the prefix term on for timed steps (None: off)."""

    def __init__(self, model, table, optimizers, schedule, sampled, *, device, hints=None, prefix_table=None):
        self.model, self.table, self.optimizers, self.schedule = model, table, optimizers, schedule
        self.sampled, self.device, self.hints, self.prefix_table = sampled, device, hints, prefix_table
        self.initial = copy.deepcopy(model.state_dict())

    def segments(self, doc_starts, T: int, cut_tokens: int) -> torch.Tensor:
        """cu_seqlens of a training row: its documents, split every segment_tokens inside a document
        on the steps whose cut exceeds it (data/packed_loader.py record_split)."""
        split = record_split(cut_tokens, cap=self.schedule.segment_tokens)
        return torch.from_numpy(segment_starts(doc_starts, T, split)).to(self.device)

    def step(self, batch, step: int, *, warmup: bool = False, table_event: bool | None = None) -> torch.Tensor:
        """One training step on this rank's batch (its table cycle already begun); the loss sum, detached."""
        plan = self.schedule.plan(step)
        x = torch.from_numpy(batch.inputs).to(self.device)
        y = torch.from_numpy(batch.targets).to(self.device)
        T = x.numel()
        hints = None if warmup or self.hints is None else self.hints(batch, step)
        prefix = None if warmup or self.prefix_table is None else self.prefix_table[y]
        candidates = None
        if plan.candidates is not None:
            candidates = self.sampled.candidates(plan.candidates, torch.from_numpy(batch.targets)).to(self.device)
        ng = self.table.embed(batch.inputs)
        loss = self.model(x, y, self.segments(batch.doc_starts, T, plan.cut_tokens), ng, windows=plan.window_tokens,
                          mtp_weights=plan.mtp_weights, prefix_targets=prefix, prefix_weight=plan.prefix_weight,
                          candidates=candidates, hints=hints)
        loss.backward()
        self.optimizers.step(plan, table_event=table_event, tails=not warmup)
        self.model.refresh_fp8()  # mlp_bank moved (ANVIL updates every step)
        return loss.detach()

    def run(self, steps, batches: Batches, *, warmup: bool = False, on_step=None) -> None:
        """steps (a list) in order; batches.get(i) is the batch of steps[i]; on_step(step, loss) after each."""
        is_event = odd_step if warmup else self.schedule.is_table_event
        for i, step in enumerate(steps):
            if self.table.cycle is None:
                n = len(cycle_steps(steps, i, is_event))
                self.table.begin_cycle([batches.get(j).inputs for j in range(i, i + n)])
            loss = self.step(batches.get(i), step, warmup=warmup, table_event=is_event(step) if warmup else None)
            batches.drop(i)
            if on_step is not None:
                on_step(step, loss)

    @torch.no_grad()
    def reset(self) -> None:
        """The post-warm-up reset: initial weights, every optimizer and table state, the step-0 windows and
        rotary tables, the fp8 scales, the sampled-softmax sweep (the caller opens a fresh loader)."""
        self.model.zero_grad(set_to_none=True)
        self.model.load_state_dict(self.initial)
        self.optimizers.reset()
        self.sampled.reset()
        self.model.reset_windows()
        self.model.reset_fp8()

    @torch.no_grad()
    def validate(self, reader, *, val_hints=None, canon_mask=None, dist=None) -> dict:
        """The final validation over every batch of `reader` (data/packed_loader.py ValidationReader): the
        final windows without a YaRN rescale, the full softmax, `canon_mask` (or none), loss without hints
        and, when val_hints(inputs) gives RecordHints, with them. Next-token CE averaged over the tokens of
        every batch and rank."""
        final = self.schedule.final_validation()
        was_training = self.model.training
        self.model.eval()
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # CE without hints, with, tokens
        for batch in reader:
            x = torch.from_numpy(batch.inputs).to(self.device)
            y = torch.from_numpy(batch.targets).to(self.device)
            cu = torch.from_numpy(segment_starts(batch.doc_starts, x.numel())).to(self.device)
            ng = self.table.lookup(batch.inputs)
            args = dict(windows=final.window_tokens, canon_mask=canon_mask, yarn=False)
            total, n = self.model.evaluate(x, y, cu, ng, **args)
            sums[0] += total.double()
            sums[2] += n
            hints = val_hints(batch.inputs) if val_hints is not None else None
            if hints is not None:
                sums[1] += self.model.evaluate(x, y, cu, ng, hints=hints, **args)[0].double()
        if dist is not None:
            dist.all_sum(sums)
        self.model.train(was_training)
        tokens = max(sums[2].item(), 1.0)
        return dict(val_loss_nohints=sums[0].item() / tokens,
                    val_loss_hints=sums[1].item() / tokens if val_hints is not None else None,
                    val_tokens=int(sums[2].item()))


def record_hints(followers: np.ndarray, cells: np.ndarray, weights: np.ndarray, device) -> RecordHints:
    """train/positional_hints.py cells_to_arrays' (1, T, F), (1, T), (1, T, F) arrays -> the model's RecordHints."""
    return RecordHints(torch.from_numpy(followers[0]).to(device), torch.from_numpy(cells[0]).to(device),
                       torch.from_numpy(weights[0]).to(device))
