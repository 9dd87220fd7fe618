"""scripts/compare.py end to end at a tiny shape: two real train_gpt.py runs (with hints, and
with --no-hints and the same other arguments) give three finite losses, and the baseline
really trained without hints on the same steps and tokens."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VOCAB = 512


def test_compare_reports_three_finite_losses(tmp_path, phrase_corpus):
    phrase_corpus(tmp_path, {"train_000000.bin": 30_000, "val_000000.bin": 5_000}, VOCAB, n_phrases=100)
    out = tmp_path / "compare"
    train_args = ["--preset", "demo-2025", "--train-files", str(tmp_path / "train_*.bin"),
                  "--val-files", str(tmp_path / "val_*.bin"), "--vocab-size", str(VOCAB), "--n-layer", "2",
                  "--n-embd", "32", "--n-head", "2", "--seq-len", "32", "--batch-size", "2", "--steps", "4",
                  "--val-every", "0", "--val-tokens", "512", "--val-batch-size", "4", "--hint-tokens", "0",
                  "--log-dir", str(tmp_path / "logs")]
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "compare.py"), "--out", str(out), "--", *train_args],
                       cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((out / "compare.json").read_text())
    for key in ("hinted_with_hints", "hinted_without_hints", "baseline_no_hints"):
        assert math.isfinite(r[key]) and r[key] > 0, key
    hinted = json.loads((out / "hinted.json").read_text())
    baseline = json.loads((out / "baseline.json").read_text())
    assert baseline["no_hints"] is True and hinted["no_hints"] is False
    assert baseline["hint_tokens_train"] == 0 and hinted["hint_tokens_train"] == 4 * 2 * 32
    assert baseline["steps"] == hinted["steps"] == 4 and baseline["train_tokens"] == hinted["train_tokens"]
    assert r["hinted_with_hints"] == hinted["val_loss_hints"] and r["baseline_no_hints"] == baseline["val_loss_nohints"]
    assert r["hinted_without_hints"] == hinted["val_loss_nohints"]
    table = (out / "compare.md").read_text()
    assert table in p.stdout and "baseline trained with --no-hints" in table and f"{r['baseline_no_hints']:.4f}" in table


def test_compare_refuses_flags_it_sets(tmp_path):
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "compare.py"), "--out", str(tmp_path), "--",
                        "--steps", "2", "--no-hints"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--no-hints is set by compare.py" in p.stderr
