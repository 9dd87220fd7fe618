"""The one switch for GPU-only paths: torch.compile, bf16 autocast, bf16 Newton-Schulz.

Everything the model does on a GPU it also does on the CPU, with these paths swapped for
their plain equivalents. Set HINTS_GPU_PATHS=0 to run the CPU forms on a GPU (debugging).
"""
import contextlib
import os

import torch

GPU_PATHS_ENV = "HINTS_GPU_PATHS"


def gpu_paths_enabled() -> bool:
    """True when CUDA is available and HINTS_GPU_PATHS is not "0"."""
    return torch.cuda.is_available() and os.environ.get(GPU_PATHS_ENV, "1") != "0"


def maybe_compile(fn):
    """torch.compile `fn` (a module or a function) on the GPU path; return it unchanged on CPU."""
    if not gpu_paths_enabled():
        return fn
    # dynamic=False: training and eval shapes are fixed, so specialise rather than trace symbolic shapes.
    return torch.compile(fn, dynamic=False)


def autocast_context(device):
    """bf16 autocast for a CUDA device on the GPU path, else a no-op context (float32 on CPU)."""
    if gpu_paths_enabled() and torch.device(device).type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
