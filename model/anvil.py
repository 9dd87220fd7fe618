"""ANVIL: the record's optimizer for its three matrix banks (qk_bank, vo_bank, mlp_bank).

Per step and whitening unit (each qk_bank[i]: one head pair's Q or K rows; each vo_bank[i]: one
layer's V or O; each mlp_bank[s, m]: one MLP matrix), with g its rank-mean gradient:
  rails     v_f <- lerp(v_f, g, 1 - b_f); v_s <- lerp(v_s, g, 1 - 0.98), both from step 0;
            before the engage step b_f = beta(t) and blend = v_f, from it b_f = 0.85 and
            blend = 0.4385 v_f + 0.5615 v_s (the schedule says which: train/record_schedule.py)
  Nesterov  g' = lerp(g, blend, beta(t))
  cascade   X = bf16(g') / (1.05 |X|_F + 1e-6), then six quintic maps (cascade(), below)
  equalizer lanes along the longer side; P = lane mean of X^2; L <- lerp(L, P, 1 - 0.9);
            X <- X L^-1/2 |X|_F / |X L^-1/2|_F
  update    W <- W - n X - n k W [v_s W >= 0], on the fp32 master
            n = 0.023 s lr_mul shape m,  k = 3.15 wd_mul 0.023 s  (so the decay is ~ s^2)
            shape = sqrt(max(1, rows / cols)); qk lr_mul = wd_mul = 1.22; m = 2 on the MLP down
            projections (mlp_bank[s, 1]), 0 on the frozen slots (layer 7: no step, no decay), else 1.
All constants are the record's optim/anvil.py and training.py (its `anvil_defaults`, `param_table`).

Precision: a bf16 bank keeps a uint16 mantissa per weight; bf16 bits << 16 | mantissa is the exact
fp32 master the update reads, and the result's top 16 bits are stored back (truncated) with the low
16 in the mantissa (split_fp32 / join_fp32). A float32 bank (the CPU demo) is its own master.
Products are bf16 with float32 accumulation and one rounding per stored tensor (what the GPU's
bf16 GEMMs do); the CPU runs the same statements with the GEMMs in float32, rounded to bf16.

Distribution as the record's: each bank's gradient is reduce-scattered (mean) over its units,
world_size equal runs of consecutive units; each rank updates its own units (their rails, lane
energies and mantissas live only there) and all-gathers the bank. With one process nothing is sent.

Use: Anvil(model.labelled_parameters(), rank=, world_size=) takes the three bank labels; after
every backward, step(lr_scale=s, rail_beta=beta(t), engaged=t >= engage step) consumes the banks'
.grad (and sets it to None). Every step updates the banks (the record's ANVIL runs every step).
"""
import math
from dataclasses import dataclass

import torch

from model.collectives import all_gather_segments, is_distributed, reduce_scatter_mean
from model.device import gpu_paths_enabled, torch_compile

ANVIL_LABELS = ("qk_bank", "vo_bank", "mlp_bank")

# The six quintic maps (a, b, c): X <- a X + (b A + c A^2) X, A = X X^T (record's optim/anvil.py ANVIL_MAPS).
ANVIL_MAPS = (
    (3.923798038567, -6.095026865488, 3.905234618423),
    (3.278126713798, -3.328923386476, 0.989127286973),
    (3.505298394150, -5.137358782410, 1.968325560615),
    (2.815058591845, -3.685181239622, 1.417196497642),
    (2.245503932403, -2.443826979899, 0.963091710461),
    (2.256537145403, -2.166840097229, 0.929501253245),
)
# The cascade's input is divided by FROBENIUS_MARGIN |X|_F + FROBENIUS_EPS (record's optim/anvil.py).
FROBENIUS_MARGIN, FROBENIUS_EPS = 1.05, 1e-6
# Twin rails (record's optim/anvil.py): the engaged fast rail's beta, the slow rail's, the fast weight.
RAIL_FAST_BETA, RAIL_SLOW_BETA, RAIL_FAST_WEIGHT = 0.85, 0.98, 0.4385
# Base lr, decay and the equalizer's EMA decay (record's training.py anvil_defaults).
ANVIL_LR, ANVIL_WEIGHT_DECAY, EQUALIZER_BETA2 = 0.023, 3.15, 0.9
# The equalizer's floors on the lane energy and on the rescaled norm (record's optim/anvil.py _rail_equalizer).
LANE_FLOOR = 1e-10
# qk_bank's lr and decay multipliers (record's training.py param_table); vo and mlp take 1.
QK_LR_MUL = QK_WD_MUL = 1.22
# The MLP down projection's extra lr (record's optim/anvil.py: 2x on the odd mlp matrices, c_proj).
C_PROJ_LR_MUL = 2.0
# The record's layer 7 has no MLP: its bank slot never moves (model/gpt.py NO_MLP_LAYERS, frozen_matrices).
FROZEN_MLP_SLOTS = (7,)


