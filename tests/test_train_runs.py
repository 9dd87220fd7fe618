"""train_gpt.py end to end on CPU with tiny models, run as a script (nothing imports it): two gloo
ranks train like one rank with the whole batch and stay identical; a resumed run continues
bit-exactly; warm-up steps are undone; the real background builder is used when ready, and a
late or killed one is reported and cleaned up while training goes on; the demo preset runs."""
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from data.loader import iter_tokens
from data.local_corpus import build_local_corpus, stdlib_dir
from data.manifest import write_manifest
from data.shards import write_shard
from hints import Geometry, HintIndex, n_kinds
from hints.index.background import SHM_DIR

REPO = Path(__file__).resolve().parents[1]

VOCAB = 512
RUN_TIMEOUT_S = 180
# PYTHONPATH: scripts/ run against this checkout's packages, installed or not
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, phrase_corpus):
    sizes = {"train_000000.bin": 60_000, "train_000001.bin": 40_000, "val_000000.bin": 10_000}
    return phrase_corpus(tmp_path_factory.mktemp("corpus"), sizes, VOCAB)


def tiny_args(corpus, tmp_path, *extra):
    return ["--preset", "demo-2025", "--train-files", str(corpus / "train_*.bin"), "--val-files", str(corpus / "val_*.bin"),
            "--vocab-size", str(VOCAB), "--n-layer", "2", "--n-embd", "64", "--n-head", "2", "--seq-len", "64",
            "--val-tokens", "2048", "--val-batch-size", "4", "--log-every", "1", "--hint-tokens", "0",
            "--log-dir", str(tmp_path / "logs"), *extra]


def run(args, nproc=1, check=True):
    if nproc == 1:
        cmd = [sys.executable, str(REPO / "train_gpt.py"), *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               str(REPO / "train_gpt.py"), *args]
    p = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\n--- stdout\n{p.stdout[-6000:]}\n--- stderr\n{p.stderr[-6000:]}")
    return p


def train(args, nproc=1):
    """Run the trainer; its summary JSON (args must name --summary-json)."""
    run(args, nproc)
    return json.loads(Path(args[args.index("--summary-json") + 1]).read_text())


def losses(summary):
    return {step: loss for step, loss in summary["train_losses"]}


def test_two_gloo_ranks_match_one_rank_and_stay_identical(corpus, tmp_path):
    # the per-length hints' n-grams run across rank slices: 2 x 2 sequences hint like 1 x 4
    common = tiny_args(corpus, tmp_path, "--steps", "6", "--val-every", "3", "--hint-repr", "lengths")
    run(common + ["--batch-size", "2", "--summary-json", str(tmp_path / "two.json")], nproc=2)
    run(common + ["--batch-size", "4", "--summary-json", str(tmp_path / "one.json")])
    two, one = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("two", "one"))
    assert two["world_size"] == 2 and two["global_batch_tokens"] == one["global_batch_tokens"] == 256
    assert len(two["param_digests"]) == 2 and two["ranks_in_sync"]  # both ranks hold the same weights
    assert sorted(losses(two)) == list(range(1, 7))
    for step, loss in losses(one).items():  # same global batches: the same losses up to fp32 sums
        assert abs(losses(two)[step] - loss) < 1e-4, (step, losses(two)[step], loss)
    assert abs(two["val_loss_hints"] - one["val_loss_hints"]) < 1e-4
    assert abs(two["val_loss_nohints"] - one["val_loss_nohints"]) < 1e-4
    assert two["hint_tokens_train"] == one["hint_tokens_train"] == 6 * 256  # every rank saw the global stream
    # no step's hints are looked up or added before the clock: the prep thread starts at the clock's start
    assert 0.0 <= two["hint_prep_started_s"] < 5.0 and 0.0 <= one["hint_prep_started_s"] < 5.0


