"""model/tail_average.py on a toy run: each average against an EMA computed by hand over the sheet's
tick lists (RECORD.md section 12, the record's 570 steps, written out here), the ship's blends, order
and norm restore, a short run under the schedule's scaled windows; gloo_part is the two-rank check's
(tests/test_record_optim_gloo.py)."""
import pytest
import torch

from model.tail_average import TailAverages
from tests.record_params import labelled_params
from train.record_schedule import RecordSchedule

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LABELS = ("lm_head", "embed", "qk_bank", "vo_bank", "mlp_bank", "value_embeds")


def toy_params():
    lp = labelled_params(seed=0, value_embeds=True)
    return {k: lp[k] for k in LABELS}


def weights_at(lp, step):
    """The toy run: every weight drifts, W_s = W_0 (1 + s/570) + 0.1 noise_s (deterministic per step)."""
    for i, label in enumerate(LABELS):
        p = lp[label][0]
        if not hasattr(p, "start"):
            p.start = p.data.clone()
        noise = torch.randn(p.shape, generator=torch.Generator().manual_seed(1000 * step + i))
        p.data.copy_(p.start * (1 + step / 570) + 0.1 * noise)


def record_cadence(step):
    """The table's events at the record's 570 steps: odd steps to 159, then 3 mod 4."""
    return step % 4 == 3 if step >= 160 else step % 2 == 1


def hand_ema(ticks, weight_of):
    """A <- A + rho (W - A) over [(step, rho)], the first tick a copy; float64."""
    A = None
    for step, rho in ticks:
        W = weight_of(step)
        A = W.clone() if A is None else A + rho * (W - A)
    return A


def test_each_average_and_the_ship_at_570_steps():
    lp = toy_params()
    record = dict(total_steps=570, ema_window=142, avg_window=119, avg_rate=4 / 53 * 1194 / 570)
    tail = TailAverages(lp, **record, value_embed_updates=record_cadence)
    history = {}
    for step in range(570):
        if step >= 428:  # the earliest window start: the weights before it are never read
            weights_at(lp, step)  # "after the step's update"
            history[step] = {k: lp[k][0].data.double().clone() for k in LABELS}
        tail.tick(step)
    r = 2 / 143
    ticks = {  # the sheet's table, written out
        "tail-ema": [(428, None)] + [(s, 1 - (1 - r) ** 2) for s in range(429, 568, 2)] + [(569, r)],
        "tail-avg": [(s, 4 / 53 * 1194 / 570) for s in range(453, 570, 4)],
        "value-embed-avg": [(s, 4 / 53 * 1194 / 570) for s in range(451, 568, 4)],
        "bank-blend": [(s, 2 / 36) for s in range(429, 566, 4)] + [(568, 2 / 36), (569, 2 / 36)],
    }
    labels = {"tail-ema": ("lm_head", "embed"), "tail-avg": ("vo_bank", "mlp_bank"),
              "value-embed-avg": ("value_embeds",), "bank-blend": ("qk_bank", "vo_bank", "mlp_bank")}
    expect = {(tag, label): hand_ema(ticks[tag], lambda s, label=label: history[s][label].view(-1))
              for tag in ticks for label in labels[tag]}
    for acc in tail.accumulators:
        for label in acc.labels:
            torch.testing.assert_close(acc.bufs[label].double(), expect[acc.tag, label], rtol=1e-5, atol=1e-6)
    # the ship, by hand: blends in the record's order, then the five norms restored (not value_embeds)
    final = history[569]
    shipped = {
        "lm_head": 0.35 * final["lm_head"].view(-1) + 0.65 * expect["tail-ema", "lm_head"],
        "embed": 0.35 * final["embed"].view(-1) + 0.65 * expect["tail-ema", "embed"],
        "qk_bank": 0.45 * final["qk_bank"].view(-1) + 0.55 * expect["bank-blend", "qk_bank"],
        "value_embeds": expect["value-embed-avg", "value_embeds"],
    }
    for label in ("vo_bank", "mlp_bank"):  # bank-blend lerps from the shipped tail average
        shipped[label] = 0.6507 * expect["tail-avg", label] + 0.3493 * expect["bank-blend", label]
    for label in ("lm_head", "embed", "qk_bank", "vo_bank", "mlp_bank"):
        shipped[label] = shipped[label] * final[label].norm() / shipped[label].norm()
    tail.ship()
    for label in LABELS:
        torch.testing.assert_close(lp[label][0].data.double().view(-1), shipped[label], rtol=1e-5, atol=1e-6)
    assert lp["value_embeds"][0].data.norm() < final["value_embeds"].norm() * 0.99  # averaging shrank it: no rescale


def test_a_short_run_under_the_scaled_schedule_ticks_every_average():
    schedule = RecordSchedule(100)
    lp = toy_params()
    tail = TailAverages(lp, **schedule.tail_settings(), value_embed_updates=schedule.is_table_event)
    for step in range(100):
        weights_at(lp, step)
        tail.tick(step)
    assert all(label in acc.seeded for acc in tail.accumulators for label in acc.labels)
    tail.ship()


def test_ship_before_any_tick_is_refused():
    tail = TailAverages(toy_params(), total_steps=570, ema_window=142, avg_window=119, avg_rate=0.158,
                        value_embed_updates=record_cadence)
    with pytest.raises(RuntimeError, match="tail-ema never ticked lm_head"):
        tail.ship()
    with pytest.raises(ValueError, match="expected one contiguous 'value_embeds' parameter"):
        TailAverages({k: v for k, v in toy_params().items() if k != "value_embeds"}, total_steps=570,
                     ema_window=142, avg_window=119, avg_rate=0.158, value_embed_updates=record_cadence)


# ---- two gloo ranks (run by tests/test_record_optim_gloo.py, one spawn for all parts) ----

SMALL = dict(total_steps=40, ema_window=14, avg_window=12, avg_rate=0.5)


def small_cadence(step):
    return step % 4 == 3


def gloo_part(rank=0, world=1):
    """The shipped weights of a 40-step toy run, and each accumulator's size (a rank averages its half).
    On the ranks value_embeds' other half is spoiled before the ship (it is not rescaled): the
    gather must bring it back."""
    lp = toy_params()
    tail = TailAverages(lp, **SMALL, value_embed_updates=small_cadence, rank=rank, world_size=world)
    for step in range(40):
        weights_at(lp, step)
        tail.tick(step)
    sizes = {f"size/{acc.tag}/{label}": buf.numel() for acc in tail.accumulators for label, buf in acc.bufs.items()}
    if world > 1:
        ve = lp["value_embeds"][0].data.view(-1)
        n = ve.numel() // world
        ve[(1 - rank) * n:(2 - rank) * n] = 7.0
    else:  # what each of two ranks holds
        sizes = {k: v // 2 for k, v in sizes.items()}
    tail.ship()
    return {**sizes, **{label: lp[label][0].data.clone() for label in LABELS}}
