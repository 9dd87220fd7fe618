"""ANVIL (model/anvil.py): the cascade against a plain statement of the six maps and against SVD,
the bf16 + mantissa pair as an exact fp32 master, a few optimizer steps against the record's
equations written out here in float64, the decay's exact factors (lr^2, multipliers, the frozen
slot); gloo_part is the two-rank check's (tests/test_record_optim_gloo.py)."""
import math

import pytest
import torch

from model.anvil import ANVIL_MAPS, Anvil, _cascade, cascade, join_fp32, split_fp32
from tests.record_params import BANK_SHAPES, labelled_params, mean_grads, set_grads

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# The record's six maps (RECORD.md section 9), written out again: the test does not read the module's table.
MAPS = [(3.923798038567, -6.095026865488, 3.905234618423), (3.278126713798, -3.328923386476, 0.989127286973),
        (3.505298394150, -5.137358782410, 1.968325560615), (2.815058591845, -3.685181239622, 1.417196497642),
        (2.245503932403, -2.443826979899, 0.963091710461), (2.256537145403, -2.166840097229, 0.929501253245)]
BANKS = tuple(BANK_SHAPES)


def plain_maps(G):
    """X = G / (1.05 |G|_F + 1e-6); six rounds X <- a X + (b A + c A^2) X with A = X X^T, in float64
    (a tall matrix as its transpose: the same statement as a X + X B with A = X^T X)."""
    X = G.double()
    tall = X.shape[-2] > X.shape[-1]
    X = X.mT if tall else X
    X = X / (1.05 * X.norm(dim=(-2, -1), keepdim=True) + 1e-6)
    for a, b, c in MAPS:
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return X.mT if tall else X


@pytest.mark.parametrize("shape", [(32, 64), (224, 64), (48, 48), (3, 16, 48), (4, 96, 32)])
def test_cascade_is_the_six_maps(shape):
    G = torch.randn(shape, generator=torch.Generator().manual_seed(1)).bfloat16()
    got = cascade(G)
    assert got.dtype == torch.bfloat16 and got.shape == G.shape
    ref = plain_maps(G)
    # bf16 storage between the products: ~0.5% relative (observed 0.52-0.59%)
    assert (got.double() - ref).norm() / ref.norm() < 0.015


def test_cascade_maps_each_singular_value_by_the_composed_quintics():
    """On a diagonal G the maps act on each singular value alone: x -> a x + b x^3 + c x^5, six times,
    from x = sigma / (1.05 |G|_F). Values spread over the steep part (x ~ 4e-4 .. 5e-3) and the flat
    part, so a wrong margin or a mistyped coefficient shows (observed bf16 error <= 1.0%)."""
    sigma = torch.logspace(-3, math.log10(0.95), 64, dtype=torch.float64)
    for G in (torch.zeros(64, 128, dtype=torch.float64), torch.zeros(128, 64, dtype=torch.float64)):
        G[range(64), range(64)] = sigma
        x = sigma / (1.05 * sigma.norm())
        for a, b, c in MAPS:
            x = a * x + b * x ** 3 + c * x ** 5
        got = cascade(G).double().diagonal()
        assert ((got - x) / x).abs().max() < 0.015


def test_gpu_forms_bf16_gemms_agree_with_the_cpu_form():
    """The GPU path's native bf16 GEMMs (run here on the CPU) against the float32-accumulate-then-round
    form the CPU runs: the same rounding points, so they agree to within accumulation order."""
    g = torch.Generator().manual_seed(8)
    for shape in [(2, 32, 64), (2, 224, 64)]:
        G = torch.randn(shape, generator=g)
        native, emulated = _cascade(G, True).double(), _cascade(G, False).double()
        assert (native - emulated).norm() / emulated.norm() < 0.01


def test_cascade_table_is_the_records():
    assert [tuple(m) for m in ANVIL_MAPS] == MAPS


def test_cascade_singular_values_near_one():
    g = torch.Generator().manual_seed(2)
    for shape in [(256, 512), (1792, 512), (64, 16), (4, 32, 96)]:
        s = torch.linalg.svdvals(cascade(torch.randn(shape, generator=g)).double())
        # observed band on these Gaussian (well-conditioned) inputs: [0.9952, 1.0048]
        assert s.min() > 0.99 and s.max() < 1.01, (shape, s.min(), s.max())
    # A square Gaussian matrix has tiny singular values; those >= 0.5% of the Frobenius norm land in the band
    # (the composed maps send [0.005, 1/1.05] into [0.9993, 1.0004]).
    G = torch.randn(512, 512, generator=g, dtype=torch.float64)
    s_in = torch.linalg.svdvals(G) / G.norm()
    s_out = torch.linalg.svdvals(cascade(G).double())
    kept = s_out[s_in >= 0.005]
    assert kept.numel() > 400 and kept.min() > 0.99 and kept.max() < 1.01


