"""The record's Adam (model/record_adam.py) against a plain float64 statement of the sheet's table
and rules (RECORD.md sections 6 and 9): odd steps on the two-step gradient sum, cautious decay
~ lr^2, the lm_head / embed tie through the untie step and the moments handed over there, groups
without gradients skipped; gloo_part is the two-rank check's (tests/test_record_optim_gloo.py)."""
import pytest
import torch

from model.record_adam import RecordAdam
from tests.record_params import labelled_params, mean_grads, set_grads

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# The sheet's table (RECORD.md section 9), written out again: (lr_mul, beta1, beta2, wd_mul).
TABLE = {
    "scalars": (5, 0.9, 0.99, 0), "smear_gate": (0.01, 0.9, 0.99, 0), "ve_gate_bank": (1, 0.9, 0.99, 1),
    "post_lambdas": (1, 0.9, 0.95, 0), "resid_lambdas": (5, 0.9, 0.95, 0),
    "lm_head": (1.22, 0.5, 0.95, 150), "embed": (1.22, 0.5, 0.95, 150),
    "mudd_w1": (0.5, 0.9, 0.99, 1), "mudd_w2": (0.25, 0.9, 0.99, 1), "mudd_w2g": (0.25, 0.9, 0.99, 1),
    "mudd_b2": (0.25, 0.9, 0.99, 0), "mudd_gate_w1": (0.2, 0.9, 0.99, 1), "mudd_gate_w2": (0.1, 0.9, 0.99, 1),
    "mudd_gate_b2": (0.1, 0.9, 0.99, 0), "s_g": (0.1, 0.9, 0.99, 0),
    "hint_scales": (10, 0.9, 0.99, 0), "hint_embed": (1, 0.9, 0.99, 0),
}
UNTIE = 5
LR_SCALES = [1.0, 1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.3]
# which labels get a gradient at which steps (the rest: every step)
ONLY_AT = {"hint_scales": (), "hint_embed": (2,), "smear_gate": (3,)}


def adam_params(seed=0):
    lp = labelled_params(seed=seed, value_embeds=True)
    lp["lm_head"][0].data.mul_(30)  # weights ~ N(0, 3^2): lm_head's decay (wd_mul 150) is ~2% of its update
    lp["embed"][0].data.copy_(lp["lm_head"][0].data.T)
    return lp


def grads_at(lp, step, seed):
    """A gradient for every Adam parameter that ONLY_AT allows at this step (banks and value_embeds too)."""
    set_grads(lp, seed)
    for label, steps in ONLY_AT.items():
        if step not in steps:
            for p in lp[label]:
                p.grad = None


def reference(params0, grads, lr_scales, untie):
    """params0 {label: [float64]}, grads[step] {label: [float64 or None]}: the sheet's rules, plainly."""
    W = {k: [p.clone() for p in v] for k, v in params0.items()}
    sums = {k: [torch.zeros_like(p) for p in v] for k, v in W.items()}
    got = {k: [False] * len(v) for k, v in W.items()}
    m = {k: [torch.zeros_like(p) for p in v] for k, v in W.items()}
    v2 = {k: [torch.zeros_like(p) for p in v] for k, v in W.items()}
    t = {k: [0] * len(v) for k, v in W.items()}
    tied = True
    for step, (g_step, s) in enumerate(zip(grads, lr_scales)):
        for k in W:
            for j, g in enumerate(g_step[k]):
                if g is not None:
                    sums[k][j] += g
                    got[k][j] = True
        if step % 2 == 0:
            continue
        if tied:
            sums["lm_head"][0] += sums["embed"][0].T
            got["lm_head"][0] |= got["embed"][0]
        for k, (lr_mul, b1, b2, wd_mul) in TABLE.items():
            if k == "embed" and tied:
                continue
            for j in range(len(W[k])):
                if not got[k][j]:
                    continue
                g = sums[k][j]
                t[k][j] += 1
                m[k][j] = b1 * m[k][j] + (1 - b1) * g
                v2[k][j] = b2 * v2[k][j] + (1 - b2) * g * g
                L = 0.008 * s * lr_mul
                u = L * (1 - b2 ** t[k][j]) ** 0.5 / (1 - b1 ** t[k][j]) * m[k][j] / (v2[k][j].sqrt() + 1e-10)
                u = u + L * L * 0.005 * wd_mul * W[k][j] * (u * W[k][j] > 0)
                W[k][j] = W[k][j] - u
        if tied:
            W["embed"][0] = W["lm_head"][0].T.clone()
            if step == untie:
                m["embed"][0], v2["embed"][0] = m["lm_head"][0].T.clone(), v2["lm_head"][0].T.clone()
                t["embed"][0] = t["lm_head"][0]
                tied = False
        sums = {k: [torch.zeros_like(p) for p in v] for k, v in W.items()}
        got = {k: [False] * len(v) for k, v in W.items()}
    return W


