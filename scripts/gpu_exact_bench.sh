#!/usr/bin/env bash
# Exact validation hints on ONE H100/H200, offline, in at most 90 s (GPU_EXACT_BUDGET_S in
# scripts/gpu_lib.sh; second of the first device run's three scripts, docs/gpu.md):
#   1. warm-up (timed: the cold start): compiles the Triton kernels of hints/exact/triton_kernels.py for
#      the specialisation the timed runs use: the full validation query (its CAP_BITS) and the
#      bench's pair table (PAIR_BITS; the table starts at PAIR_SLOTS slots, so it need not grow);
#   2. checks the Triton count against the torch twin on the GPU (100M training tokens);
#   3. times the exact count of the 10,485,760 validation tokens' 6-, 10- and 20-grams against
#      1B and 10B training tokens, already on the GPU, and prints training tokens/s, table
#      doublings (each would compile a new PAIR_BITS: 0 expected) and host syncs. A size whose
#      projected time (from the previous size's rate) would pass the deadline is skipped, said so.
# Tokens: the FineWeb shards under data/fineweb100B or data/fineweb10B when they hold enough
# (validation: data/fineweb10B/fineweb_val_000000.bin); otherwise synthetic tokens made on the
# GPU, said so in the output: phrases of 16 tokens (ids log-uniform over GPT-2's 50,257) drawn
# from one pool of 2^20 with Zipf(1.1) weights, the validation stream and the training stream
# from different draws, so n-grams recur and followers vary as in text (the hit rates print).
# Phases: deps 15 s, bench 75 s (its own deadline 70 s). With no CUDA GPU it says so and exits 0.
# Output also goes to $OUT/gpu_exact_bench.log if set.
#
# Usage: bash scripts/gpu_exact_bench.sh [--dry-run]
#   --dry-run: the same code on this CPU, offline, at tiny sizes (2,048 validation tokens, 4k and
#   12k training tokens), the Triton kernels in Triton's interpreter and the torch twin on the CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
LIB_NAME=gpu_exact_bench
source scripts/gpu_lib.sh
parse_common_args "$@"
export PYTHONUNBUFFERED=1
LIMITS=(15 75)
[ "$DRY" = 1 ] && LIMITS=(60 240)
LOG=${OUT:+$OUT/gpu_exact_bench.log}
LOG=${LOG:-/dev/null}
[ -z "${OUT:-}" ] || mkdir -p "$OUT"

need_gpu
[ "$DRY" = 1 ] || timeout 5 nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
t=$(date +%s.%N)
DEPS_TIMEOUT=${LIMITS[0]} need_python_deps
say "[deps] done in $(elapsed "$t")s of ${LIMITS[0]}s"

