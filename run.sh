#!/usr/bin/env bash
# Run the trainer on whatever this machine has:
#   8+ CUDA GPUs: the record attempt (--preset record), torchrun over 8 GPUs on FineWeb100B (downloaded if missing);
#   1-7 GPUs:     the record's model and recipe on the GPUs there are (for checks);
#   no CUDA:      the CPU demo on the local standard-library corpus (built on first use).
# Extra arguments go to train_gpt.py, e.g. ./run.sh --steps 100 --summary-json out.json
# It first installs what is missing (scripts/install.sh): the pinned requirements and this checkout.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/install.sh

# One dataset, as the record has it: FineWeb100B. The record trains on its first train shard(s)
# (570 x 131,072 = 74.7M tokens), validates on its val shard, and builds the background hint index
# from its first N train shards (the plan's N, sized to this node: train_gpt.py --preset record --plan;
# the record: 350 shards, 35B tokens), the shards it trains on included. FineWeb10B stays an option:
# pass --train-files/--val-files/--hint-files data/fineweb10B/... after fetching it with data.cached_fineweb10B.
n_gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
    n_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi

if [ "$n_gpus" -ge 1 ]; then
    tokens=$("$PY" train_gpt.py --preset record --plan "$@" | "$PY" -c "import json, sys; print(json.load(sys.stdin)['hint_tokens'])")
    train_tokens=$("$PY" train_gpt.py --preset record --describe "$@" | "$PY" -c "import json, sys; c = json.load(sys.stdin); print(c['steps'] * c['tokens_per_step'])")
    tokens=$(( tokens > train_tokens ? tokens : train_tokens ))
    shards=$(( (tokens + 99999999) / 100000000 ))
    shards=$(( shards < 1 ? 1 : shards ))
    have=$(ls data/fineweb100B/fineweb_train_*.bin 2>/dev/null | wc -l)
    if [ ! -f data/fineweb100B/fineweb_val_000000.bin ] || [ "$have" -lt "$shards" ]; then
        echo "run.sh: the plan reads $tokens FineWeb100B tokens: downloading $shards train shards and the val shard"
        "$PY" -m data.cached_fineweb100B "$shards"
    fi
    nproc_per_node=$(( n_gpus >= 8 ? 8 : n_gpus ))
    if [ "$n_gpus" -ge 8 ]; then
        echo "run.sh: $n_gpus CUDA GPUs: record attempt (torchrun --standalone --nproc_per_node=8 train_gpt.py --preset record)"
    else
        echo "run.sh: $n_gpus CUDA GPU(s), fewer than the record's 8: the record's model and recipe on $n_gpus GPU(s)" \
             "(each rank takes 131,072 / $nproc_per_node tokens a step and 1/$nproc_per_node of the n-gram table; it must fit)"
    fi
    exec "$PY" -m torch.distributed.run --standalone --nproc_per_node="$nproc_per_node" train_gpt.py --preset record "$@"
else
    echo "run.sh: no CUDA GPU: CPU demo (train_gpt.py --preset demo: the record's model at width 128, its recipe" \
         "scaled to 84 steps, on Python's standard library; a few minutes on 2 cores)"
    exec "$PY" train_gpt.py --preset demo "$@"
fi
