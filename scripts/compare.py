"""The honest comparison in one command: the hinted model with hints, the same model without
them, and a baseline trained with --no-hints for the same steps and data.

"Validation loss with and without hints" gives two numbers for one model, and training with
hints makes the backbone slightly worse without them (the article's footnote 5). The third
number, the same recipe trained without hints, says what the hints are worth. This script runs
train_gpt.py twice as subprocesses with the same arguments, once as given and once with
--no-hints, reads their --summary-json files, checks that both trained the same steps on the
same tokens, and prints a Markdown table and writes JSON.

    python scripts/compare.py --out runs/compare -- --preset demo-2025 --steps 300
    python scripts/compare.py --nproc 8 --out runs/compare -- --preset record-2025

Every argument this script does not know goes to train_gpt.py verbatim (a `--` before them is
optional). It never imports train_gpt.py: the trainer's flags may change; this script relies
only on --summary-json, --no-hints and the summary's val_loss_hints, val_loss_nohints, steps,
train_tokens and no_hints.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_GPT = os.path.join(REPO, "train_gpt.py")
OWN_FLAGS = ("--summary-json", "--no-hints")  # this script sets them for each run


def trainer_command(nproc, train_args):
    if nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                TRAIN_GPT, *train_args]
    return [sys.executable, TRAIN_GPT, *train_args]


def with_checkpoint_suffix(train_args, suffix):
    """The same arguments with --save-checkpoint PATH renamed PATH<suffix> (the runs must not share it)."""
    out = list(train_args)
    for i, a in enumerate(out):
        if a == "--save-checkpoint" and i + 1 < len(out):
            root, ext = os.path.splitext(out[i + 1])
            out[i + 1] = f"{root}{suffix}{ext}"
        elif a.startswith("--save-checkpoint="):
            root, ext = os.path.splitext(a.split("=", 1)[1])
            out[i] = f"--save-checkpoint={root}{suffix}{ext}"
    return out


def run_trainer(name, nproc, train_args, summary_path, log_path):
    cmd = trainer_command(nproc, [*train_args, "--summary-json", summary_path])
    print(f"compare: {name}: {' '.join(cmd)}  (log: {log_path})", flush=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        code = subprocess.call(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    if code != 0:
        with open(log_path) as f:
            tail = f.read()[-4000:]
        raise SystemExit(f"compare: the {name} run exited with code {code}; last lines of {log_path}:\n{tail}")
    with open(summary_path) as f:
        summary = json.load(f)
    print(f"compare: {name}: done in {time.perf_counter() - t0:.0f}s", flush=True)
    return summary


def check_same_recipe(hinted, baseline):
    """The baseline must have trained the same steps on the same tokens, without hints."""
    problems = [f"{k}: hinted {hinted.get(k)!r}, baseline {baseline.get(k)!r}"
                for k in ("steps", "train_tokens", "global_batch_tokens", "arch", "world_size")
                if hinted.get(k) != baseline.get(k)]
    if not baseline.get("no_hints"):
        problems.append("the baseline summary does not say no_hints: true")
    if hinted.get("no_hints"):
        problems.append("the hinted run's summary says no_hints: true (was --no-hints passed through?)")
    if problems:
        raise SystemExit("compare: the two runs are not the same recipe: " + "; ".join(problems))


def result(hinted, baseline):
    index = hinted.get("val_index_desc") or hinted.get("val_index") or "?"
    return dict(
        hinted_with_hints=hinted["val_loss_hints"],
        hinted_without_hints=hinted["val_loss_nohints"],
        baseline_no_hints=baseline["val_loss_nohints"],
        val_index=hinted.get("val_index"), val_index_desc=index, hint_tokens_val=hinted.get("hint_tokens_val"),
        steps=hinted["steps"], train_tokens=hinted["train_tokens"], val_tokens=hinted.get("val_tokens"),
        train_time_s=dict(hinted=hinted.get("train_time_s"), baseline=baseline.get("train_time_s")),
        run_ids=dict(hinted=hinted.get("run_id"), baseline=baseline.get("run_id")),
    )


def markdown(r):
    def fmt(v):
        return f"{v:.4f}" if isinstance(v, (int, float)) and math.isfinite(v) else "n/a"
    return "\n".join([
        f"| {r['steps']} steps, {r['train_tokens']:,} training tokens | val loss |",
        "|---|---|",
        f"| hinted model, with hints ({r['val_index_desc']}) | **{fmt(r['hinted_with_hints'])}** |",
        f"| hinted model, without hints | {fmt(r['hinted_without_hints'])} |",
        f"| baseline trained with --no-hints (same steps and data) | {fmt(r['baseline_no_hints'])} |",
    ])


def main(argv=None):
    p = argparse.ArgumentParser(
        description="Train with hints and with --no-hints (same other arguments) and report three validation "
        "losses: hinted model with hints, the same model without, and the no-hints baseline. Unknown arguments "
        "go to train_gpt.py.", usage="%(prog)s [--out DIR] [--nproc N] [--] TRAIN_GPT_ARGS...", allow_abbrev=False)
    p.add_argument("--out", default=os.path.join(REPO, "runs", "compare"),
                   help="directory for compare.json, compare.md, both summaries and both logs")
    p.add_argument("--nproc", type=int, default=1, help="processes per run (torch.distributed.run when > 1)")
    args, train_args = p.parse_known_args(argv)
    if train_args[:1] == ["--"]:
        train_args = train_args[1:]
    for a in train_args:
        if a.split("=", 1)[0] in OWN_FLAGS:
            p.error(f"{a.split('=', 1)[0]} is set by compare.py for each run; leave it out")
    os.makedirs(args.out, exist_ok=True)
    out = os.path.abspath(args.out)

    hinted = run_trainer("hinted", args.nproc, train_args, os.path.join(out, "hinted.json"),
                         os.path.join(out, "hinted.log"))
    baseline = run_trainer("baseline (--no-hints)", args.nproc, with_checkpoint_suffix(train_args, "_nohints") + ["--no-hints"],
                           os.path.join(out, "baseline.json"), os.path.join(out, "baseline.log"))
    check_same_recipe(hinted, baseline)
    r = result(hinted, baseline)
    table = markdown(r)
    with open(os.path.join(out, "compare.json"), "w") as f:
        json.dump(r, f, indent=1)
    with open(os.path.join(out, "compare.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    print(f"compare: wrote {out}/compare.json and compare.md")
    return r


if __name__ == "__main__":
    main()
