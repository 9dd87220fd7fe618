"""The record's protocol: N seeds of the record run, optionally interleaved with baseline legs, and
the table the speedrun asks for.

Each leg is one `train_gpt.py` run (under torchrun with --nproc > 1) with its own --seed, its
summary JSON and its full output kept as one log per run in --out. Baseline legs run the same
command with the baseline's flags (default: no hints, no background index) and are interleaved in the order --pattern
gives (H: a hinted leg, B: a baseline leg; the article's session ran HHB eight times). The table
(--out/statistics.md, also printed): mean, sample std and range of train time; mean and sample
std of the final val loss; the one-sided t-test of the val loss against the 3.28 target; and,
with baseline legs, the train-time difference with Welch's two-sided t-test. Statistics count
the legs whose summary says the attempt was valid; any other leg is listed and excluded, and
the script then exits 1. The t distribution is computed here (regularized incomplete beta
function, by continued fraction), so the script needs nothing beyond the standard library.

    python scripts/record_stats.py --seeds 16 --pattern HHB --nproc 8 --out runs/record_stats
    python scripts/record_stats.py --seeds 2 --nproc 1 --out /tmp/rs -- --steps 2 --n-layer 2 ...  # tiny, CPU
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_VAL_LOSS = 3.28  # the speedrun's target (train_gpt.py's SPEEDRUN_TARGET_VAL_LOSS)
BETACF_ITERATIONS = 300  # continued-fraction terms; it converges in far fewer for the degrees of freedom used here
BETACF_EPS = 1e-15
TINY = 1e-300  # Lentz's method: stands in for a zero denominator


# ---- the t distribution ------------------------------------------------------------------------

def _betacf(a, b, x):
    """The continued fraction of the incomplete beta function (modified Lentz's method)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > TINY else TINY)
    h = d
    for m in range(1, BETACF_ITERATIONS + 1):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((a + m2 - 1) * (a + m2)), -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > TINY else TINY)
            c = 1.0 + num / c
            c = c if abs(c) > TINY else TINY
            h *= d * c
        if abs(d * c - 1.0) < BETACF_EPS:
            return h
    raise ArithmeticError(f"incomplete beta I_{x}({a}, {b}): no convergence in {BETACF_ITERATIONS} terms")


def betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc: x = {x} outside [0, 1]")
    if x in (0.0, 1.0):
        return x
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t, df):
    """P(T > t) for Student's t with df degrees of freedom (df > 0, not necessarily whole)."""
    if df <= 0:
        raise ValueError(f"t_sf: df = {df}, expected > 0")
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return tail if t >= 0 else 1.0 - tail


# ---- statistics ----------------------------------------------------------------------------------

def mean_std(xs):
    """(mean, sample standard deviation: n - 1 in the denominator; 0 for one value)."""
    n = len(xs)
    m = sum(xs) / n
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0


def one_sided_below(xs, target):
    """(t, p) of the one-sided t-test that the mean of xs is below target: t = (target - mean) / (s / sqrt(n))."""
    m, s = mean_std(xs)
    if len(xs) < 2 or s == 0:
        return math.nan, math.nan
    t = (target - m) / (s / math.sqrt(len(xs)))
    return t, t_sf(t, len(xs) - 1)


def welch(xs, ys):
    """(t, degrees of freedom, two-sided p) of Welch's t-test of mean(xs) - mean(ys)."""
    (mx, sx), (my, sy) = mean_std(xs), mean_std(ys)
    vx, vy = sx * sx / len(xs), sy * sy / len(ys)
    if len(xs) < 2 or len(ys) < 2 or vx + vy == 0:
        return math.nan, math.nan, math.nan
    t = (mx - my) / math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx * vx / (len(xs) - 1) + vy * vy / (len(ys) - 1))
    return t, df, 2.0 * t_sf(abs(t), df)


def leg_val_loss(summary):
    """A leg's final val loss: with hints when it had them (the record), else without (a no-hints baseline)."""
    v = summary.get("val_loss_hints")
    return v if v is not None else summary.get("val_loss_nohints")


