"""The hashed index (HintIndex): one 64-bit slot per stream position in 2^P x 2^B buckets of S slots,
built in two Numba stages, looked up by a scan while it grows or by a search once sealed, saved in
one file, and built in shared memory by a background process (`python -m hints.index.background`,
which with `hints.index.memory` is imported by its own name). ReferenceIndex is the plain-Python
count it is tested against. docs/design.md, "The hint index".
"""
from .geometry import (DEFAULT_LENGTHS, MAX_LENGTH, MAX_MEMORY_FRACTION, PRESETS, TARGET_LOAD, Geometry,
                       available_memory_bytes, human_bytes, parse_lengths)
from .hint_index import HintIndex, compile_kernels
from .rates import cpu_model, load_rates, save_rate
from .reference import ReferenceIndex
from .results import Hints, hints_from_counts
from .sealed import search_sealed
from .sizing import default_chunk_tokens, stage1_chunk, staging_nbytes
from .store import file_bytes

__all__ = ["DEFAULT_LENGTHS", "MAX_LENGTH", "MAX_MEMORY_FRACTION", "PRESETS", "TARGET_LOAD", "Geometry", "available_memory_bytes", "human_bytes",
           "parse_lengths", "HintIndex", "compile_kernels", "cpu_model", "load_rates", "save_rate", "ReferenceIndex",
           "Hints", "hints_from_counts", "search_sealed", "default_chunk_tokens", "stage1_chunk", "staging_nbytes",
           "file_bytes"]
