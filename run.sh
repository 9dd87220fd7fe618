#!/usr/bin/env bash
# Run the trainer on whatever this machine has:
#   8+ CUDA GPUs: the record attempt, torchrun over 8 GPUs on FineWeb10B (downloaded if missing);
#   1-7 GPUs:     the record shape on the GPUs there are (a smaller global batch; for checks);
#   no CUDA:      the CPU demo on the local standard-library corpus (built on first use).
# Extra arguments go to train_gpt.py, e.g. ./run.sh --steps 100 --summary-json out.json
# It first installs what is missing (scripts/install.sh): the pinned requirements and this checkout.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/install.sh

# FineWeb10B train shards of 100M tokens: the record trains on 70.8M tokens, so one is enough. The
# background hint index comes from FineWeb100B shards, as many as the plan (train_gpt.py --plan,
# sized to this node's memory, cores and disk; up to the article's 37B tokens) asks for.
FINEWEB_TRAIN_SHARDS=${FINEWEB_TRAIN_SHARDS:-1}

n_gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
    n_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi

if [ "$n_gpus" -ge 1 ]; then
    have=$(ls data/fineweb10B/fineweb_train_*.bin 2>/dev/null | wc -l)
    if [ ! -f data/fineweb10B/fineweb_val_000000.bin ] || [ "$have" -lt "$FINEWEB_TRAIN_SHARDS" ]; then
        echo "run.sh: FineWeb10B shards missing ($have of $FINEWEB_TRAIN_SHARDS train shards): downloading"
        "$PY" -m data.cached_fineweb10B "$FINEWEB_TRAIN_SHARDS"
    fi
    plan_tokens=$("$PY" train_gpt.py --preset record --plan "$@" | "$PY" -c "import json, sys; print(json.load(sys.stdin)['hint_tokens'])")
    hint_shards=$(( (plan_tokens + 99999999) / 100000000 ))
    have100=$(ls data/fineweb100B/fineweb_train_*.bin 2>/dev/null | wc -l)
    if [ "$have100" -lt "$hint_shards" ]; then
        echo "run.sh: the plan builds the hint index from $plan_tokens FineWeb100B tokens: downloading $hint_shards shards"
        "$PY" -m data.cached_fineweb100B "$hint_shards"
    fi
    nproc_per_node=$(( n_gpus >= 8 ? 8 : n_gpus ))
    if [ "$n_gpus" -ge 8 ]; then
        echo "run.sh: $n_gpus CUDA GPUs: record attempt (torchrun --standalone --nproc_per_node=8 train_gpt.py --preset record)"
    else
        echo "run.sh: $n_gpus CUDA GPU(s), fewer than the record's 8: record shape on $n_gpus GPU(s), smaller global batch"
    fi
    exec "$PY" -m torch.distributed.run --standalone --nproc_per_node="$nproc_per_node" train_gpt.py --preset record "$@"
else
    echo "run.sh: no CUDA GPU: CPU demo (train_gpt.py --preset demo; a few minutes on 2 cores)"
    exec "$PY" train_gpt.py --preset demo "$@"
fi
