"""Hint-corpus ablation: one trained checkpoint, validation loss against hint indexes of
growing size (a doubling ladder, e.g. 75M ... 37B training tokens), plus the no-hint row.

One incremental pass over the training shards (hints.bench.scaling.run_ladder) grows a single
index; at every ladder size the checkpoint is evaluated with hints from it. Writes
ablation.md (table), ablation.csv, ablation.json and ablation.png (loss vs hint tokens,
log x-axis) to --out, and prints the table.

    python scripts/ablate.py --checkpoint runs/demo.pt --min-tokens 500K --out runs/ablate
"""
import argparse
import os
import time

import torch

from data.units import human_tokens, parse_token_count
from hints import Geometry
from hints.bench import RECORD_LADDER_START, hint_stats, ladder_sizes, markdown_table, run_ladder, write_report
from hints.tokens import count_tokens
from model import GPT, GPTConfig
from train.checkpoint import load_set
from train.common import Dist
from train.data import read_val_tokens
from train.evaluate import evaluate


def load_model(path, d):
    """The checkpoint's model (a complete set, loaded without running code) and its run's flags."""
    main_state, _, _ = load_set(path, d)
    model = GPT(GPTConfig(**main_state["model_config"]))
    model.load_state_dict(main_state["model"])
    return model.to(d.device).eval(), main_state["args"]


def write_outputs(rows, nohints, out_dir):
    lengths = [k.split("_")[1] for k in rows[0] if k.startswith("coverage_")]
    table = markdown_table(
        ["hint tokens", "val loss (hints)", "vs no hints"] + [f"{L}-gram coverage" for L in lengths],
        [["none", f"{nohints:.4f}", "0"] + ["-"] * len(lengths)]
        + [[human_tokens(r["hint_tokens"]), f"{r['val_loss_hints']:.4f}", f"{r['val_loss_hints'] - nohints:+.4f}"]
           + [f"{r[f'coverage_{L}']:.2%}" for L in lengths] for r in rows])

    def draw(plt):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        ax.plot([r["hint_tokens"] for r in rows], [r["val_loss_hints"] for r in rows], marker="o", label="with hints")
        ax.axhline(nohints, color="gray", linestyle="--", label="no hints")
        ax.set_xscale("log")
        ax.set_xlabel("hint corpus (training tokens)")
        ax.set_ylabel("validation loss")
        ax.set_title("validation loss vs hint-corpus size")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        return fig

    write_report(out_dir, "ablation", rows, table, plots=[("ablation.png", draw)], val_loss_nohints=nohints)
    return table


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="a train_gpt.py checkpoint (--save-checkpoint)")
    ap.add_argument("--train-files", default=None, help="hint corpus shards (default: the checkpoint's training shards)")
    ap.add_argument("--val-files", default=None, help="validation shards (default: the checkpoint's)")
    ap.add_argument("--val-tokens", type=parse_token_count, default=None, help="first N validation tokens (default: the checkpoint's)")
    ap.add_argument("--min-tokens", default=str(RECORD_LADDER_START), help="smallest hint corpus (e.g. 75M)")
    ap.add_argument("--max-tokens", default=None, help="largest hint corpus (e.g. 37B; default: all training tokens)")
    ap.add_argument("--batch-size", type=int, default=None, help="validation sequences per forward (default: the run's)")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="hint build/lookup worker threads")
    ap.add_argument("--out", default="runs/ablate", help="output directory")
    args = ap.parse_args(argv)

    d = Dist(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    model, train_args = load_model(args.checkpoint, d)
    train_files = args.train_files or train_args["train_files"]
    val = read_val_tokens(args.val_files or train_args["val_files"], args.val_tokens or train_args["val_tokens"])
    max_tokens = parse_token_count(args.max_tokens) if args.max_tokens else count_tokens(train_files)
    sizes = ladder_sizes(max_tokens, parse_token_count(args.min_tokens))
    geom = Geometry.for_tokens(sizes[-1], lengths=tuple(train_args["hint_lengths"]))
    print(f"ablation: {args.checkpoint}, {len(val):,} val tokens, ladder {[human_tokens(n) for n in sizes]}, {geom.describe()}")
    seq_len = train_args["seq_len"]
    kw = dict(seq_len=seq_len, batch_size=args.batch_size or train_args["val_batch_size"], dist=d,
              record=model.cfg.hint_repr == "record")  # the record's cells, else per-length hints

    nohints = evaluate(model, val, None, **kw)["loss_nohints"]
    print(f"  no hints: val loss {nohints:.4f}")
    rows = []

    def measure(idx, n):
        t0 = time.perf_counter()
        idx.workers = args.workers
        res = evaluate(model, val, idx, also_without_hints=False, **kw)
        st = hint_stats(idx, val)
        row = dict(hint_tokens=n, val_loss_hints=res["loss_hints"], val_loss_nohints=nohints,
                   dropped=idx.dropped, build_s=sum(idx.build_seconds.values()),
                   prefault_s=idx.prefault["seconds"] if idx.prefault else 0.0, **{f"coverage_{L}": c / max(1, st["positions"]) for L, c in zip(st["lengths"], st["covered"])},
                   **{f"accuracy_{L}": (r / c if c else float("nan")) for L, c, r in zip(st["lengths"], st["covered"], st["correct"])})
        rows.append(row)
        print(f"  {human_tokens(n):>6} hint tokens: val loss {row['val_loss_hints']:.4f} ({row['val_loss_hints'] - nohints:+.4f}), "
              f"coverage " + ", ".join(f"{L}: {row[f'coverage_{L}']:.2%}" for L in st["lengths"]) +
              f"  [index built in {row['build_s']:.1f}s so far (stages 1 + 2), its table pre-faulted in "
              f"{row['prefault_s']:.2f}s when made; evaluated in {time.perf_counter() - t0:.1f}s]")

    from tqdm import tqdm
    with tqdm(total=sizes[-1], unit="tok", unit_scale=True, desc="hint corpus") as bar:
        run_ladder(train_files, sizes, measure, geometry=geom, workers=args.workers, progress=bar)
    table = write_outputs(rows, nohints, args.out)
    print(table)
    print(f"wrote {args.out}/ablation.md, .csv, .json, .png")


if __name__ == "__main__":
    main()
