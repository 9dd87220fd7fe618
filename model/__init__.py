"""The model package: GPT with n-gram hints, its optimizers and gradient sync, and the GPU-path switch."""
from model.device import autocast_context, gpu_paths_enabled, maybe_compile
from model.gpt import GPT, HINT_REPRS, RECORD_BACKBONE, GPTConfig
from model.grad_sync import GradSync
from model.hint_cells import CellHints
from model.hint_embedding import HintEmbedding
from model.muon import Muon
from model.optim import (allreduce_grads, attention_window_blocks, build_optimizers, lr_multiplier,
                         muon_momentum)

__all__ = [
    "GPT", "GPTConfig", "HINT_REPRS", "RECORD_BACKBONE", "HintEmbedding", "CellHints", "Muon", "GradSync",
    "build_optimizers", "allreduce_grads", "lr_multiplier", "muon_momentum", "attention_window_blocks",
    "gpu_paths_enabled", "maybe_compile", "autocast_context",
]