def test_steps_follow_the_sheet():
    lp = adam_params()
    W0 = {k: [p.data.double().clone() for p in lp[k]] for k in TABLE}
    opt = RecordAdam(lp, untie_step=UNTIE)
    grads = []
    for step, s in enumerate(LR_SCALES):
        grads_at(lp, step, seed=step)
        grads.append({k: [None if p.grad is None else p.grad.double() for p in lp[k]] for k in TABLE})
        before = {k: [p.data.clone() for p in lp[k]] for k in TABLE}
        updated = opt.step(step, s)
        assert updated == (step % 2 == 1)
        assert all(p.grad is None for k in TABLE for p in lp[k])
        if step % 2 == 0:  # even steps move nothing
            assert all(torch.equal(p.data, b) for k in TABLE for p, b in zip(lp[k], before[k]))
        if step <= UNTIE:  # tied: embed is lm_head^T after every step, the untie step's update included
            assert torch.equal(lp["embed"][0].data, lp["lm_head"][0].data.T)
    ref = reference(W0, grads, LR_SCALES, UNTIE)
    for k in TABLE:
        for j, p in enumerate(lp[k]):
            moved = (ref[k][j] - W0[k][j]).abs()
            if k in ("hint_scales",):
                assert moved.max() == 0 and torch.equal(p.data.double(), W0[k][j]), k  # never a gradient: untouched
                continue
            err = (p.data.double() - ref[k][j]).abs()
            # float32 against float64: 1e-4 of the distance moved, plus a few float32 roundings of the weight
            assert (err <= 1e-4 * moved + 1e-6 * W0[k][j].abs() + 1e-12).all(), (k, j, float(err.max()))
    # after the untie the two are separate, and both moved on their own at step 7 and 9
    assert not torch.equal(lp["embed"][0].data, lp["lm_head"][0].data.T)
    assert [opt.sharded[k].t for k in ("lm_head", "embed")] == [5, 5]  # 3 tied updates, then 2 each


def test_decay_is_lr_squared_and_gated_on_the_update_sign():
    """One odd step with a gradient of one sign everywhere: u = L (first step: bias-corrected m/sqrt v = 1)
    plus L^2 0.005 wd_mul W where u W > 0."""
    lp = adam_params(seed=1)
    opt = RecordAdam(lp, untie_step=UNTIE)
    W0 = lp["lm_head"][0].data.clone()
    s = 0.5
    for step in (0, 1):
        for k in TABLE:
            for p in lp[k]:
                p.grad = torch.full_like(p, 0.25)
        opt.step(step, s)
    L = 0.008 * s * 1.22
    # the summed gradient includes embed's transposed: 2 * 0.25 + 2 * 0.25 = 1, u = L exactly (up to eps)
    expect = W0 - L - L * L * 0.005 * 150 * W0 * (W0 > 0)
    torch.testing.assert_close(lp["lm_head"][0].data, expect, rtol=0, atol=1e-6)


def test_bad_labels_and_untie_step_are_named():
    lp = adam_params()
    with pytest.raises(ValueError, match=r"no Adam group for labels \['mystery'\]"):
        RecordAdam({**lp, "mystery": [torch.zeros(3)]}, untie_step=UNTIE)
    with pytest.raises(ValueError, match="untie_step=560 must be odd"):
        RecordAdam(lp, untie_step=560)
    with pytest.raises(ValueError, match="torch.distributed is not initialised"):
        RecordAdam(lp, untie_step=UNTIE, world_size=2, rank=0)


def test_reset_restarts_tied_with_zero_state():
    lp = adam_params()
    opt = RecordAdam(lp, untie_step=1)
    for step in range(4):
        set_grads(lp, step)
        opt.step(step, 1.0)
    assert not opt.tied
    opt.reset()
    assert opt.tied and all(e.t == 0 and not e.exp_avg.any() and not e.grad_sum.any() for e in opt.params)


# ---- two gloo ranks (run by tests/test_record_optim_gloo.py, one spawn for all parts) ----

DIST_STEPS = 8


def gloo_part(rank=0, world=1):
    """Every Adam parameter after 8 steps (untie at 5): on `world` ranks each feeds its own gradients;
    on one process the mean of the two ranks' (exact: dyadic)."""
    lp = adam_params(seed=2)
    opt = RecordAdam(lp, untie_step=UNTIE, rank=rank, world_size=world)
    for step in range(DIST_STEPS):
        if world == 1:
            mean_grads(lp, [100 * step + r for r in range(2)], labels=TABLE)
        else:
            set_grads(lp, 100 * step + rank, labels=TABLE)
        opt.step(step, LR_SCALES[step])
    return {f"{k}/{j}": p.data.clone() for k in TABLE for j, p in enumerate(lp[k])}
