"""Optimizer setup, the blocking gradient all-reduce, and the training schedules.

speedrun (modded-nanogpt recipe): Adam for the embedding tables (token, value embeddings, hint
trust embeddings), the LM head and every scalar (hint trust amounts and injection scales, skip
and mix weights), Muon for the hidden matrices.
gpt2 (llm.c recipe): a single AdamW, weight decay on 2-D parameters only.
The record's hint parameters (model/hint_cells.py), in either arch, get groups of their own in
that Adam(W), as the record trains them: betas (0.9, 0.99), lr 0.008 for the cell embeddings and
10x for the cell and site scales, no weight decay.
Every group stores its base lr in group["initial_lr"]; the trainer sets
group["lr"] = group["initial_lr"] * lr_multiplier(...) each step, the Muon momentum to
muon_momentum(step) and the attention window to attention_window_blocks(step, ...).

Gradient averaging, two ways (build_optimizers(grad_sync=...) must match the one used):
  "overlap"   model.grad_sync.GradSync: bucketed reductions started during backward; Muon
              reduce-scatters its own matrices (shard_grads=True);
  "allreduce" allreduce_grads(model) after backward: one blocking all-reduce of every gradient
              (the path before GradSync, kept for A/B runs); Muon gets identical gradients on
              every rank and only splits the orthogonalisation (shard_grads=False).
"""
import math

import torch

from model.collectives import all_reduce_mean, is_distributed
from model.muon import Muon

# speedrun learning rates, from modded-nanogpt's records with a zero-initialised LM head.
EMBED_LR = 0.6          # token embedding table (unit-scale rows); also the per-kind trust embeddings
HEAD_LR = 0.008         # untied, zero-initialised LM head
SCALAR_LR = 0.04        # 0-/1-D parameters: hint trust amounts and injection scales
MUON_LR = 0.05
MUON_MOMENTUM = 0.95
# Muon momentum warm-up of the records from 2024-11-06 on: linear 0.85 -> 0.95 over 300 steps.
MUON_MOMENTUM_START = 0.85
MUON_MOMENTUM_WARMUP_STEPS = 300
# Attention window of the record of 2025-01-04: linear in training progress from 128 to 1856
# tokens, in whole blocks of 128 (1 -> 14 blocks).
WINDOW_START_TOKENS = 128
WINDOW_END_TOKENS = 1856
ADAM_BETAS = (0.8, 0.95)
ADAM_EPS = 1e-8  # the 2025-01-04 record's Adam leaves eps at torch's default (later records use 1e-10)
# The record's hint parameters (records/track_1_short/2026-10-01_ExactMatchRetrieval, training.py).
HINT_CELL_LR = 0.008
HINT_SCALE_LR = 10 * HINT_CELL_LR  # the cell scales and the three site scales
HINT_BETAS = (0.9, 0.99)

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


GRAD_SYNCS = ("overlap", "allreduce")


