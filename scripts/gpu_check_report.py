"""The report of scripts/gpu_check.sh: two train_gpt.py summary JSONs side by side.

    python3 scripts/gpu_check_report.py [--strict] HINTED.json NOHINTS.json
    python3 scripts/gpu_check_report.py --dry-run [--out DIR]

HINTED.json is a run with hints, NOHINTS.json the paired --no-hints run (same flags, same
steps). Either may be missing (a run that failed or timed out): its column reads n/a.
Recompiles come from NAME.log beside NAME.json when it is there (the run's output with
TORCH_LOGS=recompiles, as gpu_check.sh writes it). --strict: every summary field and log line the
report reads must be there (a renamed field fails instead of printing n/a). --dry-run: makes a
tiny corpus and the two runs on this CPU (train_gpt.py --preset record-2025 at tiny shapes, offline),
then reports on them with --strict. Standard library only (CPU summaries give MFU and GPU memory n/a).

Hint prep is CPU time in the trainer's background prep thread (index lookup + add), not GPU
time; what the GPU loop pays for it is the wait. The step-time cost of the hint path on the
GPU side (hint inputs and embeddings in the model, hint tensors to the device) is the hinted
run's ms/step against the --no-hints run's. ms/step is taken from the run's log lines (loop
time only) when the log is readable, because the summary's train time also holds any wait at
the final validation for a late background index (the speedrun counts that as training time).
"""
import json
import os
import re
import subprocess
import sys
import tempfile

STEP_LINE = re.compile(r"^step (\d+)/(\d+) loss \S+ \| ([\d.]+)ms/step")
RECOMPILE_LINE = "Recompiling function"  # TORCH_LOGS=recompiles
# the summary fields the report reads (--strict: all must be there)
FIELDS = ("device", "world_size", "preset", "steps_timed", "global_batch_tokens", "batch_size", "seq_len",
          "tokens_per_s", "step_ms", "mfu", "hint_prep_ms_per_step", "hint_prep_share", "hint_wait_ms_per_step",
          "hint_wait_share", "val_loss_hints", "val_loss_nohints", "peak_memory_gib", "train_time_s",
          "target_val_loss", "target_reached", "val_index", "hint_tokens_val", "val_index_reason", "background",
          "log_file", "no_hints", "ranks_in_sync")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# --dry-run: the record preset at tiny shapes on the CPU, the flags gpu_check.sh gives
DRY_FLAGS = ["--preset", "record-2025", "--steps", "2", "--warmup-steps", "0", "--batch-size", "1", "--val-batch-size",
             "1", "--val-tokens", "256", "--val-every", "0", "--log-every", "1", "--bg-wait", "30", "--seed", "0",
             "--hint-tokens", "200K", "--node-ram", "16GiB", "--node-ranks", "1", "--n-embd", "32", "--n-head", "2",
             "--seq-len", "128"]


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"gpu_check_report: {path}: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def loop_ms_per_step(s):
    """Mean ms/step of the loop alone, weighting each log line by the steps it covers; None
    when the log is not readable or has no step lines."""
    path = s.get("log_file") if s else None
    if not path or not os.path.isfile(path):
        return None
    prev, steps, ms = 0, 0, 0.0
    with open(path, errors="replace") as f:
        for line in f:
            m = STEP_LINE.match(line)
            if m and int(m.group(1)) > prev:
                n = int(m.group(1)) - prev
                steps, ms, prev = steps + n, ms + n * float(m.group(3)), int(m.group(1))
    return ms / steps if steps else None


def recompiles(summary_path):
    """Recompile lines in NAME.log beside NAME.json, or None when there is no such log."""
    log = os.path.splitext(summary_path)[0] + ".log"
    if not os.path.isfile(log):
        return None
    with open(log, errors="replace") as f:
        return sum(RECOMPILE_LINE in line for line in f)


def check_strict(paths, summaries, loop):
    """--strict: the fields, the loop's log lines and the run logs the report reads are all there."""
    problems = []
    for path, s in zip(paths, summaries):
        if s is None:
            problems.append(f"{path}: no summary")
            continue
        problems += [f"{path}: no field {k!r}" for k in FIELDS if k not in s]
        if loop.get(id(s)) is None:
            problems.append(f"{path}: no 'step N/M loss ... ms/step' line in its log_file {s.get('log_file')}")
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
             "--hint-files", f"{corpus}/train_*.bin", "--log-dir", os.path.join(out, "logs")]
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


def target_text(s):
    if s is None:
        return "n/a"
    if s.get("target_val_loss") is None:
        return "no target"
    if s.get("target_reached"):
        return (f"<= {s['target_val_loss']} at step {s.get('steps_to_target')}, "
                f"{num(s.get('time_to_target_s'), '{:.2f}')}s, {num(s.get('tokens_to_target'), '{:,}')} tokens")
    return f"{s['target_val_loss']} not reached"


