"""Muon: momentum SGD whose update is orthogonalised by a Newton-Schulz iteration, for the hidden
2-D weight matrices, with the gradient reduction and the orthogonalisation split across ranks.

Per step and parameter: buf = lerp(buf, grad, 1 - momentum); Nesterov update
g = lerp(grad, buf, momentum); update = NS5(g) (approximately U V^T of g's SVD, singular values
pushed towards 1); p -= lr * sqrt(max(1, rows / cols)) * update.

One process (or torch.distributed not initialised): every matrix, locally.
world_size > 1: each matrix has one owner rank. The matrices are split, in reverse parameter
order (roughly the order backward produces their gradients), into a few buckets; within a bucket
the owners are chosen greedily by Newton-Schulz cost (largest first, to the least loaded rank),
and each bucket is one flat gradient buffer of world_size equal segments, segment r holding the
matrices rank r owns (parameters' .grad are views into it). Per bucket:
  1. reduce-scatter (shard_grads=True): each rank gets the average of its own segment only.
     GradSync starts it from a backward hook as soon as the bucket's gradients are complete; if
     no GradSync did, step() starts it. With shard_grads=False the caller has already averaged
     every gradient on every rank (model.optim.allreduce_grads) and nothing is reduced here;
  2. the owner orthogonalises its matrices (momentum state lives only on the owner) and writes
     the scaled updates, in bf16, into its segment of the bucket's update buffer;
  3. an all-gather of the bf16 update buffer hands every rank every update (started per bucket,
     so it overlaps the next bucket's Newton-Schulz); every rank applies them all, so all ranks
     keep identical weights.
"""
import torch
import torch.distributed as dist

from model.collectives import all_gather_segments, is_distributed, reduce_scatter_mean
from model.device import gpu_paths_enabled, maybe_compile
from model.grad_sync import IDLE, GradBucket

# Quintic Newton-Schulz coefficients from Keller Jordan's Muon (chosen to maximise the slope at 0,
# so small singular values grow fast; the result lands roughly in [0.7, 1.2] rather than exactly 1).
NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7  # guards the initial Frobenius normalisation of an all-zero gradient
# Buckets of matrices: more start their reduce-scatter earlier in backward, fewer balance better.
# Three suit the 12-layer record: 4 layers per bucket = 16 square + 8 MLP matrices, which 8 ranks
# share exactly (one MLP matrix and two square ones each).
MUON_BUCKETS = 3
# Updates are rounded to bf16 on every path (what Newton-Schulz computes in on the GPU path), so
# one process and many apply the same updates; the distributed path all-gathers them in bf16.
UPDATE_DTYPE = torch.bfloat16


def newton_schulz(g: torch.Tensor, steps: int = NS_STEPS) -> torch.Tensor:
    """Approximately orthogonalise the last two dims of g; bf16 on the GPU path, float32 otherwise."""
    a, b, c = NS_COEFFS
    dtype = torch.bfloat16 if gpu_paths_enabled() and g.is_cuda else torch.float32
    x = g.to(dtype)
    tall = x.size(-2) > x.size(-1)
    if tall:  # iterate on the wide orientation: X X^T is then the smaller Gram matrix
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + NS_EPS)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


def newton_schulz_cost(shape) -> int:
    """Multiply-adds of one Newton-Schulz iteration on a (rows, cols) matrix, wide orientation
    m <= n: X X^T (m^2 n), A A (m^3), B X (m^2 n)."""
    m, n = sorted(shape[-2:])
    return 2 * m * m * n + m ** 3


