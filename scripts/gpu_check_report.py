"""The report of scripts/gpu_check.sh: two record-arch summary JSONs side by side.

    python3 scripts/gpu_check_report.py [--strict] HINTED.json NOHINTS.json
    python3 scripts/gpu_check_report.py --dry-run [--out DIR]

HINTED.json is a `train_gpt.py --preset record` run with hints, NOHINTS.json the paired --no-hints run
(same flags, same steps): the summaries train/record_run.py writes. Either may be missing (a run that
failed or timed out): its column reads n/a. Recompiles come from NAME.log beside NAME.json when it is
there (the run's output with TORCH_LOGS=recompiles, as gpu_check.sh writes it). --strict: every summary
field the report reads and the run log beside each summary must be there (a renamed field fails
instead of printing n/a). --dry-run: makes a tiny corpus and the two runs on this CPU (the record
preset at tiny shapes, 3 steps, offline), then reports on them with --strict. Standard library only
(CPU summaries give MFU and GPU memory n/a).

ms/step, tokens/s and MFU are the timed steps' (the clock's start to the last step, after a device
sync), without the tail ship and the canonical mask's join after them. The hint lookups' time is the
loop's wall time in the positional index's lookups (with any wait for the index, built on the clock,
to cover the step) and their copy to the device, on the training loop's thread: part of step time
unless the GPU is still busy with earlier work. The GPU-side cost of
the whole hint path (lookups, the hint inputs in the model) is the hinted run's ms/step against the
--no-hints run's.
"""
import json
import os
import subprocess
import sys
import tempfile

RECOMPILE_LINE = "Recompiling function"  # TORCH_LOGS=recompiles
# the summary fields the report reads (--strict: all must be there)
FIELDS = ("device", "world_size", "preset", "arch", "steps", "steps_trained", "tokens_per_step", "tokens_per_rank",
          "ngram_rows", "tokens_per_s", "step_ms", "flops_per_token", "mfu", "hint_ms_per_step", "hint_share",
          "val_loss_hints", "val_loss_nohints", "val_tokens", "peak_memory_gib", "train_time_s", "warmup_time_s",
          "val_time_s", "tail_shipped", "val_index", "val_index_reason", "hint_tokens_val", "no_hints", "log_file")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# --dry-run: the record preset at tiny shapes on the CPU, the flags gpu_check.sh's dry run gives its two runs
DRY_FLAGS = ["--preset", "record", "--n-embd", "64", "--n-head", "4", "--block-tokens", "16", "--steps", "84",
             "--stop-after", "3", "--no-record-warmup", "--tokens-per-step", "1024", "--ngram-rows", "65536",
             "--val-tokens", "4096", "--val-batch-tokens", "2048", "--log-every", "1", "--seed", "0"]


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"gpu_check_report: {path}: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def recompiles(summary_path):
    """Recompile lines in NAME.log beside NAME.json, or None when there is no such log."""
    log = os.path.splitext(summary_path)[0] + ".log"
    if not os.path.isfile(log):
        return None
    with open(log, errors="replace") as f:
        return sum(RECOMPILE_LINE in line for line in f)


def check_strict(paths, summaries):
    """--strict: the fields and the run logs the report reads are all there."""
    problems = []
    for path, s in zip(paths, summaries):
        if s is None:
            problems.append(f"{path}: no summary")
            continue
        problems += [f"{path}: no field {k!r}" for k in FIELDS if k not in s]
        if recompiles(path) is None:
            problems.append(f"{path}: no run log {os.path.splitext(path)[0] + '.log'} beside it")
    for p in problems:
        print(f"gpu_check_report: --strict: {p}", file=sys.stderr)
    return not problems


