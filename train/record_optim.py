"""The record arch's optimizers as one object: ANVIL on the three banks, the record's Adam (with the
lm_head / embed tie), value_embeds' Adam and the n-gram table's row Adam on the table's update
events, and the tail averages; stepped in the record's order with the schedule's values, and reset
in place after the warm-up.

One step (the record's training.py step_optimizers, then train_gpt.py's tail tick), after the
backward of step s, with plan = RecordSchedule.plan(s) and L = 0.008 s (Adam's base lr, s the LR
multiplier):
  1. value_embeds' gradient goes into its cycle's fp16 sum (model/row_adam.py ValueEmbedAdam).
  2. at a table event: the n-gram table's cycle ends (its row Adam, lr L; model/ngram_table.py) and
     value_embeds' Adam runs on the cycle's sum (lr L).
  3. the record's Adam folds this step's gradients into its two-step sums and updates on odd steps
     (model/record_adam.py; the untie at the schedule's untie step).
  4. ANVIL updates the banks (every step; lr scale s, rail beta, rails engaged: model/anvil.py).
  5. the tail averages tick (model/tail_average.py) -- not in the warm-up.
The optimizers own disjoint parameters, so 2-4 commute; this is the record's order all the same.
The warm-up steps the same object with table_event = the step is odd (the record's warm-up updates
the tables on every odd warm-up step) and without tail ticks.

reset(): every optimizer's state to its initial value, the table's rows to zero and its cycle
dropped, the tail averages unseeded. The weights are the caller's to restore (the model's initial
state dict), embed = lm_head^T among them: RecordAdam starts tied again.
"""
import torch

from model.anvil import Anvil
from model.record_adam import ADAM_LR, RecordAdam
from model.row_adam import ValueEmbedAdam
from model.tail_average import TailAverages


def cycle_steps(steps, i: int, is_event) -> list:
    """The update cycle that starts at steps[i]: the steps from it up to and including the first one
    that is_event(step) holds for (the n-gram table pulls their rows at once), or to the list's end
    (a cycle whose gradient is never applied: the record's steps after its last event)."""
    out = []
    for step in steps[i:]:
        out.append(step)
        if is_event(step):
            break
    return out


def value_embeds_rows(p: torch.Tensor) -> torch.Tensor:
    """value_embeds as the 2-D (planes * vocab, d) table ValueEmbedAdam updates (a view of p's storage)."""
    return p.data.view(-1, p.shape[-1])


class RecordOptimizers:
    """Every optimizer of the record arch over a {label: [params]} dict (RecordGPT.labelled_params())
    and, optionally, the run's NgramTable (it is not a parameter: it holds its own row Adam)."""

    def __init__(self, labelled: dict, schedule, *, table=None, rank: int = 0, world_size: int = 1):
        if len(labelled.get("value_embeds", [])) != 1:
            raise ValueError("RecordOptimizers: expected exactly one 'value_embeds' parameter, got "
                             f"{len(labelled.get('value_embeds', []))}")
        self.schedule, self.table = schedule, table
        self.value_embeds_param = labelled["value_embeds"][0]
        self.anvil = Anvil(labelled, rank=rank, world_size=world_size)
        self.adam = RecordAdam(labelled, untie_step=schedule.untie_step, rank=rank, world_size=world_size)
        self.value_embeds = ValueEmbedAdam(value_embeds_rows(self.value_embeds_param), rank=rank,
                                           world_size=world_size, period4_start=schedule.table_switch)
        self.tails = TailAverages(labelled, **schedule.tail_settings(), value_embed_updates=schedule.is_table_event,
                                  rank=rank, world_size=world_size)
        if table is not None and table.adam.period4_start != schedule.table_switch:
            raise ValueError(f"RecordOptimizers: the n-gram table switches its cadence at step "
                             f"{table.adam.period4_start}, the schedule at {schedule.table_switch}")

    @torch.no_grad()
    def step(self, plan, *, table_event: bool | None = None, tails: bool = True) -> None:
        """Every optimizer after the backward of plan.step (the module docstring's order); every
        gradient is consumed. table_event: None = the plan's (the timed run's cadence)."""
        s, step = plan.lr_scale, plan.step
        p = self.value_embeds_param
        if p.grad is not None:
            self.value_embeds.accumulate(p.grad.view(-1, p.shape[-1]))
            p.grad = None
        if plan.table_event if table_event is None else table_event:
            if self.table is not None:
                self.table.end_cycle(step, ADAM_LR * s)
            self.value_embeds.update(step, ADAM_LR * s)
        self.adam.step(step, s)
        self.anvil.step(lr_scale=s, rail_beta=plan.rail_beta, engaged=plan.rails_engaged)
        if tails:
            self.tails.tick(step)

    def ship(self) -> None:
        """The tail averages into the weights (once, after the last step, before the final validation)."""
        self.tails.ship()

    def reset(self) -> None:
        """Every state back to its start, in place (the module docstring)."""
        self.anvil.reset()
        self.adam.reset()
        self.value_embeds.reset()
        self.tails.reset()
        if self.table is not None:
            self.table.reset()
