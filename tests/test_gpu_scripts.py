"""The GPU check scripts' dry runs: each runs here, on the CPU, offline, at tiny shapes, through
every dependency, path and flag its real run uses (scripts/gpu_lib.sh), and the real runs' phase
timeouts add up inside one 600 s device call."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from data.packed_loader import VAL_TOKENS_PER_RANK
from model.ngram_table import NGRAM_ROWS
from train.record_memory import H100_BYTES
from train.record_schedule import TOKENS_PER_STEP as RECORD_TOKENS_PER_STEP

REPO = Path(__file__).resolve().parent.parent
DEVICE_CALL_S = 600   # one device call (docs/gpu.md)
CALL_OVERHEAD_S = 30  # interpreter starts, nvidia-smi, the shell between phases


def run_script(args, tmp_path, timeout=600, deps=True):
    env = dict(os.environ, OUT=str(tmp_path / "out"), GPU_SITE=str(tmp_path / "site"), PYTHON=sys.executable)
    env.pop("HINTS_GPU_PATHS", None)
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "DRY RUN" in out
    assert "deps: torch" in out or not deps  # every package imported, the GPT-2 encoding loaded
    return out


def test_gpu_check_dry_run(tmp_path):
    out = run_script(["bash", "scripts/gpu_check.sh", "--dry-run"], tmp_path)
    for phase in ("corpus", "card", "smoke", "hints", "nohints", "report"):
        assert re.search(rf"\[{phase}\] done, exit 0 in [\d.]+s of \d+s", out), phase
    assert out.index("[smoke] done") < out.index("[hints] start")  # the smoke test first
    assert "recompiles (TORCH_LOGS=recompiles)" in out and "val loss without hints" in out
    assert re.search(r"^warm-up: steps \[0, 1, .*\] in [\d.]+s", out, re.M)  # the smoke test ran the record's warm-up
    assert re.search(r"card: 11 layers x 64, 4 heads, .* memory per GPU between steps", out)
    summaries = {name: json.loads((tmp_path / "out" / f"{name}.json").read_text()) for name in ("hints", "nohints")}
    for name, s in summaries.items():
        assert (s["preset"], s["arch"], s["steps"], s["steps_trained"]) == ("record", "record", 84, 3), name
        assert (s["tokens_per_step"], s["ngram_rows"], s["device"]) == (1024, 65536, "cpu")
        # the speed fields agree with each other and with the clock's
        assert s["step_ms"] * 3 == pytest.approx(s["loop_time_s"] * 1e3) and s["loop_time_s"] <= s["train_time_s"]
        assert s["tokens_per_s"] == pytest.approx(3 * 1024 / s["loop_time_s"])
        assert s["hint_share"] == pytest.approx(s["hint_ms_per_step"] / s["step_ms"])
        assert s["mfu"] is None and s["peak_memory_gib"] is None  # no CUDA here
        assert s["flops_per_token"] > 0 and s["val_time_s"] > 0
    assert summaries["hints"]["hint_ms_per_step"] > 0 and summaries["nohints"]["hint_ms_per_step"] == 0
    assert summaries["nohints"]["val_loss_hints"] is None and summaries["hints"]["val_loss_hints"] is not None


def script_value(script, name):
    """The first NAME=<int> of a script: its real run's value."""
    return int(re.search(rf"^{name}=(\d+)", (REPO / "scripts" / script).read_text(), re.M).group(1))


def test_gpu_check_runs_one_ranks_share_of_the_record_and_fits_one_h100():
    """The real run's table is one rank's shard of the record's and its batch one rank's share; the card of
    those flags on one rank fits an 80 GB H100 with room for activations, the whole table would not."""
    assert script_value("gpu_check.sh", "NGRAM_ROWS") * 8 == NGRAM_ROWS
    assert script_value("gpu_check.sh", "TOKENS_PER_STEP") * 8 == RECORD_TOKENS_PER_STEP
    assert script_value("gpu_check.sh", "VAL_BATCH_TOKENS") == VAL_TOKENS_PER_RANK
    for script in ("gpu_ab.sh",):  # its new run is gpu_check's
        for name in ("NGRAM_ROWS", "VAL_BATCH_TOKENS"):
            assert script_value(script, name) == script_value("gpu_check.sh", name), (script, name)

    def card(rows):
        cmd = [sys.executable, "train_gpt.py", "--preset", "record", "--describe", "--steps", "84",
               "--ngram-rows", str(rows), "--tokens-per-step", str(script_value("gpu_check.sh", "TOKENS_PER_STEP")),
               "--val-batch-tokens", str(script_value("gpu_check.sh", "VAL_BATCH_TOKENS"))]
        p = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, WORLD_SIZE="1"), capture_output=True, text=True,
                           timeout=120, check=True)
        return json.loads(p.stdout)

    shard = card(script_value("gpu_check.sh", "NGRAM_ROWS"))
    assert shard["world_size"] == 1 and (shard["n_layer"], shard["model_dim"], shard["n_head"]) == (11, 512, 4)
    assert shard["memory_per_gpu"]["total"] < 0.25 * H100_BYTES
    assert card(NGRAM_ROWS)["memory_per_gpu"]["total"] > H100_BYTES


