"""The hint index: which tokens follow each 6-, 10- and 20-gram of a token stream.

NumPy + Numba only (no torch). docs/design.md, "The hint index", explains it.
"""
from .geometry import Geometry
from .index import HintIndex, Hints
from .kinds import KINDS_PER_LENGTH, n_kinds
from .reference import ReferenceIndex

__all__ = ["Geometry", "HintIndex", "Hints", "ReferenceIndex", "KINDS_PER_LENGTH", "n_kinds"]
