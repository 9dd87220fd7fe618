"""The hint indexes: which tokens follow each 6-, 10- and 20-gram of a token stream.

  index/       the hashed index (HintIndex): its geometry, Numba build, lookup, sealed search, file format,
               the background builder in shared memory, and the plain-Python reference
  positional/  the record's exact training-time index over the known training stream (PositionalIndex)
  exact/       exact hints by counting a known query's n-grams (count_exact: torch, Triton)
  draft/       drafting for generation: llama.cpp's n-gram rule, drafting from a hint index, the replay
  bench/       the benchmarks, the machine's limits, the record's shape, and the stats and scaling tools
Beside them the shared vocabulary: kinds and cells (what a hint is), tokens, fingerprints, workers
(parallel.py) and the low-level Numba helpers (numba_ops.py); `python -m hints` is cli.py.

NumPy + Numba only at import (no torch); `count_exact` imports torch, and Triton for its GPU
kernels, when called. docs/design.md, "The hint index", explains it.
"""
from . import numba_cache

numba_cache.register()  # before any kernel is defined: kernels are cached against all of hints/'s source

from .cells import BOS, Cells
from .exact import count_exact
from .index import Geometry, HintIndex, Hints, ReferenceIndex
from .kinds import KINDS_PER_LENGTH, cell_of, n_cells, n_kinds
from .positional import PositionalIndex, exact_cells

__all__ = ["BOS", "Cells", "PositionalIndex", "exact_cells", "cell_of", "n_cells", "count_exact", "Geometry", "HintIndex",
           "Hints", "ReferenceIndex", "KINDS_PER_LENGTH", "n_kinds"]