# ---- the fp32 master as bf16 + a 16-bit mantissa ----

def split_fp32(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 -> (bf16 of its top 16 bits, i.e. truncated; uint16 of its low 16 bits)."""
    bits = x.contiguous().view(torch.int32)
    high = (bits >> 16).to(torch.int16)  # arithmetic shift: fits int16 exactly
    low = bits.to(torch.int16)           # the low 16 bits (integer casts wrap)
    return high.view(torch.bfloat16), low.view(torch.uint16)


def join_fp32(high: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """(bf16, uint16 mantissa) -> the float32 whose bits are high << 16 | low."""
    top = high.contiguous().view(torch.int16).to(torch.int32) * 65536  # in int32 range for every int16
    return (top + (low.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF)).view(torch.float32)


# ---- the cascade ----

def _gemm(native: bool, m1: torch.Tensor, m2: torch.Tensor, bias: torch.Tensor | None = None, beta: float = 0.0,
          alpha: float = 1.0) -> torch.Tensor:
    """bf16(beta bias + alpha m1 @ m2) of bf16 batches, float32 accumulation, one rounding: a bf16
    GEMM when `native` (the GPU path), the same in float32 otherwise."""
    if native:
        return torch.bmm(m1, m2) * alpha if bias is None else torch.baddbmm(bias, m1, m2, beta=beta, alpha=alpha)
    out = torch.bmm(m1.float(), m2.float())
    out = out * alpha if bias is None else torch.baddbmm(bias.float(), m1.float(), m2.float(), beta=beta, alpha=alpha)
    return out.bfloat16()


def _cascade(G: torch.Tensor, native: bool) -> torch.Tensor:
    """cascade() on a 3-D batch; `native`: bf16 GEMMs (_gemm)."""
    X = G.bfloat16()
    tall = X.size(-2) > X.size(-1)
    gram = (lambda Y: _gemm(native, Y.mT, Y)) if tall else (lambda Y: _gemm(native, Y, Y.mT))
    # The first Gram is of the unnormalised X: its trace is |X|_F^2 (the record's optim/anvil.py does the same).
    A = gram(X)
    d = A.diagonal(dim1=-2, dim2=-1).float().sum(-1)[..., None, None].sqrt() * FROBENIUS_MARGIN + FROBENIUS_EPS
    X = (X.float() / d).bfloat16()
    A = (A.float() / d.square()).bfloat16()
    for k, (a, b, c) in enumerate(ANVIL_MAPS):
        if k:
            A = gram(X)
        B = _gemm(native, A, A, A, beta=b, alpha=c)  # b A + c A^2
        X = _gemm(native, X, B, X, beta=a) if tall else _gemm(native, B, X, X, beta=a)  # a X + X B, or a X + B X
    return X


_compiled_cascade = None


def cascade(G: torch.Tensor) -> torch.Tensor:
    """The six quintic maps on G (2-D, or a 3-D batch of matrices; wide or tall), after the Frobenius
    normalisation; bf16 out. Drives every singular value of each matrix towards 1: the composed maps send
    [0.005, 1/1.05] (a singular value over 1.05 |G|_F) into [0.9993, 1.0004]. Past 1/1.05 they diverge,
    so an exactly rank-1 G, which sits on that edge, can blow up once bf16 rounding tips it over (the
    record's math; a batch's gradient is far from rank 1)."""
    if G.ndim not in (2, 3):
        raise ValueError(f"cascade: expected a 2-D matrix or a 3-D batch of them, got shape {tuple(G.shape)}")
    batch = G if G.ndim == 3 else G.unsqueeze(0)
    if gpu_paths_enabled() and G.is_cuda:
        global _compiled_cascade
        if _compiled_cascade is None:
            _compiled_cascade = torch_compile(_cascade)
        out = _compiled_cascade(batch, True)
    else:
        out = _cascade(batch, False)
    return out if G.ndim == 3 else out.squeeze(0)


# ---- one bank's update ----

def equalize_lanes(X: torch.Tensor, lane_energy: torch.Tensor, lane_dim: int, beta2: float) -> torch.Tensor:
    """The lane equalizer on a bf16 batch X, lanes reduced over `lane_dim` (the longer side's
    mean); updates lane_energy in place and returns the rescaled X (bf16)."""
    power = X.float().square().mean(dim=lane_dim, keepdim=True)
    lane_len = X.size(lane_dim)
    pre_norm = (power.sum(dim=(-2, -1), keepdim=True) * lane_len).sqrt()
    lane_energy.lerp_(power, 1 - beta2)
    gain = lane_energy.clamp_min(LANE_FLOOR).rsqrt()
    post_norm = (power * lane_len * gain.square()).sum(dim=(-2, -1), keepdim=True).sqrt()
    scale = gain * (pre_norm / post_norm.clamp_min(LANE_FLOOR))
    return (X.float() * scale.bfloat16().float()).bfloat16()


def anvil_update(grad, velocity, lane_energy, master, lr_units, lane_dim: int, native: bool, nesterov_beta,
                 fast_beta, fast_weight, decay):
    """One bank shard's update; returns the new fp32 master. grad [u, r, c]; velocity [2, u, r, c]
    fp32 (fast, slow), updated in place; lr_units [u, 1, 1] fp32 = n per unit; decay = k (0-D);
    the betas and weight are 0-D fp32 tensors (so a compiled graph never recompiles for them);
    native: the GPU path's bf16 GEMMs."""
    g = grad.float()
    fast, slow = velocity[0], velocity[1]
    fast.lerp_(g, 1 - fast_beta)
    slow.lerp_(g, 1 - RAIL_SLOW_BETA)
    blend = fast_weight * fast + (1 - fast_weight) * slow
    X = _cascade(g.lerp(blend, nesterov_beta), native)
    X = equalize_lanes(X, lane_energy, lane_dim, EQUALIZER_BETA2)
    aligned = (slow * master) >= 0  # cautious decay gated on the slow rail's sign (record: >= 0)
    return master - master * aligned * decay * lr_units - X.float() * lr_units


@dataclass
class _Bank:
    label: str
    param: torch.Tensor
    units: tuple[int, int, int]  # (n_units, rows, cols)
    lo: int                      # this rank's units are [lo, lo + chunk)
    chunk: int
    unit_lr_mul: torch.Tensor    # [chunk, 1, 1] fp32: lr_mul * shape * m
    wd_mul: float
    lane_dim: int                # -1: lanes are rows; -2: lanes are columns
    velocity: torch.Tensor       # [2, chunk, r, c] fp32
    lane_energy: torch.Tensor    # [chunk, r, 1] or [chunk, 1, c] fp32
    mantissa: torch.Tensor | None  # [chunk, r, c] uint16 for a bf16 bank

    def own_units(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(self.units)[self.lo:self.lo + self.chunk]


def _unit_multipliers(label: str, n_units: int, rows: int, cols: int, frozen_slots) -> list[float]:
    """lr_mul * shape * m of every unit of a bank, in unit order."""
    shape = math.sqrt(max(1.0, rows / cols))
    if label == "qk_bank":
        return [QK_LR_MUL * shape] * n_units
    if label == "vo_bank":
        return [shape] * n_units
    # mlp_bank unit g = slot g // 2, matrix g % 2 (0: c_fc, 1: c_proj^T)
    return [0.0 if g // 2 in frozen_slots else shape * (C_PROJ_LR_MUL if g % 2 else 1.0) for g in range(n_units)]


class Anvil:
    """ANVIL over the banks of a {label: [params]} dict (the labels in ANVIL_LABELS; others ignored)."""

    def __init__(self, labelled: dict, *, rank: int = 0, world_size: int = 1, lr: float = ANVIL_LR,
                 weight_decay: float = ANVIL_WEIGHT_DECAY, frozen_mlp_slots=FROZEN_MLP_SLOTS):
        self.rank, self.world_size = rank, world_size
        self.lr, self.weight_decay = lr, weight_decay
        self.banks: list[_Bank] = []
        for label in ANVIL_LABELS:
            params = labelled.get(label, [])
            if len(params) != 1:
                raise ValueError(f"Anvil: expected exactly one '{label}' parameter, got {len(params)}")
            self.banks.append(self._bank(label, params[0], frozen_mlp_slots))
        self.distributed = world_size > 1 and is_distributed()
        if world_size > 1 and not self.distributed:
            raise ValueError(f"Anvil: world_size={world_size} but torch.distributed is not initialised")

    def _bank(self, label, p, frozen_slots) -> _Bank:
        if label == "mlp_bank" and (p.ndim != 4 or p.shape[1] != 2):
            raise ValueError(f"Anvil: mlp_bank must be (slots, 2, hidden, d), got {tuple(p.shape)}")
        if label != "mlp_bank" and p.ndim != 3:
            raise ValueError(f"Anvil: {label} must be (units, rows, cols), got {tuple(p.shape)}")
        if p.dtype not in (torch.float32, torch.bfloat16) or not p.is_contiguous():
            raise ValueError(f"Anvil: {label} must be a contiguous float32 or bfloat16 tensor, got {p.dtype}")
        n_units, rows, cols = p.numel() // (p.shape[-2] * p.shape[-1]), p.shape[-2], p.shape[-1]
        if n_units % self.world_size:
            raise ValueError(f"Anvil: {label} has {n_units} units, not a multiple of world_size={self.world_size} "
                             "(pad the bank: RecordGPT's world_size argument)")
        chunk = n_units // self.world_size
        lo = self.rank * chunk
        muls = _unit_multipliers(label, n_units, rows, cols, frozen_slots)[lo:lo + chunk]
        lane_shape = (chunk, rows, 1) if rows >= cols else (chunk, 1, cols)
        f32 = dict(dtype=torch.float32, device=p.device)
        return _Bank(label=label, param=p, units=(n_units, rows, cols), lo=lo, chunk=chunk,
                     unit_lr_mul=torch.tensor(muls, **f32).view(chunk, 1, 1),
                     wd_mul=QK_WD_MUL if label == "qk_bank" else 1.0,
                     lane_dim=-1 if rows >= cols else -2,
                     velocity=torch.zeros(2, chunk, rows, cols, **f32),
                     lane_energy=torch.zeros(lane_shape, **f32),
                     mantissa=(torch.zeros(chunk, rows, cols, dtype=torch.uint16, device=p.device)
                               if p.dtype == torch.bfloat16 else None))

    def _update_fn(self):
        if not hasattr(self, "_update"):
            self._update = torch_compile(anvil_update) if gpu_paths_enabled() else anvil_update
        return self._update

    @torch.no_grad()
    def step(self, *, lr_scale: float, rail_beta: float, engaged: bool) -> None:
        """One update of every bank from its .grad (consumed: set to None). lr_scale = s (the LR
        multiplier), rail_beta = beta(t) (the Nesterov lookahead; also the fast rail's beta until
        engaged), engaged: the blend of both rails is on (the record: from step 245)."""
        lr = self.lr * lr_scale
        native = gpu_paths_enabled() and self.banks[0].param.is_cuda
        scalars = [torch.tensor(x, dtype=torch.float32, device=self.banks[0].param.device) for x in
                   (rail_beta, RAIL_FAST_BETA if engaged else rail_beta, RAIL_FAST_WEIGHT if engaged else 1.0)]
        flats = []
        for bank in self.banks:
            if bank.param.grad is None:
                raise ValueError(f"Anvil: {bank.label} has no gradient (every bank is updated every step)")
            flat = bank.param.grad.contiguous().view(-1)
            flats.append((flat, reduce_scatter_mean(flat) if self.distributed else None))
        gathers = []
        for bank, (flat, pending) in zip(self.banks, flats):
            if pending is not None:
                pending.wait()
            shard = bank.own_units(bank.param.data)
            master = shard if bank.mantissa is None else join_fp32(shard, bank.mantissa)
            decay = torch.tensor(bank.wd_mul * self.weight_decay * lr, dtype=torch.float32, device=shard.device)
            new = self._update_fn()(bank.own_units(flat), bank.velocity, bank.lane_energy, master,
                                    bank.unit_lr_mul * lr, bank.lane_dim, native, *scalars, decay)
            if bank.mantissa is None:
                shard.copy_(new)
            else:
                high, low = split_fp32(new)
                shard.copy_(high)
                bank.mantissa.copy_(low)
            if self.distributed:
                gathers.append(all_gather_segments(bank.param.data.view(-1)))
            bank.param.grad = None
        for pending in gathers:
            pending.wait()

    def reset(self) -> None:
        """Rails, lane energies and mantissas to zero, in place (the post-warm-up reset)."""
        for bank in self.banks:
            bank.velocity.zero_()
            bank.lane_energy.zero_()
            if bank.mantissa is not None:
                bank.mantissa.zero_()
