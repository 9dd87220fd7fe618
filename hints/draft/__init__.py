"""Drafting for generation: llama.cpp's n-gram rule on fast containers (llama.py, with its caches in
caches.py and static.py), its plain-Python statement (reference.py), drafting from a hint index
(from_hints.py), and the replay of a text that `python -m hints draft-stats` runs (stats.py).
"""
from .from_hints import HintDrafter, replay_hints
from .llama import LlamaDrafter, replay
from .static import build_static, load_static, save_static, static_nbytes
from .stats import add_draft_stats_args, run_draft_stats

__all__ = ["HintDrafter", "replay_hints", "LlamaDrafter", "replay", "build_static", "load_static", "save_static",
           "static_nbytes", "add_draft_stats_args", "run_draft_stats"]
