"""Measurement: the index's speed against the plain-Python reference and the machine's limits
(speed.py, limits.py, shares.py, the host rows sampled through a run in host_sampler.py; a fresh
index's first add, fresh.py), the record's shape
(record.py), the exact count's and the positional index's benchmarks, hint coverage and
accuracy (stats.py), and how they grow with the hint corpus (scaling.py, report.py). The
`python -m hints bench|stats|scaling|...` commands.
"""
from .exact_bench import format_exact_table, run_exact_bench
from .host_sampler import HostSampler
from .positional_bench import run_positional_bench
from .record import (RECORD_ADD, RECORD_INDEX_TOKENS, RECORD_LOOKUP, RECORD_PREFILL, RECORD_THREADS,
                     bench_record_step)
from .report import markdown_table, write_report
from .scaling import RECORD_LADDER_START, ladder_sizes, run_ladder, run_scaling
from .shares import reproducibility
from .speed import format_table, run_bench
from .stats import format_stats, hint_stats

__all__ = ["format_exact_table", "run_exact_bench", "HostSampler", "run_positional_bench", "RECORD_ADD",
           "RECORD_INDEX_TOKENS", "RECORD_LOOKUP", "RECORD_PREFILL", "RECORD_THREADS", "bench_record_step",
           "markdown_table", "write_report", "RECORD_LADDER_START", "ladder_sizes", "run_ladder", "run_scaling",
           "reproducibility", "format_table", "run_bench", "format_stats", "hint_stats"]