def test_cascade_rejects_a_vector():
    with pytest.raises(ValueError, match="2-D matrix or a 3-D batch"):
        cascade(torch.ones(5))


def test_bf16_and_mantissa_restore_fp32_bitwise():
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(10000, generator=g) * 10 ** torch.randint(-30, 30, (10000,), generator=g).float(),
                   torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-42, -1e-42, 3.4e38])])
    high, low = split_fp32(x)
    assert high.dtype == torch.bfloat16 and low.dtype == torch.uint16
    assert torch.equal(join_fp32(high, low).view(torch.int32), x.view(torch.int32))
    # the stored bf16 is the truncation (towards zero) of the fp32 value, not its rounding
    assert (high.float().abs() <= x.abs()).all()


def run_steps(labelled, anvil, settings, seed0=0, grads=None):
    for t, (s, beta, engaged) in enumerate(settings):
        if grads is None:
            set_grads(labelled, seed0 + t, labels=BANKS)
        else:
            for label in BANKS:
                labelled[label][0].grad = grads[t][label].clone()
        anvil.step(lr_scale=s, rail_beta=beta, engaged=engaged)


SETTINGS = [(1.0, 0.85, False), (0.8, 0.9, False), (0.5, 0.93, True), (0.3, 0.9, True)]


def test_bf16_bank_with_mantissa_is_the_fp32_run_truncated():
    fp32 = labelled_params(seed=4, adam=False)
    bf16 = labelled_params(seed=4, bank_dtype=torch.bfloat16, adam=False)
    for label in BANKS:  # the same start: the bf16 values
        fp32[label][0].data.copy_(bf16[label][0].data.float())
    a32, a16 = Anvil(fp32), Anvil(bf16)
    grads = [{label: torch.randn(BANK_SHAPES[label], generator=torch.Generator().manual_seed(10 + t))
              for label in BANKS} for t in range(len(SETTINGS))]
    # the same gradient values in both runs: bf16's, which float32 holds exactly
    run_steps(fp32, a32, SETTINGS, grads=[{k: v.bfloat16().float() for k, v in g.items()} for g in grads])
    run_steps(bf16, a16, SETTINGS, grads=[{k: v.bfloat16() for k, v in g.items()} for g in grads])
    for label, bank in zip(BANKS, a16.banks):
        master = fp32[label][0].data.view(bank.units)
        stored = bf16[label][0].data.view(bank.units)
        assert torch.equal(join_fp32(stored, bank.mantissa).view(torch.int32), master.view(torch.int32)), label
        assert not torch.equal(stored.float(), master)  # the low bits matter: bf16 alone would have lost them


# ---- the record's equations in float64 (RECORD.md section 9), per whitening unit ----

