"""Optimizer setup, gradient averaging across ranks, and the learning-rate schedule.

speedrun (modded-nanogpt recipe): Adam for the embedding table, the LM head and every scalar
(including the hint trust amounts and injection scales), Muon for the hidden matrices.
gpt2 (llm.c recipe): a single AdamW, weight decay on 2-D parameters only.
Every group stores its base lr in group["initial_lr"]; the trainer sets
group["lr"] = group["initial_lr"] * lr_multiplier(...) each step.

Gradient averaging is the caller's job: call allreduce_grads(model) after backward and before
stepping (Muon only splits the orthogonalisation work, it assumes identical gradients).
"""
import torch
import torch.distributed as dist

from model.muon import Muon

# speedrun learning rates, from modded-nanogpt's records with a zero-initialised LM head.
EMBED_LR = 0.6          # token embedding table (unit-scale rows); also the per-kind trust embeddings
HEAD_LR = 0.008         # untied, zero-initialised LM head
SCALAR_LR = 0.04        # 0-/1-D parameters: hint trust amounts and injection scales
MUON_LR = 0.05
MUON_MOMENTUM = 0.95
ADAM_BETAS = (0.8, 0.95)
ADAM_EPS = 1e-10

# gpt2 baseline, from llm.c's GPT-2 124M run.
GPT2_LR = 6e-4
GPT2_BETAS = (0.9, 0.95)
GPT2_EPS = 1e-8
GPT2_WEIGHT_DECAY = 0.1


def _adam(cls, groups, **kwargs):
    for group in groups:
        group["initial_lr"] = group["lr"]
    fused = all(p.is_cuda for group in groups for p in group["params"])
    return cls(groups, fused=fused, **kwargs)


def build_optimizers(model, *, arch: str, lr_scale: float = 1.0, rank: int = 0, world_size: int = 1):
    """The list of optimizers for `model`; together they cover every parameter exactly once."""
    params = dict(model.named_parameters())  # deduplicates the tied gpt2 embedding / LM head
    if arch == "gpt2":
        decay = [p for p in params.values() if p.ndim >= 2]
        no_decay = [p for p in params.values() if p.ndim < 2]
        groups = [
            dict(params=decay, lr=GPT2_LR * lr_scale, weight_decay=GPT2_WEIGHT_DECAY),
            dict(params=no_decay, lr=GPT2_LR * lr_scale, weight_decay=0.0),
        ]
        return [_adam(torch.optim.AdamW, groups, betas=GPT2_BETAS, eps=GPT2_EPS)]
    if arch != "speedrun":
        raise ValueError(f"unknown arch {arch!r}")
    embed = [params["wte.weight"], params["hints.trust_embedding"]]
    head = [params["lm_head.weight"]]
    hidden = [p for name, p in params.items() if name.startswith("blocks.") and p.ndim >= 2]
    scalars = [p for p in params.values() if p.ndim < 2]
    groups = [
        dict(params=embed, lr=EMBED_LR * lr_scale),
        dict(params=head, lr=HEAD_LR * lr_scale),
        dict(params=scalars, lr=SCALAR_LR * lr_scale),
    ]
    adam = _adam(torch.optim.Adam, groups, betas=ADAM_BETAS, eps=ADAM_EPS)
    muon = Muon(hidden, lr=MUON_LR * lr_scale, momentum=MUON_MOMENTUM, rank=rank, world_size=world_size)
    for group in muon.param_groups:
        group["initial_lr"] = group["lr"]
    return [adam, muon]


def allreduce_grads(model) -> None:
    """Average gradients across ranks (no-op unless torch.distributed runs with world_size > 1).

    A parameter without a gradient on this rank gets a zero one, so every rank reduces the same
    list. All gradients go through one flat buffer per dtype and a single all_reduce.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    world_size = dist.get_world_size()
    by_dtype = {}
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)  # SUM: gloo has no AVG
        flat.div_(world_size)
        for g, reduced in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(reduced.view_as(g))


def lr_multiplier(step: int, total_steps: int, warmup_steps: int = 0, cooldown_frac: float = 0.0) -> float:
    """Multiplier on each group's initial_lr at `step` (0-based).

    Linear warmup over warmup_steps, then constant, then linear decay to 0 at total_steps over
    the last cooldown_frac of total_steps (never starting before warmup ends).
      speedrun: warmup_steps=0, cooldown_frac ~0.4 (modded-nanogpt: constant, then cool down)
      gpt2:     warmup_steps=700 (llm.c), cooldown_frac=1.0 (decay over the whole run)
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    cooldown_start = max(warmup_steps, total_steps * (1.0 - cooldown_frac))
    if step < cooldown_start:
        return 1.0
    return max(total_steps - step, 0) / max(total_steps - cooldown_start, 1)
