"""The positional index (PositionalIndex): the record's exact training-time index over the known
training stream, one row per position sorted by fingerprint, filtered by position at lookup (kernels
in kernels.py, the class and its file in positional_index.py), built in phases (phases.py).
docs/design.md, "The positional training index".
"""
from .phases import build_phases, load_covering, phase_ends
from .positional_index import DEFAULT_CAP, MAGIC, TRAIN_FOLLOWERS, PositionalIndex, exact_cells

__all__ = ["build_phases", "load_covering", "phase_ends", "DEFAULT_CAP", "MAGIC", "TRAIN_FOLLOWERS", "PositionalIndex",
           "exact_cells"]