def test_record_hints_two_gloo_ranks(corpus, tmp_path):
    """The record's representation over two gloo ranks: one positional index (local rank 0 builds it,
    both map it), the ranks stay in sync, the hinted validation runs, and the hint path trains."""
    common = tiny_args(corpus, tmp_path, "--steps", "6", "--val-every", "3", "--hint-repr", "record", "--warmup-steps", "2")
    s = train(common + ["--batch-size", "2", "--summary-json", str(tmp_path / "two.json")], nproc=2)
    assert s["world_size"] == 2 and s["ranks_in_sync"] and s["hint_repr"] == "record"
    assert s["hint_tokens_train"] == 6 * 256 and s["positional_build_s"] is not None
    # no n-gram of the run is hashed before the clock: the build starts at the clock's start (the warm-up ran on
    # an index of its own)
    assert 0.0 <= s["positional_build_started_s"] < 5.0 and 0.0 <= s["hint_prep_started_s"] < 5.0
    assert [p[0] for p in s["positional_phases"]] == [6 * 256]  # one phase: the run is shorter than 8 steps
    assert s["val_loss_hints"] is not None and s["val_index"] == "training"
    assert sorted(losses(s)) == list(range(1, 7))
    # a distributed run leaves without the interpreter's teardown (train_gpt.py), but its exit
    # handlers still ran: the node's positional phases (and the warm-up's) are removed
    left = [p for base in (SHM_DIR, tempfile.gettempdir()) for p in glob.glob(os.path.join(base, f"nghints-{s['run_id']}*"))]
    assert not left, left


@pytest.mark.parametrize("repr_", ["record", "lengths"])
def test_resume_continues_exactly(corpus, tmp_path, repr_):
    """lengths: the growing training index is saved and restored; record: the positional index is
    rebuilt from the stream (nothing to save), and the resumed steps are the same."""
    common = tiny_args(corpus, tmp_path, "--steps", "8", "--batch-size", "2", "--val-every", "4", "--hint-repr", repr_)
    ck = tmp_path / "ckpt.pt"
    run(common + ["--save-checkpoint", str(ck), "--checkpoint-every", "4", "--summary-json", str(tmp_path / "full.json")])
    lengths = repr_ == "lengths"
    assert (tmp_path / "ckpt_step000004.pt").exists() and (tmp_path / "ckpt_step000004.pt.hints").exists() == lengths
    assert ck.exists() and Path(str(ck) + ".hints").exists() == lengths
    run(common + ["--resume", str(tmp_path / "ckpt_step000004.pt"), "--summary-json", str(tmp_path / "resumed.json")])
    full, resumed = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("full", "resumed"))
    assert resumed["resumed_from_step"] == 4
    assert losses(resumed) == losses(full)  # steps 5..8 bit-exact (1..4 come from the checkpoint)
    assert resumed["val_loss_hints"] == full["val_loss_hints"]
    assert resumed["val_loss_nohints"] == full["val_loss_nohints"]
    assert resumed["hint_tokens_train"] == full["hint_tokens_train"] == 8 * 128
    if lengths:
        assert HintIndex.load(str(ck) + ".hints").tokens_added == 8 * 128


def test_warmup_steps_are_undone(corpus, tmp_path):
    common = tiny_args(corpus, tmp_path, "--steps", "4", "--batch-size", "2", "--val-every", "0")
    run(common + ["--summary-json", str(tmp_path / "cold.json")])
    p = run(common + ["--warmup-steps", "3", "--summary-json", str(tmp_path / "warm.json")])
    assert "warm-up: 3 steps" in p.stdout
    cold, warm = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("cold", "warm"))
    assert losses(warm) == losses(cold)
    assert warm["val_loss_hints"] == cold["val_loss_hints"]
    assert warm["hint_tokens_train"] == cold["hint_tokens_train"] == 4 * 128  # no warm-up batch in the index


def builder_children(parent):
    """PIDs of hint-builder processes (python -m hints.index.background) whose parent is `parent`."""
    found = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"hints.index.background" in cmd:
            found.append(int(d))
    return found


def signal_builder_when_started(sig, parent):
    """In a thread: send `sig` to the training run's builder process as soon as it exists."""
    sent = []

    def watch():
        deadline = time.time() + 60
        while not sent and time.time() < deadline:
            for pid in builder_children(parent):
                os.kill(pid, sig)
                sent.append(pid)
            time.sleep(0.002)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t, sent


LATE_WAIT_S = 3  # a paused builder is waited for this long at the final validation, on the clock


