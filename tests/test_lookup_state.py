"""scripts/lookup_state.py: warm lookups against lookups after a host sample, and identical indexes
timed round by round, on a phrase stream the test makes."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from streams import phrase_stream

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("lookup_state", REPO / "scripts" / "lookup_state.py")
lookup_state = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lookup_state)


def test_rounds_and_after_sample_measure_every_cell():
    train = phrase_stream(0, 60_000, 300, 400, 12)
    query = phrase_stream(1, 5_000, 300, 400, 12)
    lines = []
    table = lookup_state.rounds(train, query, 3, 2, 1, lines.append)
    assert table.shape == (2, 3) and (table > 0).all()
    assert lines[0].split() == ["round", "index", "0", "index", "1", "index", "2"] and len(lines) == 4
    assert "within a round" in lines[-1] and "across the rounds" in lines[-1]
    rates = lookup_state.after_sample(train, query, 2, 1, lines.append)
    assert set(rates) == {(w, s) for w in (1, 2) for s in ("warm", "after a host sample")}
    assert all(len(r) == 2 and min(r) > 0 for r in rates.values())


def test_bad_counts_are_a_clear_error():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "lookup_state.py"), "--rounds", "0"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and "--rounds 0: expected at least 1" in out.stderr
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "lookup_state.py"), "--tokens", "x_*.bin"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and "--tokens needs --query" in out.stderr
