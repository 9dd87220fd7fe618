"""The hint index: which tokens follow each 6-, 10- and 20-gram of a token stream.

NumPy + Numba only at import (no torch); `count_exact` (exact hints by counting the query's
n-grams, hints/exact.py) imports torch, and Triton for its GPU kernels, when called.
docs/design.md, "The hint index", explains it.
"""
from .cells import BOS, Cells
from .exact import count_exact
from .geometry import Geometry
from .index import HintIndex, Hints
from .kinds import KINDS_PER_LENGTH, cell_of, n_cells, n_kinds
from .positional import PositionalIndex, exact_cells
from .reference import ReferenceIndex

__all__ = ["BOS", "Cells", "PositionalIndex", "exact_cells", "cell_of", "n_cells", "count_exact", "Geometry", "HintIndex", "Hints", "ReferenceIndex", "KINDS_PER_LENGTH", "n_kinds"]
