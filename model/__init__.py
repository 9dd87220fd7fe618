"""The model package: GPT with n-gram hints, its optimizers, and the GPU-path switch."""
from model.device import autocast_context, gpu_paths_enabled, maybe_compile
from model.gpt import GPT, GPTConfig
from model.hint_embedding import HintEmbedding
from model.muon import Muon
from model.optim import allreduce_grads, build_optimizers, lr_multiplier

__all__ = [
    "GPT", "GPTConfig", "HintEmbedding", "Muon",
    "build_optimizers", "allreduce_grads", "lr_multiplier",
    "gpu_paths_enabled", "maybe_compile", "autocast_context",
]
