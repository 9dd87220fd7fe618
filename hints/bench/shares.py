"""Figures as shares of their host rows (hints.bench.limits), measured in the same run: each figure
against the host rows sampled while it was measured (hints.bench.host_sampler). And the
reproducibility criterion of docs/performance.md that `python -m hints bench --compare` checks.
"""
import numpy as np

from .host_sampler import random_writes_row
from .record import RECORD_ADD, RECORD_LOOKUP

# Reproducibility (docs/performance.md): two consecutive runs agree within REPRO_TOLERANCE on every figure as a
# share of its host row, and two workers reach REPRO_SCALING of the vector ceiling's own 2-thread/1-thread ratio.
REPRO_TOLERANCE = 0.15
REPRO_SCALING = 0.9


# Each figure's host row (measured in the same run): compute-bound figures against the vector ceiling
# of as many threads, memory-bound ones against memcpy (1 core; a figure of w cores is taken per core
# there) or against the random-write floor of as many cores at once. None: the figure is a host row.
def host_row(key, workers):
    if key == "latency" or key.startswith(("vector_", "random_writes")) or key == "memcpy_1w":
        return None
    if key.startswith("memcpy_"):
        return "memcpy_1w"
    if key.startswith("lookup_"):
        return random_writes_row(int(key.rsplit("_", 1)[1][:-1]))
    w = workers if key == "seal" else (int(key.rsplit("_", 1)[1][:-1]) if key.endswith("w") else 1)
    return f"vector_{w}w"


def host_of(res, f, row):
    """The rate of host row `row` while figure (or record step) f was measured: the medians of the
    samples of its window (hints.bench.host_sampler), else the run's median of that row."""
    host = f.get("host") or {}
    return host[row] if row in host else res["figures"][row]["median"]


def host_shares(res):
    """{figure: share of its host row} from one run's medians (rates per second), each against the
    host rows of its own window (host_of), and per stage: each build's stage 1 against the vector
    ceiling, stage 2 against the random-write floor, each of as many threads as the build's
    workers; the record step's lookup and stage 2 against its own floor (random writes into its
    table, 1 core), its stage 1 against the vector ceiling."""
    figs, workers = res["figures"], res["workers"]
    shares = {}
    for key, f in figs.items():
        row = host_row(key, workers)
        if row is None or row not in figs:
            continue
        per = f["workers"] if row == "memcpy_1w" else 1
        shares[key] = f["median"] / per / host_of(res, f, row)
    n = res["train_tokens"]
    for label, stages in (("build", res["stages"]), ("build_many", res["stages_many"])):
        for w, st in stages.items():
            for stage, row in (("stage1", f"vector_{w}w"), ("stage2", random_writes_row(int(w)))):
                if row in figs:
                    host = host_of(res, figs[f"{label}_{w}w"], row)
                    shares[f"{label}_{w}w_{stage}"] = n / float(np.median([x[stage] for x in st])) / host
    if "record_step" in res:  # against its own floor: random writes into the record-shape table
        r = res["record_step"]
        vec = host_of(res, r, "vector_1w")
        floor = RECORD_ADD / (1e-3 * np.median(r["random_writes_ms"]))
        shares["record_lookup"] = RECORD_LOOKUP / (1e-3 * np.median(r["lookup_ms"])) / floor
        shares["record_stage1"] = RECORD_ADD / (1e-3 * np.median(r["stage1_ms"])) / vec
        shares["record_stage2"] = RECORD_ADD / (1e-3 * np.median(r["stage2_ms"])) / floor
    return {k: float(v) for k, v in shares.items()}


def host_shares_cpu(res):
    """The same shares from rates per CPU second (work / the process's CPU time, a per-core rate):
    what the figure's code does while it runs, less moved by time the host gives to others (a
    shared host took 3/4 of this bench's core at times, "cores used" 0.15-0.3). Figures only."""
    figs = res["figures"]
    out = {}
    for key, f in figs.items():
        row = host_row(key, res["workers"])
        if row in figs and np.isfinite(f.get("median_per_cpu_s", np.nan)):
            out[key] = float(f["median_per_cpu_s"] / figs[row]["median_per_cpu_s"])
    return out


def reproducibility(res, previous=None):
    """The criterion of docs/performance.md: (1) with `previous` (an earlier run's JSON), every
    host-relative share of both runs agrees within REPRO_TOLERANCE (larger / smaller - 1); (2) in
    this run, two workers reach REPRO_SCALING of the vector ceiling's own 2-thread/1-thread ratio
    (the builds' and the in-cache hashing's ratios)."""
    out = {}
    ratios = res["ratios"]
    vec = ratios.get(f"vector_{res['workers']}w_vs_1w")
    if vec:
        scaling = {k[:-len("_vs_1w")]: ratios[k] / vec for k in ratios
                   if k.endswith("_vs_1w") and not k.startswith(("vector", "memcpy", "lookup", "random_writes"))}
        out["scaling_vs_vector"] = scaling
        out["scaling_met"] = bool(scaling) and all(v >= REPRO_SCALING for v in scaling.values())
    if previous is not None:
        a, b = res["shares"], previous.get("shares", {})
        common = sorted(set(a) & set(b))
        if not common:
            raise ValueError("--compare: the earlier run's JSON has no host-relative shares (made before they existed?)")
        dev = {k: max(a[k], b[k]) / min(a[k], b[k]) - 1 for k in common}
        out["agreement"] = dev
        out["worst"] = max(dev, key=dev.get)
        out["agreement_met"] = all(v <= REPRO_TOLERANCE for v in dev.values())
        a, b = res.get("shares_cpu", {}), previous.get("shares_cpu", {})
        common = sorted(set(a) & set(b))
        if common:
            dev = {k: max(a[k], b[k]) / min(a[k], b[k]) - 1 for k in common}
            out["agreement_cpu"] = dev
            out["worst_cpu"] = max(dev, key=dev.get)
            out["agreement_cpu_met"] = all(v <= REPRO_TOLERANCE for v in dev.values())
    return out


def share_text(res, key):
    """'0.21 of the vector ceiling' (or of memcpy, of the random writes); 'host row' for a host row."""
    v = res.get("shares", {}).get(key)
    if v is None:
        return "host row" if key in res["figures"] and host_row(key, res["workers"]) is None else ""
    if key.startswith("memcpy"):
        row = "memcpy, 1 core (per core)"
    elif key.startswith(("lookup", "record_lookup")) or key.endswith("stage2"):
        row = "random writes" + ("" if "_1w" in key or key.startswith("record") else " of as many cores at once")
    else:
        row = "vector ceiling"
    cpu = res.get("shares_cpu", {}).get(key)
    return f"{v:.3g} of {row}" + (f" ({cpu:.3g} per CPU second)" if cpu is not None else "")
