"""The report of scripts/gpu_check.sh: two train_gpt.py summary JSONs side by side.

    python3 scripts/gpu_check_report.py HINTED.json NOHINTS.json

HINTED.json is a run with hints, NOHINTS.json the paired --no-hints run (same flags, same
steps). Either may be missing (a run that failed or timed out): its column reads n/a.
Standard library only, so it runs anywhere (CPU summaries give MFU and GPU memory n/a).

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
import sys

STEP_LINE = re.compile(r"^step (\d+)/(\d+) loss \S+ \| ([\d.]+)ms/step")


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
    return 0 if (h is not None and n is not None) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
