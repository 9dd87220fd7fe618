"""The figures a benchmark reports: rates measured `repeats` times, alternated between the things
they are compared with, each with its wall and CPU seconds (hints.bench.speed says why).
"""
import dataclasses
import time

import numpy as np

REPEATS = 5
MIB = 1 << 20


def timed(fn):
    """(wall seconds, process CPU seconds, fn's result)."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


@dataclasses.dataclass
class Figure:
    """One measured rate, repeated: what it is, its unit and the per-repeat values."""

    name: str
    unit: str
    work: float                                  # units of work per repeat (tokens, positions)
    workers: int = 1
    wall: list = dataclasses.field(default_factory=list)
    cpu: list = dataclasses.field(default_factory=list)
    host: dict = None                            # the host rows while it was measured (hints.bench.host_sampler)

    def add(self, wall, cpu):
        self.wall.append(wall)
        self.cpu.append(cpu)

    @property
    def rates(self):
        return np.array([self.work / w for w in self.wall])

    @property
    def median(self):
        return float(np.median(self.rates))

    @property
    def cores_used(self):
        """Median CPU seconds per wall second: how many cores the figure actually got."""
        return float(np.median(np.array(self.cpu) / np.array(self.wall)))

    def summary(self):
        r = self.rates
        return dict(name=self.name, unit=self.unit, workers=self.workers, median=self.median, min=float(r.min()),
                    max=float(r.max()), repeats=len(r), wall_s=self.wall, cpu_s=self.cpu, cores_used=self.cores_used,
                    median_per_cpu_s=float(np.median([self.work / c for c in self.cpu if c > 0] or [np.nan])),
                    **({"host": self.host} if self.host is not None else {}))

    def text(self, scale=1e6, digits=1):
        r = self.rates / scale
        return (f"{np.median(r):.{digits}f}M {self.unit} [{r.min():.{digits}f}-{r.max():.{digits}f}], "
                f"{self.cores_used:.2f} cores used")


def alternate(figs, measure, repeats, sampler=None, warm=None):
    """Measure each of `figs` `repeats` times, alternating between them, after one untimed round:
    measure(key) -> (wall, cpu, extra); returns each key's extras. Without that round, in eight
    runs of this bench, the first of five repeats was the slowest in 21 of the 48 build figures
    (one in five by chance), at up to 1.68x the median. With a `sampler`
    (hints.bench.host_sampler.HostSampler), the host rows are sampled before the first timed
    round and after every timed measurement, and each figure's `host` is their medians.

    A sample's random writes push what a figure had in cache out of it, so a figure that reads
    the same memory again and again (a lookup of one index) would be timed from the sampler's
    state, not its own: `warm(key)`, untimed, runs right before each timed measure(key). Timed
    right after a sample, the sealed lookup of the prose split (a 44 MiB index) ran 5.98-6.19M
    positions a second on 1 worker against 6.69-6.96M right after a lookup, and 10.8M against
    12.1-12.6M on 2 (scripts/lookup_state.py --mode after-sample --repeats 11, at a slow moment
    of the Intel Xeon of 2026-12-07)."""
    extras = {k: [] for k in figs}
    start = len(sampler) if sampler is not None else 0
    for rep in range(repeats + 1):
        if rep == 1 and sampler is not None:
            sampler.sample()
        for k, fig in figs.items():
            if rep and warm is not None:
                warm(k)
            wall, cpu, extra = measure(k)
            if rep:
                fig.add(wall, cpu)
                extras[k].append(extra)
                if sampler is not None:
                    sampler.sample()
    if sampler is not None:
        for fig in figs.values():
            fig.host = sampler.window(start)
    return extras
