"""The record arch's optimizer bundle (train/record_optim.py) on labelled tensors shaped like
RecordGPT's (tests/record_params.py) and a small n-gram table, over a whole scaled run: who moves
on which step (the record's cadences), the tie, the warm-up step list, and the post-warm-up reset
(a warmed-up-then-reset run equals a fresh one bit for bit)."""
import copy

import pytest
import torch

from model.ngram_table import NgramTable
from tests.record_params import D, VOCAB, labelled_params, set_grads
from train.record_optim import RecordOptimizers, cycle_steps
from train.record_schedule import RecordSchedule

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 84            # the shortest run where every switch happens (RecordSchedule's MIN_STEPS)
TOKENS = 12           # a rank's tokens a step
TABLE_ROWS = 64
SCHED = RecordSchedule(STEPS, vocab=VOCAB)


def tokens_of(step):
    return torch.randint(0, VOCAB, (TOKENS,), generator=torch.Generator().manual_seed(10_000 + step))


def make():
    labelled = labelled_params(seed=3, value_embeds=True)
    table = NgramTable(TABLE_ROWS, D, dtype=torch.float32, period4_start=SCHED.table_switch, sign_pool_rows=8)
    return labelled, table, RecordOptimizers(labelled, SCHED, table=table)


def train(labelled, table, opt, steps, *, warmup, record=None):
    """steps (a list) in order, each with fresh gradients; the table's cycles as the loop runs them.
    warmup: the tables update on odd steps, no tail ticks. record(step) after each step."""
    is_event = (lambda s: s % 2 == 1) if warmup else SCHED.is_table_event
    for i, step in enumerate(steps):
        if table.cycle is None:
            table.begin_cycle([tokens_of(s) for s in cycle_steps(steps, i, is_event)])
        ng = table.embed(tokens_of(step))
        (ng * torch.linspace(-1, 1, D)).sum().backward()
        set_grads(labelled, seed=step)
        opt.step(SCHED.plan(step), table_event=is_event(step) if warmup else None, tails=not warmup)
        if record:
            record(step)


def snapshot(labelled, table):
    return {**{f"{label}{j}": p.detach().clone() for label, ps in labelled.items() for j, p in enumerate(ps)},
            "table": table.shard.clone()}


def test_each_optimizer_moves_on_its_steps_and_the_tie_holds_to_the_untie():
    labelled, table, opt = make()
    moved, before = {}, [snapshot(labelled, table)]

    def record(step):
        after = snapshot(labelled, table)
        moved[step] = {k for k in after if not torch.equal(after[k], before[0][k])}
        before[0] = after
        lm, embed = labelled["lm_head"][0], labelled["embed"][0]
        assert torch.equal(embed, lm.T) == (step <= SCHED.untie_step + 1), step  # 562 = 561's weights

    train(labelled, table, opt, list(range(STEPS)), warmup=False, record=record)
    for step, keys in moved.items():
        assert {"qk_bank0", "vo_bank0", "mlp_bank0"} <= keys, step                  # ANVIL: every step
        assert ("scalars0" in keys) == (step % 2 == 1), step                        # Adam: odd steps only
        assert ("value_embeds0" in keys) == SCHED.is_table_event(step), step         # the table's events
        assert ("table" in keys) == SCHED.is_table_event(step), step
    opt.ship()  # every tail average ticked (ship refuses an unseeded one)


def test_warmup_steps_cover_every_configuration():
    for steps in (STEPS, 300, 570):
        s = RecordSchedule(steps)
        key = lambda t: (s.plan(t).stage, s.plan(t).candidates, t % 2, s.plan(t).tied)  # noqa: E731
        warm = s.warmup_steps()
        assert {key(t) for t in range(steps)} == {key(t) for t in warm}, steps
        assert s.untie_step in warm and warm == sorted(set(warm))
    assert RecordSchedule().warmup_steps() == [0, 1, *range(158, 162), *range(338, 342), *range(462, 466),
                                               *range(524, 528), *range(558, 565)]  # RECORD.md section 13


def test_warmup_then_reset_gives_the_fresh_run_bitwise():
    labelled, table, opt = make()
    initial = copy.deepcopy({k: v for k, v in snapshot(labelled, table).items() if k != "table"})
    train(labelled, table, opt, SCHED.warmup_steps(), warmup=True)
    assert not torch.equal(labelled["scalars"][0], initial["scalars0"])  # the warm-up trained
    with torch.no_grad():
        for label, ps in labelled.items():
            for j, p in enumerate(ps):
                p.copy_(initial[f"{label}{j}"])
    opt.reset()
    train(labelled, table, opt, list(range(STEPS)), warmup=False)
    opt.ship()
    warmed = snapshot(labelled, table)

    labelled, table, opt = make()
    train(labelled, table, opt, list(range(STEPS)), warmup=False)
    opt.ship()
    fresh = snapshot(labelled, table)
    for k in fresh:
        assert torch.equal(warmed[k], fresh[k]), k


def test_cycle_steps():
    odd = lambda s: s % 2 == 1  # noqa: E731
    assert cycle_steps([0, 1, 2, 3], 0, odd) == [0, 1]
    assert cycle_steps([0, 1, 158, 159, 164], 2, odd) == [158, 159]
    assert cycle_steps([0, 1, 158, 159, 164], 4, odd) == [164]      # never ends: never applied
    assert cycle_steps(list(range(160, 170)), 0, SCHED.is_table_event) == [160, 161, 162, 163]