def test_gpu_ab_dry_run(tmp_path):
    out = run_script(["bash", "scripts/gpu_ab.sh", "--dry-run"], tmp_path)
    for run in ("old", "new"):
        assert re.search(rf"\[{run}\] done, exit 0 in [\d.]+s of \d+s; recompiles: \d+", out), run
        assert re.search(rf"^{run}\s+\S+ \(\w+\)\s+\d+\s+[\d,]+\s+[\d.]+\s+[\d,]+", out, re.M), run  # its table row
    old, new = (json.loads((tmp_path / "out" / f"ab_{run}.json").read_text()) for run in ("old", "new"))
    assert (old["preset"], old["arch"], new["preset"], new["arch"]) == ("record-2025", "speedrun", "record", "record")
    assert old["train_tokens"] == new["train_tokens"] == 2048  # equal training tokens
    assert not new["canonical_mask"]  # both validations plain cross-entropy


def test_gpu_exact_bench_dry_run(tmp_path):
    out = run_script(["bash", "scripts/gpu_exact_bench.sh", "--dry-run"], tmp_path)
    assert "[warm-up] cold compile" in out
    assert re.search(r"\[check\] Triton == torch twin on [\d,]+ \w+ training tokens: True", out)
    assert re.search(r"\[12,288\] .* counted in", out) and "0 table doublings" in out
    assert re.search(r"\[bench\] done, exit 0", out)


def test_gpu_check_report_dry_run(tmp_path):
    out = run_script([sys.executable, "scripts/gpu_check_report.py", "--dry-run", "--out", str(tmp_path / "r")],
                     tmp_path, deps=False)  # standard library only; its runs are train_gpt.py's
    assert re.search(r"recompiles \(TORCH_LOGS=recompiles\)\s+0\s+0", out)
    assert "preset record (arch record), 3 of 84 recipe steps x 1,024 tokens" in out


def test_report_strict_names_a_missing_field(tmp_path):
    """--strict fails, naming the field, on a summary without one the report reads."""
    (tmp_path / "a.json").write_text('{"device": "cpu"}')
    (tmp_path / "b.json").write_text('{"device": "cpu"}')
    proc = subprocess.run([sys.executable, "scripts/gpu_check_report.py", "--strict", str(tmp_path / "a.json"),
                           str(tmp_path / "b.json")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "no field 'tokens_per_s'" in proc.stderr and "no field 'mfu'" in proc.stderr


def bash_value(expr):
    return int(subprocess.run(["bash", "-c", f"source scripts/gpu_lib.sh; echo $(({expr}))"], cwd=REPO,
                              capture_output=True, text=True, check=True).stdout)


def real_limits(script):
    """The first LIMITS=(...) of a script: its real run's phase timeouts (every phase's)."""
    text = (REPO / "scripts" / script).read_text()
    return [int(x) for x in re.search(r"^LIMITS=\(([\d ]+)\)", text, re.M).group(1).split()]


def test_the_three_scripts_fit_one_device_call():
    check, exact, ab = (bash_value(v) for v in ("GPU_CHECK_BUDGET_S", "GPU_EXACT_BUDGET_S", "GPU_AB_BUDGET_S"))
    assert check + exact + ab + CALL_OVERHEAD_S <= DEVICE_CALL_S
    assert sum(real_limits("gpu_check.sh")) <= check
    assert sum(real_limits("gpu_exact_bench.sh")) <= exact
    assert sum(real_limits("gpu_ab.sh")) <= ab  # deps, corpus, report and its two runs


@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_ab.sh", "gpu_exact_bench.sh"])
def test_help(script):
    proc = subprocess.run(["bash", f"scripts/{script}", "--help"], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "--dry-run" in proc.stdout and "Usage" in proc.stdout
