"""The record run as the record runs it, at tiny width on CPU: the background builder gets ready
before the clock but indexes nothing until the clock starts; the one validation, at the end,
waits for the index if it is not ready by the last step, and the wait is training time (runs
that force each ordering); the record's verdict for every way an attempt fails; llmc at demo
width plans and runs here, within the memory its plan gives a rank; the builder's memory is
pre-faulted by its threads."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data.manifest import write_manifest
from data.shards import write_shard
from hints import Geometry, HintIndex
from train.val_hints import record_verdict

REPO = Path(__file__).resolve().parents[1]
VOCAB = 512
RUN_TIMEOUT_S = 300
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
# A background index of random tokens (every n-gram new, so every slot is staged and placed):
# its build takes seconds here (~15M tokens/s on 2 shared cores) and ~0.5 s on a fast 2-core
# host, far longer than 2 tiny steps, so it is ready only after the last step.
LATE_HINT_TOKENS = 24_000_000
# A background index of a few thousand tokens is ready within milliseconds of the clock's start,
# long before the 8th tiny step ends (each takes 10-20 milliseconds here).
EARLY_HINT_TOKENS = 20_000

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, phrase_corpus):
    # the training shards; the val shard is held out (its own seed)
    sizes = {"train_000000.bin": 100_000, "train_000001.bin": 100_000, "val_000000.bin": 8_000}
    return phrase_corpus(tmp_path_factory.mktemp("record"), sizes, VOCAB)


@pytest.fixture(scope="module")
def long_hint_shards(tmp_path_factory):
    """LATE_HINT_TOKENS random tokens in two shards (and their manifest), for --hint-files."""
    folder = tmp_path_factory.mktemp("record_hints")
    rng = np.random.default_rng(7)
    for i in range(2):
        write_shard(folder / f"hint_{i:06d}.bin", rng.integers(0, VOCAB, LATE_HINT_TOKENS // 2).astype(np.uint16))
    write_manifest(folder)
    return folder / "hint_*.bin"


def trainer(args, tmp_path):
    """Run train_gpt.py in a fresh interpreter; (exit code, output, summary dict or None, peak RSS bytes).
    The peak is the interpreter's own VmHWM: getrusage's ru_maxrss survives exec, so a child of a pytest
    worker that had grown to GBs in earlier tests would report the worker's peak, not its own."""
    summary = tmp_path / "s.json"
    args = [*args, "--log-dir", str(tmp_path / "logs"), "--summary-json", str(summary)]
    code = ("import runpy, sys\n"
            f"sys.argv = {[str(REPO / 'train_gpt.py'), *args]!r}\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "finally:\n    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
            "    print('PEAK_RSS_KIB', hwm.split()[1], flush=True)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S)
    out = p.stdout + p.stderr
    rss = int(out.rsplit("PEAK_RSS_KIB", 1)[1].split()[0]) * 1024 if "PEAK_RSS_KIB" in out else None
    return p.returncode, out, json.loads(summary.read_text()) if summary.exists() else None, rss


def record_args(corpus, *extra):
    return ["--preset", "record-2025", "--train-files", str(corpus / "train_*.bin"), "--val-files", str(corpus / "val_*.bin"),
            "--vocab-size", str(VOCAB), "--n-layer", "2", "--n-embd", "64", "--n-head", "2", "--seq-len", "64",
            "--batch-size", "2", "--val-tokens", "2048", "--hint-workers", "1",
            "--attn-block-size", "16", "--value-embeds", "1", "--no-attn-layers", "", "--warmup-steps", "0", *extra]


@pytest.mark.parametrize("ordering", ["ready_before_the_last_step", "ready_after_the_last_step"])
def test_record_preset_builds_on_the_clock_and_its_one_validation_waits(corpus, long_hint_shards, tmp_path, ordering):
    """A record-preset run: the builder indexed 0 tokens before the clock (measured when the clock
    started) and started hashing after it; the one validation (at the end) used the index, and
    the clock ran until the index was ready: when it was ready only after the last step, the
    validation waited and the wait is training time; when it was ready before, nothing was added.
    Which happened is read from the summary's numbers (ready_s against final_validation_s, both
    seconds after the clock's start), so the test holds whichever process wins; the two cases
    make each ordering happen (a tiny index and 8 steps; a long build and 2 steps)."""
    if ordering == "ready_before_the_last_step":
        args, tokens = ["--hint-tokens", str(EARLY_HINT_TOKENS), "--steps", "8"], EARLY_HINT_TOKENS
    else:
        args, tokens = ["--hint-files", str(long_hint_shards), "--hint-tokens", str(LATE_HINT_TOKENS),
                        "--steps", "2"], LATE_HINT_TOKENS
    rc, out, s, _ = trainer(record_args(corpus, *args), tmp_path)
    assert rc == 0, out[-6000:]
    b = s["background"]
    assert b["state"] == "ready" and b["tokens_done"] == tokens
    assert b["tokens_done_at_clock_start"] == 0
    assert 0 <= b["build_started_s"] < b["ready_s"]
    assert b["prefault"]["how"] in ("populate", "fallocate+touch") and b["prefault"]["bytes"] >= b["geometry"]["slots"]
    assert "armed before the clock" in out
    # one validation, at the end, on the background index
    assert [v["step"] for v in s["val_history"]] == [s["steps"]] and s["val_index"] == "background"
    assert s["val_history"][0]["train_s"] == s["train_time_s"]
    assert s["record_valid"] is True and "built from the clock's start" in s["record_reason"]
    # the clock ran once, from its start to the last step (final_validation_s), then for the wait
    stopped, wait = b["final_validation_s"], b["final_wait_s"]
    assert s["train_time_s"] == pytest.approx(stopped + wait, rel=1e-9, abs=1e-9)
    late = b["ready_s"] > stopped
    if late:  # the validation waited from the clock's stop until it saw the index ready, and said so
        assert wait > 0
        assert "waiting until it is ready or fails" in out or "after the clock stopped" in out
    else:  # ready before the last step: nothing to wait for, nothing added
        assert wait == 0 and "waiting until it is ready or fails" not in out
    assert s["train_time_s"] >= b["ready_s"]  # either way the clock ran until the index was ready


CLEAN = dict(tokens_done_at_clock_start=0)  # the builder's status when it indexed nothing before the clock


@pytest.mark.parametrize("final_val, status, valid, reason", [
    pytest.param(dict(index="background"), CLEAN, True, "built from the clock's start", id="valid"),
    # tokens indexed before the clock started: an index not built (only) on the clock
    pytest.param(dict(index="background"), dict(tokens_done_at_clock_start=1), False,
                 "indexed 1 tokens before the clock", id="one-token-before-the-clock"),
    pytest.param(dict(index="background"), dict(tokens_done_at_clock_start=12_345), False,
                 "12,345 tokens before the clock", id="tokens-before-the-clock"),
    # never measured: no status at all, or a status without the count
    pytest.param(dict(index="background"), None, False, "were not measured", id="no-status"),
    pytest.param(dict(index="background"), dict(state="ready"), False, "were not measured", id="not-measured"),
    # the final validation used another index (the builder died, was late under a finite --bg-wait,
    # failed to open): its reason is passed on
    pytest.param(dict(index="training", index_reason="the background index is not ready (failed: died)"), CLEAN,
                 False, "did not use the background index (the background index is not", id="training-index"),
    pytest.param(dict(index="val-index", index_reason="x"), CLEAN, False, "did not use", id="val-index"),
    pytest.param(dict(index=None, index_reason="no index"), CLEAN, False, "did not use", id="no-index"),
    pytest.param(dict(), CLEAN, False, "did not use", id="no-final-validation"),
])
def test_record_verdict_names_every_way_an_attempt_fails(final_val, status, valid, reason):
    """train.val_hints.record_verdict on each way an attempt becomes invalid, and on a valid one."""
    got_valid, got_reason = record_verdict(True, final_val, status)
    assert got_valid is valid and reason in got_reason, got_reason
    # a run that is no attempt (another preset, --no-hints, no background index) gets no verdict at all
    assert record_verdict(False, final_val, status) == (None, None)


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