def dry_run(out):
    """A tiny corpus and the two runs on this CPU, then the report on them with --strict."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", HINTS_GPU_PATHS="0", PYTHONUNBUFFERED="1")
    corpus = os.path.join(out, "corpus")
    subprocess.run([sys.executable, "-m", "data.local_corpus", "--out-dir", corpus, "--max-train-tokens", "400000",
                    "--max-val-tokens", "50000", "--shard-tokens", "200000"], cwd=REPO, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    files = ["--train-files", f"{corpus}/train_*.bin", "--val-files", f"{corpus}/val_*.bin",
             "--log-dir", os.path.join(out, "logs")]
    paths = []
    for name, extra in (("hints", []), ("nohints", ["--no-hints"])):
        path = os.path.join(out, f"{name}.json")
        with open(os.path.join(out, f"{name}.log"), "w") as log:
            subprocess.run([sys.executable, "train_gpt.py", *DRY_FLAGS, *files, *extra, "--summary-json", path],
                           cwd=REPO, env=dict(env, TORCH_LOGS="recompiles"), stdout=log, stderr=subprocess.STDOUT,
                           check=True, timeout=300)
        paths.append(path)
    return main(["--strict", *paths])


def num(v, fmt="{:.4f}"):
    return "n/a" if v is None else fmt.format(v)


def pct(v, digits=1):
    return "n/a" if v is None else f"{100 * v:.{digits}f}%"


def main(argv):
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if argv and argv[0] == "--dry-run":
        if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--out"):
            print("usage: gpu_check_report.py --dry-run [--out DIR]", file=sys.stderr)
            return 2
        out = argv[2] if len(argv) == 3 else tempfile.mkdtemp(prefix="gpu_check_report_dry.")
        os.makedirs(out, exist_ok=True)
        print(f"gpu_check_report: DRY RUN: two tiny record-preset runs on the CPU in {out}")
        return dry_run(out)
    strict = bool(argv) and argv[0] == "--strict"
    argv = argv[1:] if strict else argv
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    h, n = load(argv[0]), load(argv[1])
    if h is None and n is None:
        print("gpu_check_report: no summary to report (both runs failed?)")
        return 1
    first = h or n
    print(f"device {first.get('device')}, {first.get('world_size')} rank(s), preset {first.get('preset')} "
          f"(arch {first.get('arch')}), {first.get('steps_trained')} of {first.get('steps')} recipe steps x "
          f"{first.get('tokens_per_step', 0):,} tokens ({first.get('tokens_per_rank', 0):,} a rank), n-gram table "
          f"{first.get('ngram_rows', 0):,} rows")

    def row(label, fn):
        cols = [fn(s) if s is not None else "n/a" for s in (h, n)]
        print(f"  {label:<44}{cols[0]:>22}{cols[1]:>22}")

    print(f"  {'':<44}{'with hints':>22}{'--no-hints':>22}")
    row("tokens/s", lambda s: num(s.get("tokens_per_s"), "{:,.0f}"))
    row("ms/step (timed steps)", lambda s: num(s.get("step_ms"), "{:.2f}"))
    row("model FLOPs/token (model/record_flops.py)", lambda s: num(s.get("flops_per_token"), "{:,.0f}"))
    row("MFU (vs 989 TFLOP/s bf16 dense)", lambda s: pct(s.get("mfu")) if s.get("mfu") is not None
        else "n/a (no CUDA)")
    row("hint lookups, ms/step (in the loop)", lambda s: num(s.get("hint_ms_per_step"), "{:.2f}"))
    row("  ... as a share of step time", lambda s: pct(s.get("hint_share"), 2))
    row("val loss with hints", lambda s: num(s.get("val_loss_hints")) if not s.get("no_hints")
        else "(not trained with)")
    row("val loss without hints", lambda s: num(s.get("val_loss_nohints")))
    row("val tokens", lambda s: num(s.get("val_tokens"), "{:,}"))
    row("peak GPU memory (allocated)", lambda s: num(s.get("peak_memory_gib"), "{:.1f} GiB") if
        s.get("peak_memory_gib") is not None else "n/a (no CUDA)")
    row("warm-up (untimed, compiles), s", lambda s: num(s.get("warmup_time_s"), "{:.1f}") if
        s.get("warmup_time_s") is not None else "off")
    row("train time (clock, incl. tail ship), s", lambda s: num(s.get("train_time_s"), "{:.2f}"))
    row("final validation, s", lambda s: num(s.get("val_time_s"), "{:.1f}"))
    row("tail averages shipped", lambda s: "yes" if s.get("tail_shipped") else "no (stopped early)")
    compiles = {id(s): recompiles(p) for p, s in zip(argv, (h, n)) if s is not None}
    row("recompiles (TORCH_LOGS=recompiles)", lambda s: num(compiles.get(id(s)), "{:d}"))

    if h is not None:
        print(f"hinted run's validation hints: the {h.get('val_index')} index ({h.get('val_index_reason')}), "
              f"{h.get('hint_tokens_val', 0):,} tokens")
        if h.get("val_loss_hints") is not None and h.get("val_loss_nohints") is not None:
            print(f"hint gain at validation (hinted run): {h['val_loss_nohints'] - h['val_loss_hints']:+.4f} "
                  f"(loss without hints - loss with hints)")
    if h is not None and n is not None:
        lh, ln = h.get("step_ms"), n.get("step_ms")
        if lh and ln:
            print(f"GPU-side cost of the hint path: ({lh:.2f} - {ln:.2f}) / {ln:.2f} = {pct((lh - ln) / ln, 2)} "
                  f"of step time (short runs: a few % is noise)")
        if n.get("val_loss_nohints") is not None and h.get("val_loss_hints") is not None:
            print(f"val loss: hinted run with hints {h['val_loss_hints']:.4f}, without {num(h.get('val_loss_nohints'))}; "
                  f"--no-hints run {n['val_loss_nohints']:.4f}")
    for label, s in (("with hints", h), ("--no-hints", n)):
        digests = (s or {}).get("param_digests") or []
        if len(set(digests)) > 1:
            print(f"WARNING ({label}): ranks ended with different weights: {digests}")
    if strict and not check_strict(argv, (h, n)):
        return 1
    return 0 if (h is not None and n is not None) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