def build_optimizers(model, *, arch: str, lr_scale: float = 1.0, rank: int = 0, world_size: int = 1,
                     grad_sync: str = "allreduce"):
    """The list of optimizers for `model`; together they cover every parameter exactly once.

    grad_sync: how the trainer averages gradients across ranks (see the module docstring); it
    decides whether Muon reduce-scatters its own gradients.
    """
    if grad_sync not in GRAD_SYNCS:
        raise ValueError(f"grad_sync must be one of {GRAD_SYNCS}, got {grad_sync!r}")
    params = dict(model.named_parameters())  # deduplicates the tied gpt2 embedding / LM head
    hint_groups = []
    if getattr(model, "record_hints", False):  # the record's hint parameters: their own groups
        cell = [params.pop("hints.cell_embedding")]
        scales = [params.pop("hints.cell_scale"), params.pop("hints.scales")]
        hint_groups = [dict(params=cell, lr=HINT_CELL_LR * lr_scale, betas=HINT_BETAS, weight_decay=0.0),
                       dict(params=scales, lr=HINT_SCALE_LR * lr_scale, betas=HINT_BETAS, weight_decay=0.0)]
    if arch == "gpt2":
        decay = [p for p in params.values() if p.ndim >= 2]
        no_decay = [p for p in params.values() if p.ndim < 2]
        groups = [
            dict(params=decay, lr=GPT2_LR * lr_scale, weight_decay=GPT2_WEIGHT_DECAY),
            dict(params=no_decay, lr=GPT2_LR * lr_scale, weight_decay=0.0),
            *hint_groups,
        ]
        return [_adam(torch.optim.AdamW, groups, betas=GPT2_BETAS, eps=GPT2_EPS)]
    if arch != "speedrun":
        raise ValueError(f"unknown arch {arch!r}")
    embed = [params["wte.weight"], *(p for name, p in params.items()
                                     if name == "hints.trust_embedding" or name.startswith("value_embeds."))]
    head = [params["lm_head.weight"]]
    hidden = [p for name, p in params.items() if name.startswith("blocks.") and p.ndim >= 2]
    scalars = [p for p in params.values() if p.ndim < 2]
    groups = [
        dict(params=embed, lr=EMBED_LR * lr_scale),
        dict(params=head, lr=HEAD_LR * lr_scale),
        dict(params=scalars, lr=SCALAR_LR * lr_scale),
        *hint_groups,
    ]
    adam = _adam(torch.optim.Adam, groups, betas=ADAM_BETAS, eps=ADAM_EPS)
    muon = Muon(hidden, lr=MUON_LR * lr_scale, momentum=MUON_MOMENTUM, rank=rank, world_size=world_size,
                shard_grads=grad_sync == "overlap")
    for group in muon.param_groups:
        group["initial_lr"] = group["lr"]
    return [adam, muon]


def allreduce_grads(model) -> None:
    """Average gradients across ranks, blocking (no-op unless torch.distributed runs with
    world_size > 1): the "allreduce" grad sync, for A/B runs against model.grad_sync.GradSync.

    A parameter without a gradient on this rank gets a zero one, so every rank reduces the same
    list. All gradients go through one flat buffer per dtype and a single all-reduce.
    """
    if not is_distributed():
        return
    by_dtype = {}
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        all_reduce_mean(flat).wait()
        for g, reduced in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(reduced.view_as(g))


def lr_multiplier(step: int, total_steps: int, warmup_steps: int = 0, cooldown_frac: float = 0.0,
                  shape: str = "linear") -> float:
    """Multiplier on each group's initial_lr at `step` (0-based).

    Linear warmup over warmup_steps, then constant, then a decay to 0 at total_steps over the
    last cooldown_frac of total_steps (never starting before warmup ends), linear or cosine.
      speedrun: warmup_steps=0, cooldown_frac ~0.4, linear (modded-nanogpt: constant, then cool down)
      gpt2:     warmup_steps=700, cooldown_frac=1.0, cosine (llm.c: cosine decay over the whole run)
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    cooldown_start = max(warmup_steps, total_steps * (1.0 - cooldown_frac))
    if step < cooldown_start:
        return 1.0
    left = max(total_steps - step, 0) / max(total_steps - cooldown_start, 1)  # 1 -> 0 over the decay
    if shape == "cosine":
        return 0.5 * (1.0 - math.cos(math.pi * left))
    if shape != "linear":
        raise ValueError(f"lr shape must be 'linear' or 'cosine', got {shape!r}")
    return left


def muon_momentum(step: int, warmup_steps: int = MUON_MOMENTUM_WARMUP_STEPS,
                  start: float = MUON_MOMENTUM_START, end: float = MUON_MOMENTUM) -> float:
    """Muon momentum at `step`: linear from start to end over warmup_steps, then end."""
    if warmup_steps <= 0:
        return end
    frac = min(step / warmup_steps, 1.0)
    return (1 - frac) * start + frac * end


def attention_window_blocks(step: int, total_steps: int, block_size: int = 128,
                            start_tokens: int = WINDOW_START_TOKENS, end_tokens: int = WINDOW_END_TOKENS) -> int:
    """Attention window at `step` in blocks of block_size tokens: linear in training progress from
    start_tokens to end_tokens, rounded down to whole blocks, at least one."""
    frac = min(max(step / max(total_steps, 1), 0.0), 1.0)
    return max(1, int(((1 - frac) * start_tokens + frac * end_tokens) // block_size))
