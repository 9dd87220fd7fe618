"""The record's Adam: every parameter that is neither an ANVIL bank nor value_embeds (whose sparse
Adam runs on the n-gram table's events, elsewhere), with its table of groups, the two-step
gradient sum, the lm_head / embed tie and its untie.

Per group (the record's training.py param_table; base lr 0.008 s, eps 1e-10, decay 0.005):
  m <- b1 m + (1-b1) g;  v <- b2 v + (1-b2) g^2;  L = 0.008 s lr_mul
  u = L sqrt(1-b2^t)/(1-b1^t) m / (sqrt v + eps);  u += L^2 0.005 wd_mul W where u W > 0;  W <- W - u
(the update in float32, stored in the parameter's dtype: bf16 on the GPU path rounds to nearest).

Cadence: step(step, lr_scale) is called after EVERY backward. It adds each parameter's .grad into
a float32 sum (and sets .grad to None); on odd steps only it updates, from the sum of that even and
odd step's gradients, then clears the sums. So the caller may zero every gradient every step.

The tie (record's optim/anvil.py): through the update of `untie_step` (561 at the record's 570
steps: the first odd step of the extension stage) embed's summed gradient, transposed, is added to
lm_head's, only lm_head is updated, and embed <- lm_head^T after each update; right after that
step's update lm_head's moments (transposed) and step count go to embed, and from the next odd
step (563) the two are separate. embed must start as lm_head^T (RecordGPT ties them at init).

Distribution as the record's: the replicated groups' sums are all-reduced (mean) as one flat
buffer; lm_head and embed are sharded by rows (lm_head (d, V): d / world rows per rank; embed
(V, d): V / world), reduce-scattered (mean), updated on the owner and all-gathered; their moments
live on the owner only (the untie all-gathers lm_head's, transposes them, and keeps embed's rows).
A group none of whose parameters got a gradient on any rank in the two steps is skipped whole
(its moments and step count do not move), as the record's fused replicated update does.
"""
from dataclasses import dataclass

import torch

from model.anvil import ANVIL_LABELS
from model.collectives import all_gather_segments, all_reduce_mean, is_distributed, own_segment, reduce_scatter_mean
from model.device import gpu_paths_enabled, torch_compile

# Base lr, eps and decoupled decay (record's training.py adam_defaults).
ADAM_LR, ADAM_EPS, ADAM_WEIGHT_DECAY = 0.008, 1e-10, 0.005


@dataclass(frozen=True)
class AdamGroup:
    lr_mul: float
    betas: tuple[float, float]
    wd_mul: float
    sharded: bool = False


# The record's training.py param_table (its MUDD overrides and `ret_` labels included), under this
# repo's labels: s_g is its _mudd_gate_scale; hint_scales its ret_* scales (10x lr), hint_embed its
# ret_bucket_embed. wd_mul defaults to 1 there (ve_gate_bank, mudd_w1/w2/w2g, mudd_gate_w1/w2).
ADAM_TABLE = {
    "scalars": AdamGroup(5.0, (0.9, 0.99), 0.0),
    "smear_gate": AdamGroup(0.01, (0.9, 0.99), 0.0),
    "ve_gate_bank": AdamGroup(1.0, (0.9, 0.99), 1.0),
    "post_lambdas": AdamGroup(1.0, (0.9, 0.95), 0.0),
    "resid_lambdas": AdamGroup(5.0, (0.9, 0.95), 0.0),
    "lm_head": AdamGroup(1.22, (0.5, 0.95), 150.0, sharded=True),
    "embed": AdamGroup(1.22, (0.5, 0.95), 150.0, sharded=True),
    "mudd_w1": AdamGroup(0.5, (0.9, 0.99), 1.0),
    "mudd_w2": AdamGroup(0.25, (0.9, 0.99), 1.0),
    "mudd_w2g": AdamGroup(0.25, (0.9, 0.99), 1.0),
    "mudd_b2": AdamGroup(0.25, (0.9, 0.99), 0.0),
    "mudd_gate_w1": AdamGroup(0.2, (0.9, 0.99), 1.0),
    "mudd_gate_w2": AdamGroup(0.1, (0.9, 0.99), 1.0),
    "mudd_gate_b2": AdamGroup(0.1, (0.9, 0.99), 0.0),
    "s_g": AdamGroup(0.1, (0.9, 0.99), 0.0),
    "hint_scales": AdamGroup(10.0, (0.9, 0.99), 0.0),
    "hint_embed": AdamGroup(1.0, (0.9, 0.99), 0.0),
}
# Labels other optimizers own: the banks (model/anvil.py) and value_embeds (the table's sparse Adam).
LABELS_ELSEWHERE = (*ANVIL_LABELS, "value_embeds")


