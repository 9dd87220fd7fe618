"""`python -m hints positional-bench`: the training-time hint work per rank per step at the record's
shape, the exact positional index (one per node, built ahead) against today's growing per-rank
index, alternated step by step in one process; and the positional index's build time per phase.

The record's shape: 8 ranks x 16,384 tokens = 131,072 tokens a step, 12M tokens already trained
on. New: one rank's lookup_cells of its 16,384 positions (cap 96, 2 followers) in an index built
ahead over the whole stream, filtered to before the step. Today: the same rank's per-length lookup
of its 16,384 positions, then the add of the step's 131,072 tokens into its own growing index (every
rank repeats that add). Times are this thread's CPU time (the shared machine's wall time counts
other processes' turns) and wall time; medians and [min-max] over the steps.
"""
import time

import numba
import numpy as np

from ..cells import BOS
from ..index import Geometry, HintIndex
from ..positional import DEFAULT_CAP, TRAIN_FOLLOWERS, PositionalIndex, phase_ends
from .record import RECORD_INDEX_TOKENS, RECORD_PREFILL

RANK_TOKENS = 16_384     # the record's tokens per rank per step
WORLD = 8                # its ranks
PREFILL = RECORD_PREFILL  # tokens already trained on when the steps are timed
INDEX_TOKENS = RECORD_INDEX_TOKENS  # today's growing index is sized for this many (the record step's)


def timed(fn):
    """(thread CPU seconds, wall seconds, fn's result)."""
    c, w = time.thread_time(), time.perf_counter()
    out = fn()
    return time.thread_time() - c, time.perf_counter() - w, out


def spread(ms):
    ms = np.asarray(ms)
    return f"{np.median(ms):.2f} ms [{ms.min():.2f}-{ms.max():.2f}]"


def run_positional_bench(stream, steps=10, rank_tokens=RANK_TOKENS, world=WORLD, prefill=PREFILL, log=print,
                         compare=True):
    """Measure; returns a dict of the numbers (ms lists) and logs a table."""
    G = rank_tokens * world
    stream = np.ascontiguousarray(stream, dtype=np.uint16)
    total_steps = stream.size // G
    first = min(prefill // G, total_steps - steps - 1)
    if first < 1:
        raise ValueError(f"positional-bench: {stream.size:,} tokens hold {total_steps} steps of {G:,}; "
                         f"needs at least {steps + 2}")
    stream = stream[:total_steps * G]
    log(f"stream: {stream.size:,} tokens = {total_steps} steps of {world} x {rank_tokens:,}; timing steps "
        f"{first + 1}..{first + steps} ({first * G:,} tokens in)")
    warm = PositionalIndex.build(stream[:4 * G], segment=rank_tokens)  # compile outside the timings
    warm.lookup_cells(stream[3 * G:3 * G + rank_tokens], 3 * G, cap=DEFAULT_CAP, max_followers=TRAIN_FOLLOWERS)
    phases = []
    for end in phase_ends(total_steps, G):  # process CPU time: the build's row loop runs on Numba's threads
        c, w = time.process_time(), time.perf_counter()
        idx = PositionalIndex.build(stream, segment=rank_tokens, upto=end)
        c, w = time.process_time() - c, time.perf_counter() - w
        phases.append(dict(tokens=end, cpu_s=c, wall_s=w, entries=idx.entries, mib=idx.nbytes / 2 ** 20,
                           threads=numba.get_num_threads()))
        log(f"  build phase up to {end:,} tokens: {c:.2f} s CPU ({c / end * 1e9:.0f} ns/token), {w:.2f} s wall on "
            f"{numba.get_num_threads()} thread(s), {idx.entries:,} entries, {idx.nbytes / 2 ** 20:.0f} MiB")
    old = None
    if compare:
        old = HintIndex(Geometry.for_tokens(INDEX_TOKENS)).reserve(G)
        old.add(stream[:(first + 1) * G])
        old.lookup(stream[:RANK_TOKENS])  # compile
    new_ms, new_wall, old_ms, old_wall, matched = [], [], [], [], []
    for i, s in enumerate(range(first + 1, first + 1 + steps)):
        a = s * G  # rank 0's slice of step s
        q = stream[a:a + rank_tokens]

        def new():
            return timed(lambda: idx.lookup_cells(q, a, cap=DEFAULT_CAP, max_followers=TRAIN_FOLLOWERS, boundary=BOS))

        def today():
            c1, w1, _ = timed(lambda: old.lookup_span(stream, a, a + rank_tokens))
            c2, w2, _ = timed(lambda: old.add(stream[a:a + G]))
            return c1 + c2, w1 + w2, None

        order = (new, today) if (i % 2 == 0 or not compare) else (today, new)
        for f in order:
            if f is today and not compare:
                continue
            c, w, out = f()
            if f is new:
                new_ms.append(1e3 * c)
                new_wall.append(1e3 * w)
                matched.append(float((out.depth >= 0).mean()))
            else:
                old_ms.append(1e3 * c)
                old_wall.append(1e3 * w)
    log(f"  per rank per step, new (lookup_cells of {rank_tokens:,}, cap {DEFAULT_CAP}): {spread(new_ms)} CPU, "
        f"{spread(new_wall)} wall; {np.mean(matched):.0%} of positions have a cell")
    res = dict(phases=phases, new_cpu_ms=new_ms, new_wall_ms=new_wall, matched=matched, steps=steps,
               first_step=first + 1, rank_tokens=rank_tokens, world=world)
    if compare:
        ratio = np.median(np.array(new_ms) / np.array(old_ms))
        log(f"  per rank per step, today (lookup of {rank_tokens:,} + add of {G:,}): {spread(old_ms)} CPU, "
            f"{spread(old_wall)} wall; new / today = {ratio:.2f}x (median of per-step CPU ratios)")
        res.update(old_cpu_ms=old_ms, old_wall_ms=old_wall, ratio=float(ratio))
    return res
