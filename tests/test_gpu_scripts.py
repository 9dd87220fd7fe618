"""The GPU check scripts' dry runs: each runs here, on the CPU, offline, at tiny shapes, through
every dependency, path and flag its real run uses (scripts/gpu_lib.sh), and the real runs' phase
timeouts add up inside one 600 s device call."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
    for phase in ("corpus", "smoke", "hints", "nohints", "report"):
        assert re.search(rf"\[{phase}\] done, exit 0 in [\d.]+s of \d+s", out), phase
    assert out.index("[smoke] done") < out.index("[hints] start")  # the smoke test first
    assert "recompiles (TORCH_LOGS=recompiles)" in out and "val loss without hints" in out
    assert "plan: " in out  # the record plan ran and did not refuse


def test_gpu_ab_dry_run(tmp_path):
    out = run_script(["bash", "scripts/gpu_ab.sh", "--dry-run"], tmp_path)
    for run in ("old", "new_all"):
        assert re.search(rf"\[{run}\] done, exit 0 in [\d.]+s of \d+s; recompiles: \d+", out), run
        assert re.search(rf"^{run}\s+[\d.]+\s+[\d,]+", out, re.M), run  # its row in the results table


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


def test_report_strict_names_a_missing_field(tmp_path):
    """--strict fails, naming the field, on a summary without one the report reads."""
    (tmp_path / "a.json").write_text('{"device": "cpu"}')
    (tmp_path / "b.json").write_text('{"device": "cpu"}')
    proc = subprocess.run([sys.executable, "scripts/gpu_check_report.py", "--strict", str(tmp_path / "a.json"),
                           str(tmp_path / "b.json")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "no field 'tokens_per_s'" in proc.stderr


def bash_value(expr):
    return int(subprocess.run(["bash", "-c", f"source scripts/gpu_lib.sh; echo $(({expr}))"], cwd=REPO,
                              capture_output=True, text=True, check=True).stdout)


def real_limits(script):
    """The first LIMITS=(...) of a script: its real run's phase timeouts."""
    text = (REPO / "scripts" / script).read_text()
    return [int(x) for x in re.search(r"^LIMITS=\(([\d ]+)\)", text, re.M).group(1).split()]


def test_the_three_scripts_fit_one_device_call():
    check, exact, ab = (bash_value(v) for v in ("GPU_CHECK_BUDGET_S", "GPU_EXACT_BUDGET_S", "GPU_AB_BUDGET_S"))
    assert check + exact + ab + CALL_OVERHEAD_S <= DEVICE_CALL_S
    assert sum(real_limits("gpu_check.sh")) <= check
    assert sum(real_limits("gpu_exact_bench.sh")) <= exact
    ab_text = (REPO / "scripts" / "gpu_ab.sh").read_text()
    runs = len(re.search(r'AB_RUNS:-([\w ]+)\}', ab_text).group(1).split())
    run_timeout = int(re.search(r"AB_RUN_TIMEOUT:-(\d+)", ab_text).group(1))
    assert sum(real_limits("gpu_ab.sh")) + runs * run_timeout <= ab


@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_ab.sh", "gpu_exact_bench.sh"])
def test_help(script):
    proc = subprocess.run(["bash", f"scripts/{script}", "--help"], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "--dry-run" in proc.stdout and "Usage" in proc.stdout