def table(hinted, baseline, target=TARGET_VAL_LOSS):
    """The statistics as Markdown rows (list of str) and as a dict; hinted/baseline: leg summaries."""
    times = [s["train_time_s"] for s in hinted]
    losses = [leg_val_loss(s) for s in hinted]
    tm, ts = mean_std(times)
    lm, ls = mean_std(losses)
    t, p = one_sided_below(losses, target)
    stats = dict(n=len(hinted), train_time_mean=tm, train_time_std=ts, train_time_min=min(times),
                 train_time_max=max(times), val_loss_mean=lm, val_loss_std=ls, t_vs_target=t, p_vs_target=p,
                 target=target)
    rows = ["| metric | value |", "| --- | ---: |", f"| runs | {len(hinted)} |",
            f"| mean train time | {tm:.3f} s |", f"| train time sample std | {ts:.3f} s |",
            f"| train time range | {min(times):.3f}-{max(times):.3f} s |", f"| mean val loss | {lm:.6f} |",
            f"| val loss sample std | {ls:.6f} |", f"| t-statistic vs {target} (one-sided) | {t:.2f} |",
            f"| one-sided p vs {target} | {p:.3g} |"]
    if baseline:
        btimes = [s["train_time_s"] for s in baseline]
        bm, _ = mean_std(btimes)
        bl, _ = mean_std([leg_val_loss(s) for s in baseline])
        wt, wdf, wp = welch(times, btimes)
        stats.update(baseline_n=len(baseline), baseline_train_time_mean=bm, train_time_diff=tm - bm,
                     welch_t=wt, welch_df=wdf, welch_p=wp, val_loss_diff=lm - bl)
        rows += [f"| baseline runs | {len(baseline)} |", f"| baseline mean train time | {bm:.3f} s |",
                 f"| mean train time difference | {tm - bm:+.3f} s ({(tm - bm) / bm:+.1%}) |",
                 f"| Welch t-test on train time, two-sided p | {wp:.3g} (t {wt:.2f}, df {wdf:.1f}) |",
                 f"| mean val loss difference | {lm - bl:+.5f} |"]
    return rows, stats


# ---- the legs ------------------------------------------------------------------------------------

def legs(seeds, pattern):
    """[(kind, seed)] in session order: the pattern repeated until `seeds` hinted legs ran; baseline
    legs take seeds of their own count (0, 1, ...)."""
    if not pattern or set(pattern) - {"H", "B"} or "H" not in pattern:
        raise ValueError(f"--pattern {pattern!r}: expected letters H (hinted leg) and B (baseline leg), at least one H")
    out, h, b = [], 0, 0
    while h < seeds:
        for kind in pattern:
            if kind == "H" and h < seeds:
                out.append(("hinted", h))
                h += 1
            elif kind == "B":
                out.append(("baseline", b))
                b += 1
    return out


def run_leg(i, kind, seed, args, extra):
    """One leg: its command's whole output to <out>/legs/<i>_<kind>_seed<seed>.txt; its summary dict
    (None when the run wrote none)."""
    out = Path(args.out)
    name = f"{i:02d}_{kind}_seed{seed}"
    summary = out / "summaries" / f"{name}.json"
    flags = ["--preset", args.preset, "--seed", str(seed), "--summary-json", str(summary),
             "--log-dir", str(out / "logs"), *extra, *(args.baseline_args.split() if kind == "baseline" else [])]
    if args.nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
               str(REPO / "train_gpt.py"), *flags]
    else:
        cmd = [sys.executable, str(REPO / "train_gpt.py"), *flags]
    log = out / "legs" / f"{name}.txt"
    t0 = time.time()
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode
    s = json.loads(summary.read_text()) if summary.exists() else None
    return dict(leg=i, kind=kind, seed=seed, rc=rc, log=str(log), summary=s, wall_s=time.time() - t0)


