"""The one switch for GPU-only paths: torch.compile, bf16 autocast, bf16 Newton-Schulz; and
torch.compile's settings.

Everything the model does on a GPU it also does on the CPU, with these paths swapped for
their plain equivalents. Set HINTS_GPU_PATHS=0 to run the CPU forms on a GPU (debugging).
Every torch.compile of the repo goes through torch_compile() (or calls configure_compile()
first), so its recompile limit is set deliberately; TORCH_LOGS=recompiles logs each recompile
(scripts/gpu_check.sh counts them).
"""
import contextlib
import os

import torch

GPU_PATHS_ENV = "HINTS_GPU_PATHS"
# torch.compile's recompile limit per code object (torch's default is 8; past it a function runs
# eagerly from then on, slowly and silently). All SpeedrunBlocks share one forward, compiled once
# per variant: 3 block kinds (attention with value embeddings, attention alone, MLP only) x 2 grad
# modes (training, no-grad validation) x 2 batch shapes (training, validation batch) = 12 (measured on
# CPU with the record backbone: 3 for training, 3 more for no-grad validation, 3 more per new batch
# shape; the window growing adds none). Twice that leaves room for guards a torch version adds.
RECOMPILE_LIMIT = 24


def gpu_paths_enabled() -> bool:
    """True when CUDA is available and HINTS_GPU_PATHS is not "0"."""
    return torch.cuda.is_available() and os.environ.get(GPU_PATHS_ENV, "1") != "0"


def configure_compile() -> None:
    """Raise torch.compile's recompile limit to RECOMPILE_LIMIT (idempotent; never lowers it)."""
    import torch._dynamo
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # older torch
    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))


def torch_compile(fn):
    """torch.compile `fn` (a module or a function) with the repo's settings. dynamic=False: training
    and eval shapes are fixed, so specialise rather than trace symbolic shapes."""
    configure_compile()
    return torch.compile(fn, dynamic=False)


def maybe_compile(fn):
    """torch_compile `fn` on the GPU path; return it unchanged on CPU."""
    return torch_compile(fn) if gpu_paths_enabled() else fn


def autocast_context(device):
    """bf16 autocast for a CUDA device on the GPU path, else a no-op context (float32 on CPU)."""
    if gpu_paths_enabled() and torch.device(device).type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
