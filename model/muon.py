"""Muon: momentum SGD whose update is orthogonalised by a Newton-Schulz iteration, for the hidden
2-D weight matrices, with the orthogonalisation work split across ranks.

Per step and parameter: buf = lerp(buf, grad, 1 - momentum); Nesterov update
g = lerp(grad, buf, momentum); update = NS5(g) (approximately U V^T of g's SVD, singular values
pushed towards 1); p -= lr * sqrt(max(1, rows / cols)) * update.

Gradients must already be identical on all ranks: the caller averages them first
(model.optim.allreduce_grads). With world_size > 1, parameters of the same shape are taken in
chunks of world_size; rank r orthogonalises chunk[r] (keeping momentum only for the parameters it
owns) and an all_gather hands every rank every update, so all ranks apply the same updates and
keep identical weights. With world_size == 1 (or torch.distributed not initialised) it is local.
"""
import torch
import torch.distributed as dist

from model.device import gpu_paths_enabled, maybe_compile

# Quintic Newton-Schulz coefficients from Keller Jordan's Muon (chosen to maximise the slope at 0,
# so small singular values grow fast; the result lands roughly in [0.7, 1.2] rather than exactly 1).
NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7  # guards the initial Frobenius normalisation of an all-zero gradient


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


class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr=0.05, momentum=0.95, nesterov=True, ns_steps=NS_STEPS, rank=0, world_size=1):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps))
        if any(p.ndim < 2 for group in self.param_groups for p in group["params"]):
            raise ValueError("Muon is for matrices; give it parameters with ndim >= 2")
        self.rank, self.world_size = rank, world_size
        self._orthogonalise = maybe_compile(newton_schulz)

    def _update(self, p: torch.Tensor, group: dict) -> torch.Tensor:
        """This rank's scaled update for p (momentum state lives only on the rank that owns p)."""
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
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
        distributed = self.world_size > 1 and dist.is_available() and dist.is_initialized()
        for group in self.param_groups:
            if not distributed:
                for p in group["params"]:
                    p.add_(self._update(p, group), alpha=-group["lr"])
                continue
            pending = []
            by_shape = {}
            for p in group["params"]:
                by_shape.setdefault(p.shape, []).append(p)
            for same_shape in by_shape.values():
                for start in range(0, len(same_shape), self.world_size):
                    chunk = same_shape[start : start + self.world_size]
                    mine = self._update(chunk[self.rank], group) if self.rank < len(chunk) else torch.zeros_like(chunk[0])
                    gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
                    pending.append((dist.all_gather(gathered, mine.contiguous(), async_op=True), chunk, gathered))
            for work, chunk, gathered in pending:
                work.wait()
                for p, update in zip(chunk, gathered):
                    p.add_(update, alpha=-group["lr"])
        return loss
