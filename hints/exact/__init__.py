"""Exact hints by counting: a known query's n-grams counted in the training stream, with torch
(count.py, any device) or Triton kernels (triton_count.py drives triton_kernels.py; on a CPU in
Triton's interpreter). Nothing here imports torch or Triton until it counts.
"""
from .count import count_exact, exact_val_hints

__all__ = ["count_exact", "exact_val_hints"]
