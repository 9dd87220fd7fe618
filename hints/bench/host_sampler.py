"""The host rows of `python -m hints bench`, sampled all through the run, and each figure's host
as it was while that figure was measured.

A shared VM's speed moves in phases: on the Intel Xeon of 2026-12-07 the vector loop ran at
~930M positions a second for minutes and ~1,330M for others, with dips of 4-200 ms in between.
A host row measured once, at the end of the run, set every figure against whichever phase the
last second fell in: run pairs whose host rows differed 1.4-1.5x broke the 15% agreement of
their shares. Shares taken repeat by repeat do not help: from one second to the next the host
rows and the figures move independently (docs/performance.md).

So the sampler measures each host row briefly (the vector ceiling and the random-write floor, each
on 1 and on `workers` threads at once) before the first timed repeat of a figure and after each of its
repeats (hints.bench.figures.alternate). A figure's host is the median of the samples of its own
window; the host rows the bench reports are the medians of every sample of the run.
"""
import numpy as np

from ..index import human_bytes
from ..parallel import line_aligned, run_split
from .figures import Figure, timed
from .limits import VECTOR_WORDS, scatter_words, vector_rounds, write_table
from .record import RECORD_ADD

# A sample of the vector ceiling: VECTOR_WORDS positions SAMPLE_ROUNDS times a thread, ~40 ms at the
# 1.0-1.3G positions a second of the Intel Xeon of 2026-12-07. Long enough that a second thread's
# start is a small share of it: at 2,000 rounds (~8 ms) 2 threads / 1 read 1.87-1.88x, against
# 1.94-1.96x at 20,000 rounds, in one process on that host.
SAMPLE_ROUNDS = 12_000


def random_writes_row(w):
    """The name of the random-write floor of w cores at once (the 1-core row's is "random_writes")."""
    return "random_writes" if w == 1 else f"random_writes_{w}w"


class HostSampler:
    """Samples of the host rows, taken as the bench asks (sample), and the medians of a window of
    them (window). The random writes go to a table of `table_bytes` of the sampler's own, faulted in
    when it is made (on huge pages where the kernel allows, as an index's table): RECORD_ADD
    writes a sample, each to new places."""

    def __init__(self, workers, table_bytes, rounds=SAMPLE_ROUNDS, writes=RECORD_ADD):
        self.counts = sorted({1, int(workers)})
        self.rounds, self.writes = rounds, writes
        rng = np.random.default_rng(0)
        self.bufs = []
        for _ in range(self.counts[-1]):
            src = line_aligned((VECTOR_WORDS,), np.uint64)
            src[:] = rng.integers(0, 1 << 16, VECTOR_WORDS, dtype=np.uint64)
            self.bufs.append((src, line_aligned((VECTOR_WORDS,), np.uint64)))
        self.rng = np.random.default_rng(1)
        self.table = write_table(table_bytes // 8, self.rng)
        self.rows = {f"vector_{w}w": Figure(f"vector ceiling: stage 1's multiplies and shifts, plain loop in cache, "
                                            f"{w} thread(s), sampled through the run", "pos/s",
                                            VECTOR_WORDS * rounds * w, w) for w in self.counts}
        for w in self.counts:
            self.rows[random_writes_row(w)] = Figure(
                f"random 8-byte writes into {human_bytes(self.table.nbytes)}, {w} core(s) at once, sampled through "
                f"the run", "writes/s", writes * w, w)
        vector_rounds(*self.bufs[0], 1)  # compile outside any sample

    def __len__(self):
        return len(self.rows[random_writes_row(1)].wall)

    def sample(self):
        """One sample of every row, appended to its Figure."""
        for w in self.counts:
            self.rows[f"vector_{w}w"].add(*timed(lambda: run_split(
                lambda r, a, b: vector_rounds(*self.bufs[r], self.rounds), w, w))[:2])
        for w in self.counts:
            where = [self.rng.integers(0, self.table.size, self.writes) for _ in range(w)]
            self.rows[random_writes_row(w)].add(*timed(lambda: run_split(
                lambda r, a, b: scatter_words(self.table, where[r]), w, w))[:2])

    def window(self, start, stop=None):
        """{row: median rate} over samples start..stop-1 (stop None: to the last)."""
        return {key: float(np.median(fig.rates[start:stop])) for key, fig in self.rows.items()}

    def log(self, log):
        """The host rows of the run: medians [min-max] of every sample."""
        for w in self.counts:
            log(f"  vector ceiling (stage 1's multiplies and shifts in a plain loop), {w} thread(s), "
                f"{len(self)} samples through the run: {self.rows[f'vector_{w}w'].text(digits=0)}")
        for w in self.counts:
            r = self.rows[random_writes_row(w)].rates / w
            log(f"  random 8-byte writes into {human_bytes(self.table.nbytes)}, {w} core(s) at once, new places "
                f"each sample, {len(self)} samples through the run: {1e9 / np.median(r):.1f} ns per write a core "
                f"[{1e9 / r.max():.1f}-{1e9 / r.min():.1f}]")