def unit_multipliers(label, n_units, rows, cols):
    """(lr_mul * shape * m, wd_mul) per unit, from the sheet: qk 1.22 / 1.22; shape sqrt(max(1, r/c));
    mlp_bank[s, 1] (down projection) 2x; slot 7 frozen."""
    shape = math.sqrt(max(1.0, rows / cols))
    if label == "qk_bank":
        return [(1.22 * shape, 1.22)] * n_units
    if label == "vo_bank":
        return [(shape, 1.0)] * n_units
    return [(0.0 if u // 2 == 7 else shape * (2.0 if u % 2 else 1.0), 1.0) for u in range(n_units)]


def reference_anvil(weights, grads, settings):
    """weights: {label: (units, r, c) float64}; grads: per step {label: same}; returns the final weights."""
    W = {k: v.clone() for k, v in weights.items()}
    state = {k: [torch.zeros_like(v), torch.zeros_like(v), None] for k, v in W.items()}
    for t, (s, beta, engaged) in enumerate(settings):
        for label in W:
            vf, vs, L = state[label]
            n_units, rows, cols = W[label].shape
            g = grads[t][label]
            bf, w = (0.85, 0.4385) if engaged else (beta, 1.0)
            vf.mul_(bf).add_((1 - bf) * g)
            vs.mul_(0.98).add_(0.02 * g)
            gp = (1 - beta) * g + beta * (w * vf + (1 - w) * vs)
            X = plain_maps(gp)
            P = (X ** 2).mean(dim=-1, keepdim=True) if rows >= cols else (X ** 2).mean(dim=-2, keepdim=True)
            L = 0.1 * P if L is None else 0.9 * L + 0.1 * P
            state[label][2] = L
            Xe = X / L.sqrt()
            Xe = Xe * X.norm(dim=(-2, -1), keepdim=True) / Xe.norm(dim=(-2, -1), keepdim=True)
            for u, (lr_mul, wd_mul) in enumerate(unit_multipliers(label, n_units, rows, cols)):
                n = 0.023 * s * lr_mul
                k = 3.15 * wd_mul * 0.023 * s
                gate = (vs[u] * W[label][u] >= 0).double()
                W[label][u] = W[label][u] - n * Xe[u] - n * k * W[label][u] * gate
    return W


def test_steps_follow_the_record_equations():
    labelled = labelled_params(seed=5, adam=False)
    for label in BANKS:  # weights ~ N(0, 2^2): the gated decay is as large as the update
        labelled[label][0].data.mul_(2)
    anvil = Anvil(labelled)
    units = {b.label: b.units for b in anvil.banks}
    W0 = {label: labelled[label][0].data.view(units[label]).double().clone() for label in BANKS}
    grads = [{label: torch.randn(units[label], generator=torch.Generator().manual_seed(20 + t))
              for label in BANKS} for t in range(len(SETTINGS))]
    run_steps(labelled, anvil, SETTINGS, grads=[{k: v.view(BANK_SHAPES[k]) for k, v in g.items()} for g in grads])
    ref = reference_anvil(W0, [{k: v.double() for k, v in g.items()} for g in grads], SETTINGS)
    for label in BANKS:
        got = labelled[label][0].data.view(units[label]).double()
        for u in range(units[label][0]):
            moved = (ref[label][u] - W0[label][u]).norm()
            if moved == 0:  # the frozen slot: not one bit moves
                assert torch.equal(got[u], W0[label][u]), (label, u)
            else:
                assert (got[u] - ref[label][u]).norm() < 0.02 * moved, (label, u)


def test_decay_scales_with_lr_squared_and_the_multipliers():
    """A zero gradient leaves only the decay, gated open everywhere (v_s = 0 >= 0):
    W <- W (1 - 3.15 wd_mul (0.023 s)^2 lr_mul shape m)."""
    labelled = labelled_params(seed=6, adam=False)
    anvil = Anvil(labelled)
    W0 = {label: labelled[label][0].data.clone() for label in BANKS}
    s = 0.6
    for label in BANKS:
        labelled[label][0].grad = torch.zeros(BANK_SHAPES[label])
    anvil.step(lr_scale=s, rail_beta=0.9, engaged=False)
    lr = 0.023 * s
    for label, bank in zip(BANKS, anvil.banks):
        n_units, rows, cols = bank.units
        got, start = labelled[label][0].data.view(bank.units), W0[label].view(bank.units)
        for u, (lr_mul, wd_mul) in enumerate(unit_multipliers(label, n_units, rows, cols)):
            factor = 1 - 3.15 * wd_mul * lr * lr * lr_mul
            torch.testing.assert_close(got[u], start[u] * factor, rtol=2e-7, atol=0)
    # spot values: qk 1 - 3.15 * 1.22^2 * lr^2, mlp c_proj 1 - 3.15 * 2 sqrt(3.5)... at this shape sqrt(2)
    assert unit_multipliers("mlp_bank", 24, 64, 32)[3] == (2 * math.sqrt(2), 1.0)
    assert unit_multipliers("mlp_bank", 24, 64, 32)[14] == (0.0, 1.0)


def test_bad_banks_and_missing_gradients_are_named():
    labelled = labelled_params(adam=False)
    labelled["vo_bank"] = [torch.nn.Parameter(torch.zeros(3, 32, 32))]
    with pytest.raises(ValueError, match="vo_bank has 3 units, not a multiple of world_size=2"):
        Anvil(labelled, rank=0, world_size=2)
    labelled["mlp_bank"] = [torch.nn.Parameter(torch.zeros(24, 64, 32))]
    with pytest.raises(ValueError, match="mlp_bank must be"):
        Anvil(labelled)
    with pytest.raises(ValueError, match="torch.distributed is not initialised"):
        Anvil(labelled_params(adam=False), rank=0, world_size=2)
    anvil = Anvil(labelled_params(adam=False))
    with pytest.raises(ValueError, match="qk_bank has no gradient"):
        anvil.step(lr_scale=1.0, rail_beta=0.85, engaged=False)


# ---- two gloo ranks (run by tests/test_record_optim_gloo.py, one spawn for all parts) ----

DIST_SETTINGS = SETTINGS[:3]


def gloo_part(rank=0, world=1):
    """The banks after three steps, float32 and bf16: on `world` ranks each feeds its own gradients;
    on one process (world=1) the mean of the two ranks' (exact: dyadic)."""
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        labelled = labelled_params(seed=7, bank_dtype=dtype, adam=False)
        anvil = Anvil(labelled, rank=rank, world_size=world)
        for t, (s, beta, engaged) in enumerate(DIST_SETTINGS):
            if world == 1:
                mean_grads(labelled, [100 * t + r for r in range(2)], labels=BANKS)
            else:
                set_grads(labelled, 100 * t + rank, labels=BANKS)
            anvil.step(lr_scale=s, rail_beta=beta, engaged=engaged)
        results.update({f"{dtype}/{label}": labelled[label][0].data.clone() for label in BANKS})
    return results
