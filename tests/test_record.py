"""The record run as the record runs it, at tiny width on CPU: the background builder gets ready
before the clock but indexes nothing until the clock starts; the one validation, at the end,
waits for the index and the wait is training time; llmc at demo width plans and runs here,
within the memory its plan gives a rank; the builder's memory is pre-faulted by its threads."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hints import Geometry, HintIndex

REPO = Path(__file__).resolve().parents[1]
VOCAB = 512
RUN_TIMEOUT_S = 300
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, phrase_corpus):
    # 2M training tokens: their build takes longer than 2 tiny steps, so the final validation waits;
    # the val shard is held out (its own seed)
    sizes = {"train_000000.bin": 1_000_000, "train_000001.bin": 1_000_000, "val_000000.bin": 8_000}
    return phrase_corpus(tmp_path_factory.mktemp("record"), sizes, VOCAB)


def trainer(args, tmp_path):
    """Run train_gpt.py in a fresh interpreter; (exit code, output, summary dict or None, peak RSS bytes)."""
    summary = tmp_path / "s.json"
    args = [*args, "--log-dir", str(tmp_path / "logs"), "--summary-json", str(summary)]
    code = ("import resource, runpy, sys\n"
            f"sys.argv = {[str(REPO / 'train_gpt.py'), *args]!r}\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "finally:\n    print('PEAK_RSS_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S)
    out = p.stdout + p.stderr
    rss = int(out.rsplit("PEAK_RSS_KIB", 1)[1].split()[0]) * 1024 if "PEAK_RSS_KIB" in out else None
    return p.returncode, out, json.loads(summary.read_text()) if summary.exists() else None, rss


def record_args(corpus, *extra):
    return ["--preset", "record", "--train-files", str(corpus / "train_*.bin"), "--val-files", str(corpus / "val_*.bin"),
            "--vocab-size", str(VOCAB), "--n-layer", "2", "--n-embd", "64", "--n-head", "2", "--seq-len", "64",
            "--batch-size", "2", "--val-tokens", "2048", "--hint-tokens", "2M", "--hint-workers", "1",
            "--attn-block-size", "16", "--value-embeds", "1", "--no-attn-layers", "", "--warmup-steps", "0", *extra]


def test_record_preset_builds_on_the_clock_and_its_one_validation_waits(corpus, tmp_path):
    """A 2-step record-preset run: the builder indexed 0 tokens before the clock (measured when the
    clock started), started hashing after it, and the one validation (at the end) waited for the
    index, used it, and counted any wait in train_time_s: the clock ran until the index was ready."""
    rc, out, s, _ = trainer(record_args(corpus, "--steps", "2"), tmp_path)
    assert rc == 0, out[-6000:]
    b = s["background"]
    assert b["state"] == "ready" and b["tokens_done"] == 2_000_000
    assert b["tokens_done_at_clock_start"] == 0
    assert 0 <= b["build_started_s"] < b["ready_s"]
    assert b["prefault"]["how"] in ("populate", "fallocate+touch") and b["prefault"]["bytes"] >= b["geometry"]["slots"]
    # one validation, at the end, on the background index, after a wait that is training time
    assert [v["step"] for v in s["val_history"]] == [2] and s["val_index"] == "background"
    # (whether it had to wait depends on the machine: the 2M-token build may finish before the two steps do)
    assert b["final_wait_s"] >= 0 and s["train_time_s"] >= b["final_wait_s"]
    assert s["val_history"][0]["train_s"] == s["train_time_s"]
    # the index was ready when the wait ended: the clock ran at least until ready_s
    assert s["train_time_s"] >= b["ready_s"] - b["build_started_s"]
    assert s["record_valid"] is True and "built from the clock's start" in s["record_reason"]
    assert "armed before the clock" in out and "waiting until it is ready or fails" in out


def test_llmc_at_demo_width_plans_and_runs_here_within_its_plan(corpus, tmp_path):
    """--preset llmc at demo width on this CPU machine, with no memory flag: each rank's memory comes
    from the model and the device (not a GPU rank's 30 GiB), the run fits, and its peak RSS stays
    within what the plan gave the rank."""
    args = ["--preset", "llmc", "--n-layer", "2", "--n-embd", "64", "--n-head", "2", "--batch-size", "2",
            "--seq-len", "64", "--steps", "2", "--val-every", "0", "--val-tokens", "2048", "--val-batch-size", "4",
            "--train-files", str(corpus / "train_*.bin"), "--val-files", str(corpus / "val_*.bin"),
            "--hint-files", str(corpus / "train_*.bin"), "--vocab-size", str(VOCAB), "--hint-tokens", "100000",
            "--bg-wait", "120", "--warmup-steps", "0"]
    rc, out, s, rss = trainer(args, tmp_path)
    assert rc == 0, out[-6000:]
    assert s["arch"] == "gpt2" and s["val_index"] == "background" and s["record_valid"] is None
    assert s["plan"]["rank_bytes"] < 2 << 30 and s["plan"]["memory_bytes"] <= s["plan"]["budget_bytes"]
    assert rss is not None and rss <= s["plan"]["rank_bytes"]


def test_llmc_default_batch_on_a_cpu_is_refused_naming_the_flag():
    """llm.c's 64 x 1024 tokens a step on this CPU machine: three float32 copies of the logits
    alone exceed it; the plan says so in one line naming --batch-size, instead of the run running
    out of memory."""
    p = subprocess.run([sys.executable, str(REPO / "train_gpt.py"), "--preset", "llmc", "--n-layer", "2", "--n-embd",
                        "64", "--plan"], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "--batch-size" in p.stderr and "do not fit" in p.stderr, p.stderr[-3000:]
    assert len(p.stderr.strip().splitlines()) == 1


def test_shared_table_is_prefaulted_by_its_workers_and_builds_the_same_bytes():
    """A memfd-backed index is sized, asked for huge pages and populated by its workers before any
    add(); what it builds is byte for byte what an index in private memory builds."""
    geom = Geometry(3, 8, 32)
    fd = os.memfd_create("test-prefault", os.MFD_CLOEXEC)
    try:
        idx = HintIndex(geom, workers=2, path=fd)
        pf = idx.prefault
        assert pf["workers"] == 2 and pf["how"] in ("populate", "fallocate+touch")
        assert pf["bytes"] >= geom.table_bytes and pf["seconds"] >= 0
        assert os.fstat(fd).st_blocks * 512 >= geom.table_bytes  # every page allocated now, not at first write
        toks = np.random.default_rng(0).integers(0, 60, 30_000).astype(np.uint16)
        idx.add(toks)
        ref = HintIndex(geom).add(toks)
        assert np.array_equal(np.asarray(idx.table), ref.table) and np.array_equal(np.asarray(idx.fill), ref.fill)
    finally:
        os.close(fd)