def main(argv=None):
    p = argparse.ArgumentParser(description="Run the record N times (seeds 0..N-1), optionally interleaved with "
                                "baseline legs, and write the speedrun's statistics table. Arguments after -- go "
                                "to every train_gpt.py run.")
    p.add_argument("--seeds", type=int, default=16, help="hinted legs (the article: 16)")
    p.add_argument("--pattern", default="H", help="session order, repeated: H hinted, B baseline (the article: HHB)")
    p.add_argument("--baseline-args", default="--no-hints --hint-tokens 0", help="flags a baseline leg adds to the hinted command")
    p.add_argument("--preset", default="record-2025")
    p.add_argument("--nproc", type=int, default=8, help="processes per run (1: no torchrun)")
    p.add_argument("--target", type=float, default=TARGET_VAL_LOSS)
    p.add_argument("--out", default="runs/record_stats", help="folder: legs/ (one log per run), summaries/, "
                   "logs/ (the trainer's own), statistics.md, statistics.json")
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.seeds < 1 or args.nproc < 1:
        p.error("--seeds and --nproc must be >= 1")
    try:
        order = legs(args.seeds, args.pattern)
    except ValueError as e:
        p.error(str(e))
    for sub in ("legs", "summaries", "logs"):
        os.makedirs(os.path.join(args.out, sub), exist_ok=True)
    from tqdm import tqdm
    results = []
    for i, (kind, seed) in enumerate(tqdm(order, desc="legs", unit="run"), start=1):
        r = run_leg(i, kind, seed, args, extra)
        s = r["summary"] or {}
        tqdm.write(f"leg {i} {kind} seed {seed}: exit {r['rc']}, train time {s.get('train_time_s', float('nan')):.3f} s, "
                   f"val loss {leg_val_loss(s) if s else float('nan')}, log {r['log']}")
        results.append(r)

    def counted(r):
        s = r["summary"]
        return r["rc"] == 0 and s is not None and leg_val_loss(s) is not None and (
            r["kind"] == "baseline" or s.get("record_valid") is not False)

    hinted = [r["summary"] for r in results if r["kind"] == "hinted" and counted(r)]
    baseline = [r["summary"] for r in results if r["kind"] == "baseline" and counted(r)]
    excluded = [r for r in results if not counted(r)]
    if not hinted:
        print("error: no hinted leg finished validly; see the logs in " + os.path.join(args.out, "legs"), file=sys.stderr)
        return 1
    rows, stats = table(hinted, baseline, args.target)
    lines = [f"# Record statistics ({len(hinted)} hinted run(s), {len(baseline)} baseline run(s))", "",
             f"command: train_gpt.py --preset {args.preset} {' '.join(extra)} (--nproc {args.nproc}); baseline legs "
             f"add: {args.baseline_args}; session order: {args.pattern} repeated", "", *rows, "", "## Runs (session order)", "",
             "| leg | kind | seed | exit | train time | val loss | index ready after clock | record valid | log |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in results:
        s = r["summary"] or {}
        ready = (s.get("background") or {}).get("ready_s")
        loss = leg_val_loss(s) if s else None
        cells = [r["leg"], r["kind"], r["seed"], r["rc"], f"{s['train_time_s']:.3f} s" if s else "-",
                 f"{loss:.4f}" if loss is not None else "-", f"{ready:.2f} s" if ready is not None else "-",
                 s.get("record_valid", "-"), f"`{os.path.basename(r['log'])}`"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if excluded:
        lines += ["", f"Excluded from the statistics: legs {', '.join(str(r['leg']) for r in excluded)} (a non-zero "
                  f"exit, no summary, or an invalid record attempt)."]
    text = "\n".join(lines) + "\n"
    Path(args.out, "statistics.md").write_text(text)
    Path(args.out, "statistics.json").write_text(json.dumps(dict(stats, legs=[{k: v for k, v in r.items() if k != "summary"}
                                                                              for r in results]), indent=1))
    print(text)
    return 1 if excluded else 0


if __name__ == "__main__":
    sys.exit(main())