@pytest.mark.parametrize("mode", ["ready", "late", "killed"])
def test_background_index_real_builder(corpus, tmp_path, mode):
    """The real builder process: used when ready; when paused (late) or killed mid-run the run
    goes on, says so, validates with the training index, and leaves no shared memory."""
    shm_before = set(glob.glob(os.path.join(SHM_DIR, "hints-*")))
    summary = tmp_path / "s.json"
    args = tiny_args(corpus, tmp_path, "--steps", "4", "--batch-size", "2", "--val-every", "2",
                     "--bg-wait", {"ready": "60", "late": str(LATE_WAIT_S), "killed": "0"}[mode],
                     "--summary-json", str(summary))
    args[args.index("--hint-tokens") + 1] = "50000"
    p = subprocess.Popen([sys.executable, str(REPO / "train_gpt.py"), *args], cwd=REPO, env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if mode != "ready":
        watcher, sent = signal_builder_when_started(signal.SIGSTOP if mode == "late" else signal.SIGKILL, p.pid)
    out, _ = p.communicate(timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, out[-6000:]
    s = json.loads(summary.read_text())
    if mode == "ready":
        assert s["val_index"] == "background" and s["hint_tokens_val"] == 50_000
        assert s["background"]["state"] == "ready"
    else:
        watcher.join()
        assert sent, "the builder process was never seen"
        assert s["val_index"] == "training" and s["hint_tokens_val"] == s["hint_tokens_train"] == 4 * 128
        assert "background index is not ready" in s["val_index_reason"]
        late = ("starting", "armed", "running")  # paused before its first status write, armed, or building
        assert s["background"]["state"] in (("failed",) if mode == "killed" else late)
        assert [v["index"] for v in s["val_history"]] == ["training", "training"]
        if mode == "late":  # the final validation waited for it, and the wait is training time
            assert s["val_history"][-1]["train_s"] >= LATE_WAIT_S and s["train_time_s"] >= LATE_WAIT_S
    assert s["val_loss_hints"] is not None and s["val_loss_nohints"] is not None
    assert builder_children(p.pid) == []  # the builder is gone, paused or not
    assert set(glob.glob(os.path.join(SHM_DIR, "hints-*"))) == shm_before  # and so is its shared memory


def test_no_hints_ablation(corpus, tmp_path):
    s = train(tiny_args(corpus, tmp_path, "--steps", "3", "--batch-size", "2", "--no-hints",
                        "--summary-json", str(tmp_path / "s.json")))
    assert s["no_hints"] and s["hint_tokens_train"] == 0
    assert s["val_loss_hints"] is None and s["val_index"] is None and s["val_loss_nohints"] > 0


def test_demo_preset_small_budget(tmp_path):
    """The demo preset (its model and batch) on a small stdlib corpus, 20 steps."""
    out = tmp_path / "corpus"
    build_local_corpus(src_dir=os.path.join(stdlib_dir(), "email"), out_dir=str(out), progress=False)
    summary = tmp_path / "demo.json"
    run(["--preset", "demo-2025", "--train-files", str(out / "train_*.bin"), "--val-files", str(out / "val_*.bin"),
             "--steps", "20", "--val-every", "10", "--val-tokens", "1024", "--hint-tokens", "0",
             "--log-dir", str(tmp_path / "logs"), "--summary-json", str(summary)])
    s = json.loads(summary.read_text())
    for key in ("val_loss_hints", "val_loss_nohints", "steps", "train_tokens", "hint_tokens_train", "hint_tokens_val",
                "train_time_s", "tokens_per_s", "val_index", "hint_wait_ms_total", "hint_prep_ms_per_step"):
        assert key in s, key
    assert s["steps"] == 20 and s["train_tokens"] == 20 * 2 * 256 == s["hint_tokens_train"]
    assert s["val_index"] == "training" and s["hint_tokens_val"] == s["hint_tokens_train"]
    assert np.isfinite(s["val_loss_hints"]) and np.isfinite(s["val_loss_nohints"])
    assert s["arch"] == "speedrun" and s["seq_len"] == 256 and s["batch_size"] == 2
    assert [v["step"] for v in s["val_history"]] == [10, 20]
    assert [step for step, _ in s["train_losses"]] == list(range(1, 21))
    # the log file starts with the code the run imported, verbatim, then versions and hardware
    log = Path(s["log_file"]).read_text()
    assert log.index("# file: train_gpt.py") < log.index("# packages: torch") < log.index("step 10/20 val_loss_hints")
    assert (REPO / "train" / "evaluate.py").read_text() in log


def test_val_index_used_when_no_background(corpus, tmp_path):
    idx = HintIndex(Geometry.for_tokens(100_000))
    for chunk in iter_tokens(str(corpus / "train_*.bin")):
        idx.add(chunk)
    path = idx.save(str(tmp_path / "val.hints"))
    s = train(tiny_args(corpus, tmp_path, "--steps", "3", "--batch-size", "2", "--val-index", path,
                        "--summary-json", str(tmp_path / "s.json")))
    assert s["val_index"] == "val-index" and s["hint_tokens_val"] == 100_000
    assert s["hint_tokens_train"] == 3 * 128


def test_ablation_writes_every_row_and_file(corpus, tmp_path):
    """scripts/ablate.py on a checkpoint trained with hints: the no-hint row equals the run's own
    final no-hint loss, every ladder size gets a row, and the largest hint corpus beats no hints."""
    ck = tmp_path / "ck.pt"
    s = train(tiny_args(corpus, tmp_path, "--steps", "40", "--batch-size", "4", "--val-every", "0",
                        "--save-checkpoint", str(ck), "--summary-json", str(tmp_path / "s.json")))
    out = tmp_path / "ablate"
    subprocess.run([sys.executable, str(REPO / "scripts" / "ablate.py"), "--checkpoint", str(ck), "--min-tokens",
                    "12500", "--workers", "2", "--out", str(out)], cwd=REPO, env=ENV, check=True,
                   capture_output=True, timeout=RUN_TIMEOUT_S)
    result = json.loads((out / "ablation.json").read_text())
    rows, nohints = result["rows"], result["val_loss_nohints"]
    assert nohints == pytest.approx(s["val_loss_nohints"], abs=1e-6)
    assert [r["hint_tokens"] for r in rows] == [12_500, 25_000, 50_000, 100_000]
    assert rows[-1]["val_loss_hints"] < nohints
    assert rows[-1]["coverage_6"] > rows[0]["coverage_6"]
    # the build's seconds grow along the ladder; the table's pre-fault is apart (none: a small table faults at first write)
    assert 0 < rows[0]["build_s"] <= rows[-1]["build_s"] and all(r["prefault_s"] == 0.0 for r in rows)
    for f in ("ablation.md", "ablation.csv", "ablation.json", "ablation.png"):
        assert (out / f).stat().st_size > 0, f
    assert (out / "ablation.md").read_text().count("\n") == 2 + 1 + len(rows)  # header, rule, no-hint row, sizes


def test_exact_val_hints_and_val_index_mismatch(corpus, tmp_path):
    """--val-hints exact: every validation uses exact counts of the val n-grams in the first
    --hint-tokens training tokens, recorded in the summary; exact-gpu on CPU and a --val-index of
    other lengths are refused before training, naming the flag."""
    s = train(tiny_args(corpus, tmp_path, "--steps", "2", "--batch-size", "2", "--val-every", "1", "--val-hints",
                        "exact", "--summary-json", str(tmp_path / "s.json")) + ["--hint-tokens", "30000"])
    assert s["val_index"] == "exact" and s["val_hint_path"] == "exact" and s["hint_tokens_val"] == 30_000
    assert [v["index"] for v in s["val_history"]] == ["exact", "exact"] and s["val_hints_count_s"] > 0
    assert s["background"] is None and np.isfinite(s["val_loss_hints"])
    p = run(tiny_args(corpus, tmp_path, "--steps", "1", "--val-hints", "exact-gpu", "--hint-tokens", "1000"), check=False)
    assert p.returncode == 1 and "--val-hints exact-gpu needs a CUDA device" in p.stderr
    idx = HintIndex(Geometry(2, 6, 16, (4, 8)))
    idx.add(np.arange(500, dtype=np.uint16))
    path = idx.save(str(tmp_path / "other.hints"))
    p = run(tiny_args(corpus, tmp_path, "--steps", "1", "--val-index", path), check=False)
    assert p.returncode == 1 and "--val-index" in p.stderr and "lengths (4, 8)" in p.stderr


def test_target_stops_the_run_and_reports_time_to_target(corpus, tmp_path):
    """--target-val-loss: the run stops at the first validation with hints at or below it and
    reports the training time there; here with the later-record backbone flags on."""
    s = train(tiny_args(corpus, tmp_path, "--steps", "8", "--batch-size", "2", "--val-every", "2",
                        "--target-val-loss", "99", "--unet-skips", "--embed-skips", "--value-embeds", "1",
                        "--window-attn", "--attn-block-size", "16", "--rope", "half", "--muon-momentum-warmup", "4",
                        "--grad-sync", "overlap", "--summary-json", str(tmp_path / "s.json")))
    assert s["target_reached"] and s["steps_to_target"] == 2 and s["steps"] == 2
    assert s["tokens_to_target"] == 2 * 128 == s["train_tokens"] and s["hint_tokens_train"] == 2 * 128
    assert 0 < s["time_to_target_s"] == s["val_history"][0]["train_s"]
    assert [step for step, _ in s["train_losses"]] == [1, 2]


def test_llmc_preset_runs_four_lengths_end_to_end(corpus, tmp_path):
    """--preset llmc at demo width: the gpt2 arch with hints of four lengths (index, kinds, model,
    validation on the planned background index); its 3.28 target is not reached, and it says so."""
    s = train(["--preset", "llmc", "--train-files", str(corpus / "train_*.bin"), "--val-files", str(corpus / "val_*.bin"),
               "--hint-files", str(corpus / "train_*.bin"), "--vocab-size", str(VOCAB), "--n-layer", "2",
               "--n-embd", "48", "--n-head", "2", "--seq-len", "64", "--batch-size", "2", "--steps", "4",
               "--val-every", "2", "--val-tokens", "2048", "--val-batch-size", "4", "--warmup-steps", "0",
               "--hint-tokens", "50000", "--bg-wait", "60", "--node-rank-ram", "1GiB", "--train-index-geometry", "tiny",
               "--align-documents",
               "--log-dir", str(tmp_path / "logs"), "--summary-json", str(tmp_path / "s.json")])
    assert s["arch"] == "gpt2" and s["hint_lengths"] == [5, 6, 10, 20] and s["hint_kinds"] == n_kinds(4)
    assert s["plan"]["geometry"]["lengths"] == [5, 6, 10, 20] and s["val_index"] == "background"
    assert s["hint_tokens_val"] == 50_000 and np.isfinite(s["val_loss_hints"])
    assert s["target_val_loss"] == 3.28 and not s["target_reached"] and s["time_to_target_s"] is None
    assert s["steps"] == 4


def test_switch_to_the_background_index_midway(corpus, tmp_path):
    """--switch-hints-at: once the background index (from other shards than the training ones) is
    ready on every rank, at or after the given step, training-time hints come from it; an index
    over the training shards themselves is refused before training."""
    other = tmp_path / "hint_corpus"
    other.mkdir()
    rng = np.random.default_rng(7)
    write_shard(other / "train_000000.bin", rng.integers(0, VOCAB, 20_000))
    write_manifest(other)
    common = tiny_args(corpus, tmp_path, "--batch-size", "2", "--val-every", "0", "--log-every", "10",
                       "--switch-hints-at", "10", "--hint-repr", "lengths") + ["--hint-tokens", "20000"]
    # 400 steps (~15 s): the builder's start (a fresh interpreter loading Numba) is ready well before
    s = train(common + ["--steps", "400", "--hint-files", str(other / "train_*.bin"), "--summary-json",
                        str(tmp_path / "s.json")])
    assert s["hints_switched_at_step"] is not None and s["hints_switched_at_step"] >= 10
    assert (s["hints_switched_at_step"] - 10) % 10 == 0 and s["background"]["state"] == "ready"
    p = run(common + ["--steps", "20", "--hint-files", str(corpus / "train_*.bin")], check=False)
    assert p.returncode == 1 and "--switch-hints-at" in p.stderr and "disjoint" in p.stderr