def adam_math(p, g, m, v, beta1, beta2, eps: float, step_size, eff_wd, active):
    """One Adam update in float32 (m, v in place where `active`); returns the new float32 weights.
    Scalars may be 0-D tensors or per-element vectors (the flat replicated buffer)."""
    p = p.float()
    m.copy_(torch.where(active, m * beta1 + g * (1 - beta1), m))
    v.copy_(torch.where(active, v * beta2 + g * g * (1 - beta2), v))
    u = m / (v.sqrt() + eps) * step_size
    u = u + eff_wd * p * ((u * p) > 0)  # cautious decay, gated on the update's sign (> 0)
    return torch.where(active, p - u, p)


@dataclass
class _Param:
    label: str
    param: torch.Tensor
    group: AdamGroup
    grad_sum: torch.Tensor       # float32, the parameter's shape (a view into the flat buffer if replicated)
    exp_avg: torch.Tensor        # float32: the whole parameter if replicated, this rank's rows if sharded
    exp_avg_sq: torch.Tensor
    t: int = 0


class RecordAdam:
    """Adam over a {label: [params]} dict: the labels of ADAM_TABLE (LABELS_ELSEWHERE are skipped)."""

    def __init__(self, labelled: dict, *, untie_step: int, rank: int = 0, world_size: int = 1,
                 lr: float = ADAM_LR, eps: float = ADAM_EPS, weight_decay: float = ADAM_WEIGHT_DECAY):
        unknown = sorted(set(labelled) - set(ADAM_TABLE) - set(LABELS_ELSEWHERE))
        if unknown:
            raise ValueError(f"RecordAdam: no Adam group for labels {unknown} (known: {sorted(ADAM_TABLE)})")
        if untie_step % 2 != 1:
            raise ValueError(f"RecordAdam: untie_step={untie_step} must be odd (an Adam step)")
        self.untie_step, self.rank, self.world_size = untie_step, rank, world_size
        self.lr, self.eps, self.weight_decay = lr, eps, weight_decay
        replicated = [(label, p) for label in ADAM_TABLE if not ADAM_TABLE[label].sharded
                      for p in labelled.get(label, [])]
        device = next(p.device for ps in labelled.values() for p in ps)
        # the replicated sums, then one activity flag per parameter (replicated and sharded): one all-reduce
        self.sharded = {}
        for label in ("lm_head", "embed"):
            if len(labelled.get(label, [])) != 1:
                raise ValueError(f"RecordAdam: expected exactly one '{label}' parameter, "
                                 f"got {len(labelled.get(label, []))}")
            p = labelled[label][0]
            if p.shape[0] % world_size or not p.is_contiguous():
                raise ValueError(f"RecordAdam: {label} {tuple(p.shape)} must be contiguous with rows divisible "
                                 f"by world_size={world_size}")
        n_flat = sum(p.numel() for _, p in replicated)
        self.flat = torch.zeros(n_flat + len(replicated) + 2, dtype=torch.float32, device=device)
        self.flags = self.flat[n_flat:]
        self.n_flat = n_flat
        self.flat_exp_avg = torch.zeros(n_flat, dtype=torch.float32, device=device)
        self.flat_exp_avg_sq = torch.zeros_like(self.flat_exp_avg)
        self.params: list[_Param] = []
        offset = 0
        for label, p in replicated:
            views = [t[offset:offset + p.numel()].view(p.shape) for t in (self.flat, self.flat_exp_avg, self.flat_exp_avg_sq)]
            offset += p.numel()
            self.params.append(_Param(label, p, ADAM_TABLE[label], *views))
        for label in ("lm_head", "embed"):
            p = labelled[label][0]
            rows = p.shape[0] // world_size
            shard = torch.zeros((rows, *p.shape[1:]), dtype=torch.float32, device=device)
            entry = _Param(label, p, ADAM_TABLE[label], torch.zeros(p.shape, dtype=torch.float32, device=device),
                           shard, torch.zeros_like(shard))
            self.params.append(entry)
            self.sharded[label] = entry
        self.replicated = self.params[:len(replicated)]
        self.distributed = world_size > 1 and is_distributed()
        if world_size > 1 and not self.distributed:
            raise ValueError(f"RecordAdam: world_size={world_size} but torch.distributed is not initialised")
        # per-element betas of the flat replicated buffer (fixed per group)
        self._beta1 = self._per_element([e.group.betas[0] for e in self.replicated])
        self._beta2 = self._per_element([e.group.betas[1] for e in self.replicated])
        self._math = torch_compile(adam_math) if gpu_paths_enabled() and device.type == "cuda" else adam_math
        self.tied = True

    def _per_element(self, values) -> torch.Tensor:
        """One value per replicated parameter -> a float32 vector over the flat buffer."""
        sizes = torch.tensor([e.param.numel() for e in self.replicated], device=self.flat.device)
        return torch.repeat_interleave(torch.tensor(values, dtype=torch.float32, device=self.flat.device), sizes)

    def _scalars(self, entry: _Param, lr_scale: float) -> tuple[float, float]:
        """(step size, decay factor) of an update at the entry's (already advanced) step count."""
        (beta1, beta2), L = entry.group.betas, self.lr * lr_scale * entry.group.lr_mul
        step_size = L * (1 - beta2 ** entry.t) ** 0.5 / (1 - beta1 ** entry.t)
        return step_size, L * L * self.weight_decay * entry.group.wd_mul

    @torch.no_grad()
    def step(self, step: int, lr_scale: float) -> bool:
        """Fold this step's gradients into the sums; on odd steps update (see the module docstring).
        Returns whether it updated."""
        for i, e in enumerate(self.params):
            if e.param.grad is not None:
                e.grad_sum.add_(e.param.grad)
                self.flags[i] = 1.0
                e.param.grad = None
        if step % 2 == 0:
            return False
        lm, embed = self.sharded["lm_head"], self.sharded["embed"]
        if self.tied:
            lm.grad_sum.add_(embed.grad_sum.T)
            self.flags[len(self.params) - 2] += self.flags[len(self.params) - 1]
        sharded = [lm] if self.tied else [lm, embed]
        if self.distributed:
            reduce = all_reduce_mean(self.flat)
            scatters = [reduce_scatter_mean(e.grad_sum.view(-1)) for e in sharded]
            reduce.wait()
        active = (self.flags > 0).tolist()
        self._update_replicated(lr_scale, active[:len(self.replicated)])
        gathers = []
        for e in sharded:
            if self.distributed:
                scatters.pop(0).wait()
            if active[self.params.index(e)]:
                self._update_sharded(e, lr_scale)
                if self.distributed:
                    gathers.append(all_gather_segments(e.param.data.view(-1)))
        for pending in gathers:
            pending.wait()
        if self.tied:
            embed.param.data.copy_(lm.param.data.T)
            if step == self.untie_step:
                self._untie()
        self.flat.zero_()
        for e in self.sharded.values():
            e.grad_sum.zero_()
        return True

    def _update_replicated(self, lr_scale: float, active: list[bool]) -> None:
        live = [e for e, a in zip(self.replicated, active) if a]
        if not live:
            return
        for e in live:
            e.t += 1
        scalars = [self._scalars(e, lr_scale) if a else (0.0, 0.0) for e, a in zip(self.replicated, active)]
        weights = torch.cat([e.param.data.reshape(-1).float() for e in self.replicated])
        new = self._math(weights, self.flat[:self.n_flat], self.flat_exp_avg, self.flat_exp_avg_sq, self._beta1,
                         self._beta2, self.eps, self._per_element([s for s, _ in scalars]),
                         self._per_element([w for _, w in scalars]), self._per_element(active) > 0)
        offset = 0
        for e in self.replicated:
            e.param.data.copy_(new[offset:offset + e.param.numel()].view(e.param.shape))
            offset += e.param.numel()

    def _update_sharded(self, e: _Param, lr_scale: float) -> None:
        e.t += 1
        rows = e.exp_avg.shape[0]
        shard = e.param.data[self.rank * rows:(self.rank + 1) * rows]
        grad = e.grad_sum.view(-1)
        if self.distributed:
            grad = own_segment(grad, self.rank, self.world_size)
        f32 = dict(dtype=torch.float32, device=shard.device)
        (b1, b2), (step_size, eff_wd) = e.group.betas, self._scalars(e, lr_scale)
        new = self._math(shard, grad.view(shard.shape), e.exp_avg, e.exp_avg_sq, torch.tensor(b1, **f32),
                         torch.tensor(b2, **f32), self.eps, torch.tensor(step_size, **f32),
                         torch.tensor(eff_wd, **f32), torch.ones((), dtype=torch.bool, device=shard.device))
        shard.copy_(new)

    def _untie(self) -> None:
        """lm_head's moments, transposed, and its step count become embed's; the two are separate from here."""
        lm, embed = self.sharded["lm_head"], self.sharded["embed"]
        embed.t = lm.t
        rows = embed.exp_avg.shape[0]
        for key in ("exp_avg", "exp_avg_sq"):
            full = torch.zeros(lm.param.shape, dtype=torch.float32, device=lm.exp_avg.device)
            own_segment(full.view(-1), self.rank, self.world_size).copy_(getattr(lm, key).view(-1))
            if self.distributed:
                all_gather_segments(full.view(-1)).wait()
            getattr(embed, key).copy_(full.T[self.rank * rows:(self.rank + 1) * rows])
        self.tied = False

    def reset(self) -> None:
        """Sums, moments and step counts to zero and re-tied, in place (the post-warm-up reset; the
        caller restores the weights, embed = lm_head^T among them)."""
        self.flat.zero_()
        for e in self.params:  # the replicated ones are views into the flat buffers
            e.grad_sum.zero_()
            e.exp_avg.zero_()
            e.exp_avg_sq.zero_()
            e.t = 0
        self.tied = True
