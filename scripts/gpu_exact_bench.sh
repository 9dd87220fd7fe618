#!/usr/bin/env bash
# Exact validation hints on ONE H100/H200, offline, in well under 8 minutes (cold compile included):
#   1. compiles the Triton kernels of hints/exact_kernels.py (timed: the cold start);
#   2. checks the Triton count against the torch twin on the GPU (100M training tokens);
#   3. times the exact count of the 10,485,760 validation tokens' 6-, 10- and 20-grams against
#      1B and 10B training tokens, already on the GPU, and prints training tokens/s.
# Tokens: the FineWeb shards under data/fineweb100B or data/fineweb10B when they hold enough
# (validation: data/fineweb10B/fineweb_val_000000.bin); otherwise synthetic tokens made on the
# GPU, said so in the output: phrases of 16 tokens (ids log-uniform over GPT-2's 50,257) drawn
# from one pool of 2^20 with Zipf(1.1) weights, the validation stream and the training stream
# from different draws, so n-grams recur and followers vary as in text (the hit rates print).
# With no CUDA GPU it says so and exits 0. Output also goes to $OUT/gpu_exact_bench.log if set.
# Usage: bash scripts/gpu_exact_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOG=${OUT:+$OUT/gpu_exact_bench.log}
LOG=${LOG:-/dev/null}

if ! $PY -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_exact_bench: no CUDA GPU here (or no torch with CUDA); nothing to time"
    exit 0
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader || true

set -o pipefail
timeout 450 $PY - <<'PYEOF' 2>&1 | tee "$LOG"
import glob
import time

import numpy as np
import torch
import triton

from data.shards import read_shard, shard_token_count
from hints.exact import count_exact

N_VAL = 10_485_760          # the speedrun's validation tokens
SIZES = (1_000_000_000, 10_000_000_000)
CHECK_TOKENS = 100_000_000  # Triton vs the torch twin on this many training tokens
CHUNK = 1 << 28             # tokens per device-resident chunk (512 MiB of uint16)
VOCAB = 50257
POOL, PHRASE, ZIPF = 1 << 20, 16, 1.1
dev = torch.device("cuda")
print(f"gpu_exact_bench: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")


class Synthetic:
    """Zipf-weighted draws of 16-token phrases from one shared pool, made on the GPU."""

    def __init__(self):
        g = torch.Generator(device=dev).manual_seed(12345)
        u = torch.rand(POOL, PHRASE, generator=g, device=dev)
        self.pool = (torch.exp(u * np.log(VOCAB)) - 1).to(torch.int32).clamp_(0, VOCAB - 1)
        w = torch.arange(1, POOL + 1, device=dev, dtype=torch.float64) ** -ZIPF
        self.cdf = torch.cumsum(w / w.sum(), 0)

    def tokens(self, n, seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        picks = torch.searchsorted(self.cdf, torch.rand(-(-n // PHRASE), generator=g, device=dev, dtype=torch.float64))
        return self.pool[picks.clamp_(max=POOL - 1)].reshape(-1)[:n].to(torch.uint16)


synthetic = None


def fineweb(pattern, n):
    files = sorted(glob.glob(pattern))
    if sum(shard_token_count(f) for f in files) < n:
        return None
    out, left = [], n
    for f in files:
        t = read_shard(f)[:left]
        for a in range(0, t.size, CHUNK):
            out.append(torch.from_numpy(np.array(t[a:a + CHUNK])).to(dev))
        left -= t.size
        if left == 0:
            return out


def train_chunks(n, seed):
    global synthetic
    t = time.perf_counter()
    for pattern in ("data/fineweb100B/fineweb_train_*.bin", "data/fineweb10B/fineweb_train_*.bin"):
        chunks = fineweb(pattern, n)
        if chunks is not None:
            return chunks, f"FineWeb ({pattern})", time.perf_counter() - t
    synthetic = synthetic or Synthetic()
    chunks = [synthetic.tokens(min(CHUNK, n - a), seed + a) for a in range(0, n, CHUNK)]
    torch.cuda.synchronize()
    return chunks, "synthetic", time.perf_counter() - t


val_files = sorted(glob.glob("data/fineweb10B/fineweb_val_*.bin"))
if val_files and shard_token_count(val_files[0]) >= N_VAL:
    val, val_kind = np.array(read_shard(val_files[0])[:N_VAL]), "FineWeb val"
else:
    synthetic = Synthetic()
    val, val_kind = synthetic.tokens(N_VAL, seed=1).cpu().numpy(), "synthetic"
print(f"validation: {val.size:,} tokens ({val_kind})")

t = time.perf_counter()
count_exact(val[:4096], [val[:8192]], backend="triton", device=dev)
print(f"cold compile + first run of the kernels: {time.perf_counter() - t:.1f}s")

chunks, kind, load_s = train_chunks(CHECK_TOKENS, seed=2)
a = count_exact(val, chunks, backend="triton", device=dev)
b = count_exact(val, chunks, backend="torch", device=dev)
same = all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("token", "count", "purity", "kind"))
print(f"check: Triton == torch twin on {CHECK_TOKENS:,} {kind} training tokens: {same}")
del chunks

for size in SIZES:
    chunks, kind, load_s = train_chunks(size, seed=1000)
    torch.cuda.synchronize()
    stats = {}
    t = time.perf_counter()
    try:
        h = count_exact(val, chunks, backend="triton", device=dev, stats=stats)
    except MemoryError as e:
        print(f"{size:,} training tokens: {e}")
        break
    dt = time.perf_counter() - t  # count_exact returns host arrays: the GPU is done
    rates = ", ".join(f"{L}-gram {r:.1%}" for L, r in zip((6, 10, 20), (h.count > 0).mean(axis=1)))
    print(f"{size:,} {kind} training tokens (on the GPU; made/loaded in {load_s:.1f}s): counted in {dt:.2f}s = "
          f"{size / dt / 1e9:.2f}B training tokens/s; validation positions with a hint: {rates}")
    print(f"    pairs {stats['pairs']:,} in {stats['pair_slots']:,} slots ({stats['pair_table_bytes'] / 2**30:.1f} GiB), "
          f"{stats['launches']} stream launches, {stats['syncs']} host syncs, {stats['growths']} table doublings; "
          f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    del chunks, h
    torch.cuda.empty_cache()
PYEOF