def assign_owners(shapes, world_size: int) -> list[int]:
    """Owner rank of each matrix: largest Newton-Schulz cost first, each to the rank with the least
    cost so far (ties: fewest elements, then lowest rank)."""
    load = [(0, 0)] * world_size
    owners = [0] * len(shapes)
    for i in sorted(range(len(shapes)), key=lambda i: (-newton_schulz_cost(shapes[i]), i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owners[i] = r
        numel = shapes[i][-2] * shapes[i][-1]
        load[r] = (load[r][0] + newton_schulz_cost(shapes[i]), load[r][1] + numel)
    return owners


def split_buckets(numels, n_buckets: int) -> list[list[int]]:
    """Consecutive groups of indices with about equal total elements (at most n_buckets)."""
    total, groups, current, acc = sum(numels), [], [], 0
    for i, n in enumerate(numels):
        current.append(i)
        acc += n
        if acc >= total * (len(groups) + 1) / n_buckets and len(groups) < n_buckets - 1:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr=0.05, momentum=0.95, nesterov=True, ns_steps=NS_STEPS, rank=0, world_size=1,
                 shard_grads=True, n_buckets=MUON_BUCKETS):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps))
        if any(p.ndim != 2 for group in self.param_groups for p in group["params"]):
            raise ValueError("Muon is for matrices; give it 2-D parameters")
        self.rank, self.world_size = rank, world_size
        self.distributed = world_size > 1 and is_distributed()
        if self.distributed and (rank, world_size) != (dist.get_rank(), dist.get_world_size()):
            raise ValueError(f"Muon: rank={rank}, world_size={world_size} differ from torch.distributed's "
                             f"{dist.get_rank()} of {dist.get_world_size()}")
        self.shard_grads = shard_grads
        self._orthogonalise = maybe_compile(newton_schulz)
        # per bucket: (params, GradBucket of their gradients or None, bf16 update buffer, views
        # into it, owner rank by id(param))
        self._buckets = []
        if self.distributed:
            self._build_buckets(n_buckets)
        # GradSync reduces these during backward and leaves Muon's parameters out of its all-reduce
        self.grad_buckets = [b[1] for b in self._buckets if b[1] is not None]

    def _build_buckets(self, n_buckets):
        W = self.world_size
        matrices = [p for group in self.param_groups for p in group["params"]][::-1]
        for members in split_buckets([p.numel() for p in matrices], n_buckets):
            params = [matrices[i] for i in members]
            owners = assign_owners([tuple(p.shape) for p in params], W)
            used = [0] * W
            offsets = {}
            for p, r in zip(params, owners):
                offsets[id(p)] = used[r]
                used[r] += p.numel()
            segment = max(used)
            offsets = {id(p): r * segment + offsets[id(p)] for p, r in zip(params, owners)}
            grads = None
            if self.shard_grads:
                grads = GradBucket(params, reduce_scatter_mean, numel=W * segment, offsets=offsets)
                grads.attach()
            updates = torch.zeros(W * segment, dtype=UPDATE_DTYPE, device=params[0].device)
            views = {id(p): updates[offsets[id(p)]:offsets[id(p)] + p.numel()].view_as(p) for p in params}
            self._buckets.append((params, grads, updates, views, dict(zip(map(id, params), owners))))

    def _update(self, p: torch.Tensor, grad: torch.Tensor, group: dict) -> torch.Tensor:
        """The scaled update of p from its (averaged) gradient; momentum state on the caller's rank."""
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(grad)
        buf = state["momentum_buffer"]
        buf.lerp_(grad, 1 - group["momentum"])
        g = grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
        update = self._orthogonalise(g, group["ns_steps"]).to(p.dtype)
        # Shape-aware lr: a tall matrix's orthogonal update has smaller per-entry RMS; rescale it.
        return update * (max(1.0, p.size(-2) / p.size(-1)) ** 0.5)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        group_of = {id(p): group for group in self.param_groups for p in group["params"]}
        if not self.distributed:
            for group in self.param_groups:
                for p in group["params"]:
                    grad = p.grad if p.grad is not None else torch.zeros_like(p)
                    p.add_(self._update(p, grad, group).to(UPDATE_DTYPE), alpha=-group["lr"])
            return loss
        gathers = []
        for params, grads, updates, views, owner in self._buckets:
            if grads is not None:
                if grads.state == IDLE:  # no GradSync started the reduce-scatter during backward
                    grads.launch()
                grads.wait()
            for p in params:
                if owner[id(p)] == self.rank:
                    if grads is not None:
                        grad = grads.view(p)
                    else:  # the caller averaged every gradient already
                        grad = p.grad if p.grad is not None else torch.zeros_like(p)
                    views[id(p)].copy_(self._update(p, grad, group_of[id(p)]))
            if grads is not None:
                grads.reset()
            gathers.append((all_gather_segments(updates), params, views))
        for pending, params, views in gathers:
            pending.wait()
            for p in params:
                p.add_(views[id(p)], alpha=-group_of[id(p)]["lr"])
        return loss