bench() {
    timeout "${PHASE_TIMEOUT:-75}" "$PY" - "$DRY" "$((PHASE_TIMEOUT - 5))" <<'PYEOF' 2>&1 | tee "$LOG"
import glob
import sys
import time

import numpy as np
import torch
import triton

from data.shards import read_shard, shard_token_count
from hints.exact import count_exact

DRY, DEADLINE_S = sys.argv[1] == "1", float(sys.argv[2])
T0 = time.perf_counter()
VOCAB = 50257
PHRASE, ZIPF = 16, 1.1
if not DRY:
    N_VAL = 10_485_760          # the speedrun's validation tokens
    SIZES = (1_000_000_000, 10_000_000_000)
    CHECK_TOKENS = 100_000_000  # Triton vs the torch twin on this many training tokens
    CHUNK = 1 << 28             # tokens per device-resident chunk (512 MiB of uint16)
    POOL = 1 << 20
    # the pair table's slots from the start (2^29 x 16 B = 8 GiB): 400M (n-gram, follower) pairs at
    # its 3/4 load, more than 10B training tokens give the validation n-grams, so it does not double
    # (a doubling compiles a new PAIR_BITS specialisation inside the timing; the output counts them)
    PAIR_SLOTS = 1 << 29
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name()
else:
    N_VAL, SIZES, CHECK_TOKENS, CHUNK, POOL, PAIR_SLOTS = 2048, (4096, 12_288), 4096, 1 << 13, 1 << 12, 1 << 15
    dev = torch.device("cpu")
    name = "CPU (dry run: Triton's interpreter)"
OPTIONS = dict(pair_capacity=PAIR_SLOTS, max_pair_bytes=PAIR_SLOTS * 16 * 2)


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


print(f"gpu_exact_bench: {name}, torch {torch.__version__}, triton {triton.__version__}")


class Synthetic:
    """Zipf-weighted draws of 16-token phrases from one shared pool, made on the device."""

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
    if not files or sum(shard_token_count(f) for f in files) < n:
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
    sync()
    return chunks, "synthetic", time.perf_counter() - t


val_files = sorted(glob.glob("data/fineweb10B/fineweb_val_*.bin"))
if val_files and shard_token_count(val_files[0]) >= N_VAL:
    val, val_kind = np.array(read_shard(val_files[0])[:N_VAL]), "FineWeb val"
else:
    synthetic = Synthetic()
    val, val_kind = synthetic.tokens(N_VAL, seed=1).cpu().numpy(), "synthetic"
print(f"validation: {val.size:,} tokens ({val_kind})")

# the warm-up compiles what the timed runs use: the whole query (CAP_BITS) and the bench's pair
# table (PAIR_BITS), on a short training stream
t = time.perf_counter()
warm_stats = {}
count_exact(val, [torch.from_numpy(val[:8192].copy()).to(dev)], backend="triton", device=dev, stats=warm_stats,
            **OPTIONS)
print(f"[warm-up] cold compile + first run of the kernels at the timed specialisation "
      f"(query slots 2^{warm_stats['query_slots'].bit_length() - 1}, pair slots {warm_stats['pair_slots']:,}): "
      f"{time.perf_counter() - t:.1f}s")

t = time.perf_counter()
chunks, kind, load_s = train_chunks(CHECK_TOKENS, seed=2)
a = count_exact(val, chunks, backend="triton", device=dev, **OPTIONS)
b = count_exact(val, chunks, backend="torch", device=dev)
same = all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("token", "count", "purity", "kind"))
print(f"[check] Triton == torch twin on {CHECK_TOKENS:,} {kind} training tokens: {same} ({time.perf_counter() - t:.1f}s)")
del chunks
if not same:
    sys.exit(1)

last_rate = None
for size in SIZES:
    left = DEADLINE_S - (time.perf_counter() - T0)
    if last_rate is not None and 1.5 * size / last_rate > left:  # 1.5: making or loading the tokens too
        print(f"[{size:,}] skipped: at {last_rate / 1e9:.2f}B tokens/s it would not end in the {left:.0f}s left")
        break
    chunks, kind, load_s = train_chunks(size, seed=1000)
    sync()
    stats = {}
    t = time.perf_counter()
    try:
        h = count_exact(val, chunks, backend="triton", device=dev, stats=stats, **OPTIONS)
    except MemoryError as e:
        print(f"[{size:,}] {e}")
        break
    dt = time.perf_counter() - t  # count_exact returns host arrays: the device is done
    last_rate = size / dt
    rates = ", ".join(f"{L}-gram {r:.1%}" for L, r in zip((6, 10, 20), (h.count > 0).mean(axis=1)))
    print(f"[{size:,}] {kind} training tokens (on the device; made/loaded in {load_s:.1f}s): counted in {dt:.2f}s = "
          f"{size / dt / 1e9:.2f}B training tokens/s; validation positions with a hint: {rates}")
    peak = f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if dev.type == "cuda" else "n/a (CPU)"
    print(f"    pairs {stats['pairs']:,} in {stats['pair_slots']:,} slots ({stats['pair_table_bytes'] / 2**30:.1f} GiB), "
          f"{stats['launches']} stream launches, {stats['syncs']} host syncs, {stats['growths']} table doublings "
          f"(each a compile); peak device memory {peak}")
    del chunks, h
    if dev.type == "cuda":
        torch.cuda.empty_cache()
PYEOF
}
phase bench "${LIMITS[1]}" bench
