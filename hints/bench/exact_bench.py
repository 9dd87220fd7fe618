"""`python -m hints exact-bench`: three ways to hints for a validation stream, timed in one run.

  * the hint index (HintIndex): build from the training tokens, then look the query up;
  * exact count, torch backend, on this machine's CPU (hints.exact.count);
  * exact count, Triton backend: on a CPU only in Triton's interpreter, on a small slice, for
    correctness (its speed there means nothing); on a CUDA GPU, timed, beside torch on the GPU.

Machines here are shared and noisy: each timing is the median of `repeats` runs, printed with
its min-max, and the claims are ratios within the run. The run also checks that the exact
backends agree with each other (and the interpreter with the plain-Python reference), says
where the index differs from the exact count (its drops and checksum collisions), and
measures fingerprint collisions on the training tokens.
"""
import time

import numpy as np

from ..exact import count_exact
from ..fingerprint import fingerprint_collisions
from ..index import DEFAULT_LENGTHS, Geometry, HintIndex, ReferenceIndex

FIELDS = ("token", "count", "purity", "kind")
INTERPRETER_TRAIN = 3000   # tokens the interpreted kernels count (~1 s)
INTERPRETER_QUERY = 500
COLLISION_TOKENS = 4_000_000  # training tokens whose n-grams are checked for fingerprint collisions


def _timed(fn, repeats):
    """(median seconds, min, max, last result) of `repeats` calls."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)), min(times), max(times), out


def same_hints(a, b):
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def run_exact_bench(train, query, lengths=DEFAULT_LENGTHS, workers=2, repeats=3, log=print):
    import torch
    lengths = tuple(lengths)
    log(f"exact-bench: {train.size:,} training tokens, {query.size:,} query positions, lengths {lengths}, "
        f"{repeats} repeats; torch threads {torch.get_num_threads()}")
    res = dict(train_tokens=int(train.size), query_tokens=int(query.size), lengths=list(lengths), workers=workers,
               repeats=repeats, rows=[])

    def row(name, t, note="", rate=None):
        """rate: (items, what) processed per run, printed per second of the median."""
        med, lo, hi = t
        speed = "-" if rate is None else f"{rate[0] / med / 1e6:.2f}M {rate[1]}/s"
        res["rows"].append(dict(name=name, median_s=med, min_s=lo, max_s=hi, note=note, speed=speed))
        log(f"  {name}: {med:.2f}s (min {lo:.2f}, max {hi:.2f}) {note}")

    geom = Geometry.for_tokens(train.size, lengths=lengths)
    HintIndex(Geometry(2, 4, 8, lengths)).add(train[:1000]).lookup(query[:1000])  # load compiled kernels
    holder = {}

    def build():
        holder["idx"] = HintIndex(geom, workers=workers).add(train)

    b = _timed(build, repeats)
    idx = holder["idx"]
    lk = _timed(lambda: idx.lookup(query), repeats)
    index_hints = lk[3]
    train_rate, query_rate = (train.size, "training tokens"), (query.size, "query positions")
    row(f"index build ({geom.describe()}, {workers} workers)", b[:3], f"{idx.dropped:,} dropped", train_rate)
    row("index lookup", lk[:3], rate=query_rate)
    both = [b[i] + lk[i] for i in range(3)]
    row("index build + lookup", both, rate=train_rate)

    count_exact(query[:1000], train[:1000], lengths, backend="torch", device="cpu")  # warm torch
    ex = _timed(lambda: count_exact(query, train, lengths, backend="torch", device="cpu"), repeats)
    exact = ex[3]
    row("exact count, torch on CPU", ex[:3], rate=train_rate)
    res["ratio_exact_cpu_vs_index"] = both[0] / ex[0]
    has = exact.count > 0
    res["index_differs_share"] = float(np.any([getattr(index_hints, f) != getattr(exact, f) for f in FIELDS], axis=0)[has].mean())
    res["index_token_differs_share"] = float((index_hints.token != exact.token)[has].mean())
    res["exact_hint_share"] = [float(r) for r in has.mean(axis=1)]
    log(f"  exact hints at {', '.join(f'{r:.1%}' for r in res['exact_hint_share'])} of positions (per length); "
        f"where there is one, the index's differs in some field at {res['index_differs_share']:.1%} "
        f"(hinted token: {res['index_token_differs_share']:.1%}) - its drops and checksum collisions")

    tq, tt = query[:INTERPRETER_QUERY], train[:INTERPRETER_TRAIN]
    t = time.perf_counter()
    interp = count_exact(tq, tt, lengths, backend="triton", device="cpu")
    t = time.perf_counter() - t
    ok = same_hints(interp, ReferenceIndex(lengths).add(tt).lookup(tq)) and same_hints(
        interp, count_exact(tq, tt, lengths, backend="torch", device="cpu"))
    res["interpreter_equal"] = bool(ok)
    row(f"exact count, Triton interpreter ({tt.size:,} train / {tq.size:,} query tokens)", (t, t, t),
        "equal to reference and torch" if ok else "DIFFERS from the reference")

    if torch.cuda.is_available():
        for backend in ("torch", "triton"):
            count_exact(query[:1000], train[:1000], lengths, backend=backend, device="cuda")  # compile / warm up
            g = _timed(lambda: count_exact(query, train, lengths, backend=backend, device="cuda"), repeats)
            same = same_hints(g[3], exact)
            res[f"gpu_{backend}_equal"] = same
            row(f"exact count, {backend} on {torch.cuda.get_device_name()}", g[:3],
                "equal to CPU" if same else "DIFFERS from CPU", train_rate)
    else:
        log("  no CUDA device: the GPU rows are not measured")

    n = min(train.size, COLLISION_TOKENS)
    res["collisions"] = {}
    for L in lengths:
        grams, fps = fingerprint_collisions(train[:n], L)
        res["collisions"][L] = dict(ngrams=grams, fingerprints=fps)
        log(f"  fingerprints, {L}-grams of {n:,} tokens: {grams:,} distinct n-grams, {fps:,} distinct "
            f"fingerprints ({grams - fps} collisions)")
    return res


def format_exact_table(res):
    """Markdown table of one run: median (min-max) seconds, and each row's speed."""
    out = ["| path | median s (min-max) | speed | note |", "|---|---|---|---|"]
    for r in res["rows"]:
        out.append(f"| {r['name']} | {r['median_s']:.2f} ({r['min_s']:.2f}-{r['max_s']:.2f}) | {r['speed']} | {r['note']} |")
    r = res["ratio_exact_cpu_vs_index"]
    out.append(f"\nexact torch on CPU takes {1 / r:.1f}x the time of index build + lookup "
               f"({res['train_tokens']:,} training tokens, {res['query_tokens']:,} query positions)")
    return "\n".join(out)
