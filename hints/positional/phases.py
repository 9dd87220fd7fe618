"""The positional index in phases: the stream ends a node's rank 0 builds it up to (steps 8, 32, then
all, as the record), one file per phase published by an atomic rename, and the newest phase that
covers a step, which every rank maps (train/positional_hints.py).
"""
import glob
import os
import time

from ..cells import BOS
from ..index import DEFAULT_LENGTHS
from .positional_index import PositionalIndex


def phase_ends(steps, global_tokens, phases=(8, 32)):
    """Stream ends of the build phases: the tokens before each phase's last step (up to steps 8,
    32, then all, as the record), each covering the lookups of the steps up to it."""
    ends = [int(p) * int(global_tokens) for p in phases if p < steps] + [int(steps) * int(global_tokens)]
    return sorted(set(ends))


def phase_path(directory, end):
    return os.path.join(directory, f"positional-{end:015d}.idx")


def build_phases(stream, ends, directory, segment=0, lengths=DEFAULT_LENGTHS, boundary=BOS, log=None):
    """Build and save one index per phase end (in order), each published by an atomic rename as
    soon as it is done; returns the paths. Readers take the newest phase that covers them
    (`load_covering`)."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for end in ends:
        idx = PositionalIndex.build(stream, segment=segment, upto=end, lengths=lengths, boundary=boundary)
        paths.append(idx.save(phase_path(directory, end)))
        if log:
            log(f"positional index phase: {end:,} tokens, {idx.entries:,} entries, built in {idx.build_s:.2f}s")
    return paths


def load_covering(directory, before, timeout=None, poll=0.01):
    """The saved phase with the fewest tokens >= `before` (waits up to `timeout` seconds for it:
    None waits forever)."""
    t0 = time.perf_counter()
    while True:
        ends = sorted(int(os.path.basename(p)[11:26]) for p in glob.glob(os.path.join(directory, "positional-*.idx")))
        ok = [e for e in ends if e >= before]
        if ok:
            return PositionalIndex.load(phase_path(directory, ok[0]))
        if timeout is not None and time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"{directory}: no positional index phase covers stream position {before:,} "
                               f"after {timeout}s (phases so far end at {ends})")
        time.sleep(poll)
