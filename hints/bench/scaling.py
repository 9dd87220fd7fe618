"""Hint-corpus scaling: one incremental pass over training shards, stopping at each size of a
doubling ladder (75M, 150M, ... up to the largest), to measure something at every size.

`run_ladder` owns the pass; a callback measures. `python -m hints scaling` measures hint
coverage and accuracy of a validation stream per length, count bucket and purity bucket
(the article's "1% of validation tokens have a 20-gram match in a 75M-token corpus, 11% in
37B"), and writes a Markdown table, JSON, CSV and plots. `scripts/ablate.py` uses the same
pass to evaluate a checkpoint's validation loss at every size.
"""

from data.units import human_tokens

from ..cells import BOS, describe_boundary
from ..index import Geometry, HintIndex
from ..tokens import count_tokens, iter_chunks
from .report import markdown_table, write_report
from .stats import grouped, hint_stats

RECORD_LADDER_START = 75_000_000  # the article's smallest hint corpus (75M tokens)


def ladder_sizes(max_tokens, min_tokens=RECORD_LADDER_START):
    """min, 2*min, 4*min, ... below max_tokens, then max_tokens itself."""
    if min_tokens <= 0 or max_tokens <= 0:
        raise ValueError(f"ladder: token counts must be positive (min {min_tokens}, max {max_tokens})")
    sizes, n = [], int(min_tokens)
    while n < max_tokens:
        sizes.append(n)
        n *= 2
    return sizes + [int(max_tokens)]


def run_ladder(train_files, sizes, on_size, geometry=None, workers=2, progress=None):
    """Add training tokens in order; call on_size(index, n_tokens) when the index holds each size.

    One index, sized for the largest size, grows through the whole pass (lookups are exact
    whatever the load, so smaller sizes see exactly their own prefix of the stream).
    """
    sizes = sorted(set(int(s) for s in sizes))
    available = count_tokens(train_files)
    if sizes[-1] > available:
        raise ValueError(f"ladder: largest size {sizes[-1]:,} tokens exceeds the {available:,} in {train_files}")
    idx = HintIndex(geometry or Geometry.for_tokens(sizes[-1]), workers=workers)
    results, i = [], 0
    for chunk in iter_chunks(train_files, sizes[-1]):
        while chunk.size:
            take = min(chunk.size, sizes[i] - idx.tokens_added)
            idx.add(chunk[:take])
            chunk = chunk[take:]
            if progress is not None:
                progress.update(take)
            if idx.tokens_added == sizes[i]:
                results.append(on_size(idx, sizes[i]))
                i += 1
                if i == len(sizes):
                    return results
    return results


def scaling_rows(stats_by_size):
    """Flat rows: one per (size, length) with coverage/accuracy, plus the grouped bucket rows."""
    rows = []
    for n, st in stats_by_size:
        for L, cov, cor in zip(st["lengths"], st["covered"], st["correct"]):
            rows.append(dict(hint_tokens=n, length=L, by="all", bucket="all", covered=cov, correct=cor,
                             coverage=cov / max(1, st["positions"]), accuracy=cor / cov if cov else float("nan")))
        for r in grouped(st):
            rows.append(dict(hint_tokens=n, **r))
    return rows


def scaling_table(rows):
    main = [r for r in rows if r["by"] == "all"]
    lengths = sorted({r["length"] for r in main})
    cells = []
    for n in sorted({r["hint_tokens"] for r in main}):
        by_length = {r["length"]: r for r in main if r["hint_tokens"] == n}
        cells.append([human_tokens(n)] + [f"{by_length[L][k]:{fmt}}" for L in lengths
                                          for k, fmt in (("coverage", ".2%"), ("accuracy", ".1%"))])
    return markdown_table(["hint tokens"] + [f"{L}-gram {what}" for L in lengths for what in ("coverage", "accuracy")],
                          cells)


def plot_coverage(rows):
    main = [r for r in rows if r["by"] == "all"]

    def draw(plt):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for L in sorted({r["length"] for r in main}):
            pts = sorted((r["hint_tokens"], r["coverage"], r["accuracy"]) for r in main if r["length"] == L)
            xs = [p[0] for p in pts]
            axes[0].plot(xs, [100 * p[1] for p in pts], marker="o", label=f"{L}-gram")
            axes[1].plot(xs, [100 * p[2] for p in pts], marker="o", label=f"{L}-gram")
        for ax, title in zip(axes, ("coverage: validation positions with a hint (%)", "accuracy: hint = next token (%)")):
            ax.set_xscale("log")
            ax.set_xlabel("hint corpus (training tokens)")
            ax.set_title(title)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        return fig
    return draw


def plot_buckets(rows):
    """Accuracy by count and purity bucket at the largest size: how much each kind can be trusted."""
    n = max(r["hint_tokens"] for r in rows)

    def draw(plt):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, by in zip(axes, ("count", "purity")):
            for L in sorted({r["length"] for r in rows}):
                sel = [r for r in rows if r["hint_tokens"] == n and r["by"] == by and r["length"] == L and r["covered"]]
                ax.plot([r["bucket"] for r in sel], [100 * r["accuracy"] for r in sel], marker="o", label=f"{L}-gram")
            ax.set_xlabel(f"{by} bucket")
            ax.set_ylabel("accuracy (%)")
            ax.set_title(f"hint accuracy by {by} ({human_tokens(n)} hint tokens)")
            ax.grid(True, alpha=0.3)
            ax.legend()
        return fig
    return draw


def write_scaling(rows, out_dir, boundary=BOS):
    table = scaling_table(rows) + f"\n\n{describe_boundary(boundary)}"
    write_report(out_dir, "scaling", rows, table, boundary=describe_boundary(boundary),
                 plots=[("scaling.png", plot_coverage(rows)), ("scaling_buckets.png", plot_buckets(rows))])
    return table


def run_scaling(train_files, val_tokens, sizes, out_dir, geometry=None, workers=2, log=print, boundary=BOS):
    from tqdm import tqdm
    stats = []
    log(describe_boundary(boundary))

    def measure(idx, n):
        st = hint_stats(idx, val_tokens, boundary=boundary)
        cov = ", ".join(f"{L}-gram {c / max(1, st['positions']):.2%}" for L, c in zip(st["lengths"], st["covered"]))
        log(f"  {human_tokens(n):>6} hint tokens: coverage {cov}")
        stats.append((n, st))

    with tqdm(total=max(sizes), unit="tok", unit_scale=True, desc="hint corpus") as bar:
        run_ladder(train_files, sizes, measure, geometry=geometry, workers=workers, progress=bar)
    table = write_scaling(scaling_rows(stats), out_dir, boundary)
    log(table)
    log(f"wrote {out_dir}/scaling.md, .json, .csv, .png, scaling_buckets.png")
    return stats
