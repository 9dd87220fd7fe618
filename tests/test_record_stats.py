"""scripts/record_stats.py: its t distribution against exact and tabulated values, its table
against a hand computation (and the article's 16 runs against its published t and p), and the
whole protocol on tiny CPU runs: hinted and baseline legs interleaved, one log per run."""
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("record_stats", REPO / "scripts" / "record_stats.py")
rs = importlib.util.module_from_spec(_spec)  # a script, not a package module: loaded from its file
_spec.loader.exec_module(rs)


def test_t_distribution_against_exact_and_tabulated_values():
    assert rs.t_sf(1.0, 1) == pytest.approx(0.25, abs=1e-12)  # Cauchy: 1/2 - atan(1)/pi
    for t in (0.3, 1.5, 4.0):  # df = 2: P(T > t) = 1/2 - t / (2 sqrt(t^2 + 2))
        assert rs.t_sf(t, 2) == pytest.approx(0.5 - t / (2 * math.sqrt(t * t + 2)), abs=1e-12)
    assert rs.t_sf(1.812461, 10) == pytest.approx(0.05, abs=1e-6)  # t tables: 95th percentile, 10 df
    assert 2 * rs.t_sf(2.228139, 10) == pytest.approx(0.05, abs=1e-6)  # two-sided 5%, 10 df
    assert rs.t_sf(0.0, 7) == pytest.approx(0.5) and rs.t_sf(-1.3, 5) == pytest.approx(1 - rs.t_sf(1.3, 5))
    with pytest.raises(ValueError, match="df"):
        rs.t_sf(1.0, 0)


def test_table_matches_a_hand_computation():
    # four runs by hand: mean 13.096 / 4 = 3.274; deviations -4, +1, -2, +5 (x 1e-3), squares sum to
    # 46e-6, sample variance 46e-6 / 3; t = (3.28 - 3.274) / (s / 2) with 3 degrees of freedom, whose
    # survival function is 1/2 - (1/pi) (u / (1 + u^2) + atan u), u = t / sqrt(3)
    runs = [dict(train_time_s=t, val_loss_hints=v) for t, v in
            ((7.0, 3.270), (7.2, 3.275), (7.1, 3.272), (6.9, 3.279))]
    base = [dict(train_time_s=t, val_loss_hints=None, val_loss_nohints=v) for t, v in ((9.0, 3.30), (11.0, 3.31), (10.0, 3.29))]
    rows, st = rs.table(runs, base)
    s = math.sqrt(46e-6 / 3)
    t = 0.006 / (s / 2)
    u = t / math.sqrt(3)
    p = 0.5 - (u / (1 + u * u) + math.atan(u)) / math.pi
    assert st["val_loss_mean"] == pytest.approx(3.274) and st["val_loss_std"] == pytest.approx(s)
    assert st["t_vs_target"] == pytest.approx(t) and st["p_vs_target"] == pytest.approx(p, rel=1e-9)
    assert st["train_time_mean"] == pytest.approx(7.05) and st["train_time_std"] == pytest.approx(math.sqrt(0.05 / 3))
    assert (st["train_time_min"], st["train_time_max"]) == (6.9, 7.2)
    # Welch by hand: times mean 7.05 (var 0.05/3) vs 10 (var 1); v = var/n; t = -2.95 / sqrt(vx + vy)
    vx, vy = 0.05 / 3 / 4, 1.0 / 3
    wt = -2.95 / math.sqrt(vx + vy)
    wdf = (vx + vy) ** 2 / (vx * vx / 3 + vy * vy / 2)
    assert st["welch_t"] == pytest.approx(wt) and st["welch_df"] == pytest.approx(wdf)
    assert st["welch_p"] == pytest.approx(2 * rs.t_sf(-wt, wdf)) and st["val_loss_diff"] == pytest.approx(3.274 - 3.30)
    assert f"| mean val loss | 3.274000 |" in rows and f"| t-statistic vs 3.28 (one-sided) | {t:.2f} |" in rows
    assert "| train time range | 6.900-7.200 s |" in rows


def test_welch_with_four_degrees_of_freedom_is_exact():
    # equal sizes and variances: df = 2 (n - 1) = 4, t = -sqrt(6); the df = 4 CDF in closed form
    t, df, p = rs.welch([1.0, 2.0, 3.0], [3.0, 4.0, 5.0])
    assert t == pytest.approx(-math.sqrt(6)) and df == pytest.approx(4.0)
    x = math.sqrt(6) / math.sqrt(2.5)
    assert p == pytest.approx(2 * (0.5 - 0.375 * x * (1 - 6 / 30)), rel=1e-9)


def test_the_articles_sixteen_runs_give_its_published_t_and_p():
    losses = [3.2763, 3.2759, 3.2744, 3.2809, 3.2776, 3.2717, 3.2829, 3.2761, 3.2714, 3.2752, 3.2825, 3.2705,
              3.2786, 3.2727, 3.2743, 3.2752]  # its statistics.md: mean 3.2760125, std 0.0037489332, t 4.25, p 3.46e-4
    m, s = rs.mean_std(losses)
    t, p = rs.one_sided_below(losses, 3.28)
    assert m == pytest.approx(3.2760125) and s == pytest.approx(0.0037489332, rel=1e-7)
    assert round(t, 2) == 4.25 and float(f"{p:.3g}") == 3.46e-4


def test_legs_interleave_as_the_pattern_says():
    assert rs.legs(4, "HHB") == [("hinted", 0), ("hinted", 1), ("baseline", 0), ("hinted", 2), ("hinted", 3),
                                 ("baseline", 1)]
    assert rs.legs(2, "H") == [("hinted", 0), ("hinted", 1)]
    with pytest.raises(ValueError, match="--pattern"):
        rs.legs(2, "BX")


def test_protocol_on_tiny_cpu_runs(tmp_path, phrase_corpus):
    corpus = phrase_corpus(tmp_path / "c", {"train_000000.bin": 60_000, "val_000000.bin": 6_000}, 512)
    out = tmp_path / "stats"
    tiny = ["--train-files", str(corpus / "train_*.bin"), "--val-files", str(corpus / "val_*.bin"), "--vocab-size",
            "512", "--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--seq-len", "32", "--batch-size", "2",
            "--steps", "2", "--val-tokens", "1024", "--hint-tokens", "50000", "--hint-workers", "1",
            "--attn-block-size", "16", "--value-embeds", "1", "--no-attn-layers", "", "--warmup-steps", "0"]
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "record_stats.py"), "--seeds", "2", "--pattern", "HHB",
                        "--nproc", "1", "--out", str(out), "--", *tiny], cwd=REPO, capture_output=True, text=True,
                       timeout=900, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    logs = sorted(x.name for x in (out / "legs").iterdir())
    assert logs == ["01_hinted_seed0.txt", "02_hinted_seed1.txt", "03_baseline_seed0.txt"]
    st = json.loads((out / "statistics.json").read_text())
    assert st["n"] == 2 and st["baseline_n"] == 1 and math.isnan(st["welch_p"])  # one baseline run: no variance
    summaries = [json.loads(f.read_text()) for f in sorted((out / "summaries").iterdir())]
    assert [s["record_valid"] for s in summaries] == [True, True, None] and summaries[2]["no_hints"]
    times = [s["train_time_s"] for s in summaries[:2]]
    assert st["train_time_mean"] == pytest.approx(sum(times) / 2)
    text = (out / "statistics.md").read_text()
    assert "| runs | 2 |" in text and "01_hinted_seed0.txt" in text and "one-sided p vs 3.28" in text