def background_text(s):
    b = (s or {}).get("background")
    if not b:
        return "none"
    secs = num(b.get("seconds"), "{:.1f}")
    return f"{b.get('state')}, {b.get('tokens_done', 0):,} tokens in {secs}s" + (
        f" ({b['error']})" if b.get("error") else "")


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
    loop = {id(s): loop_ms_per_step(s) for s in (h, n) if s}
    first = h or n
    print(f"device {first.get('device')}, {first.get('world_size')} rank(s), preset {first.get('preset')}, "
          f"{first.get('steps_timed')} timed steps x {first.get('global_batch_tokens', 0):,} tokens "
          f"(batch {first.get('batch_size')} x seq_len {first.get('seq_len')})")

    def row(label, fn):
        cols = [fn(s) if s is not None else "n/a" for s in (h, n)]
        print(f"  {label:<44}{cols[0]:>22}{cols[1]:>22}")

    print(f"  {'':<44}{'with hints':>22}{'--no-hints':>22}")
    row("tokens/s", lambda s: num(s.get("tokens_per_s"), "{:,.0f}"))
    row("ms/step (loop, from the log)", lambda s: num(loop.get(id(s)), "{:.2f}"))
    row("ms/step (summary: train time / steps)", lambda s: num(s.get("step_ms"), "{:.2f}"))
    row("MFU (vs 989 TFLOP/s bf16 dense)", lambda s: pct(s.get("mfu")) if s.get("mfu") is not None
        else "n/a (no CUDA)")
    row("hint prep: CPU ms/step, background thread", lambda s: num(s.get("hint_prep_ms_per_step"), "{:.2f}"))
    row("  ... as a share of step time", lambda s: pct(s.get("hint_prep_share"), 2))
    row("loop's wait for hint prep, ms/step", lambda s: num(s.get("hint_wait_ms_per_step"), "{:.3f}"))
    row("  ... as a share of step time", lambda s: pct(s.get("hint_wait_share"), 3))
    row("val loss with hints", lambda s: num(s.get("val_loss_hints")) if not s.get("no_hints")
        else "(not trained with)")
    row("val loss without hints", lambda s: num(s.get("val_loss_nohints")))
    row("peak GPU memory (allocated)", lambda s: num(s.get("peak_memory_gib"), "{:.1f} GiB") if
        s.get("peak_memory_gib") is not None else "n/a (no CUDA)")
    row("train time (s)", lambda s: num(s.get("train_time_s"), "{:.2f}"))
    row("time to target", lambda s: target_text(s).split(",")[0])
    compiles = {id(s): recompiles(p) for p, s in zip(argv, (h, n)) if s is not None}
    row("recompiles (TORCH_LOGS=recompiles)", lambda s: num(compiles.get(id(s)), "{:d}"))

    if h is not None:
        if h.get("target_reached"):
            print(f"time to target (hinted run): {target_text(h)} (validation excluded)")
        print(f"hinted run's validation: hints from the {h.get('val_index')} index, {h.get('hint_tokens_val', 0):,} "
              f"tokens ({h.get('val_index_reason')}); background index: {background_text(h)}")
        if h.get("val_loss_hints") is not None and h.get("val_loss_nohints") is not None:
            print(f"hint gain at validation (hinted run): {h['val_loss_nohints'] - h['val_loss_hints']:+.4f} "
                  f"(loss without hints - loss with hints)")
        if h.get("hint_prep_ms_per_step") is not None:
            print(f"hint prep is CPU time in the background prep thread ({h['hint_prep_ms_per_step']:.2f} ms/step, "
                  f"{pct(h.get('hint_prep_share'), 2)} of step time), overlapped with the GPU step; the loop "
                  f"waited {num(h.get('hint_wait_ms_per_step'), '{:.3f}')} ms/step for it")
    if h is not None and n is not None:
        lh, ln = loop.get(id(h)), loop.get(id(n))
        src = "loop ms/step from the logs"
        if lh is None or ln is None:
            lh, ln, src = h.get("step_ms"), n.get("step_ms"), "summary ms/step (logs not readable)"
        if lh and ln:
            print(f"GPU-side cost of the hint path: ({lh:.2f} - {ln:.2f}) / {ln:.2f} = {pct((lh - ln) / ln, 2)} "
                  f"of step time ({src}; short runs: a few % is noise)")
        if n.get("val_loss_nohints") is not None and h.get("val_loss_hints") is not None:
            print(f"val loss: hinted run with hints {h['val_loss_hints']:.4f}, without {num(h.get('val_loss_nohints'))}; "
                  f"--no-hints run {n['val_loss_nohints']:.4f}")
    for label, s in (("with hints", h), ("--no-hints", n)):
        if s is not None and s.get("step_ms") and loop.get(id(s)):
            extra = s["step_ms"] - loop[id(s)]
            if extra > max(0.5, 0.02 * loop[id(s)]):
                print(f"note ({label}): summary ms/step exceeds the loop's by {extra:.2f} ms/step: the final "
                      f"validation waited for the background index (counted as training time)")
        if s is not None and s.get("ranks_in_sync") is False:
            print(f"WARNING ({label}): ranks ended with different weights")
    if strict and not check_strict(argv, (h, n), loop):
        return 1
    return 0 if (h is not None and n is not None) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
